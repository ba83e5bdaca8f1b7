"""The GPU-to-GPU fabric of AMD Instinct boards (XGMI): its error status, as the driver keeps it
until a reset clears it."""

from __future__ import annotations

from collections.abc import Iterator

from slurm_hooks.models import Action, CheckInput, Finding, Severity

_SAID = {"error": "an XGMI error", "multiple": "multiple XGMI errors"}


def check_xgmi(inp: CheckInput) -> Iterator[Finding]:
    for gpu in inp.selected():
        what = _SAID.get(gpu.xgmi_error or "")
        if what:
            yield Finding("xgmi", Severity.FAIL, Action.RESET, f"{what} on its GPU-to-GPU links", gpu.index,
                          f"XGMI errors on GPU {gpu.index}")
