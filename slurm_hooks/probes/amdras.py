"""The amdgpu driver's own RAS files: ECC and retired pages where ``amdsmi`` is not installed.

Every GPU the amdgpu driver runs is a ``/sys/class/drm/cardN`` whose ``device/vendor`` is
``0x1002``. Its ``device/ras/<block>_err_count`` files say ``ue: N`` and ``ce: M`` (newer
kernels add ``de: K``, deferred) per RAS block, and ``device/ras/gpu_vram_bad_pages`` lists
the retired pages, one ``0x<page> : 0x<size> : <flag>`` line each (``R`` reserved, ``P``
pending, ``F`` could not be reserved). That is enough to judge ECC and retired memory; what
the files do not say (temperatures, PCIe, XGMI) stays ``None``. The snapshot's ``errors`` say
that amdsmi is missing, so that ``probe`` warns and ``validate`` tells it.
"""

from __future__ import annotations

import os
import time

from slurm_hooks.models import BadPages, EccBlock, GpuSnapshot, NodeSnapshot

AMD_VENDOR = "0x1002"
#: The snapshot's ``errors`` name for what this source cannot read.
AMDSMI = "amdsmi"
_FLAGS = {"R": "reserved", "P": "pending", "F": "unreservable"}
#: amdgpu's module parameter: the retired pages a board may have; -1/-2: the driver's own default.
THRESHOLD_PARAM = "/sys/module/amdgpu/parameters/bad_page_threshold"


class SysfsRasProbe:
    name = "amdgpu-sysfs"

    def __init__(self, node: str, drm_root: str = "/sys/class/drm", missing: str = "amdsmi not installed",
                 threshold_param: str = THRESHOLD_PARAM):
        self.node = node
        self.drm_root = drm_root
        self.missing = missing
        self.threshold_param = threshold_param

    def snapshot(self) -> NodeSnapshot:
        taken = time.time()
        cards = amd_cards(self.drm_root)
        if not cards:
            return NodeSnapshot(self.node, self.name, taken_at=taken,
                                error=f"{self.missing}, and no GPU of the amdgpu driver in {self.drm_root}")
        threshold = _threshold(self.threshold_param)
        gpus = tuple(_read_card(index, device, threshold) for index, (_, device) in enumerate(cards))
        return NodeSnapshot(self.node, self.name, gpus=gpus, taken_at=taken,
                            driver_version=_read(os.path.join(os.path.dirname(os.path.dirname(
                                self.threshold_param)), "version")),
                            errors=((AMDSMI, f"{self.missing}: ECC and retired pages read from the driver's "
                                             "RAS files; temperatures, PCIe and XGMI not read"),))


def amd_cards(drm_root: str) -> list[tuple[str, str]]:
    """(card name, its PCI device directory) of every amdgpu GPU, in PCI address order."""
    try:
        names = os.listdir(drm_root)
    except OSError:
        return []
    out = []
    for name in names:
        if not name.startswith("card") or not name[4:].isdigit():
            continue
        device = os.path.realpath(os.path.join(drm_root, name, "device"))
        if _read(os.path.join(device, "vendor")).lower() == AMD_VENDOR:
            out.append((name, device))
    return sorted(out, key=lambda c: os.path.basename(c[1]))


def present(drm_root: str = "/sys/class/drm") -> bool:
    """Whether the amdgpu driver runs a GPU here (a cheap listing, no library)."""
    return bool(amd_cards(drm_root))


def parse_err_count(text: str) -> tuple[int | None, int | None, int | None]:
    """``ue: 2\\nce: 11\\n`` (``de: 0`` on newer kernels) -> (uncorrectable, correctable, deferred)."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and value.strip().isdigit():
            values[key.strip().lower()] = int(value.strip())
    return values.get("ue"), values.get("ce"), values.get("de")


def parse_bad_pages(text: str) -> dict[str, int]:
    """gpu_vram_bad_pages' lines (``0x00001a2b : 0x00001000 : R``) counted by status."""
    counts = dict.fromkeys(_FLAGS.values(), 0)
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(":")]
        if len(parts) == 3 and parts[0].lower().startswith("0x"):
            counts[_FLAGS.get(parts[2].upper(), "unreservable")] += 1
    return counts


def render_minor(pci_devices: str, bdf: str) -> int | None:
    """N of the ``renderD<N>`` under a PCI device's ``drm`` directory; ``None`` when it has none."""
    try:
        names = os.listdir(os.path.join(pci_devices, bdf.lower(), "drm"))
    except OSError:
        return None
    minors = [int(n[7:]) for n in names if n.startswith("renderD") and n[7:].isdigit()]
    return min(minors) if minors else None


def _read_card(index: int, device: str, threshold: int | None) -> GpuSnapshot:
    errors: list[tuple[str, str]] = []
    ras = os.path.join(device, "ras")
    blocks = []
    try:
        names = sorted(os.listdir(ras))
    except FileNotFoundError:
        names = []  # no RAS on this GPU: nothing to judge, nothing unread
    except OSError as exc:
        names = []
        errors.append(("ecc_blocks", f"cannot list {ras}: {exc.strerror or exc}"))
    for name in names:
        if not name.endswith("_err_count"):
            continue
        path = os.path.join(ras, name)
        block = name[:-10].upper()
        try:
            with open(path, encoding="ascii", errors="replace") as fh:
                text = fh.read()
        except OSError as exc:
            errors.append((f"ecc.{block}", f"cannot read {path}: {exc.strerror or exc}"))
            continue
        ue, ce, de = parse_err_count(text)
        if ue is None and ce is None:  # "Query currently inaccessible" while the driver recovers
            errors.append((f"ecc.{block}", f"{path} says {' '.join(text.split())[:80]!r}"))
        blocks.append(EccBlock(block, ce, ue, de))
    bad = None
    path = os.path.join(ras, "gpu_vram_bad_pages")
    if os.path.exists(path):
        try:
            with open(path, encoding="ascii", errors="replace") as fh:
                counts = parse_bad_pages(fh.read())
            bad = BadPages(counts["reserved"], counts["pending"], counts["unreservable"], threshold)
        except OSError as exc:
            errors.append(("bad_pages", f"cannot read {path}: {exc.strerror or exc}"))
    ue_total = sum(b.uncorrectable or 0 for b in blocks) if blocks else None
    bdf = os.path.basename(device).upper()
    serial = _read(os.path.join(device, "serial_number"))
    return GpuSnapshot(index=index, pci_bus_id=bdf, serial=serial, model=_read(os.path.join(device, "product_name")),
                       rocm_uuid=rocm_uuid(_read(os.path.join(device, "unique_id"))),
                       minor=render_minor(os.path.dirname(device), bdf), partition=0,
                       ecc_volatile_uncorrectable=ue_total, ecc_blocks=tuple(blocks) if names else None,
                       bad_pages=bad, errors=tuple(errors))


def _threshold(path: str) -> int | None:
    text = _read(path)
    try:
        value = int(text)
    except ValueError:
        return None
    return value if value > 0 else None


def rocm_uuid(unique_id: str) -> str | None:
    """The driver's ``unique_id`` (``%016llx``; empty where the ASIC has none) as ROCm names the
    GPU (``GPU-`` and those digits, rocminfo's and ROCR_VISIBLE_DEVICES' form); ``None`` if none."""
    try:
        n = int(unique_id, 16)
    except ValueError:
        return None
    return f"GPU-{n:016x}" if 0 < n < 1 << 64 else None


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read().strip()
    except OSError:
        return ""
