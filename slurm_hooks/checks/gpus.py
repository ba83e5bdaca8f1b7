"""GPU inventory: count vs expected, GPUs lost from the bus, model, probe errors."""

from __future__ import annotations

from collections.abc import Iterator

from slurm_hooks.models import Action, CheckInput, Finding, GpuSnapshot, Severity


def check_count(inp: CheckInput) -> Iterator[Finding]:
    snap, expected = inp.snapshot, inp.expect.gpus
    if snap.error is not None:
        return  # the engine reports a node it could not read, once
    if expected is not None and len(snap.gpus) != expected:
        yield Finding(
            "gpu-count", Severity.FAIL, Action.REBOOT,
            f"{len(snap.gpus)} GPUs visible, {expected} expected",
            summary=f"{len(snap.gpus)} of {expected} GPUs visible", config_based=True,
        )


def check_lost(inp: CheckInput) -> Iterator[Finding]:
    for gpu in inp.selected():
        if gpu.lost:
            yield Finding("gpu-lost", Severity.FAIL, Action.REPLACE,
                          "GPU is lost (fell off the bus or stopped answering)" + _identity_words(gpu),
                          gpu.index, lost_summary(gpu))
        elif gpu.needs_reset:
            yield Finding("gpu-lost", Severity.FAIL, Action.RESET, "GPU needs a reset (NVML_ERROR_RESET_REQUIRED)",
                          gpu.index, f"GPU {gpu.index} needs reset", rule="gpu-reset-required")


def lost_summary(gpu: GpuSnapshot) -> str:
    """``GPU 3 lost (XID 79)``: a lost GPU and the XIDs the driver logged for it, one text for the
    loss and its XIDs' findings alike, so the drain reason says it once."""
    codes = sorted({x.code for x in gpu.xids})
    return f"GPU {gpu.index} lost" + (f" (XID {', '.join(str(c) for c in codes)})" if codes else "")


def _identity_words(gpu: GpuSnapshot) -> str:
    """Where a lost GPU's identity comes from, when not from its answers now."""
    if not (gpu.uuid or gpu.serial or gpu.pci_bus_id):
        return ("; it was lost before any run this boot read its UUID, serial or PCI bus id: "
                "its identity is unknown (find it by its index)")
    if gpu.remembered:
        return "; its UUID, serial and PCI bus id as last read this boot"
    return ""


def check_model(inp: CheckInput) -> Iterator[Finding]:
    want = inp.expect.model
    if not want:
        return
    for gpu in inp.selected():
        if gpu.model and want.lower() not in gpu.model.lower():
            yield Finding("gpu-model", Severity.FAIL, Action.DRAIN, f"model {gpu.model!r}, expected {want!r}",
                          gpu.index, f"GPU {gpu.index} model {gpu.model}", config_based=True)


def check_probe_errors(inp: CheckInput) -> Iterator[Finding]:
    """A field that could not be read (garbled answer, NVML error) is a warning, not a guess."""
    for gpu in inp.selected():
        if gpu.lost:
            continue
        for name, why in gpu.errors:
            yield Finding("probe", Severity.WARN, Action.WARN, f"could not read {name}: {why}", gpu.index,
                          f"GPU {gpu.index} {name} unreadable")
