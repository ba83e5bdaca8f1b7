"""The amdgpu driver's kernel lines that are events, as NVIDIA's XIDs are.

The driver prints them through ``dev_info``/``dev_warn``/``dev_err`` of the GPU's PCI device
(``amdgpu 0000:c1:00.0: amdgpu: ...``), RAS events with the event id the driver gives them
(``{12}socket: 0, die: 0, 1 new uncorrectable hardware errors detected in umc block``); older
kernels print a ring timeout through ``DRM_ERROR`` without the device
(``[drm:amdgpu_job_timedout [amdgpu]] *ERROR* ring gfx timeout, ...``). The wording is the
driver's own (drivers/gpu/drm/amd/amdgpu/amdgpu_ras.c, amdgpu_ras_eeprom.c, amdgpu_device.c,
amdgpu_job.c; amdkfd/kfd_int_process_v9.c; the RAS core's ras_log_ring.c), as AMD's own kernel-log
analyzer (amd/node-scraper, ``plugins/inband/dmesg/dmesg_analyzer.py``) matches it.

Each line is one :class:`XidEvent` with ``code`` 0 and ``rule`` its severity row
(:data:`RULES`); ``subject`` the RAS block or ring it names. Lines that ask for nothing are not
events: correctable errors ("no user action is needed"), the ``detected in total in`` lines
that repeat a count already reported as new, a ring timeout the driver recovered softly.
"""

from __future__ import annotations

import re

from slurm_hooks.models import XidEvent

#: The device a ``dev_*`` line names, then the driver's ``amdgpu: `` prefix and a RAS event id.
_DEVICE = re.compile(r"\bamdgpu ((?:[0-9A-Fa-f]{4,8}:)?[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]):\s+(?:amdgpu:\s+)?"
                     r"(?:\{\d+\}\s*)?")
#: A ``DRM_ERROR`` line of the driver (no device named).
_DRM = re.compile(r"\[drm:\w+ \[amdgpu\]\] \*ERROR\* ")
#: The die a RAS line names on a multi-die GPU (MI300: ``socket: 0, die: 1, ``).
_DIE = r"(?:socket: \d+, die: \d+, )?"

#: (rule, pattern): the first that matches the text after the device names the line's row.
#: A pattern's group ``subject`` is what it names (a RAS block, a ring).
PATTERNS = (
    ("ue", _DIE + r"\d+ (?:new )?uncorrectable hardware errors detected in (?P<subject>\w+) block"),
    ("amdgpu-deferred", _DIE + r"\d+ new deferred hardware errors detected in (?P<subject>\w+) block"),
    ("amdgpu-poison", _DIE + r"\d+ new poison consumption detected in (?P<subject>\w+) block"),
    ("amdgpu-poison", r"poison is consumed by client \d+"),
    ("amdgpu-poison", r"RAS poison consumption, "),
    ("amdgpu-reset", r"GPU reset begin!"),
    ("amdgpu-reset-failed", r"GPU reset\(\d+\) failed"),
    ("amdgpu-vram-lost", r"VRAM is lost due to GPU reset!"),
    ("amdgpu-ring-timeout", r"ring (?P<subject>\S+) timeout, signaled seq=\d+, emitted seq=\d+"),
    ("amdgpu-bad-pages", r"Saved bad pages\s*\(?\d+\)? reaches threshold value\s*\(?\d+\)?"),
)

#: An uncorrectable error's row by its block: the HBM (UMC) is memory the job read; an XGMI
#: link's error takes the GPU's whole hive with it (the driver resets every GPU of the hive).
UE_RULES = {"umc": "amdgpu-ue-umc", "xgmi_wafl": "amdgpu-ue-xgmi"}
UE_OTHER = "amdgpu-ue"

_compiled: list = []


def _patterns() -> list:
    if not _compiled:
        _compiled.extend((rule, re.compile(pattern)) for rule, pattern in PATTERNS)
    return _compiled


def parse(text: str, seq: int | None = None, ts: float | None = None) -> XidEvent | None:
    """One kernel line's text (its record or ``dmesg`` prefix already split off) -> its event (the
    PCI address as the line writes it), or ``None`` when it is no amdgpu line that asks for anything."""
    device = _DEVICE.search(text)
    if device is not None:
        body, bus = text[device.end():], device.group(1)
    else:
        drm = _DRM.search(text)
        if drm is None:
            return None
        body, bus = text[drm.end():], None
    for rule, pattern in _patterns():
        m = pattern.match(body)
        if m is None:
            continue
        subject = (m.groupdict().get("subject") or "").lower() if "subject" in pattern.groupindex else ""
        if rule == "ue":
            rule = UE_RULES.get(subject, UE_OTHER)
        return XidEvent(code=0, pci_bus_id=bus, ts=ts, message=body.strip(),
                        source="kmsg", seq=seq, rule=rule, subject=subject)
    return None
