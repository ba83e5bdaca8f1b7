"""The driver's own verdict: NVML's GPU recovery action (field 230, driver >= 565) and XID 154.

The driver says what a GPU needs (a reset, a node reboot, to be drained of P2P traffic, to be
drained then reset); each verdict is a row of the severity table (``driver-*``), so its action
and urgency can be overridden like any other. A driver that does not say is no finding.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from slurm_hooks.models import Action, CheckInput, Finding, Severity

#: Verdict (the NVML probe's name for the value, ``nvmlGpuRecoveryAction_t``) -> (severity rule, action, what to say).
VERDICTS: dict[str, tuple[str, Action, str]] = {
    "gpu_reset": ("driver-reset", Action.RESET, "GPU reset required"),
    "node_reboot": ("driver-reboot", Action.REBOOT, "node reboot required"),
    "drain_p2p": ("driver-drain-p2p", Action.DRAIN, "drain P2P"),
    "drain_and_reset": ("driver-drain-and-reset", Action.RESET, "drain and reset"),
    "bus_reset": ("driver-reset", Action.RESET, "bus reset required"),
    "system_reboot": ("driver-reboot", Action.REBOOT, "system reboot required"),
}

#: How XID 154's text names the new action ("... changed from 0x0 (None) to 0x2 (Node Reboot Required)").
_TEXT = (("node reboot", "node_reboot"), ("drain and reset", "drain_and_reset"), ("drain p2p", "drain_p2p"),
         ("gpu reset", "gpu_reset"), ("reset required", "gpu_reset"))


def check_recovery_action(inp: CheckInput) -> Iterator[Finding]:
    for gpu in inp.selected():
        if gpu.recovery_action not in (None, "none"):
            yield verdict_finding("recovery-action", gpu.recovery_action, gpu.index, "driver recovery action")


def verdict_finding(check: str, verdict: str, gpu: int | None, source: str) -> Finding:
    where = f"GPU {gpu}" if gpu is not None else "node"
    known = VERDICTS.get(verdict)
    if known is None:
        return Finding(check, Severity.WARN, Action.WARN, f"{source}: {verdict} (unknown to slurm-hooks)", gpu,
                       f"driver verdict {verdict} on {where}", rule="driver-unknown")
    rule, action, what = known
    return Finding(check, Severity.FAIL, action, f"{source}: {what}", gpu, f"driver: {what} on {where}", rule=rule)


def verdict_from_text(text: str) -> str | None:
    """The new action XID 154's message names (the part after the last " to "), or ``None``."""
    low = text.lower()
    tail = low.rsplit(" to ", 1)[-1]
    for words, verdict in _TEXT:
        if re.search(r"\b" + re.escape(words) + r"\b", tail):
            return verdict
    if re.search(r"\(\s*none\s*\)|\bnone\b", tail):
        return "none"
    return None
