"""Each GPU's last known identity on this node, for a GPU that can no longer say who it is.

A GPU that falls off the bus commonly answers nothing at all, not even its handle (NVML's
GPU_IS_LOST from ``nvmlDeviceGetHandleByIndex``): its UUID, serial and PCI bus id leave the
snapshot just when the page, the RMA list and the kernel's XID for its address need them.
Every probe, whichever vendor's, leaves what it read here after each snapshot and asks back
for a GPU that did not say (:func:`recall`); the record is ``gpus-<node>.json`` in the state
dir, also the map (PCI bus id -> index, UUID) the watcher ties kernel-log lines by
(:func:`bus_map`).

A silent GPU is given the record of its own index, never a guess: within one boot the
enumeration holds still; after a reboot only while it shows unchanged (as many GPUs, each that
answers its UUID at the index the record has it), since a board missing at boot renumbers the
rest. So the repair ladder, which reboots a lost GPU's node, still names the same board after
the reboot. A GPU lost before any run read it (a fresh node, a state dir that does not outlive
a reboot) or on a node renumbered since has no known identity, and the snapshot says so. What
no record can tell: a board swapped in during a reboot that is silent from its first read is
named as the one it replaced (the finding says the identity is remembered, not read).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from slurm_hooks import fsutil
from slurm_hooks.models import GpuSnapshot
from slurm_hooks.values import replace

#: What names a board, as a probe reads it (the fields a silent GPU gets back).
FIELDS = ("uuid", "serial", "pci_bus_id", "model", "minor")


def store_path(state_dir: str, node: str) -> str:
    """Where the probes leave the node's GPU identities (and the watcher finds its bus map)."""
    return os.path.join(state_dir, f"gpus-{node}.json")


def recall(gpus: Sequence[GpuSnapshot], path: str, boot: str) -> list[GpuSnapshot]:
    """The GPUs with what a silent one did not say filled in from the record of its index
    (``remembered`` set), and the record kept up to date: written only when it changed."""
    record = _load(path)
    by_index = {e["index"]: e for e in record.get("gpus", {}).values()}
    if not (boot and record.get("boot") == boot) and not _same_order(gpus, by_index, record.get("count")):
        by_index = {}
    out = [_filled(g, by_index.get(g.index)) for g in gpus]
    _save(path, boot, out)
    return out


def _same_order(gpus: Sequence[GpuSnapshot], by_index: dict[int, dict], count: object) -> bool:
    """Whether another boot's record still numbers these GPUs: as many, and each GPU that answers
    its UUID now has it at the same index there (at least one answers)."""
    answered = [g for g in gpus if g.uuid]
    return (count == len(gpus) and bool(answered)
            and all(by_index.get(g.index, {}).get("uuid") == g.uuid for g in answered))


def _filled(gpu: GpuSnapshot, entry: dict | None) -> GpuSnapshot:
    if entry is None:
        return gpu
    missing = {k: entry[k] for k in FIELDS if getattr(gpu, k) in ("", None) and entry[k] not in ("", None)}
    return replace(gpu, remembered=True, **missing) if missing else gpu


def bus_map(path: str, boot: str = "") -> dict[str, tuple[int, str]]:
    """Normalised PCI bus id -> (index, UUID) as this boot's record has it (``boot`` "": this
    machine's); empty when there is none, it is another boot's, or it is unreadable."""
    from slurm_hooks.probes.kmsg import boot_id, normalize_pci

    record = _load(path)
    if not record or record.get("boot") != (boot or boot_id()):
        return {}
    return {normalize_pci(bus): (e["index"], e["uuid"]) for bus, e in record.get("gpus", {}).items()}


def _load(path: str) -> dict:
    """The record, its entries checked; {} when there is none or it is unreadable."""
    raw = fsutil.read_json(path, missing={}, error={})
    try:
        gpus = {str(bus): {"index": int(e["index"]), "uuid": str(e.get("uuid") or ""),
                           "serial": str(e.get("serial") or ""), "pci_bus_id": str(bus),
                           "model": str(e.get("model") or ""),
                           "minor": None if e.get("minor") is None else int(e["minor"])}
                for bus, e in raw["gpus"].items()}
        return {"boot": str(raw.get("boot") or ""), "count": int(raw["count"]), "gpus": gpus}
    except (ValueError, TypeError, KeyError, AttributeError):
        return {}


def _save(path: str, boot: str, gpus: list[GpuSnapshot]) -> None:
    """Write the record when it changed (a small read on the healthy path, a write after a change)."""
    entries = {g.pci_bus_id: {"index": g.index, "uuid": g.uuid, "serial": g.serial, "model": g.model,
                              "minor": g.minor} for g in gpus if g.pci_bus_id}
    if not entries:
        return
    text = json.dumps({"boot": boot, "count": len(gpus), "gpus": dict(sorted(entries.items()))},
                      separators=(",", ":"))
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            if fh.read() == text:
                return
    except OSError:
        pass
    try:
        fsutil.atomic_write(path, text, mode=0o644, durable=False)
    except OSError:
        pass  # a cache: the watcher asks NVML itself without it, a silent GPU stays unnamed
