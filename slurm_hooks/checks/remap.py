"""HBM health: row remapping (A100 and later) and page retirement (older GPUs)."""

from __future__ import annotations

from collections.abc import Iterator

from slurm_hooks.models import Action, CheckInput, Finding, Severity


def check_row_remap(inp: CheckInput) -> Iterator[Finding]:
    for gpu in inp.selected():
        if gpu.row_remap_failure:
            yield Finding("row-remap", Severity.FAIL, Action.REPLACE,
                          "row remapping failed: no spare rows left (RMA candidate)", gpu.index,
                          f"row remap failure on GPU {gpu.index}", rule="row-remap-failure")
        elif gpu.row_remap_pending:
            yield Finding("row-remap", Severity.FAIL, Action.RESET,
                          "row remapping pending: GPU reset needed to apply it", gpu.index,
                          f"row remap pending on GPU {gpu.index}")


def check_retired_pages(inp: CheckInput) -> Iterator[Finding]:
    for gpu in inp.selected():
        if gpu.retired_pages_pending:
            yield Finding("retired-pages", Severity.FAIL, Action.RESET,
                          "retired pages pending: GPU reset needed", gpu.index,
                          f"retired pages pending on GPU {gpu.index}")
