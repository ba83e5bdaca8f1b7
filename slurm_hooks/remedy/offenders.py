"""Repeat offenders per node: each remediation we made on a node, and the hold that too many bring.

A node that keeps needing us (a reboot for XID 79 on one GPU, then another GPU, a flaky link
drained and resumed again and again) is not mended by the next remediation: a person must look.
NVSentinel's health-events-analyzer counts per node for the same reason (its
``MultipleRemediations`` rule: 5 remediated faults on one node within 7 days -> contact support).

One remediation is one time we newly drain the node (:func:`slurm_hooks.remedy.drain.drain`), for
any GPU, any rule, links included: one fault's drain -> reset -> reboot counts once, and a check
that finds the node still drained by us adds nothing. Only our own drains count, never a warning
or an alert: a node is held only for real faults we acted on, ``[remediation] node_limit`` of
them within ``node_window``.

The drain that reaches the limit **holds** the node for a person: its reason says so
(``slurm-hooks: XID 79 on GPU 3 [held: 5 remediations in 7d]``, the tag's grammar in
:mod:`slurm_hooks.slurm` beside the other status tags), the health check does not
resume it, the repair ladder runs no rung on it, and the bridge (which acts on an action tag)
leaves it alone. A person's ``scontrol update NodeName=<node> State=RESUME`` ends the hold and
the count starts afresh (an audit record says so, with the history it ends).

The log is ``<state dir>/remediations-<node>.json``, written atomically (mode 0600) under a lock;
the hold itself is in Slurm's reason, so a lost state dir loses the count, never the hold.
"""

from __future__ import annotations

import json

from slurm_hooks import fsutil
from slurm_hooks.values import dataclass

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing (~3 ms of each start)
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

    from slurm_hooks.models import Report
    from slurm_hooks.remedy.wiring import Wiring
    from slurm_hooks.slurm import NodeInfo

#: How many remediations the log keeps at most (the window's are all that count).
KEEP = 64


@dataclass(frozen=True)
class Remediation:
    """One time we newly drained the node: when, what for, on which GPUs and ports."""

    t: float
    what: str
    action: str = ""
    gpus: tuple[int, ...] = ()
    #: The parts beyond a GPU the findings name (a port: ``mlx5_0/1``).
    subjects: tuple[str, ...] = ()
    context: str = ""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"t": round(self.t, 3), "what": self.what, "action": self.action}
        if self.gpus:
            out["gpus"] = list(self.gpus)
        if self.subjects:
            out["subjects"] = list(self.subjects)
        if self.context:
            out["context"] = self.context
        return out

    @classmethod
    def from_json(cls, data: Any) -> Remediation | None:
        """``None`` for an entry that does not read (a hand-edited file): it is not counted."""
        if not isinstance(data, dict):
            return None
        try:
            return cls(float(data["t"]), str(data.get("what", "")), str(data.get("action", "")),
                       tuple(int(g) for g in data.get("gpus") or ()),
                       tuple(str(s) for s in data.get("subjects") or ()), str(data.get("context", "")))
        except (KeyError, TypeError, ValueError):
            return None


def of_report(report: Report, what: str, now: float) -> Remediation:
    """The remediation a drain for ``report``'s findings makes (``what``: the drain's summary)."""
    found = report.drain_findings()
    return Remediation(now, what, report.worst_action.value,
                       tuple(sorted({f.gpu for f in found if f.gpu is not None})),
                       tuple(sorted({f.subject for f in found if f.subject})), report.context.value)


def span(seconds: float) -> str:
    """``7d``, ``12h``, ``90s``: a window as a reason says it."""
    s = int(seconds)
    return f"{s // 86400}d" if s % 86400 == 0 else f"{s // 3600}h" if s % 3600 == 0 else f"{s}s"


def within(entries: Iterable[Remediation], now: float, window: float) -> list[Remediation]:
    """The remediations of the last ``window`` seconds, oldest first."""
    return sorted((e for e in entries if now - e.t < window), key=lambda e: e.t)


def holds(earlier: Iterable[Remediation], now: float, limit: int, window: float) -> list[Remediation]:
    """The history that makes one more remediation now the ``limit``-th within ``window``: the
    earlier ones in the window, oldest first; [] when it may go ahead (``limit`` 0: never held)."""
    recent = within(earlier, now, window)
    return recent if limit > 0 and len(recent) + 1 >= limit else []


def history_text(entries: Iterable[Remediation]) -> str:
    """``2026-11-04 12:00Z XID 79 on GPU 0 [reboot]; ...``, as the page, ``status`` and the report say it."""
    from slurm_hooks.observe.incidents import history_text as said

    return said(e.to_json() for e in entries)


@dataclass(frozen=True)
class Log:
    """This node's remediations (``<state dir>/remediations-<node>.json``)."""

    path: str

    def read(self) -> list[Remediation]:
        """What the file holds; [] when it is not there or does not read (the count starts afresh:
        the hold, in Slurm's reason, is not lost with it)."""
        data = fsutil.read_json(self.path, missing={}, error={})
        entries = data.get("remediations") if isinstance(data, dict) else None
        out = [Remediation.from_json(e) for e in entries] if isinstance(entries, list) else []
        return [e for e in out if e is not None]

    def add(self, entry: Remediation, window: float) -> None:
        """Append ``entry``, forgetting what is older than ``window``. Raises OSError."""
        with fsutil.locked(self.path):
            self._write([*within(self.read(), entry.t, window), entry][-KEEP:])

    def clear(self) -> list[Remediation]:
        """Start afresh; what was forgotten is returned. Raises OSError."""
        with fsutil.locked(self.path):
            before = self.read()
            if before:
                self._write([])
            return before

    def _write(self, entries: list[Remediation]) -> None:
        fsutil.atomic_write(self.path, json.dumps({"remediations": [e.to_json() for e in entries]}), mode=0o600)


def log(w: Wiring) -> Log:
    return Log(w.state_path(f"remediations-{w.node}.json"))


def record(w: Wiring, entry: Remediation) -> str:
    """Keep one remediation; "" once kept, else why it could not be (a full or read-only disk)."""
    try:
        log(w).add(entry, w.config.remediation.node_window)
    except OSError as exc:
        return f"cannot remember the remediation in {log(w).path}: {exc.strerror or exc}"
    return ""


def release(w: Wiring, info: NodeInfo | None, how: str) -> None:
    """Our held drain is over (``how``: a person resumed the node, took it over): the count starts
    afresh, and the audit says so with the history it ends. Nothing when the log is empty."""
    try:
        before = log(w).clear()
    except OSError as exc:
        w.audit.write("action", node=w.node, action="offender-release", target=w.node, result="failed",
                      duration_s=0.0, level="warning", error=f"{log(w).path}: {exc.strerror or exc}",
                      detail="the hold ended, but its count could not be cleared: the next drain may hold again")
        return
    if not before:
        return
    w.audit.write("action", node=w.node, action="offender-release", target=w.node, result="ok", duration_s=0.0,
                  reason=info.reason if info is not None else "", history=[e.to_json() for e in before],
                  detail=f"{how}: the hold ends and the count of remediations starts afresh "
                         f"({len(before)} forgotten: {history_text(before)})")
