"""Processes or memory left on a GPU: after a job (epilog), or before one (prolog)."""

from __future__ import annotations

from collections.abc import Iterator

from slurm_hooks.models import Action, CheckInput, Finding, Severity

#: Driver and runtime reserve some memory even on an idle GPU.
IDLE_MEMORY_SLACK_MIB = 1024


def check_leftovers(inp: CheckInput) -> Iterator[Finding]:
    yield from _busy(inp, "leftover", "left after the job")


def check_busy_idle_node(inp: CheckInput) -> Iterator[Finding]:
    yield from _busy(inp, "busy", "before the job starts")


def _busy(inp: CheckInput, name: str, when: str) -> Iterator[Finding]:
    for gpu in inp.selected():
        if gpu.processes:
            pids = ",".join(str(p.pid) for p in gpu.processes)
            yield Finding(name, Severity.FAIL, Action.DRAIN, f"{len(gpu.processes)} process(es) {when} (pid {pids})",
                          gpu.index, f"processes on GPU {gpu.index} {when.replace(' starts', '').replace('left ', '')}")
        elif gpu.memory_used_mib is not None and gpu.memory_used_mib > IDLE_MEMORY_SLACK_MIB:
            yield Finding(name, Severity.FAIL, Action.DRAIN, f"{gpu.memory_used_mib} MiB in use {when}, no process",
                          gpu.index, f"memory held on GPU {gpu.index}")
