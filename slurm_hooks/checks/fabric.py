"""NVSwitch fabric manager: a GPU whose fabric registration did not complete cannot run NCCL."""

from __future__ import annotations

from collections.abc import Iterator

from slurm_hooks.models import Action, CheckInput, Finding, Severity

_GOOD = {"completed", "not_supported"}


def check_fabric_manager(inp: CheckInput) -> Iterator[Finding]:
    if not inp.expect.fabric_manager:
        return
    for gpu in inp.selected():
        state = gpu.fabric_state
        if state is None:
            continue  # not supported on this GPU: a reason, not a failure
        if state not in _GOOD:
            yield Finding("fabric", Severity.FAIL, Action.DRAIN,
                          f"fabric manager state {state!r}, expected 'completed' (is nvidia-fabricmanager running?)",
                          gpu.index, f"fabric {state} on GPU {gpu.index}")
