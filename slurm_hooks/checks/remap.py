"""HBM health: row remapping (A100 and later), page retirement (older GPUs), and retired pages
by status where the probe reads them (AMD's bad-page table: reserved, pending, unreservable)."""

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


def check_bad_pages(inp: CheckInput) -> Iterator[Finding]:
    """Pages that could not be retired, or as many retired as the board may have, make it an RMA
    candidate (when its jobs end); pages waiting for a reset to be retired, a reset. A healthy
    board with retired pages below its threshold and none pending is not judged."""
    for gpu in inp.selected():
        pages = gpu.bad_pages
        if pages is None:
            continue
        retired = pages.reserved + pages.unreservable
        if pages.unreservable:
            yield Finding("bad-pages", Severity.FAIL, Action.REPLACE,
                          f"{pages.unreservable} bad memory page(s) could not be retired (RMA candidate)", gpu.index,
                          f"unretired bad pages on GPU {gpu.index}", rule="bad-pages-unreservable")
        elif pages.threshold is not None and retired >= pages.threshold:
            yield Finding("bad-pages", Severity.FAIL, Action.REPLACE,
                          f"{retired} retired memory pages, the threshold is {pages.threshold} (RMA candidate)",
                          gpu.index, f"bad pages at threshold on GPU {gpu.index}", rule="bad-pages-threshold")
        if pages.pending:
            yield Finding("bad-pages", Severity.FAIL, Action.RESET,
                          f"{pages.pending} bad memory page(s) pending retirement: GPU reset needed", gpu.index,
                          f"bad pages pending on GPU {gpu.index}", rule="bad-pages-pending")
