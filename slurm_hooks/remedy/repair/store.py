"""Where the repair ladder's memory lives: ``<state dir>/repair-<node>.json`` (today's JSON,
read through :mod:`.state`), the :class:`Ledger` a repair writes it through, and the node's repair lock."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time

from slurm_hooks import fsutil
from slurm_hooks.remedy.repair import state as repair_state
from slurm_hooks.values import replace

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from slurm_hooks.remedy.repair.state import Attempt, RepairState
    from slurm_hooks.remedy.wiring import Wiring

VERSION = repair_state.VERSION
#: Attempts older than this are dropped from the state file whatever the window.
KEEP_S = 30 * 86400


def state_path(w: Wiring) -> str:
    return w.repair_state()


def load(w: Wiring) -> RepairState:
    """The ladder's memory. Raises :class:`RepairStateUnreadable` when the file is there but
    unreadable: starting afresh would forget the attempts."""
    return repair_state.load(state_path(w))


def save(w: Wiring, state: RepairState) -> RepairState:
    """Write ``state``, less the attempts older than :data:`KEEP_S` (or the window); returns what
    was written. A failed write is said, not raised: the repair goes on."""
    state = state.since(time.time() - max(KEEP_S, w.config.repair.window))
    try:
        os.makedirs(w.config.state.dir, mode=0o700, exist_ok=True)
        fsutil.atomic_write(state_path(w), json.dumps(state.to_json()), mode=0o600)
    except OSError as exc:
        print(f"slurm-hooks: cannot write {state_path(w)}: {exc.strerror}", file=sys.stderr)
    return state


class Ledger:
    """The node's repair state as last saved, and the one way to change it: save a new value.
    Every step of a repair (a rung, a validation, the journal of the services a reset stops)
    writes through the same ledger, so none overwrites what another recorded."""

    def __init__(self, w: Wiring, state: RepairState | None = None) -> None:
        self.w = w
        self.state = load(w) if state is None else state

    def save(self, state: RepairState) -> RepairState:
        self.state = save(self.w, state)
        return self.state

    def update(self, **records: Any) -> RepairState:
        """The state with these records (``None``: without it), saved."""
        return self.save(replace(self.state, **records))

    def record(self, attempt: Attempt, **records: Any) -> Attempt:
        """The attempt on disk (before the rung acts: a worker that dies is counted), with these
        records changed in the same write."""
        self.save(replace(self.state.with_attempt(attempt), **records))
        return attempt

    def settle(self, attempt: Attempt, result: str) -> None:
        self.save(self.state.settled(attempt, result))


def locked(w: Wiring) -> contextlib.AbstractContextManager[bool]:
    """One repair per node at a time: an flock, which the kernel drops when its holder dies."""
    return fsutil.try_locked(w.state_path(f"repair-{w.node}.lock"), dir_mode=0o700)
