"""The NVML probe against the shared fake NVML (real pynvml error classes, fake answers)."""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os

import pynvml
import pytest
from conftest import collect_events
from fakes import FakeLink, FakeNvml
from paths import FIXTURES

from slurm_hooks.models import OPTIONAL_GPU_FIELDS, GpuProcess, GpuSnapshot, snapshot_from_dict, snapshot_to_dict
from slurm_hooks.probes import nvml_errors
from slurm_hooks.probes.nvml import NvmlProbe

GIB = 1024**3


def snap(fake: FakeNvml, kmsg_path: str = "/nonexistent/kmsg"):
    return NvmlProbe("gpu-node-1", kmsg_path=kmsg_path, nvml=fake).snapshot()


# --- the healthy node -----------------------------------------------------------


def test_healthy_eight_gpu_node_fills_every_field():
    fake = FakeNvml.healthy(gpus=8, model="NVIDIA H100 80GB HBM3")
    s = snap(fake)
    assert s.error is None and s.backend == "nvml" and s.node == "gpu-node-1"
    assert s.driver_version == "570.124.06"
    assert [g.index for g in s.gpus] == list(range(8))
    for gpu in s.gpus:
        empty = [f.name for f in dataclasses.fields(GpuSnapshot)
                 if getattr(gpu, f.name) is None and f.name not in OPTIONAL_GPU_FIELDS]
        assert empty == [], f"GPU {gpu.index} left {empty} unset"
        assert gpu.errors == () and not gpu.lost and not gpu.needs_reset
        assert gpu.model == "NVIDIA H100 80GB HBM3"
        assert gpu.uuid.startswith("GPU-")
        assert (gpu.pcie_gen, gpu.pcie_gen_max, gpu.pcie_width, gpu.pcie_width_max) == (5, 5, 16, 16)
        assert len(gpu.nvlinks) == 18 and all(link.active and link.crc_errors == 0 for link in gpu.nvlinks)
        assert gpu.temperature_c == 33
        assert gpu.power_w == pytest.approx(71.234) and gpu.power_limit_w == 700.0
        assert gpu.throttle_reasons == ("gpu_idle",)
        assert gpu.persistence_mode is True and gpu.fabric_state == "completed"
        assert gpu.ecc_volatile_uncorrectable == 0 and gpu.row_remap_pending is False
        assert gpu.processes == () and gpu.memory_used_mib == 516
    assert len({g.uuid for g in s.gpus}) == len({g.pci_bus_id for g in s.gpus}) == 8
    assert s.gpus[1].pci_bus_id == "00000000:28:00.0"


def test_one_nvml_session_per_snapshot_and_always_shut_down():
    fake = FakeNvml.healthy(gpus=2)
    snap(fake)
    snap(fake)
    assert (fake.inits, fake.shutdowns) == (2, 2)


def test_snapshot_survives_a_json_round_trip():
    fake = FakeNvml.healthy(gpus=2).set(gpu=1, processes=[(4242, GIB, "python")], memory_used=2 * GIB)
    s = snap(fake)
    assert snapshot_from_dict(json.loads(json.dumps(snapshot_to_dict(s)))) == s


# --- per-field rules ---------------------------------------------------------------


def test_not_supported_field_is_none_and_not_an_error():
    fake = FakeNvml.healthy(gpus=8).fail("nvmlDeviceGetTemperature", gpu=2, code=pynvml.NVML_ERROR_NOT_SUPPORTED)
    gpu = snap(fake).gpus[2]
    assert gpu.temperature_c is None
    assert gpu.errors == ()
    assert snap(fake).gpus[3].temperature_c == 33


def test_function_missing_from_driver_is_treated_as_not_supported():
    fake = FakeNvml.healthy(gpus=1).fail("nvmlDeviceGetRemappedRows", code=pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
    gpu = snap(fake).gpus[0]
    assert gpu.row_remap_pending is None and gpu.row_remap_failure is None
    assert gpu.errors == ()


def test_other_nvml_error_leaves_field_none_and_says_why():
    fake = FakeNvml.healthy(gpus=2).fail("nvmlDeviceGetTotalEccErrors", gpu=1, code=pynvml.NVML_ERROR_UNKNOWN)
    gpu = snap(fake).gpus[1]
    assert gpu.ecc_volatile_uncorrectable is None and gpu.ecc_aggregate_uncorrectable is None
    why = gpu.error("ecc_volatile_uncorrectable")
    assert why is not None and "nvmlDeviceGetTotalEccErrors" in why and "NVML_ERROR_UNKNOWN" in why
    assert "\n" not in why


def test_lost_gpu_is_marked_lost_and_the_others_are_read():
    fake = FakeNvml.healthy(gpus=8).lose(gpu=5)
    s = snap(fake)
    lost = s.gpus[5]
    assert lost.lost and lost.temperature_c is None
    assert lost.errors == (("*", "GPU is lost (NVML_ERROR_GPU_IS_LOST at nvmlDeviceGetHandleByIndex)"),)
    assert [g.index for g in s.gpus if g.lost] == [5]
    assert s.gpus[6].temperature_c == 33


def test_gpu_lost_mid_query_keeps_identity_and_stops_asking_it():
    fake = FakeNvml.healthy(gpus=3).fail("nvmlDeviceGetPowerUsage", gpu=1, code=pynvml.NVML_ERROR_GPU_IS_LOST)
    gpu = snap(fake).gpus[1]
    assert gpu.lost
    assert gpu.uuid and gpu.pci_bus_id == "00000000:28:00.0" and gpu.model
    assert gpu.temperature_c is None and gpu.nvlinks is None
    asked_after = [name for name, idx in fake.calls if idx == 1][-1]
    assert asked_after == "nvmlDeviceGetPowerUsage"
    assert ("nvmlDeviceGetEnforcedPowerLimit", 2) in fake.calls


def test_reset_required_marks_the_gpu_and_keeps_the_readable_fields():
    fake = FakeNvml.healthy(gpus=2).fail("nvmlDeviceGetRemappedRows", gpu=0, code=pynvml.NVML_ERROR_RESET_REQUIRED)
    gpu = snap(fake).gpus[0]
    assert gpu.needs_reset and not gpu.lost
    assert gpu.row_remap_pending is None
    assert gpu.temperature_c == 33
    assert not snap(fake).gpus[1].needs_reset


def test_reset_required_on_the_handle_gives_an_empty_gpu_that_needs_reset():
    fake = FakeNvml.healthy(gpus=2).fail("nvmlDeviceGetHandleByIndex", gpu=1, code=pynvml.NVML_ERROR_RESET_REQUIRED)
    gpu = snap(fake).gpus[1]
    assert gpu.needs_reset and gpu.uuid == "" and gpu.temperature_c is None


def test_no_permission_on_the_handle_is_recorded():
    fake = FakeNvml.healthy(gpus=2).fail("nvmlDeviceGetHandleByIndex", gpu=0, code=pynvml.NVML_ERROR_NO_PERMISSION)
    gpu = snap(fake).gpus[0]
    assert not gpu.lost and "NVML_ERROR_NO_PERMISSION" in gpu.error("handle")


def test_temperature_0xffffffff_is_garbled_not_a_fire():
    fake = FakeNvml.healthy(gpus=8).set(gpu=3, temperature=0xFFFFFFFF)
    gpu = snap(fake).gpus[3]
    assert gpu.temperature_c is None
    assert "garbled answer from nvmlDeviceGetTemperature" in gpu.error("temperature_c")
    assert "4294967295" in gpu.error("temperature_c")


@pytest.mark.parametrize(
    ("state", "field"),
    [
        ({"ecc_volatile_uncorrectable": -3}, "ecc_volatile_uncorrectable"),
        ({"ecc_aggregate_uncorrectable": 0xFFFFFFFFFFFFFFFF}, "ecc_aggregate_uncorrectable"),
        ({"temperature": "hot"}, "temperature_c"),
        ({"retired_pages_pending": 7}, "retired_pages_pending"),
        ({"remapped_rows": (0, 0, 1)}, "row_remap"),
        ({"pcie_width": 0}, "pcie_width"),
        ({"pcie_gen_max": 99}, "pcie_gen_max"),
        ({"power_mw": 2**40}, "power_w"),
        ({"persistence_mode": 2}, "persistence_mode"),
        ({"clocks_event_reasons": -1}, "throttle_reasons"),
        ({"processes": "nope"}, "processes"),
        ({"memory_used": 200 * GIB}, "memory_used_mib"),
        ({"uuid": 12345}, "uuid"),
    ],
)
def test_garbled_answer_leaves_field_unset_and_names_it(state, field):
    gpu = snap(FakeNvml.healthy(gpus=1).set(gpu=0, **state)).gpus[0]
    assert gpu.error(field) is not None
    assert [name for name, _ in gpu.errors] == [field]


def test_garbled_row_remap_leaves_both_flags_unset():
    gpu = snap(FakeNvml.healthy(gpus=1).set(gpu=0, remapped_rows=(0, 0, 1))).gpus[0]
    assert gpu.row_remap_pending is None and gpu.row_remap_failure is None


def test_python_exception_from_the_binding_is_a_field_error_not_a_crash():
    fake = FakeNvml.healthy(gpus=1)
    fake.nvmlDeviceGetPowerUsage = lambda handle: (_ for _ in ()).throw(RuntimeError("ctypes exploded"))
    gpu = snap(fake).gpus[0]
    assert gpu.power_w is None and "ctypes exploded" in gpu.error("power_w")
    assert gpu.temperature_c == 33


def test_bytes_from_an_older_binding_are_decoded():
    gpu = snap(FakeNvml.healthy(gpus=1).set(gpu=0, uuid=b"GPU-0123", name=b"NVIDIA H200")).gpus[0]
    assert (gpu.uuid, gpu.model, gpu.errors) == ("GPU-0123", "NVIDIA H200", ())


@pytest.mark.parametrize("raw, text", [
    (b"NVIDIA H200\xff\xfe", "NVIDIA H200\ufffd\ufffd"),  # not UTF-8
    (b"NVIDIA H200\x00\xff\x13junk", "NVIDIA H200"),  # garbage after the C string's NUL
    (b"NVIDIA\nH200\x1b[31m", "NVIDIA\ufffdH200\ufffd[31m"),  # control characters
    ("NVIDIA H200\udcff", "NVIDIA H200\ufffd"),  # a lone surrogate from a surrogateescape decode
])
def test_garbled_strings_from_nvml_are_decoded_without_raising(raw, text):
    gpu = snap(FakeNvml.healthy(gpus=1).set(gpu=0, name=raw, serial=raw, uuid=b"GPU-\xc3\x28")).gpus[0]
    assert (gpu.model, gpu.serial, gpu.uuid, gpu.errors) == (text, text, "GPU-\ufffd(", ())
    json.dumps(snapshot_to_dict(snap(FakeNvml.healthy(gpus=1).set(gpu=0, name=raw))), ensure_ascii=False).encode()


def test_binding_that_fails_to_decode_a_string_gives_a_field_error():
    fake = FakeNvml.healthy(gpus=1)
    fake.nvmlDeviceGetName = lambda handle: b"\xff".decode()
    gpu = snap(fake).gpus[0]
    assert gpu.model == "" and "can't decode byte 0xff" in gpu.error("model")
    assert gpu.temperature_c == 33


def test_row_remap_pending_and_failure_are_read():
    gpu = snap(FakeNvml.healthy(gpus=1).set(gpu=0, remapped_rows=(3, 2, 1, 1))).gpus[0]
    assert gpu.row_remap_pending is True and gpu.row_remap_failure is True


def test_power_is_converted_from_milliwatts():
    gpu = snap(FakeNvml.healthy(gpus=1).set(gpu=0, power_mw=655_500, power_limit_mw=700_000)).gpus[0]
    assert (gpu.power_w, gpu.power_limit_w) == (655.5, 700.0)


# --- NVLink --------------------------------------------------------------------------


def test_nvlink_enumeration_stops_at_the_first_link_nvml_rejects():
    fake = FakeNvml.healthy(gpus=1)
    gpu = snap(fake).gpus[0]
    assert [link.link for link in gpu.nvlinks] == list(range(18))
    assert fake.called("nvmlDeviceGetNvLinkState") == 19


def test_gpu_without_nvlink_has_no_link_list():
    gpu = snap(FakeNvml.healthy(gpus=1, model="NVIDIA L40S")).gpus[0]
    assert gpu.nvlinks is None and gpu.fabric_state is None and gpu.errors == ()


def test_nvlink_down_and_error_counters_are_read_per_link():
    links = [FakeLink() for _ in range(18)]
    links[4] = FakeLink(active=0, replay=9, crc_flit=9)
    links[7] = FakeLink(crc_flit=250, replay=12, recovery=1)
    gpu = snap(FakeNvml.healthy(gpus=1).set(gpu=0, nvlinks=links)).gpus[0]
    assert gpu.nvlinks[4].active is False and gpu.nvlinks[4].crc_errors is None
    assert (gpu.nvlinks[7].crc_errors, gpu.nvlinks[7].replay_errors, gpu.nvlinks[7].recovery_errors) == (250, 12, 1)


def test_unsupported_nvlink_counter_is_none_without_error():
    fake = FakeNvml.healthy(gpus=1).fail("nvmlDeviceGetNvLinkErrorCounter", code=pynvml.NVML_ERROR_NOT_SUPPORTED)
    gpu = snap(fake).gpus[0]
    assert all(link.active and link.crc_errors is None for link in gpu.nvlinks)
    assert gpu.errors == ()


# --- clocks, fabric, processes ---------------------------------------------------------


def test_clock_event_reasons_are_decoded_into_names():
    mask = 0x4 | 0x8 | 0x20 | 0x40 | 0x80 | 0x8000
    gpu = snap(FakeNvml.healthy(gpus=1).set(gpu=0, clocks_event_reasons=mask)).gpus[0]
    assert gpu.throttle_reasons == ("sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown",
                                    "hw_power_brake_slowdown", "unknown_0x8000")


def test_old_binding_without_clocks_event_reasons_uses_throttle_reasons():
    fake = FakeNvml.healthy(gpus=1).remove("nvmlDeviceGetCurrentClocksEventReasons").set(gpu=0, clocks_event_reasons=0x40)
    assert snap(fake).gpus[0].throttle_reasons == ("hw_thermal_slowdown",)
    assert fake.called("nvmlDeviceGetCurrentClocksThrottleReasons") == 1


def test_old_driver_without_clocks_event_reasons_uses_throttle_reasons():
    fake = FakeNvml.healthy(gpus=1).fail("nvmlDeviceGetCurrentClocksEventReasons",
                                         code=pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
    assert snap(fake.set(gpu=0, clocks_event_reasons=0x8)).gpus[0].throttle_reasons == ("hw_slowdown",)


@pytest.mark.parametrize(
    ("state", "status", "expected"),
    [
        (pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, pynvml.NVML_SUCCESS, "completed"),
        (pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS, pynvml.NVML_SUCCESS, "in_progress"),
        (pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED, pynvml.NVML_SUCCESS, "not_started"),
        (pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES,
         "failed:NVML_ERROR_INSUFFICIENT_RESOURCES"),
        (pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED, pynvml.NVML_SUCCESS, None),
    ],
)
def test_fabric_manager_state_is_named(state, status, expected):
    gpu = snap(FakeNvml.healthy(gpus=1).set(gpu=0, fabric_state=state, fabric_status=status)).gpus[0]
    assert gpu.fabric_state == expected
    assert gpu.errors == ()


def test_fabric_state_falls_back_to_the_v1_call():
    fake = FakeNvml.healthy(gpus=1).remove("nvmlDeviceGetGpuFabricInfoV")
    assert snap(fake).gpus[0].fabric_state == "completed"
    assert fake.called("nvmlDeviceGetGpuFabricInfo") == 1


def test_fabric_info_struct_is_passed_by_reference_as_the_c_api_wants():
    seen = []
    fake = FakeNvml.healthy(gpus=1)
    real = fake.nvmlDeviceGetGpuFabricInfoV
    fake.nvmlDeviceGetGpuFabricInfoV = lambda handle, ref: seen.append(type(ref)) or real(handle, ref)
    snap(fake)
    assert seen == [type(ctypes.byref(ctypes.c_int()))]


def test_compute_processes_and_memory_are_reported_in_mib():
    fake = FakeNvml.healthy(gpus=2).set(gpu=1, processes=[(4242, 2 * GIB, "python"), (4243, None, "")],
                                        memory_used=3 * GIB)
    gpu = snap(fake).gpus[1]
    assert gpu.processes == (GpuProcess(4242, 2048, "python"), GpuProcess(4243, None, ""))
    assert gpu.memory_used_mib == 3072


# --- node level -------------------------------------------------------------------------


def test_driver_not_loaded_is_one_line_node_error():
    fake = FakeNvml.healthy(gpus=8).fail("nvmlInit", code=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    s = snap(fake)
    assert s.gpus == ()
    assert s.error == "NVML: driver not loaded (NVML_ERROR_DRIVER_NOT_LOADED: Driver Not Loaded)"
    assert fake.shutdowns == 0


def test_device_count_failure_is_a_node_error_and_nvml_is_shut_down():
    fake = FakeNvml.healthy(gpus=8).fail("nvmlDeviceGetCount", code=pynvml.NVML_ERROR_UNKNOWN)
    s = snap(fake)
    assert s.error.startswith("NVML: nvmlDeviceGetCount failed (NVML_ERROR_UNKNOWN")
    assert fake.shutdowns == 1


def _nvml_library_present() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


@pytest.mark.skipif(_nvml_library_present(), reason="this machine has the NVIDIA driver")
def test_real_pynvml_without_a_driver_gives_a_one_line_node_error():
    s = NvmlProbe("gpu-node-1", kmsg_path="/nonexistent/kmsg").snapshot()
    assert s.gpus == ()
    assert s.error == ("NVML: library libnvidia-ml.so.1 not found "
                       "(NVML_ERROR_LIBRARY_NOT_FOUND: NVML Shared Library Not Found)")


# --- XIDs from the kernel log --------------------------------------------------------------


def test_xids_from_kmsg_are_assigned_to_the_gpu_with_that_pci_id(tmp_path):
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(
        "6,1200,4000000,-;nvidia-nvswitch0: open (major=510)\n"
        "6,1234,5000000,-;NVRM: Xid (PCI:0000:38:00): 79, pid=0, name=python, GPU has fallen off the bus.\n"
        "4,1240,5100000,-;NVRM: Xid (PCI:0000:f0:00): 48, pid=77, name=python, An uncorrectable double bit error\n"
    )
    s = snap(FakeNvml.healthy(gpus=8), kmsg_path=str(kmsg))
    (xid,) = s.gpus[2].xids
    assert (xid.code, xid.gpu, xid.seq, xid.source) == (79, 2, 1234, "kmsg")
    assert "fallen off the bus" in xid.message
    assert [g.index for g in s.gpus if g.xids] == [2]
    assert [(x.code, x.gpu) for x in s.node_xids] == [(48, None)]


def test_xids_in_a_captured_dmesg_land_on_the_gpu_at_that_address():
    fake = FakeNvml.healthy(gpus=8).set(gpu=4, pci_bus_id="00000000:9B:00.0")
    s = snap(fake, kmsg_path=os.path.join(FIXTURES, "kmsg", "dmesg-with-xid-119.log"))
    assert s.gpus[4].xids and {x.code for x in s.gpus[4].xids} == {119}
    assert all(not g.xids for g in s.gpus if g.index != 4) and s.node_xids == ()


def test_kernel_log_xids_carry_their_gpus_uuid_and_the_probe_leaves_the_map_for_the_watcher(tmp_path):
    from slurm_hooks.probes.identity import bus_map

    log = tmp_path / "kmsg"
    log.write_text("6,1234,5000000,-;NVRM: Xid (PCI:0000:38:00): 79, pid=0, name=python, GPU has fallen off the bus.\n")
    fake = FakeNvml.healthy(gpus=4)
    map_path = str(tmp_path / "state" / "gpus-n1.json")
    s = NvmlProbe("n1", kmsg_path=str(log), nvml=fake, gpu_map_path=map_path).snapshot()
    [xid] = s.gpus[2].xids
    assert (xid.gpu, xid.uuid) == (2, fake.gpus[2]["uuid"])
    assert bus_map(map_path) == {g.pci_bus_id: (g.index, g.uuid) for g in s.gpus}
    assert stat_mtime_unchanged_after_a_second_snapshot(map_path, NvmlProbe("n1", nvml=fake, gpu_map_path=map_path))


def stat_mtime_unchanged_after_a_second_snapshot(path: str, probe: NvmlProbe) -> bool:
    before = os.stat(path).st_mtime_ns
    os.utime(path, ns=(before - 10**9, before - 10**9))  # so that a rewrite would show
    probe.snapshot()
    return os.stat(path).st_mtime_ns == before - 10**9


def test_nvml_answers_the_gpu_map_when_the_probe_left_none():
    from slurm_hooks.probes.nvml import read_gpu_map

    fake = FakeNvml.healthy(gpus=3).set(gpu=1, uuid=b"GPU-\xffone")
    assert read_gpu_map(fake) == {"00000000:18:00.0": (0, fake.gpus[0]["uuid"]),
                                  "00000000:28:00.0": (1, "GPU-\ufffdone"),
                                  "00000000:38:00.0": (2, fake.gpus[2]["uuid"])}
    assert fake.shutdowns == 1
    assert read_gpu_map(FakeNvml.healthy(gpus=1).fail("nvmlInit", code=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)) == {}


def test_a_burst_of_lines_for_one_fault_is_one_event_on_that_gpu(tmp_path):
    """The driver logs three XID 119 lines within 3 ms for one GSP timeout: one event, not three."""
    log = tmp_path / "kmsg"
    log.write_text("".join(f"3,{700 + i},{9_000_000 + i * 1500},-;NVRM: Xid (PCI:0000:38:00): 119, pid=7, name=python, "
                           "Timeout after 6s of waiting for RPC response from GPU2 GSP!\n" for i in range(3)))
    s = snap(FakeNvml.healthy(gpus=4), kmsg_path=str(log))
    assert [x.seq for x in s.gpus[2].xids] == [700]


def test_unreadable_kernel_log_means_no_xids_not_a_failed_snapshot():
    s = snap(FakeNvml.healthy(gpus=2), kmsg_path="/nonexistent/kmsg")
    assert s.error is None and all(g.xids == () for g in s.gpus)


def test_a_kernel_log_that_cannot_be_read_is_said_in_the_snapshot_and_judged_a_warning(tmp_path):
    """A path the probe cannot read records from (here a directory: read() says EISDIR, as /dev/kmsg
    says EPERM to a process without CAP_SYSLOG under dmesg_restrict): the GPUs were read, so the
    snapshot stands, but "no XID" then means nothing and the verdict says so, without acting."""
    from slurm_hooks import engine
    from slurm_hooks.models import KERNEL_LOG, Action, Context, Expectations, Severity

    log = tmp_path / "kmsg"
    log.mkdir()
    s = snap(FakeNvml.healthy(gpus=2), kmsg_path=str(log))
    assert s.error is None and len(s.gpus) == 2
    assert "cannot read kernel log" in s.unread(KERNEL_LOG)
    report = engine.judge(s, engine.JudgeRequest(Expectations(), Context.CHECK, deadline_s=10.0))
    [f] = [f for f in report.findings if f.rule == KERNEL_LOG]
    assert f.message.startswith("kernel log unreadable: GPU driver events not seen (cannot read kernel log")
    assert (f.severity, f.action, f.acts) == (Severity.WARN, Action.WARN, False)
    assert report.healthy and not report.drain_findings()


def test_a_readable_kernel_log_with_no_xid_says_nothing(tmp_path):
    log = tmp_path / "kmsg"
    log.write_text("6,1200,4000000,-;nvidia-nvswitch0: open (major=510)\n")
    assert snap(FakeNvml.healthy(gpus=2), kmsg_path=str(log)).errors == ()


# --- the one place error codes are typed ----------------------------------------------------


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (pynvml.NVML_ERROR_GPU_IS_LOST, nvml_errors.GpuLost),
        (pynvml.NVML_ERROR_RESET_REQUIRED, nvml_errors.ResetRequired),
        (pynvml.NVML_ERROR_NOT_SUPPORTED, nvml_errors.NotSupported),
        (pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, nvml_errors.NotSupported),
        (pynvml.NVML_ERROR_NO_PERMISSION, nvml_errors.NoPermission),
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, nvml_errors.LibraryNotFound),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, nvml_errors.DriverNotLoaded),
        (pynvml.NVML_ERROR_TIMEOUT, nvml_errors.NvmlTimeout),
        (pynvml.NVML_ERROR_UNINITIALIZED, nvml_errors.NvmlFailure),
        (pynvml.NVML_ERROR_UNKNOWN, nvml_errors.NvmlFailure),
        (12345, nvml_errors.NvmlFailure),
    ],
)
def test_nvml_codes_map_to_typed_errors(code, kind):
    assert nvml_errors.classify(pynvml.NVMLError(code)) is kind
    err = nvml_errors.translate(pynvml.NVMLError(code))
    assert type(err) is kind and err.code == code and "\n" not in str(err)


def test_typed_errors_fit_the_project_hierarchy():
    from slurm_hooks.errors import ProbeError, TransientError

    assert issubclass(nvml_errors.GpuLost, ProbeError)
    assert issubclass(nvml_errors.NvmlTimeout, TransientError)
    assert nvml_errors.classify(ValueError("x")) is nvml_errors.NvmlFailure
    assert nvml_errors.classify(pynvml.NVMLLibraryMismatchError("old driver")) is nvml_errors.NotSupported


# --- NVML as libnvidia-ml answers it through nvidia-ml-py (the fake teaches each) ------------


def test_gpu_lost_in_the_middle_of_a_read_keeps_identity_and_nothing_is_asked_of_it_again():
    fake = FakeNvml.healthy(gpus=3).lose(gpu=1, at="nvmlDeviceGetTotalEccErrors")
    s = snap(fake)
    gpu = s.gpus[1]
    assert gpu.lost and gpu.errors == (("*", "GPU is lost (NVML_ERROR_GPU_IS_LOST at nvmlDeviceGetTotalEccErrors)"),)
    assert (gpu.uuid, gpu.minor, gpu.pci_bus_id, gpu.model) == (
        fake.gpus[1]["uuid"], 1, "00000000:28:00.0", "NVIDIA H100 80GB HBM3")
    assert [name for name, idx in fake.calls if idx == 1][-1] == "nvmlDeviceGetTotalEccErrors"
    assert not s.gpus[0].lost and not s.gpus[2].lost and s.gpus[2].temperature_c == 33


def test_gpu_lost_while_its_mig_instances_are_listed_is_lost_not_an_empty_mig_list():
    fake = FakeNvml.healthy(gpus=2).set(gpu=0, mig=[("MIG-a", 1, 0), ("MIG-b", 2, 0)])
    fake.lose(gpu=0, at="nvmlDeviceGetMigDeviceHandleByIndex")
    gpu = snap(fake).gpus[0]
    assert gpu.lost and gpu.uuid == fake.gpus[0]["uuid"]
    assert [name for name, idx in fake.calls if idx == 0].count("nvmlDeviceGetMigDeviceHandleByIndex") == 1


def test_gpu_lost_inside_the_nvlink_counters_stops_the_link_walk():
    fake = FakeNvml.healthy(gpus=1).lose(gpu=0, at="nvmlDeviceGetNvLinkErrorCounter")
    gpu = snap(fake).gpus[0]
    assert gpu.lost and gpu.nvlinks is None and gpu.uuid
    assert fake.called("nvmlDeviceGetNvLinkErrorCounter") == 1


def test_nvlink_past_the_last_link_is_invalid_argument_and_ends_the_walk_without_an_error():
    fake = FakeNvml.healthy(gpus=1, model="NVIDIA A100-SXM4-80GB")
    with pytest.raises(pynvml.NVMLError) as err:
        fake.nvmlDeviceGetNvLinkState(fake.nvmlDeviceGetHandleByIndex(0), 12)
    assert err.value.value == pynvml.NVML_ERROR_INVALID_ARGUMENT
    gpu = snap(fake).gpus[0]
    assert len(gpu.nvlinks) == 12 and gpu.errors == ()


def test_field_230_unknown_to_the_driver_answers_not_supported_inside_a_successful_call():
    fake = FakeNvml.healthy(gpus=1).set(gpu=0, recovery_action=None)
    values = fake.nvmlDeviceGetFieldValues(fake.nvmlDeviceGetHandleByIndex(0), [230])
    assert values[0].nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED  # the call itself succeeded
    gpu = snap(fake).gpus[0]
    assert gpu.recovery_action is None and gpu.errors == () and not gpu.lost


def test_field_230_answering_gpu_lost_in_its_own_return_code_is_a_lost_gpu():
    fake = FakeNvml.healthy(gpus=2).set(gpu=1, field_returns={230: pynvml.NVML_ERROR_GPU_IS_LOST})
    gpu = snap(fake).gpus[1]
    assert gpu.lost and gpu.uuid == fake.gpus[1]["uuid"]
    assert gpu.errors == (("*", "GPU is lost (NVML_ERROR_GPU_IS_LOST at nvmlDeviceGetFieldValues field 230)"),)


def test_field_230_with_another_error_in_its_return_code_is_recorded_not_swallowed():
    fake = FakeNvml.healthy(gpus=1).set(gpu=0, field_returns={230: pynvml.NVML_ERROR_UNKNOWN})
    gpu = snap(fake).gpus[0]
    assert gpu.recovery_action is None and not gpu.lost
    assert "NVML_ERROR_UNKNOWN" in gpu.error("recovery_action")


def test_processes_that_start_between_the_count_and_the_fill_call_are_asked_for_again():
    started = [(5000 + k, GIB, "worker") for k in range(10)]  # more than the binding's 2n+5 headroom
    fake = FakeNvml.healthy(gpus=1).set(gpu=0, processes=[(4242, 2 * GIB, "python")], processes_started=started)
    gpu = snap(fake).gpus[0]
    assert [p.pid for p in gpu.processes] == [4242] + [5000 + k for k in range(10)]
    assert gpu.errors == () and fake.called("nvmlDeviceGetComputeRunningProcesses") == 2


def test_a_few_processes_starting_mid_read_fit_the_bindings_headroom():
    fake = FakeNvml.healthy(gpus=1).set(gpu=0, processes=[(4242, GIB, "python")],
                                        processes_started=[(4243, None, "")])
    gpu = snap(fake).gpus[0]
    assert gpu.processes == (GpuProcess(4242, 1024, "python"), GpuProcess(4243, None, ""))
    assert fake.called("nvmlDeviceGetComputeRunningProcesses") == 1


def test_a_process_list_that_never_settles_is_an_unreadable_field_not_a_crash():
    fake = FakeNvml.healthy(gpus=1).fail("nvmlDeviceGetComputeRunningProcesses",
                                         code=pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
    gpu = snap(fake).gpus[0]
    assert gpu.processes == () and "failed 3 time(s): NVML_ERROR_INSUFFICIENT_SIZE" in gpu.error("processes")
    assert fake.called("nvmlDeviceGetComputeRunningProcesses") == 3


def _events(fake: FakeNvml, clock=None, until: int = 1, stop_after: float = 10.0) -> list:
    from slurm_hooks.probes.nvml_events import NvmlEventSource

    kw = {"clock": clock} if clock is not None else {}
    return collect_events(NvmlEventSource(nvml=fake, poll=0.05, **kw), stop_after, until)


def test_nvml_event_struct_has_no_timestamp_and_two_xids_in_one_microsecond_are_two_events():
    fake = FakeNvml.healthy(gpus=2).emit_xid(1, 48).emit_xid(1, 48)
    data_fields = {name for name, _ in pynvml.c_nvmlEventData_t._fields_}
    assert "timeStamp" not in data_fields  # what the watcher gets from nvidia-ml-py
    first, second = _events(fake, clock=lambda: 1_700_000_000.0, until=2)
    assert (first.gpu, first.code, second.gpu, second.code) == (1, 48, 1, 48)
    assert first.key != second.key and second.seq == first.seq + 1


def test_nvml_xid_is_delivered_once_then_timeouts_and_names_its_mig_instance():
    fake = FakeNvml.healthy(gpus=2).emit_xid(0, 94, instance=3)
    got = _events(fake, until=2, stop_after=0.5)
    assert [(e.gpu, e.code, e.instance) for e in got] == [(0, 94, 3)]
    assert fake.called("nvmlEventSetWait_v2") >= 3  # the XID, then TIMEOUT after TIMEOUT


def test_kernel_log_records_of_this_boot_carry_when_they_happened():
    """A record's ts is seconds since boot: the probe adds the boot's start, so that a burst read by two
    runs minutes apart keeps its lines seconds apart. A line of no known boot (a captured file) has none."""
    import time

    from slurm_hooks.models import XidEvent
    from slurm_hooks.probes import kmsg

    now_line = XidEvent(code=31, ts=time.monotonic() - 5.0, source="kmsg", seq=1, boot="b1")
    captured = XidEvent(code=31, ts=12.0, source="kmsg", seq=2)
    dated, undated = kmsg.dated([now_line, captured], "b1")
    assert abs(dated.at - (time.time() - 5.0)) < 1.0 and dated.key == now_line.key
    assert undated.at is None
