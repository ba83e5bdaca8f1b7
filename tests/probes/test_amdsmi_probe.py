"""The AMD Instinct probe against the shared fake amdsmi (the real module's names, shapes and errors)."""

from __future__ import annotations

import os
import subprocess
import sys

import pynvml
import pytest
from fakes.fake_amdsmi import STATUS, AmdSmiMemoryPageStatus, FakeAmdSmi
from fakes.fake_nvml import FakeNvml
from paths import ROOT, TESTS

from slurm_hooks.models import BadPages, EccBlock, NodeSnapshot, snapshot_from_dict, snapshot_to_dict
from slurm_hooks.probes import AutoProbe
from slurm_hooks.probes.amdsmi import AmdSmiProbe
from slurm_hooks.probes.nvml import NvmlProbe

NO_DRM = "/nonexistent/sys/class/drm"


def snap(fake: FakeAmdSmi) -> NodeSnapshot:
    return AmdSmiProbe("mi300-1", amdsmi=fake, drm_root=NO_DRM, kmsg_path=os.devnull).snapshot()


def test_healthy_mi300x_node_reads_identity_and_every_physical_field():
    s = snap(FakeAmdSmi.healthy(gpus=8))
    assert s.error is None and s.backend == "amdsmi" and s.driver_version == "6.10.5"
    assert [g.index for g in s.gpus] == list(range(8))
    g = s.gpus[3]
    assert g.uuid == "5bff74a4-0000-1000-8000-a2a7e5b2a003"
    assert g.serial == "PCB0030A1B2C" and g.pci_bus_id == "0000:3C:00.0" and g.minor == 131
    assert g.model == "AMD Instinct MI300X" and g.partition is None  # a whole GPU: no part of one
    assert g.ecc_volatile_uncorrectable == 0
    assert {b.block for b in g.ecc_blocks} >= {"UMC", "GFX", "SDMA", "MMHUB", "XGMI_WAFL"}
    assert g.bad_pages == BadPages(0, 0, 0, 512)
    assert g.xgmi_error == "none"
    assert (g.pcie_gen, g.pcie_gen_max, g.pcie_width, g.pcie_width_max) == (5, 5, 16, 16)
    assert (g.pcie_replay, g.pcie_recovery) == (0, 0)
    assert g.temperature_c == 45 and g.memory_temperature_c == 42 and g.throttle_reasons == ()
    assert all(gpu.errors == () for gpu in s.gpus)


def test_rocm_uuid_is_the_asic_serial_as_rocm_prints_it_and_a_boards_partitions_share_it():
    s = snap(FakeAmdSmi.healthy(gpus=8))
    assert s.gpus[3].rocm_uuid == "GPU-d1cb9b1a4e0a7a30"  # asic_serial "0xD1CB9B1A4E0A7A30"
    assert len({g.rocm_uuid for g in s.gpus}) == 8
    cpx = snap(FakeAmdSmi.healthy(gpus=2, partitions=4))
    assert [g.rocm_uuid for g in cpx.gpus] == ["GPU-d1cb9b1a4e0a7a00"] * 4 + ["GPU-d1cb9b1a4e0a7a10"] * 4
    dies = snap(FakeAmdSmi.healthy(gpus=1, model="AMD Instinct MI250X"))
    assert [g.rocm_uuid for g in dies.gpus] == ["GPU-d1cb9b1a4e0a7a00", "GPU-d1cb9b1a4e0a7a01"]


@pytest.mark.parametrize("serial, error", [("N/A", None), ("0x0000000000000000", None),
                                           ("0xZZ", "garbled answer from amdsmi_get_gpu_asic_info")])
def test_an_asic_serial_that_names_nothing_leaves_the_rocm_uuid_unset(serial, error):
    g = snap(FakeAmdSmi.healthy(gpus=1).set(gpu=0, asic_serial=serial)).gpus[0]
    assert g.rocm_uuid is None and g.model == "AMD Instinct MI300X"
    assert [e for f, e in g.errors if f == "rocm_uuid" and e.startswith(error)] if error else g.errors == ()


def test_uncorrectable_umc_error_is_counted_in_its_block_and_the_total():
    fake = FakeAmdSmi.healthy(gpus=8).set(gpu=2, ecc={"UMC": (4, 3, 1)})
    g = snap(fake).gpus[2]
    assert EccBlock("UMC", 4, 3, 1) in g.ecc_blocks
    assert g.ecc_volatile_uncorrectable == 3


def test_only_the_blocks_the_driver_has_ecc_enabled_for_are_asked():
    fake = FakeAmdSmi.healthy(gpus=1).set(gpu=0, ecc_enabled=1 | 4)  # UMC, GFX
    assert [b.block for b in snap(fake).gpus[0].ecc_blocks] == ["UMC", "GFX"]
    assert fake.called("amdsmi_get_gpu_ecc_count") == 2


def test_bad_pages_are_counted_by_status_against_the_threshold():
    pages = [(0x1A2B, AmdSmiMemoryPageStatus.RESERVED), (0x1A2C, AmdSmiMemoryPageStatus.RESERVED),
             (0x2000, AmdSmiMemoryPageStatus.PENDING), (0x3000, AmdSmiMemoryPageStatus.UNRESERVABLE)]
    fake = FakeAmdSmi.healthy(gpus=2).set(gpu=1, bad_pages=[(a, int(s)) for a, s in pages], bad_page_threshold=128)
    assert snap(fake).gpus[1].bad_pages == BadPages(reserved=2, pending=1, unreservable=1, threshold=128)


def test_not_supported_leaves_the_field_unset_and_is_never_a_fault():
    fake = FakeAmdSmi.healthy(gpus=2, model="AMD Instinct MI210")  # no XGMI hive
    fake.fail("amdsmi_get_gpu_bad_page_threshold", code=STATUS["NOT_SUPPORTED"])
    fake.fail("amdsmi_get_violation_status", code=STATUS["NOT_SUPPORTED"])
    s = snap(fake)
    assert all(g.errors == () for g in s.gpus)
    assert s.gpus[0].xgmi_error is None and s.gpus[0].throttle_reasons is None
    assert s.gpus[0].bad_pages == BadPages(0, 0, 0, None)


def test_an_amdsmi_without_a_newer_call_reads_the_rest():
    fake = FakeAmdSmi.healthy(gpus=1).remove("amdsmi_get_gpu_bad_page_threshold", "amdsmi_get_gpu_enumeration_info")
    g = snap(fake).gpus[0]
    assert g.errors == () and g.bad_pages.threshold is None and g.minor is None
    assert g.uuid and g.ecc_blocks is not None


@pytest.mark.parametrize("status, words", [
    ("NO_PERM", "AMDSMI_STATUS_NO_PERM - Permission Denied"),
    ("BUSY", "AMDSMI_STATUS_BUSY - Device busy"),
])
def test_a_field_refused_is_unset_with_one_clear_line(status, words):
    fake = FakeAmdSmi.healthy(gpus=2).fail("amdsmi_get_pcie_info", gpu=1, code=STATUS[status])
    s = snap(fake)
    g = s.gpus[1]
    assert g.pcie_width is None and g.pcie_replay is None
    assert g.errors == (("pcie", f"amdsmi_get_pcie_info failed: {words}"),)
    assert s.gpus[0].errors == () and s.gpus[0].pcie_width == 16


@pytest.mark.parametrize("status, line", [
    ("DRIVER_NOT_LOADED", "amdsmi: driver not loaded (AMDSMI_STATUS_DRIVER_NOT_LOADED - Driver not loaded)"),
    ("NO_PERM", "amdsmi: no permission (AMDSMI_STATUS_NO_PERM - Permission Denied)"),
])
def test_amdsmi_that_cannot_start_is_one_line_node_error(status, line):
    s = snap(FakeAmdSmi.healthy(gpus=8).fail("amdsmi_init", code=STATUS[status]))
    assert s.error == line and s.gpus == ()


def test_the_session_is_closed_after_the_snapshot():
    fake = FakeAmdSmi.healthy(gpus=2)
    snap(fake)
    assert fake.called("amdsmi_shut_down") == 1 and not fake.initialised


def test_cpx_partitions_read_physical_sensors_on_partition_0_and_share_them():
    fake = FakeAmdSmi.healthy(gpus=2, partitions=4).set(gpu=4, ecc={"UMC": (0, 2, 0)}, temps={"HOTSPOT": 97})
    s = snap(fake)
    assert [g.partition for g in s.gpus] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert [g.minor for g in s.gpus] == list(range(128, 136))
    physical = {i for f, i in fake.calls if f in ("amdsmi_get_gpu_ecc_count", "amdsmi_get_pcie_info",
                                                   "amdsmi_get_temp_metric", "amdsmi_get_gpu_bad_page_info")}
    assert physical == {0, 4}
    assert [g.ecc_volatile_uncorrectable for g in s.gpus] == [0, 0, 0, 0, 2, 2, 2, 2]
    assert [g.temperature_c for g in s.gpus[4:]] == [97, 97, 97, 97]
    assert len({g.uuid for g in s.gpus}) == 8


def test_mi250x_dies_are_two_gpus_each_with_its_own_pci_device_on_one_board():
    s = snap(FakeAmdSmi.healthy(gpus=4, model="AMD Instinct MI250X"))
    assert len(s.gpus) == 8
    assert [g.pci_bus_id for g in s.gpus[:2]] == ["0000:0C:00.0", "0000:0D:00.0"]
    assert [g.minor for g in s.gpus[:2]] == [128, 129] and s.gpus[0].uuid != s.gpus[1].uuid
    assert s.gpus[0].serial == s.gpus[1].serial  # the board the RMA names
    assert all(g.partition is None for g in s.gpus)  # each die is a PCI device of its own


def test_hbm_temperature_is_the_hottest_stack_and_violations_are_throttle_reasons():
    fake = FakeAmdSmi.healthy(gpus=1).set(gpu=0, temps={"HOTSPOT": 88, "HBM_0": 80, "HBM_1": 94, "HBM_2": 81},
                                          violations={"active_hbm_thrm": True, "active_ppt_pwr": True})
    g = snap(fake).gpus[0]
    assert g.temperature_c == 88 and g.memory_temperature_c == 94
    assert g.throttle_reasons == ("hbm_thermal", "power_cap")


def test_amd_snapshot_survives_json_round_trip():
    fake = FakeAmdSmi.healthy(gpus=2).set(gpu=1, ecc={"UMC": (1, 2, 0)}, bad_pages=[(1, 1)])
    s = snap(fake)
    assert snapshot_from_dict(snapshot_to_dict(s)) == s


def test_a_lost_gpu_fails_alone():
    fake = FakeAmdSmi.healthy(gpus=2)
    for fn in ("amdsmi_get_gpu_device_uuid", "amdsmi_get_gpu_total_ecc_count", "amdsmi_get_pcie_info"):
        fake.fail(fn, gpu=1, code=STATUS["NOT_FOUND"])
    s = snap(fake)
    assert s.error is None and s.gpus[0].errors == ()
    assert {name for name, _ in s.gpus[1].errors} == {"uuid", "ecc_volatile_uncorrectable", "pcie"}


# --- auto -------------------------------------------------------------------------------------


class _Probe:
    def __init__(self, snap: NodeSnapshot, unloadable: bool = False):
        self.snap, self.unloadable, self.calls = snap, unloadable, 0

    def snapshot(self) -> NodeSnapshot:
        self.calls += 1
        return self.snap


def test_auto_uses_nvml_where_it_loads_and_never_asks_amdsmi():
    nvml = _Probe(NodeSnapshot("n", "nvml"))
    amd = _Probe(NodeSnapshot("n", "amdsmi"))
    assert AutoProbe(nvml, "n", amd=lambda: amd).snapshot().backend == "nvml"
    assert amd.calls == 0


def test_auto_uses_amdsmi_where_nvml_does_not_load_and_amd_gpus_answer():
    nvml = _Probe(NodeSnapshot("n", "nvml", error="NVML: library libnvidia-ml.so.1 not found"), unloadable=True)
    amd = AmdSmiProbe("n", amdsmi=FakeAmdSmi.healthy(gpus=8), drm_root=NO_DRM)
    s = AutoProbe(nvml, "n", amd=lambda: amd).snapshot()
    assert s.backend == "amdsmi" and len(s.gpus) == 8


def test_auto_keeps_nvmls_error_on_a_broken_nvidia_node():
    """An NVML that loads but fails (or a node without AMD GPUs either) is NVIDIA's fault to tell:
    an auto probe that answered with an empty AMD snapshot would hide it, and this test fails."""
    broken = _Probe(NodeSnapshot("n", "nvml", error="NVML: nvmlInit failed (NVML_ERROR_UNKNOWN)"))
    amd = AmdSmiProbe("n", amdsmi=FakeAmdSmi.healthy(gpus=8), drm_root=NO_DRM)
    assert AutoProbe(broken, "n", amd=lambda: amd).snapshot() is broken.snap
    absent = _Probe(NodeSnapshot("n", "nvml", error="NVML: driver not loaded"), unloadable=True)
    no_amd = AmdSmiProbe("n", amdsmi=FakeAmdSmi([]), drm_root=NO_DRM)
    assert AutoProbe(absent, "n", amd=lambda: no_amd).snapshot() is absent.snap


# --- the import -------------------------------------------------------------------------------


def _python(code: str, *paths: str) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, *paths])}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                          check=True).stdout.strip()


def test_amdsmi_is_imported_only_when_the_probe_runs():
    code = ("import sys, slurm_hooks.probes.amdsmi, slurm_hooks.probes;"
            "print('amdsmi' in sys.modules)")
    assert _python(code, TESTS, os.path.join(TESTS, "fakes", "amd_site")) == "False"


def test_probe_imports_amdsmi_by_name_when_it_runs():
    code = ("from slurm_hooks.probes.amdsmi import AmdSmiProbe;"
            "s = AmdSmiProbe('n', drm_root='/nonexistent').snapshot(); print(s.backend, len(s.gpus), s.error)")
    assert _python(code, TESTS, os.path.join(TESTS, "fakes", "amd_site")) == "amdsmi 8 None"


@pytest.mark.parametrize("code, unloadable", [
    (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, True),
    (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, True),
    (pynvml.NVML_ERROR_UNKNOWN, False),
    (pynvml.NVML_ERROR_NO_PERMISSION, False),
])
def test_nvml_probe_tells_auto_whether_nvml_is_absent_or_failing(code, unloadable):
    probe = NvmlProbe("n", kmsg_path="/nonexistent", nvml=FakeNvml.healthy(gpus=2).fail("nvmlInit", code=code))
    assert probe.snapshot().error and probe.unloadable is unloadable
