"""Remediation that could not finish, kept on disk until someone finishes it.

A drain or requeue that failed for a transient reason (slurmctld down, failing
over, too slow; the run's deadline spent) is written here, one JSON file per
node under ``[state] dir``, and retried with backoff by whoever runs next on
the node: the watcher's retry loop, the health check, the prolog, the epilog.
The file survives a restart of the watcher and a reboot of the node's daemons.
On the healthy path its cost is one failed ``open`` of a file that does not
exist.

This module only keeps the record; what a retry does (re-judge the node, then
act or drop the record as superseded) lives in :mod:`slurm_hooks.hooks`.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterable

from slurm_hooks import fsutil
from slurm_hooks.values import asdict, dataclass, field, fields, replace

#: Backoff between retries: 1, 2, 4, ... seconds, never more than this.
BACKOFF_MAX_S = 30.0
#: Errors that say no controller took the connection at all. Retrying those costs slurmctld
#: nothing (it is not there), and each try already waits out scontrol's own connect loop
#: (MessageTimeout rounds, one a second), so they are retried at once: the action lands
#: within about a second of the controller's return instead of up to 30 s later.
UNREACHABLE = ("unable to contact slurm controller", "connection refused", "connect failure")
#: What a pending record can hold, most urgent first.
STEPS = ("drain", "requeue")


@dataclass(frozen=True)
class Pending:
    node: str
    #: Steps still to do, in :data:`STEPS` order.
    steps: tuple[str, ...]
    #: The context whose judgement is replayed ("watch", "check", "prolog", "epilog").
    context: str
    #: The drain reason the failed run wanted (for the audit log; the retry re-judges).
    reason: str = ""
    #: XID events a source delivered that a probe may not see again (as ``XidEvent`` fields).
    events: tuple[dict, ...] = ()
    #: Identity of the incident: every audit record about this pending action carries it.
    id: str = ""
    created: float = 0.0
    attempts: int = 0
    #: Wall-clock time of the next retry.
    next_at: float = 0.0
    last_error: str = ""
    extra: dict = field(default_factory=dict, compare=False)

    def due(self, now: float | None = None) -> bool:
        return (time.time() if now is None else now) >= self.next_at

    def wait_s(self, now: float | None = None) -> float:
        return max(0.0, self.next_at - (time.time() if now is None else now))


def backoff(attempts: int, error: str = "") -> float:
    """Seconds before retry number ``attempts + 1``: 1, 2, 4, ... capped at :data:`BACKOFF_MAX_S`;
    1 while the error says the controller is not there at all (:data:`UNREACHABLE`)."""
    if any(s in error.lower() for s in UNREACHABLE):
        return 1.0
    return min(BACKOFF_MAX_S, 2.0 ** max(attempts - 1, 0))


def path(state_dir: str, node: str) -> str:
    return os.path.join(state_dir, f"pending-{node}.json")


def load(state_dir: str, node: str) -> Pending | None:
    """The node's pending action, or None (also for a record we cannot read: it is removed,
    since replaying a half-understood action is worse than waiting for the next check)."""
    p = path(state_dir, node)
    try:
        data = fsutil.read_json(p, missing=None, error=ValueError)
        if data is None:
            return None
        known = {f.name for f in fields(Pending)}
        rec = Pending(**{k: v for k, v in data.items() if k in known})
        return replace(rec, steps=tuple(s for s in rec.steps if s in STEPS),
                       events=tuple(e for e in rec.events if isinstance(e, dict)))
    except (ValueError, TypeError):
        with contextlib.suppress(OSError):
            os.unlink(p)
        return None


def save(state_dir: str, rec: Pending) -> None:
    fsutil.atomic_write(path(state_dir, rec.node), json.dumps(asdict(rec), sort_keys=True), mode=0o600)


def clear(state_dir: str, node: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path(state_dir, node))


def record_failure(state_dir: str, node: str, *, steps: Iterable[str], context: str, reason: str,
                   events: Iterable[dict], error: str, earlier: Pending | None = None,
                   now: float | None = None) -> Pending:
    """Write (or extend) the node's pending action after a failed attempt and return it.

    ``earlier``: the record this attempt retried (its identity and attempt count carry over;
    ``steps`` is what is left of it). Without it, a record another process wrote meanwhile is
    extended: its steps are kept beside ``steps``.
    """
    now = time.time() if now is None else now
    base = earlier or load(state_dir, node)
    wanted = set(steps) | (set(base.steps) if base and earlier is None else set())
    merged_events = {json.dumps(e, sort_keys=True): e for e in (*(base.events if base else ()), *events)}
    attempts = (base.attempts if base else 0) + 1
    rec = Pending(
        node=node,
        steps=tuple(s for s in STEPS if s in wanted),
        context=context,
        reason=reason or (base.reason if base else ""),
        events=tuple(merged_events.values()),
        id=base.id if base else f"{node}-{now:.6f}",
        created=base.created if base else now,
        attempts=attempts,
        next_at=now + backoff(attempts, error),
        last_error=error,
    )
    save(state_dir, rec)
    return rec


def claimed(state_dir: str, node: str) -> contextlib.AbstractContextManager[bool]:
    """Try to be the one finishing this node's pending action: yields False when another
    process (the watcher, a health check) is at it right now. Never blocks."""
    return fsutil.try_locked(path(state_dir, node) + ".lock")
