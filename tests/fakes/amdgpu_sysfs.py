"""A node's ``/sys`` as the amdgpu driver lays it, in the kernel's own formats (amdgpu_ras.c):

- ``class/drm/cardN/device`` -> ``devices/pci0000:00/<bdf>``, whose ``vendor`` is ``0x1002``;
- ``<bdf>/ras/<block>_err_count``: ``ue: N\\nce: M\\n`` (UMC adds ``de: K\\n`` on newer kernels);
- ``<bdf>/ras/gpu_vram_bad_pages``: ``0x%08x : 0x%08x : %1s\\n`` per page (R, P or F);
- ``<bdf>/drm/renderD<minor>``, ``serial_number``, ``product_name``.
"""

from __future__ import annotations

import os
from pathlib import Path

BLOCKS = ("umc", "sdma", "gfx", "mmhub", "pcie_bif", "hdp", "xgmi_wafl")


def err_count(ue: int = 0, ce: int = 0, de: int | None = None) -> str:
    return f"ue: {ue}\nce: {ce}\n" + (f"de: {de}\n" if de is not None else "")


def bad_pages(pages: list[tuple[int, str]]) -> str:
    return "".join(f"0x{page:08x} : 0x{4096:08x} : {flag}\n" for page, flag in pages)


def add_card(sys_root: Path, card: int, bdf: str, vendor: str = "0x1002", render: int | None = None,
             ras: dict[str, str] | None = None, pages: list[tuple[int, str]] | None = None,
             serial: str = "", product: str = "AMD Instinct MI300X", unique_id: int | None = None) -> Path:
    """One GPU: its PCI device (ras files for AMD unless ``ras`` is given) and its drm card link.
    ``unique_id``: the ASIC's (0: one without, whose file the driver leaves empty)."""
    device = sys_root / "devices" / "pci0000:00" / bdf
    device.mkdir(parents=True)
    (device / "vendor").write_text(vendor + "\n")
    (device / "serial_number").write_text((serial or f"PCB{card:04d}A1B2C") + "\n")
    (device / "product_name").write_text(product + "\n")
    uid = 0xD1CB9B1A4E0A7A00 + 0x10 * card if unique_id is None else unique_id
    (device / "unique_id").write_text(f"{uid:016x}\n" if uid else "")  # amdgpu_get_unique_id's "%016llx\n"
    (device / "drm" / f"renderD{render if render is not None else 128 + card}").mkdir(parents=True)
    (device / "drm" / f"card{card}").mkdir()
    if vendor == "0x1002":
        (device / "ras").mkdir()
        for block in BLOCKS:
            text = (ras or {}).get(block, err_count(de=0 if block == "umc" else None))
            (device / "ras" / f"{block}_err_count").write_text(text)
        if pages is not None:
            (device / "ras" / "gpu_vram_bad_pages").write_text(bad_pages(pages))
    drm = sys_root / "class" / "drm"
    drm.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(device / "drm" / f"card{card}", drm), drm / f"card{card}")
    os.symlink(os.path.relpath(device, device / "drm" / f"card{card}"), device / "drm" / f"card{card}" / "device")
    bus = sys_root / "bus" / "pci" / "devices"
    bus.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(device, bus), bus / bdf)
    return device
