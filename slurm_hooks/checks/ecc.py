"""Uncorrectable ECC errors: volatile since the last reset, aggregate for the GPU's life, and, where
the probe reads them per RAS block (AMD's UMC, GFX, SDMA, ...), the block they happened in.

AMD's per-block counts are the driver's since it loaded: a GPU reset does not clear them, as it
clears NVIDIA's volatile count. Judged as they stand, the count a reset has dealt with (the page
it hit retired, the GPU re-initialised) would fail the validation after the reset and climb the
ladder to a reboot of a GPU that is good again. So a block is judged by its growth past the count
the repair ladder acknowledged on this boot (``CheckInput.ecc_acked``, written by the reset rung
after a reset that worked, as the XIDs it drained for are acknowledged). That returns no bad GPU:
only the count judged before the reset is acknowledged, so an error during or after it is growth
and fails at once; the acknowledgement is of one boot (after a reboot the driver counts afresh and
an old one says nothing); nothing else acknowledges a count (a person's resume does not); and a
GPU whose errors keep coming back is replaced by the repeat rule of its uncorrectable-error lines
(``checks.amdgpu``), retired pages by the bad-page check.
"""

from __future__ import annotations

from collections.abc import Iterator

from slurm_hooks.models import Action, CheckInput, EccBlock, Finding, GpuSnapshot, Severity, gpu_identity


def check_uncorrectable(inp: CheckInput) -> Iterator[Finding]:
    limit_vol = inp.expect.ecc_uncorrectable_volatile_max
    limit_agg = inp.expect.ecc_uncorrectable_aggregate_max
    for gpu in inp.selected():
        if gpu.ecc_blocks is not None:
            yield from _blocks(inp, gpu, limit_vol)
        else:
            vol = gpu.ecc_volatile_uncorrectable
            if vol is not None and vol > limit_vol:
                yield Finding("ecc", Severity.FAIL, Action.RESET,
                              f"{vol} volatile uncorrectable ECC errors (max {limit_vol})", gpu.index,
                              f"ECC uncorrectable {vol} on GPU {gpu.index}")
        agg = gpu.ecc_aggregate_uncorrectable
        if limit_agg is not None and agg is not None and agg > limit_agg:
            yield Finding("ecc", Severity.FAIL, Action.REPLACE,
                          f"{agg} aggregate uncorrectable ECC errors (max {limit_agg})", gpu.index,
                          f"ECC aggregate {agg} on GPU {gpu.index}", rule="ecc-aggregate")


def _blocks(inp: CheckInput, gpu: GpuSnapshot, limit: int) -> Iterator[Finding]:
    """One finding per GPU naming its blocks over the limit (``UMC 3, GFX 1``), with their growth
    since the job's prolog where there is one; deferred (poisoned, not yet consumed) data alone warns."""
    before = _baseline_blocks(inp, gpu)
    dealt = inp.ecc_acked.get(gpu_identity(gpu.uuid, gpu.index, gpu.pci_bus_id), {})

    def new(b: EccBlock) -> int:
        """Uncorrectable errors past the count a repair dealt with (a count that went down: all new)."""
        done = dealt.get(b.block, 0)
        return b.uncorrectable - done if b.uncorrectable >= done else b.uncorrectable

    over = [b for b in gpu.ecc_blocks if b.uncorrectable is not None and new(b) > limit]
    if over:
        counts = ", ".join(f"{b.block} {b.uncorrectable}{_growth(b, before)}{_dealt(b, dealt)}" for b in over)
        names = ", ".join(b.block for b in over)
        total = sum(new(b) for b in over)
        yield Finding("ecc", Severity.FAIL, Action.RESET,
                      f"{total} uncorrectable ECC errors in block{'s' if len(over) > 1 else ''} {counts} (max {limit})",
                      gpu.index, f"ECC uncorrectable {total} on GPU {gpu.index}, block{'s' if len(over) > 1 else ''} {names}")
        return
    deferred = [b for b in gpu.ecc_blocks if b.deferred]
    if deferred:
        counts = ", ".join(f"{b.block} {b.deferred}" for b in deferred)
        yield Finding("ecc", Severity.WARN, Action.WARN, f"deferred (poisoned) ECC errors in {counts}", gpu.index,
                      f"ECC deferred on GPU {gpu.index}", rule="ecc-deferred")


def _baseline_blocks(inp: CheckInput, gpu: GpuSnapshot) -> dict[str, EccBlock]:
    if inp.baseline is None:
        return {}
    for old in inp.baseline.gpus:
        if (old.uuid and old.uuid == gpu.uuid) or (not old.uuid and old.index == gpu.index):
            return {b.block: b for b in old.ecc_blocks or ()}
    return {}


def _dealt(block: EccBlock, dealt: dict[str, int]) -> str:
    done = dealt.get(block.block, 0)
    return f" ({done} dealt with by a repair this boot)" if 0 < done <= (block.uncorrectable or 0) else ""


def _growth(block: EccBlock, before: dict[str, EccBlock]) -> str:
    old = before.get(block.block)
    if old is None or old.uncorrectable is None:
        return ""
    return f" (+{block.uncorrectable - old.uncorrectable} during the job)"
