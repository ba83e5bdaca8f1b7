"""Hysteresis for the threshold checks, in one place: confirm a fault before acting, hold it
until it has stayed away.

A threshold check (a link's rate or error counters, PCIe width, NVLink, temperature) may read
bad once and good the next time: draining on one reading and resuming on one reading flaps the
node (gpud 1247, azurehpc 628). Here a finding of such a rule takes the node out only when
``confirm = "K/N"`` of its last N readings were bad (one bad reading is a warning saying so),
and once out it stays out (the finding repeated, marked held) until ``resume_after`` readings in
a row were good and, with ``sticky`` seconds, that long has passed since the last bad one (a
link drop that cleared in 30 s is still seen: gpud 1110). A state the node is in (a link down)
acts at once but is held the same way.
Rules not named here (XIDs, a lost GPU, ECC) pass through untouched: never delayed.

:func:`fold` is the pure step (findings, memory, clock -> findings, memory); :class:`Hysteresis`
keeps the memory in the state dir.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence

from slurm_hooks.models import Action, Finding, Severity
from slurm_hooks.values import replace

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing (~3 ms of each start)
if TYPE_CHECKING:
    from typing import Any

#: Rules judged against a threshold: confirmed over readings before they act.
CONFIRMED = frozenset({"ib-rate", "roce-rate", "ib-errors", "pcie", "nvlink-errors", "thermal"})
#: Rules whose drain is held until ``resume_after`` good readings: the above, and link states.
HELD = CONFIRMED | frozenset({"ib-down", "ib-ports", "ib-flaps", "ib-gone", "roce-down", "roce-ports",
                               "roce-flaps", "roce-gone", "nvlink"})
#: Two folds closer than this are one run judged twice (the health check's re-judge after an
#: admin's resume): the second starts from the memory the first started from.
SAME_RUN_S = 1.0


#: The check and rule of the finding that says the memory cannot be kept (a warning, never a drain).
MEMORY_CHECK = "hysteresis"
MEMORY_RULE = "hysteresis-memory"


def _key(f: Finding) -> str:
    """One memory per subject: a rule on one GPU, or on one port (``Finding.subject``), is counted
    apart from the same rule elsewhere (two ports each bad once are not one port bad twice)."""
    key = f"{f.rule_key}|{'' if f.gpu is None else f.gpu}"
    return f"{key}|{f.subject}" if f.subject else key


def fold(findings: Sequence[Finding], memory: Mapping[str, Any] | None, now: float, confirm: tuple[int, int],
         resume_after: int, sticky: float = 0.0) -> tuple[list[Finding], dict[str, Any]]:
    """This run's findings as hysteresis lets them act, and the memory for the next run.

    Memory: ``{"at": t, "before": <memory before the run at t>, "rules": {key: {"seen": [bool...],
    "held": finding dict | None, "good": n, "bad_at": t}}}``.
    """
    memory = dict(memory or {})
    if memory and now - float(memory.get("at", 0.0)) < SAME_RUN_S and isinstance(memory.get("before"), dict):
        memory = memory["before"]
    before = {k: v for k, v in memory.items() if k != "before"}
    rules: dict[str, Any] = {k: dict(v) for k, v in (memory.get("rules") or {}).items() if isinstance(v, dict)}
    need, last = confirm
    out: list[Finding] = []
    bad: dict[str, Finding] = {}
    for f in findings:
        if f.rule_key in HELD and f.action.takes_node_out:
            bad.setdefault(_key(f), f)
        else:
            out.append(f)
    for key in sorted(set(rules) | set(bad)):
        entry = rules.get(key, {})
        seen = ([bool(x) for x in entry.get("seen", ())] + [key in bad])[-last:]
        held = entry.get("held")
        if key in bad:
            f = bad[key]
            count = sum(seen)
            if f.rule_key not in CONFIRMED or held is not None or count >= need:
                out.append(f)
                entry = {"seen": seen, "held": f.to_dict(), "good": 0, "bad_at": now}
            else:
                out.append(replace(
                    f, severity=Severity.WARN, action=Action.WARN,
                    message=f"{f.message} (bad in {count} of the last {len(seen)} readings; "
                            f"acts on {need} of {last})"))
                entry = {"seen": seen, "held": None, "good": 0}
        elif held is not None:
            good = int(entry.get("good", 0)) + 1
            left = sticky - (now - float(entry.get("bad_at", now)))
            if good >= resume_after and left <= 0:
                entry = {"seen": seen, "held": None, "good": 0}
            else:
                was = Finding.from_dict(held)
                why = f"{min(good, resume_after)} of {resume_after} good readings before resuming"
                if left > 0:
                    why += f", held {sticky:g} s after the last bad one ({left:.0f} s left)"
                out.append(replace(was, message=f"{was.message} (held: {why})"))
                entry = {"seen": seen, "held": held, "good": good, "bad_at": entry.get("bad_at", now)}
        else:
            entry = {"seen": seen, "held": None, "good": 0}
        if any(entry["seen"]) or entry["held"] is not None:
            rules[key] = entry
        else:
            rules.pop(key, None)
    return out, {"at": now, "rules": rules, "before": before}


def memory_finding(why: str) -> Finding:
    """The memory cannot be kept: every run then judges alone, ``confirm`` is never reached and a
    held drain never counts its good readings. Said in every report, acted on never."""
    return Finding(MEMORY_CHECK, Severity.WARN, Action.WARN,
                   f"cannot remember readings: {why}; each run judges alone, so a fault to be confirmed "
                   "over several readings never is", summary="hysteresis memory lost", rule=MEMORY_RULE)


class Hysteresis:
    """:func:`fold` with its memory in ``<state_dir>/hysteresis-<node>.json``. A memory that cannot
    be made sense of starts afresh; one that cannot be read or written (a full or read-only
    disk, a state dir that is no directory) is a finding of its own (:func:`memory_finding`)."""

    def __init__(self, state_dir: str, node: str, confirm: tuple[int, int] = (1, 1), resume_after: int = 1,
                 sticky: float = 0.0):
        self.path = os.path.join(state_dir, f"hysteresis-{node}.json")
        self.confirm, self.resume_after, self.sticky = confirm, resume_after, sticky

    @property
    def off(self) -> bool:
        return self.confirm[0] <= 1 and self.resume_after <= 1 and self.sticky <= 0

    def fold(self, findings: Sequence[Finding], now: float) -> list[Finding]:
        if self.off:
            return list(findings)
        from slurm_hooks import fsutil

        problems: list[str] = []
        memory = self._read(problems)
        try:
            out, memory = fold(findings, memory, now, self.confirm, self.resume_after, self.sticky)
        except (TypeError, ValueError, KeyError, AttributeError):
            # A memory we cannot make sense of (edited, torn, another version): afresh, never a crashed run.
            out, memory = fold(findings, None, now, self.confirm, self.resume_after, self.sticky)
        try:
            fsutil.atomic_write(self.path, json.dumps(memory, sort_keys=True), mode=0o600, durable=False)
        except OSError as exc:
            problems.append(f"cannot write {self.path}: {exc.strerror or exc}")
        return out + [memory_finding("; ".join(problems))] if problems else out

    def trouble(self) -> str:
        """Why the memory could not be kept, found without writing ("" when it can): validate's question."""
        problems: list[str] = []
        self._read(problems)
        directory = os.path.dirname(self.path)
        if os.path.isdir(self.path):
            problems.append(f"{self.path} is a directory")
        elif os.path.exists(directory) and not os.path.isdir(directory):
            problems.append(f"{directory} is not a directory")
        elif os.path.isdir(directory) and not os.access(directory, os.W_OK | os.X_OK):
            problems.append(f"{directory} is not writable")
        return "; ".join(dict.fromkeys(problems))

    def _read(self, problems: list[str]) -> dict[str, Any] | None:
        """The memory; ``None`` for none, or for one that is no JSON object (torn, edited: afresh, and
        this run's write mends it). A file that cannot be read at all is a problem to say."""
        try:
            with open(self.path, "rb") as fh:
                raw = fh.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            problems.append(f"cannot read {self.path}: {exc.strerror or exc}")
            return None
        try:
            memory = json.loads(raw)
        except ValueError:
            return None
        return memory if isinstance(memory, dict) else None


def from_config(config: Any, node: str) -> Hysteresis:
    from slurm_hooks.config import parse_confirm

    h = config.hysteresis
    return Hysteresis(config.state.dir, node, parse_confirm(h.confirm) or (1, 1), h.resume_after, h.sticky)
