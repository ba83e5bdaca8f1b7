"""The bridge's own small state: the circuit breaker's window and latch, as one JSON file.

Why a file and not a ConfigMap: no extra RBAC, no extra API calls per pass, and
it works on the bare-metal controller host too. Losing it (a rescheduled pod with
an emptyDir) is not dangerous: the breaker also counts the nodes whose ownership
annotation says we took them inside the window, so a restart cannot reset the
budget; only the latch and nodes already given back are forgotten.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

from slurm_hooks import fsutil

VERSION = 1


@dataclass
class BreakerState:
    #: node -> when the bridge took it (cordoned it), for the sliding window.
    taken: dict[str, float] = field(default_factory=dict)
    tripped_at: float | None = None
    trip_reason: str = ""
    #: Nodes refused while open, so the audit log says it once per change, not once per pass.
    blocked: tuple[str, ...] = ()
    #: An admin's reset: nodes taken before it no longer count against the window.
    reset_at: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "taken": {k: round(v, 3) for k, v in sorted(self.taken.items())},
            "tripped_at": self.tripped_at,
            "trip_reason": self.trip_reason,
            "blocked": list(self.blocked),
            "reset_at": self.reset_at,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BreakerState:
        taken = data.get("taken") or {}
        return cls(
            taken={str(k): float(v) for k, v in taken.items() if isinstance(v, (int, float))},
            tripped_at=float(data["tripped_at"]) if isinstance(data.get("tripped_at"), (int, float)) else None,
            trip_reason=str(data.get("trip_reason") or ""),
            blocked=tuple(str(n) for n in data.get("blocked") or ()),
            reset_at=float(data["reset_at"]) if isinstance(data.get("reset_at"), (int, float)) else None,
        )


def rebase(ours: BreakerState, base: BreakerState, theirs: BreakerState) -> BreakerState:
    """A pass's changes (``base`` -> ``ours``) laid over what someone else wrote meanwhile (``theirs``).

    The compare-and-swap's merge: an admin's ``reset-breaker`` during a pass wins over whatever
    the pass admitted or tripped before the reset (the pass's clock is its start); admissions and
    a trip after it are kept.
    """
    if ours.reset_at != base.reset_at and theirs.reset_at == base.reset_at:
        return rebase(theirs, base, ours)  # ours is the reset: it wins over what the other side did before it
    reset = theirs.reset_at if theirs.reset_at is not None and theirs.reset_at != base.reset_at else None
    horizon = reset if reset is not None else -math.inf
    merged = BreakerState.from_dict(theirs.to_dict())
    for node, ts in ours.taken.items():
        if base.taken.get(node) != ts and ts > horizon:
            merged.taken[node] = ts
    if ours.tripped_at is not None and ours.tripped_at != base.tripped_at and ours.tripped_at > horizon:
        merged.tripped_at, merged.trip_reason, merged.blocked = ours.tripped_at, ours.trip_reason, ours.blocked
    elif reset is None and ours.blocked != base.blocked:
        merged.blocked = ours.blocked
    return merged


class StateStore:
    """Load and save :class:`BreakerState`; ``path=""`` keeps it in memory only.

    ``save`` is a compare-and-swap against what ``load`` read: a file changed since (an admin's
    ``reset-breaker``) is merged with :func:`rebase`, never written over.
    """

    def __init__(self, path: str):
        self.path = path
        self._base: BreakerState | None = None

    def __str__(self) -> str:
        return self.path or "memory"

    def load(self) -> BreakerState:
        state = self._read()
        self._base = BreakerState.from_dict(state.to_dict())
        return state

    def _read(self) -> BreakerState:
        if not self.path:
            return BreakerState()
        # A corrupt file must not stop remediation; the annotations still bound the window.
        data = fsutil.read_json(self.path, missing={}, error={})
        return BreakerState.from_dict(data if isinstance(data, dict) else {})

    def save(self, state: BreakerState) -> None:
        if not self.path:
            return
        if self._base is not None:
            theirs = self._read()
            if theirs.to_dict() != self._base.to_dict():
                state = rebase(state, self._base, theirs)
        self._base = BreakerState.from_dict(state.to_dict())
        fsutil.atomic_write(self.path, json.dumps(state.to_dict(), indent=1) + "\n", mode=0o640)

    def exists(self) -> bool:
        return bool(self.path) and os.path.exists(self.path)
