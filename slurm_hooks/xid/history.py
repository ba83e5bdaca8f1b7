"""What XIDs this node has had lately, kept across runs.

A health check run is short-lived, so two things need memory: escalation (the
third XID 119 in a day on one GPU is hardware, not bad luck) and "never act twice
on one event" (the kernel log still holds yesterday's XID 79 after the node came
back). One small JSON file per node, rewritten atomically under a lock.

Each event is kept under its key with the GPU it happened on (its UUID where known,
see ``models.gpu_identity``), so escalation counts per GPU and across reboots, and with what it
was (:func:`kind`): an XID's code, another driver's event its row and subject (an amdgpu line's
``amdgpu-ue-umc:umc``, which has no code), so that the same fault on the same GPU is counted as
one fault repeating, whichever vendor's.
Timestamps are wall clock: when the event happened where its source could tell
(``XidEvent.at``), else when *we* recorded it; never the event's own ``ts``, which for
kernel log records is seconds since boot.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterable, Mapping

from slurm_hooks import fsutil
from slurm_hooks.errors import PermanentError
from slurm_hooks.models import XidEvent
from slurm_hooks.values import dataclass

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing (~3 ms of each start)
if TYPE_CHECKING:
    from typing import Any

VERSION = 2
KEEP_S = 7 * 86400
MAX_EVENTS = 2000
MAX_SEEN = 5000


#: What a file looked like when read (device, inode, size, mtime, ctime); ABSENT for no file.
Stamp = tuple
ABSENT: Stamp = ("absent",)


class XidHistory:
    """The history file. :meth:`load` reads it once into an :class:`XidState` that answers every
    question of a run and writes its changes once; the other methods are one-shot conveniences.

    ``opener`` opens the file for reading (``open``; a seam for tests that count reads).
    """

    def __init__(self, path: str, opener: Callable[..., Any] = open):
        self.path = path
        self._opener = opener

    def load(self) -> XidState:
        """Read the file once. An unreadable one loads as empty, with ``error`` saying why (saving
        it then tries the write, which says so again)."""
        try:
            state, stamp = self._read()
        except PermanentError as exc:
            return XidState(self, _empty(), None, str(exc))
        return XidState(self, state, stamp)

    def recorded(self) -> dict[str, tuple[str, int, float]]:
        return self.load().recorded()

    def record(self, events: Iterable[XidEvent], now: float | None = None) -> list[XidEvent]:
        state = self.load()
        new = state.record(events, now)
        state.save()
        return new

    def seen(self, key: str) -> bool:
        return self.load().seen(key)

    def mark_seen(self, keys: Iterable[str], now: float | None = None) -> None:
        state = self.load()
        state.mark_seen(keys, now)
        state.save()

    def acked(self) -> frozenset[str]:
        return self.load().acked()

    def ack(self, keys: Iterable[str], now: float | None = None) -> None:
        state = self.load()
        state.ack(keys, now)
        state.save()

    def _read(self) -> tuple[dict[str, Any], Stamp]:
        text, stamp = self._load()
        state = _parse(text)
        if state is None:
            try:
                with fsutil.locked(self.path):
                    state, stamp = self._load_or_reset()
            except OSError as exc:
                raise PermanentError(f"cannot reset XID history {self.path}: {exc.strerror or exc}") from None
        return state, stamp

    def _write(self, state: dict[str, Any], stamp: Stamp | None,
               changes: list[Callable[[dict[str, Any]], None]], now: float) -> tuple[dict[str, Any], Stamp]:
        """Under the lock: ``changes`` applied to the file as it is now. Unchanged since it was read
        (same stamp), that is ``state``, which already holds them; else the file is read again."""
        try:
            with fsutil.locked(self.path):
                if stamp is None or _stamp(self.path) != stamp:
                    state, _ = self._load_or_reset()
                    for change in changes:
                        change(state)
                _prune(state, now)
                fsutil.atomic_write(self.path, json.dumps(state, separators=(",", ":")), mode=0o600)
                return state, _stamp(self.path)
        except OSError as exc:
            raise PermanentError(f"cannot write XID history {self.path}: {exc.strerror or exc}") from None

    def _load(self) -> tuple[str | None, Stamp]:
        try:
            with self._opener(self.path, encoding="utf-8", errors="replace") as fh:
                stamp = _stamp_of(os.fstat(fh.fileno()))
                return fh.read(), stamp  # undecodable bytes: a corrupt file, set aside like any other
        except FileNotFoundError:
            return None, ABSENT
        except OSError as exc:
            raise PermanentError(f"cannot read XID history {self.path}: {exc.strerror or exc}") from None

    def _load_or_reset(self) -> tuple[dict[str, Any], Stamp]:
        """Call with the lock held: a corrupt file goes aside as ``.corrupt``."""
        text, stamp = self._load()
        state = _parse(text)
        if state is None:
            with contextlib.suppress(FileNotFoundError):
                os.replace(self.path, self.path + ".corrupt")
            state, stamp = _empty(), ABSENT
        return state, stamp


class XidState:
    """This node's XID history as one run read it: questions are answered from memory, changes
    are kept until :meth:`save` writes them, once, merged with whatever another process (the
    health check, the watcher) wrote meanwhile."""

    def __init__(self, history: XidHistory, state: dict[str, Any], stamp: Stamp | None, error: str | None = None):
        self.history = history
        #: Why the file could not be read (it then loads as empty), else ``None``.
        self.error = error
        self._state = state
        self._stamp = stamp
        self._changes: list[Callable[[dict[str, Any]], None]] = []
        self._now: float | None = None

    def recorded(self) -> dict[str, tuple[str, int | str, float]]:
        """Every event kept: key -> (GPU identity, :func:`kind`, when recorded); ``CheckInput.xid_history``."""
        return {e["key"]: (e["id"], e.get("rule") or e["code"], e["t"]) for e in self._state["events"]}

    def seen(self, key: str) -> bool:
        """Whether an action was already taken on the event with this key."""
        return key in self._state["seen"]

    def acked(self) -> frozenset[str]:
        """Keys of events an admin has dealt with: the XID check ignores them."""
        return frozenset(self._state["acked"])

    @property
    def has_ecc_acks(self) -> bool:
        """Whether any ECC count is acknowledged (else no boot id need be read)."""
        return bool(self._state["ecc"])

    def ecc_acked(self, boot: str) -> dict[str, dict[str, int]]:
        """Uncorrectable counts per GPU identity and RAS block that a repair has dealt with on this
        boot (``CheckInput.ecc_acked``); none for another boot, whose counts are not these."""
        ecc = self._state["ecc"]
        return {gpu: dict(blocks) for gpu, blocks in ecc.get("gpus", {}).items()} if boot and ecc.get("boot") == boot else {}

    def ack_ecc(self, boot: str, counts: Mapping[str, Mapping[str, int]], now: float | None = None) -> None:
        """Take ``counts`` (GPU identity -> block -> uncorrectable) as dealt with on this boot; an
        acknowledgement of another boot is dropped."""
        if not boot or not counts:
            return
        now = time.time() if now is None else now
        fresh = {gpu: dict(blocks) for gpu, blocks in counts.items()}
        self._change(lambda state: _add_ecc(state, boot, fresh), now)

    def record(self, events: Iterable[XidEvent], now: float | None = None) -> list[XidEvent]:
        """Remember ``events`` (once per key); returns the ones not recorded before."""
        now = time.time() if now is None else now
        known = {e["key"] for e in self._state["events"]}
        fresh: dict[str, XidEvent] = {}
        for event in events:
            if event.key not in known:
                fresh.setdefault(event.key, event)
        new = list(fresh.values())
        if new:  # the usual case on a node with an old XID in its log: nothing to write
            self._change(lambda state: _add_events(state, new, now), now)
        return new

    def mark_seen(self, keys: Iterable[str], now: float | None = None) -> None:
        self._mark("seen", keys, now)

    def ack(self, keys: Iterable[str], now: float | None = None) -> None:
        self._mark("acked", keys, now)

    @property
    def changed(self) -> bool:
        return bool(self._changes)

    def save(self) -> None:
        """Write the changes made since the last save (nothing to do when there are none), pruned
        as of the latest change. Raises :class:`PermanentError` when the file cannot be written;
        the changes stay."""
        if not self._changes:
            return
        now = time.time() if self._now is None else self._now
        self._state, self._stamp = self.history._write(self._state, self._stamp, self._changes, now)
        self._changes = []

    def _mark(self, section: str, keys: Iterable[str], now: float | None) -> None:
        now = time.time() if now is None else now
        keys = [k for k in keys if k not in self._state[section]]
        if keys:
            self._change(lambda state: _add_keys(state[section], keys, now), now)

    def _change(self, change: Callable[[dict[str, Any]], None], now: float) -> None:
        change(self._state)
        self._changes.append(change)
        self._now = now


def kind(event: XidEvent) -> int | str:
    """What an event is, as repeats are counted: an XID's code; a driver event without one (an amdgpu
    line, ``rule`` set) its row and what it names, ``amdgpu-ue-umc:umc`` (a UMC error repeating is
    not a GFX one repeating)."""
    return f"{event.rule}:{event.subject}" if event.rule else event.code


def when(event: XidEvent, now: float) -> float:
    """When an event counts as having happened: its own time where the source knew it (and it lies
    within what the history keeps), else ``now``, when it was read."""
    at = event.at
    return at if at is not None and now - KEEP_S < at <= now else now


def _add_events(state: dict[str, Any], events: list[XidEvent], now: float) -> None:
    known = {e["key"] for e in state["events"]}
    for event in events:
        if event.key not in known:
            known.add(event.key)
            entry = {"key": event.key, "code": event.code, "gpu": event.gpu, "id": event.gpu_id, "t": when(event, now)}
            if event.rule:
                entry["rule"] = kind(event)
            state["events"].append(entry)


def _add_ecc(state: dict[str, Any], boot: str, counts: dict[str, dict[str, int]]) -> None:
    ecc = state["ecc"] if state["ecc"].get("boot") == boot else {"boot": boot, "gpus": {}}
    for gpu, blocks in counts.items():
        mine = ecc["gpus"].setdefault(gpu, {})
        for block, count in blocks.items():
            mine[block] = max(int(count), mine.get(block, 0))
    state["ecc"] = ecc


def _add_keys(section: dict[str, float], keys: list[str], now: float) -> None:
    for key in keys:
        section.setdefault(key, now)


def _stamp(path: str) -> Stamp:
    try:
        return _stamp_of(os.stat(path))
    except FileNotFoundError:
        return ABSENT


def _stamp_of(st: os.stat_result) -> Stamp:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _empty() -> dict[str, Any]:
    return {"version": VERSION, "events": [], "seen": {}, "acked": {}, "ecc": {}}


def _parse(text: str | None) -> dict[str, Any] | None:
    """The state in ``text``; an empty state for no file; ``None`` if it is corrupt."""
    if text is None:
        return _empty()
    try:
        state = json.loads(text)
        rename = _v1_key if state.get("version", 1) < 2 else str
        events = [{"key": rename(e["key"]), "code": int(e["code"]),
                   "gpu": None if e.get("gpu") is None else int(e["gpu"]), "t": float(e["t"])}
                  for e in state["events"]]
        for event, raw in zip(events, state["events"]):
            event["id"] = str(raw.get("id") or (f"gpu{event['gpu']}" if event["gpu"] is not None else ""))
            if raw.get("rule"):
                event["rule"] = str(raw["rule"])
        seen = {rename(k): float(v) for k, v in state["seen"].items()}
        acked = {rename(k): float(v) for k, v in state.get("acked", {}).items()}
        raw_ecc = state.get("ecc") or {}
        ecc = {"boot": str(raw_ecc["boot"]),
               "gpus": {str(g): {str(b): int(n) for b, n in blocks.items()} for g, blocks in raw_ecc["gpus"].items()}} \
            if raw_ecc else {}
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    return {"version": VERSION, "events": events, "seen": seen, "acked": acked, "ecc": ecc}


def _v1_key(key: Any) -> str:
    """Version 1 kernel-log keys carried the GPU index (``kmsg:<boot>:<seq>@<ts>:<gpu>:<code>``);
    version 2 keys hold only what the log line says: drop it, so that an event acknowledged
    before the upgrade stays acknowledged."""
    key = str(key)
    if key.startswith("kmsg:") and key.count(":") >= 3:
        head, _gpu, code = key.rsplit(":", 2)
        return f"{head}:{code}"
    return key


def _prune(state: dict[str, Any], now: float) -> None:
    oldest = now - KEEP_S
    events = [e for e in state["events"] if e["t"] >= oldest]
    state["events"] = sorted(events, key=lambda e: e["t"])[-MAX_EVENTS:]
    seen = sorted(((t, k) for k, t in state["seen"].items() if t >= oldest))[-MAX_SEEN:]
    state["seen"] = {k: t for t, k in seen}
    # Acknowledged events stay in the kernel log until a reboot, however old: keep them by count only.
    acked = sorted((t, k) for k, t in state["acked"].items())[-MAX_SEEN:]
    state["acked"] = {k: t for t, k in acked}


#: A GPU (or a node, for node-wide faults) remediated this often within REPEAT_WINDOW_S goes to a
#: person (``[replace]``) instead of another reset or reboot (NVSentinel: >= 5 in 7 days -> support).
REPEAT_LIMIT = 5
REPEAT_WINDOW_S = 7 * 86400.0


@dataclass(frozen=True)
class BurstRule:
    """How an XID that is the application's as a rule (13, 31) is told from a faulty GPU: lines closer
    than ``burst_s`` to the one before are one burst (one fault of one job); ``repeat`` bursts on
    one GPU within ``window_s`` are the GPU's; the code on ``spread`` GPUs or more within
    ``window_s`` is the application's. The two rules are evaluated apart: a GPU that keeps
    failing is the GPU's even while a job also failed on another."""

    burst_s: float
    repeat: int = 2
    spread: int = 2
    window_s: float = 86400.0


#: NVSentinel's published defaults (health-events-analyzer, ``distros/kubernetes/nvsentinel/charts/
#: health-events-analyzer/values.yaml``): ``RepeatedXID31OnSameGPU`` (2 bursts in 24 h, a new burst
#: after 180 s without one; RUN_DCGMEUD), ``RepeatedXID31OnDifferentGPU`` (2 GPUs in 24 h; NONE),
#: ``RepeatedXID13OnSameGPCAndTPC`` (2 bursts in 24 h, a new burst after 15 s; RUN_DCGMEUD) and
#: ``RepeatedXID13OnDifferentGPCAndTPC`` (NONE).
APP_OR_HARDWARE: dict[int, BurstRule] = {31: BurstRule(burst_s=180.0), 13: BurstRule(burst_s=15.0)}
#: XIDs that are the application's fault when they spread across GPUs, the GPU's when they repeat on one.
APP_OR_HARDWARE_XIDS = frozenset(APP_OR_HARDWARE)


def bursts(times: Iterable[float], gap: float) -> int:
    """How many bursts ``times`` make: a time more than ``gap`` after the one before starts a new one."""
    count, last = 0, None
    for t in sorted(times):
        if last is None or t - last > gap:
            count += 1
        last = t
    return count


@dataclass(frozen=True)
class Verdict:
    """XID 13/31 on one GPU read against the node's history (:func:`app_or_hardware`)."""

    code: int
    #: Bursts of the code on this GPU within the window (this one included).
    bursts: int = 0
    #: The other GPUs that had the code within the window.
    others: tuple[str, ...] = ()
    rule: BurstRule = BurstRule(burst_s=0.0)

    @property
    def hardware(self) -> bool:
        return self.bursts >= self.rule.repeat

    @property
    def application(self) -> bool:
        return len(self.others) + 1 >= self.rule.spread


def app_or_hardware(recorded: Mapping[str, tuple[str, int | str, float]], gpu: str, code: int, now: float) -> Verdict:
    """XID ``code`` (13 or 31) on ``gpu`` read against the node's history (:meth:`XidState.recorded`,
    with this run's events not yet recorded at the time they happened, or ``now``): how many bursts
    on this GPU, and which other GPUs had it (:data:`APP_OR_HARDWARE`)."""
    rule = APP_OR_HARDWARE[code]
    hits = [(ident, t) for ident, c, t in recorded.values() if c == code and now - t < rule.window_s]
    mine = bursts((t for ident, t in hits if ident == gpu), rule.burst_s)
    others = tuple(sorted({ident for ident, _ in hits if ident != gpu}))
    return Verdict(code, mine, others, rule)


def repeat_offender(attempts: Iterable[Mapping[str, Any]], ids: Iterable[str], now: float,
                    limit: int = REPEAT_LIMIT, window: float = REPEAT_WINDOW_S) -> str:
    """Why this remediation should go to a person: "" when it may go ahead, else the history of the
    GPU (repair ladder ``attempts``: ``{"rung", "t", "gpus", "result"}``) that makes this one the
    ``limit``-th within ``window``. A refused reboot mended nothing and is not counted."""
    wanted = set(ids)
    worst: tuple[str, list[Mapping[str, Any]]] = ("", [])
    for ident in sorted(wanted):
        mine = sorted((a for a in attempts if a.get("rung") in ("reset", "reboot") and a.get("result") != "refused"
                       and now - float(a.get("t", 0.0)) < window and ident in (a.get("gpus") or ())),
                      key=lambda a: float(a.get("t", 0.0)))
        if len(mine) > len(worst[1]):
            worst = (ident, mine)
    ident, mine = worst
    if len(mine) + 1 < limit:
        return ""
    days = window / 86400.0
    told = ", ".join(f"{a['rung']} {time.strftime('%Y-%m-%d %H:%M', time.gmtime(float(a['t'])))}" for a in mine)
    return (f"repeat offender: {ident} would have its remediation {len(mine) + 1} within {days:g} days "
            f"(limit {limit}; before: {told}): a person must look")


