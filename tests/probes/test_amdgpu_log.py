"""The amdgpu driver's event lines read from the kernel log, as the XID lines are."""

from __future__ import annotations

import os

from paths import FIXTURES

from slurm_hooks.probes import kmsg

MI300X = os.path.join(FIXTURES, "kmsg", "amdgpu-mi300x.log")


def test_every_event_line_of_the_capture_is_found_with_its_row_gpu_and_block():
    got = [(e.rule, e.pci_bus_id, e.subject) for e in kmsg.read_xids(MI300X, coalescer=kmsg.Coalescer(0))]
    assert got == [
        ("amdgpu-ue-umc", "00000000:46:00.0", "umc"),
        ("amdgpu-reset", "00000000:46:00.0", ""),
        ("amdgpu-vram-lost", "00000000:46:00.0", ""),
        ("amdgpu-ring-timeout", "00000000:65:00.0", "gfx_0.0.0"),
        ("amdgpu-poison", "00000000:85:00.0", ""),
        ("amdgpu-bad-pages", "00000000:A6:00.0", ""),
        ("amdgpu-reset", "00000000:C6:00.0", ""),
        ("amdgpu-reset-failed", "00000000:C6:00.0", ""),
        ("amdgpu-ue-xgmi", "00000000:E5:00.0", "xgmi_wafl"),
        ("amdgpu-ring-timeout", None, "comp_1.0.0"),
        ("amdgpu-deferred", "00000000:26:00.0", "umc"),
        ("amdgpu-ue", "00000000:05:00.0", "gfx"),
        ("amdgpu-bad-pages", "00000000:05:00.0", ""),
    ]


def test_lines_that_ask_for_nothing_are_no_events():
    """A correctable count ("no user action is needed"), the ``detected in total`` line that repeats
    a count already reported as new, a ring the driver recovered softly, a job's process line and
    the driver's account of its reset that came back: none is an event."""
    for text in ("amdgpu 0000:65:00.0: amdgpu: 2 correctable hardware errors detected in total in gfx block, "
                 "no user action is needed.",
                 "amdgpu 0000:46:00.0: amdgpu: {3}socket: 0, die: 0, 1 uncorrectable hardware errors detected "
                 "in total in umc block",
                 "amdgpu 0000:65:00.0: amdgpu: ring sdma0 timeout, but soft recovered",
                 "amdgpu 0000:46:00.0: amdgpu: GPU reset(2) succeeded!",
                 "[drm] amdgpu kernel modesetting enabled",
                 "amdgpu 0000:03:00.0: amdgpu: ring gfx_0.0.0 uses VM inv eng 0 on hub 0"):
        assert kmsg.parse_line(f"[  12.000000] {text}") is None, text


def test_an_event_line_is_no_xid_and_keys_by_its_row():
    """One line is one event under one key, never confused with an XID of another GPU's driver:
    its code is 0 and its key ends in its row."""
    event = kmsg.parse_line("6,1771,8123456789,-;amdgpu 0000:46:00.0: amdgpu: {3}socket: 0, die: 0, "
                            "1 new uncorrectable hardware errors detected in umc block")
    assert (event.code, event.rule, event.seq, event.ts) == (0, "amdgpu-ue-umc", 1771, 8123.456789)
    assert event.key == "kmsg:1771@8123.456789:amdgpu-ue-umc"
    assert event.message == "socket: 0, die: 0, 1 new uncorrectable hardware errors detected in umc block"


def test_a_burst_on_one_gpu_is_one_event_per_row():
    """The per-die lines of one error come within microseconds: one event; the reset that follows is
    an event of its own row, not folded into the error."""
    events = kmsg.read_xids(MI300X)
    on_46 = [e.rule for e in events if e.pci_bus_id == "00000000:46:00.0"]
    assert on_46 == ["amdgpu-ue-umc", "amdgpu-reset", "amdgpu-vram-lost"]
    assert len({e.key for e in events}) == len(events)


def test_event_lines_are_tied_to_their_gpu_by_pci_address():
    gpus = {"00000000:46:00.0": (2, "2fa1..."), "00000000:C6:00.0": (6, "77b0...")}
    by = {(e.rule, e.gpu) for e in kmsg.assign_gpus(kmsg.read_xids(MI300X), gpus)}
    assert {("amdgpu-ue-umc", 2), ("amdgpu-reset-failed", 6)} <= by
    assert ("amdgpu-ring-timeout", None) in by  # the DRM_ERROR form names no device: the node's
