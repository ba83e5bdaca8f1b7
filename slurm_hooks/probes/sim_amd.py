"""Simulated AMD Instinct GPUs: their identity as amdsmi gives it, the amdgpu driver's kernel lines
and the RAS files of ``/sys/class/drm/card<N>/device/ras/``, for :mod:`slurm_hooks.probes.sim`.

An MI300X/MI325X is one GPU in SPX mode and 2/4/8 logical GPUs in DPX/QPX/CPX mode: each
partition has its own render node (``/dev/dri/renderD<minor>``, what Slurm's GRES ``File=``
names), UUID and index, and shares the physical GPU's PCI address and board serial; the kernel
names the physical device in its lines, so a line is every partition's. An MI250X is two dies
(GCDs), each its own PCI device and Slurm GPU, on one board (one serial). Physical sensors
(temperature, power) are read on partition 0 only, as amdsmi reads them.

The lines are the driver's own format strings (see :mod:`slurm_hooks.probes.amdgpu_log`).
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

#: model -> (name as amdsmi gives it (market name), PCIe gen, PCIe width, power limit W, dies per board)
MODELS: dict[str, tuple[str, int, int, int, int]] = {
    "MI300X": ("AMD Instinct MI300X", 5, 16, 750, 1),
    "MI325X": ("AMD Instinct MI325X", 5, 16, 1000, 1),
    "MI250X": ("AMD Instinct MI250X", 4, 16, 560, 2),
}
#: Compute partition mode -> logical GPUs per physical one (MI300X/MI325X; amd-smi set -C).
PARTITIONS = {"spx": 1, "dpx": 2, "qpx": 4, "cpx": 8}
#: An 8 x MI300X platform's PCI buses, GPU 0..7 (the physical GPUs' order).
_BUSES = (0x05, 0x26, 0x46, 0x65, 0x85, 0xA6, 0xC6, 0xE5)
#: The first render node's minor (``/dev/dri/renderD128``).
RENDER_MINOR_BASE = 128
#: The RAS blocks whose ``<block>_err_count`` files the sim lays.
RAS_BLOCKS = ("umc", "sdma", "gfx", "mmhub", "pcie_bif", "hdp", "xgmi_wafl")
#: The driver's bad-page threshold (``amdgpu_bad_page_threshold``'s default on these boards).
BAD_PAGE_THRESHOLD = 128
#: ``sim inject --driver-reset``'s outcomes.
DRIVER_RESETS = ("succeeded", "failed")


def check(model: str, partition: str | None) -> int:
    """Logical GPUs per physical one for ``model`` in ``partition`` mode; errors say what is known."""
    from slurm_hooks.errors import SimStateError

    if model not in MODELS:
        raise SimStateError(f"unknown AMD model {model!r} (known: {', '.join(MODELS)})")
    dies = MODELS[model][4]
    if partition is None:
        return dies
    if dies > 1:
        raise SimStateError(f"--partition: an {model} is {dies} dies, not partitioned")
    if partition not in PARTITIONS:
        raise SimStateError(f"--partition must be one of {', '.join(PARTITIONS)}, not {partition!r}")
    return PARTITIONS[partition]


def bdf(physical: int, die: int = 0) -> str:
    """The PCI address amdsmi gives a physical GPU (an MI250X's second die: the next bus)."""
    bus = _BUSES[physical] if physical < len(_BUSES) else (0x05 + physical * 0x20) & 0xFF
    return f"0000:{(bus + die * 2) & 0xFF:02x}:00.0"


def healthy_gpu(index: int, node: str, model: str, per_physical: int, generation: int = 0) -> dict[str, Any]:
    """Logical GPU ``index``: physical ``index // per_physical``; its partition (or die) the rest."""
    import uuid as uuidlib

    name, gen, width, power, dies = MODELS[model]
    physical, part = divmod(index, per_physical)
    swap = f".{generation}" if generation else ""
    board = uuidlib.uuid5(uuidlib.NAMESPACE_DNS, f"{node}.amdgpu{physical}{swap}.slurm-hooks.sim")
    uid = uuidlib.uuid5(board, f"part{part}")
    first = part == 0 or dies > 1  # where the physical sensors are read
    return {
        **({"generation": generation} if generation else {}),
        "index": index,
        "uuid": str(uid),
        "minor": RENDER_MINOR_BASE + index,
        "partition": None if per_physical == 1 else part,
        "serial": f"SIM{board.int % 10**9:09d}",
        "pci_bus_id": bdf(physical, part) if dies > 1 else bdf(physical),
        "model": name,
        "lost": False,
        "needs_reset": False,
        "xids": [],
        "ecc_volatile_uncorrectable": 0,
        "ecc_aggregate_uncorrectable": 0,
        "pcie_gen": gen,
        "pcie_gen_max": gen,
        "pcie_width": width,
        "pcie_width_max": width,
        "temperature_c": 38 if first else None,
        "power_w": 140.0 if first else None,
        "power_limit_w": float(power) if first else None,
        "throttle_reasons": [],
        "processes": [],
        "memory_used_mib": 0,
        "errors": [],
    }


def per_physical(state: dict[str, Any]) -> int:
    return check(state.get("model", "MI300X"), state.get("partition"))


def line(kind: str, **what: Any) -> list[str]:
    """The driver's lines for one fault (the text after ``amdgpu <bdf>: ``)."""
    event = f"{{{what.get('event', 1)}}}"
    if kind == "ras_ue":
        n, block = what.get("count", 1), what["block"]
        return [f"amdgpu: {event}socket: 0, die: 0, {n} new uncorrectable hardware errors detected in {block} block",
                f"amdgpu: {event}socket: 0, die: 0, {what.get('total', n)} uncorrectable hardware errors detected "
                f"in total in {block} block"]
    if kind == "ras_deferred":
        n, block = what.get("count", 1), what["block"]
        return [f"amdgpu: {event}socket: 0, die: 0, {n} new deferred hardware errors detected in {block} block"]
    if kind == "poison":
        return [f"{event}poison is consumed by client 12, kick off gpu reset flow"]
    if kind == "ring_timeout":
        return [f"amdgpu: ring {what['ring']} timeout, signaled seq=41210, emitted seq=41212",
                "amdgpu: Process information: process python3 pid 4242 thread python3 pid 4242"]
    if kind == "reset":
        ok = what.get("ok", True)
        return ["amdgpu: GPU reset begin!", *(["amdgpu: VRAM is lost due to GPU reset!"] if ok else []),
                f"amdgpu: GPU reset({what.get('count', 1)}) {'succeeded!' if ok else 'failed'}"]
    if kind == "bad_pages":
        return [f"amdgpu: Saved bad pages {what['pages']} reaches threshold value {BAD_PAGE_THRESHOLD}"]
    raise ValueError(kind)


# -- /sys/class/drm/card<N>/device: the RAS counts, the retired pages, the partition mode


def sysfs_root(sim_dir: str, node: str) -> str:
    """The simulated node's ``/sys/class/drm`` (one card per physical GPU)."""
    return os.path.join(sim_dir, "drm", node)


def write_sysfs(sim_dir: str, node: str, state: dict[str, Any]) -> None:
    """Lay the RAS files of every physical GPU as the state has them (replaces the tree's files)."""
    from slurm_hooks import fsutil

    step = per_physical(state)
    dies = MODELS[state.get("model", "MI300X")][4]
    for gpu in state["gpus"]:
        if gpu["index"] % step and dies == 1:
            continue  # a partition: the card is its physical GPU's
        card = os.path.join(sysfs_root(sim_dir, node), f"card{gpu['index']}", "device")
        ras = os.path.join(card, "ras")
        os.makedirs(ras, exist_ok=True)
        counts = gpu.get("ras", {})
        for block in RAS_BLOCKS:
            ue, ce = counts.get(block, (0, 0))
            fsutil.atomic_write(os.path.join(ras, f"{block}_err_count"), f"ue: {ue}\nce: {ce}\n", durable=False)
        pages = "".join(f"0x{0x1e0000 + i:08x} : 0x00001000 : R\n" for i in range(int(gpu.get("bad_pages", 0))))
        fsutil.atomic_write(os.path.join(ras, "gpu_vram_bad_pages"), pages, durable=False)
        if dies == 1:
            mode = (state.get("partition") or "spx").upper()
            fsutil.atomic_write(os.path.join(card, "current_compute_partition"), mode + "\n", durable=False)
