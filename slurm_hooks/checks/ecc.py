"""Uncorrectable ECC errors (volatile since the last reset, aggregate for the GPU's life)."""

from __future__ import annotations

from collections.abc import Iterator

from slurm_hooks.models import Action, CheckInput, Finding, Severity


def check_uncorrectable(inp: CheckInput) -> Iterator[Finding]:
    limit_vol = inp.expect.ecc_uncorrectable_volatile_max
    limit_agg = inp.expect.ecc_uncorrectable_aggregate_max
    for gpu in inp.selected():
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
