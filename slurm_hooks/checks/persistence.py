"""Persistence mode: off means slow job starts and lost state between jobs."""

from __future__ import annotations

from collections.abc import Iterator

from slurm_hooks.models import Action, CheckInput, Finding, Severity


def check_persistence_mode(inp: CheckInput) -> Iterator[Finding]:
    want = inp.expect.persistence_mode
    if want is None:
        return
    for gpu in inp.selected():
        if gpu.persistence_mode is not None and gpu.persistence_mode != want:
            state = "on" if gpu.persistence_mode else "off"
            yield Finding("persistence", Severity.WARN, Action.WARN,
                          f"persistence mode {state}, expected {'on' if want else 'off'} (nvidia-persistenced)", gpu.index,
                          f"persistence mode {state} on GPU {gpu.index}")
