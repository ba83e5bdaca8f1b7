"""Where the repair ladder's memory lives: ``<state dir>/repair-<node>.json`` (today's JSON,
read through :mod:`.state`) and the node's repair lock."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time

from slurm_hooks import fsutil
from slurm_hooks.remedy.repair import state as repair_state

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from slurm_hooks.remedy.wiring import Wiring

VERSION = repair_state.VERSION
#: Attempts older than this are dropped from the state file whatever the window.
KEEP_S = 30 * 86400


def state_path(w: Wiring) -> str:
    return w.repair_state()


def load(w: Wiring) -> dict[str, Any]:
    """The ladder's memory as today's JSON object. Raises :class:`RepairStateUnreadable` when the
    file is there but unreadable: starting afresh would forget the attempts."""
    return repair_state.load(state_path(w)).to_json()


def save(w: Wiring, state: dict[str, Any]) -> None:
    oldest = time.time() - max(KEEP_S, float(w.config.repair.window))
    state["attempts"] = [a for a in state["attempts"] if a.get("t", 0) >= oldest]
    try:
        os.makedirs(w.config.state.dir, mode=0o700, exist_ok=True)
        fsutil.atomic_write(state_path(w), json.dumps(state), mode=0o600)
    except OSError as exc:
        print(f"slurm-hooks: cannot write {state_path(w)}: {exc.strerror}", file=sys.stderr)


def locked(w: Wiring) -> contextlib.AbstractContextManager[bool]:
    """One repair per node at a time: an flock, which the kernel drops when its holder dies."""
    return fsutil.try_locked(w.state_path(f"repair-{w.node}.lock"), dir_mode=0o700)
