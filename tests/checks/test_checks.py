"""Every check family through ``engine.run`` (snapshot, then ``engine.judge``), fed captured-style NVML snapshots.

The probe is a stand-in that returns one loaded fixture; everything after it
(job GPU selection, contexts, deadline, crash handling, the drain reason) is
the real engine.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from pathlib import Path

import pytest
from paths import FIXTURES

from slurm_hooks import engine
from slurm_hooks.checks import REGISTRY, Check, for_context
from slurm_hooks.models import (
    Action,
    Context,
    DcgmResult,
    Expectations,
    Finding,
    GpuProcess,
    NodeSnapshot,
    NvLink,
    Scope,
    Severity,
    Urgency,
    snapshot_from_dict,
    snapshot_to_dict,
)
from slurm_hooks.slurm import format_reason, parse_reason

SNAPSHOTS = Path(FIXTURES) / "snapshots"

H100 = Expectations(gpus=8, model="H100", pcie_gen=5, pcie_width=16, nvlinks=18, fabric_manager=True)
A100 = Expectations(gpus=8, model="A100", pcie_gen=4, pcie_width=16, nvlinks=12)
V100 = Expectations(gpus=8, model="V100", pcie_gen=3, pcie_width=16, nvlinks=6, fabric_manager=True)


class SnapshotProbe:
    """Answers with one fixed snapshot, as the NVML probe would have."""

    name = "nvml"

    def __init__(self, snap: NodeSnapshot):
        self.snap = snap

    def snapshot(self) -> NodeSnapshot:
        return self.snap


def load(name: str) -> NodeSnapshot:
    return snapshot_from_dict(json.loads((SNAPSHOTS / name).read_text()))


def run(snap: NodeSnapshot | str, expect: Expectations = H100, context: Context = Context.CHECK, **kw):
    if isinstance(snap, str):
        snap = load(snap)
    kw.setdefault("deadline_s", 10.0)
    return engine.run(SnapshotProbe(snap), snap.node, engine.JudgeRequest(expect, context, **kw))


def problems(report) -> list[Finding]:
    return [f for f in report.findings if f.severity is not Severity.OK]


def replace_gpu(snap: NodeSnapshot, index: int, **changes) -> NodeSnapshot:
    gpus = tuple(dataclasses.replace(g, **changes) if g.index == index else g for g in snap.gpus)
    return dataclasses.replace(snap, gpus=gpus)


# --- fixtures themselves -----------------------------------------------------


@pytest.mark.parametrize("path", sorted(SNAPSHOTS.glob("*.json")), ids=lambda p: p.name)
def test_fixture_round_trips_through_snapshot_to_dict(path):
    data = json.loads(path.read_text())
    again = json.loads(json.dumps(snapshot_to_dict(snapshot_from_dict(data))))
    # Fields added after a fixture was captured come back at their defaults (the device minor, MIG,
    # an identity remembered rather than read).
    for gpu in again["gpus"]:
        for key, default in (("minor", None), ("mig", []), ("remembered", False)):
            if gpu.get(key) == default:
                gpu.pop(key)
        for event in gpu["xids"]:
            for key in ("instance", "at"):
                if event.get(key) is None:
                    event.pop(key)
    assert again == data


def test_snapshot_from_dict_rejects_an_unknown_gpu_field():
    data = json.loads((SNAPSHOTS / "h100-healthy.json").read_text())
    data["gpus"][0]["temprature_c"] = 40
    with pytest.raises(ValueError, match="temprature_c"):
        snapshot_from_dict(data)


# --- healthy nodes -----------------------------------------------------------


@pytest.mark.parametrize("context", list(Context))
def test_healthy_h100_node_has_no_findings_in_any_context(context):
    report = run("h100-healthy.json", context=context)
    assert report.findings == ()
    assert report.healthy
    assert report.worst_action is Action.NONE
    assert engine.drain_summary(report) == ""


def test_healthy_a100_node_with_twelve_links_is_clean():
    assert run("a100-healthy.json", A100).findings == ()


def test_idle_gpu_with_downclocked_pcie_gen_is_not_a_fault():
    snap = load("h100-healthy.json")
    assert snap.gpu(6).pcie_gen == 1  # the fixture's idle GPU
    assert run(snap).findings == ()


def test_busy_gpu_with_downclocked_pcie_gen_warns():
    snap = replace_gpu(load("h100-healthy.json"), 6, processes=(GpuProcess(4242, 1024, "python3"),))
    [f] = problems(run(snap))
    assert (f.check, f.severity, f.action, f.gpu) == ("pcie", Severity.WARN, Action.WARN, 6)
    assert f.message == "PCIe gen 1 while busy, max gen 5"


# --- one fault family each ----------------------------------------------------


def test_xid79_on_gpu3_fails_with_reboot_and_names_the_gpu():
    report = run("h100-xid79-gpu3.json")
    assert report.findings == (
        Finding("xid", Severity.FAIL, Action.REBOOT, "XID 79 (GPU has fallen off the bus)", 3, "XID 79 on GPU 3",
                scope=Scope.GPU, urgency=Urgency.NOW, rule="xid.79"),
    )
    assert report.findings[0].line() == "gpu3 xid: XID 79 (GPU has fallen off the bus) -> reboot"
    assert not report.healthy
    assert report.worst_action is Action.REBOOT


def test_xid79_drain_reason_is_slurm_hooks_prefix_summary_and_action():
    report = run("h100-xid79-gpu3.json")
    summary = engine.drain_summary(report)
    reason = format_reason(summary, report.worst_action)
    assert summary == "XID 79 on GPU 3"
    assert reason == "slurm-hooks: XID 79 on GPU 3 [reboot]"
    assert parse_reason(reason) == ("XID 79 on GPU 3", Action.REBOOT)


def test_uncorrectable_ecc_on_gpu5_asks_for_a_reset():
    [f] = problems(run("h100-ecc-uncorrectable-gpu5.json"))
    assert (f.check, f.severity, f.action, f.gpu) == ("ecc", Severity.FAIL, Action.RESET, 5)
    assert f.message == "2 volatile uncorrectable ECC errors (max 0)"
    assert f.summary == "ECC uncorrectable 2 on GPU 5"


def test_aggregate_ecc_over_its_limit_asks_for_replacement():
    expect = dataclasses.replace(H100, ecc_uncorrectable_aggregate_max=10)
    findings = problems(run("h100-ecc-uncorrectable-gpu5.json", expect))
    assert [(f.action, f.gpu, f.message) for f in findings] == [
        (Action.RESET, 5, "2 volatile uncorrectable ECC errors (max 0)"),
        (Action.REPLACE, 5, "14 aggregate uncorrectable ECC errors (max 10)"),
    ]


def test_volatile_ecc_within_a_raised_limit_passes():
    expect = dataclasses.replace(H100, ecc_uncorrectable_volatile_max=2)
    assert run("h100-ecc-uncorrectable-gpu5.json", expect).findings == ()


def test_row_remap_pending_on_gpu2_asks_for_a_reset():
    [f] = problems(run("h100-row-remap-pending-gpu2.json"))
    assert (f.check, f.severity, f.action, f.gpu) == ("row-remap", Severity.FAIL, Action.RESET, 2)
    assert f.message == "row remapping pending: GPU reset needed to apply it"


def test_row_remap_failure_on_gpu6_asks_for_replacement_once():
    [f] = problems(run("h100-row-remap-failure-gpu6.json"))
    assert (f.check, f.severity, f.action, f.gpu) == ("row-remap", Severity.FAIL, Action.REPLACE, 6)
    assert f.message == "row remapping failed: no spare rows left (RMA candidate)"


def test_retired_pages_pending_on_v100_gpu1_asks_for_a_reset_and_nothing_else():
    # The V100 has no row remapping and no fabric info (None): not supported is not a fault.
    [f] = problems(run("v100-retired-pages-pending-gpu1.json", V100))
    assert (f.check, f.severity, f.action, f.gpu) == ("retired-pages", Severity.FAIL, Action.RESET, 1)
    assert f.message == "retired pages pending: GPU reset needed"


def test_pcie_x8_on_an_x16_link_drains_gpu4():
    [f] = problems(run("h100-pcie-x8-gpu4.json"))
    assert (f.check, f.severity, f.action, f.gpu) == ("pcie", Severity.FAIL, Action.DRAIN, 4)
    assert f.message == "PCIe link width x8, expected x16"
    assert f.summary == "PCIe x8 on GPU 4"


def test_pcie_width_is_judged_against_the_gpus_own_maximum_when_no_group_pins_it():
    expect = dataclasses.replace(H100, pcie_width=None)
    [f] = problems(run("h100-pcie-x8-gpu4.json", expect))
    assert f.message == "PCIe link width x8, expected x16"


def test_pcie_max_gen_below_the_pinned_gen_drains():
    expect = dataclasses.replace(A100, pcie_gen=5)
    findings = problems(run("a100-healthy.json", expect))
    assert len(findings) == 8
    assert {(f.check, f.action, f.message) for f in findings} == {("pcie", Action.DRAIN, "PCIe max gen 4, expected gen 5")}


def test_nvlinks_down_on_a100_gpu2_ask_for_a_reset_and_crc_errors_on_gpu5_warn():
    findings = problems(run("a100-nvlink-down-and-crc.json", A100))
    assert [(f.check, f.severity, f.action, f.gpu, f.message) for f in findings] == [
        ("nvlink", Severity.FAIL, Action.RESET, 2, "10 NVLinks active, 12 expected (down: 7,8)"),
        ("nvlink", Severity.WARN, Action.WARN, 5, "NVLink errors on link 3: 1873 CRC, 212 replay "
                                                 "(max 100 CRC, 100 replay)"),
    ]


def test_nvlinks_down_are_caught_without_an_expected_link_count():
    expect = dataclasses.replace(A100, nvlinks=None)
    [down] = [f for f in problems(run("a100-nvlink-down-and-crc.json", expect)) if f.severity is Severity.FAIL]
    assert (down.gpu, down.message) == (2, "NVLink(s) 7,8 down while 10 are up")


def test_nvlink_crc_errors_under_a_raised_threshold_pass():
    expect = dataclasses.replace(A100, nvlink_crc_max=5000, nvlink_replay_max=5000)
    assert [f.gpu for f in problems(run("a100-nvlink-down-and-crc.json", expect))] == [2]


def test_unreadable_nvlink_state_is_a_probe_warning_not_a_link_down():
    snap = load("a100-healthy.json")
    links = list(snap.gpu(1).nvlinks)
    links[4] = NvLink(4)  # what the NVML probe stores when nvmlDeviceGetNvLinkState fails or is garbled
    snap = replace_gpu(snap, 1, nvlinks=tuple(links),
                       errors=(("nvlink4.active", "garbled answer from nvmlDeviceGetNvLinkState: 7"),))
    findings = problems(run(snap, A100))
    assert [(f.check, f.severity) for f in findings] == [("probe", Severity.WARN)]


def test_gpu7_at_96c_with_hw_slowdown_drains_and_gpu1_at_88c_warns():
    findings = problems(run("h100-thermal-96c-gpu7.json"))
    assert [(f.check, f.severity, f.action, f.gpu, f.message) for f in findings] == [
        ("thermal", Severity.WARN, Action.WARN, 1, "temperature 88 C (warn at 85 C)"),
        ("thermal", Severity.FAIL, Action.DRAIN, 7, "temperature 96 C (limit 95 C)"),
        ("throttle", Severity.WARN, Action.WARN, 7, "clocks slowed down: hw_slowdown, hw_thermal_slowdown"),
    ]


def test_throttle_reasons_are_judged_only_by_the_periodic_check():
    findings = problems(run("h100-thermal-96c-gpu7.json", context=Context.PROLOG))
    assert [f.check for f in findings] == ["thermal", "thermal"]


def test_persistence_mode_off_warns_on_every_gpu_without_draining():
    report = run("h100-persistence-off.json")
    assert [f.gpu for f in report.findings] == list(range(8))
    assert {(f.check, f.severity, f.action, f.message) for f in report.findings} == {
        ("persistence", Severity.WARN, Action.WARN, "persistence mode off, expected on (nvidia-persistenced)")}
    assert report.healthy
    assert report.drain_findings() == ()


def test_persistence_mode_is_not_judged_when_the_group_does_not_care():
    expect = dataclasses.replace(H100, persistence_mode=None)
    assert run("h100-persistence-off.json", expect).findings == ()


def test_fabric_manager_not_started_on_an_nvswitch_node_drains():
    findings = problems(run("h100-fabric-not-started.json"))
    assert [f.gpu for f in findings] == list(range(8))
    assert {(f.check, f.severity, f.action) for f in findings} == {("fabric", Severity.FAIL, Action.DRAIN)}
    assert findings[0].message == ("fabric manager state 'not_started', expected 'completed' "
                                   "(is nvidia-fabricmanager running?)")


def test_fabric_state_is_ignored_on_nodes_without_nvswitch():
    expect = dataclasses.replace(H100, fabric_manager=False)
    assert run("h100-fabric-not-started.json", expect).findings == ()


def test_leftover_processes_and_held_memory_are_flagged_in_the_epilog():
    findings = problems(run("h100-leftover-processes.json", context=Context.EPILOG))
    assert [(f.check, f.severity, f.action, f.gpu, f.message) for f in findings] == [
        ("leftover", Severity.FAIL, Action.DRAIN, 0, "1 process(es) left after the job (pid 48213)"),
        ("leftover", Severity.FAIL, Action.DRAIN, 1, "2 process(es) left after the job (pid 48214,48290)"),
        ("leftover", Severity.FAIL, Action.DRAIN, 2, "20480 MiB in use left after the job, no process"),
    ]
    assert all(f"GPU {f.gpu}" in f.summary for f in findings)


def test_processes_are_not_leftovers_for_the_periodic_check():
    # A running job's processes are what a busy node looks like.
    assert run("h100-leftover-processes.json", context=Context.CHECK).findings == ()


def test_processes_before_a_job_starts_are_flagged_by_the_prolog_as_busy():
    findings = problems(run("h100-leftover-processes.json", context=Context.PROLOG))
    assert [(f.check, f.gpu) for f in findings] == [("busy", 0), ("busy", 1), ("busy", 2)]
    assert findings[0].message == "1 process(es) before the job starts (pid 48213)"


def test_lost_gpu5_asks_for_replacement_and_nothing_else_about_it():
    report = run("h100-gpu5-lost.json")
    assert report.findings == (
        Finding("gpu-lost", Severity.FAIL, Action.REPLACE, "GPU is lost (fell off the bus or stopped answering)", 5,
                "GPU 5 lost", scope=Scope.GPU, urgency=Urgency.NOW),
    )


def test_gpu_needing_a_reset_asks_for_a_reset():
    snap = replace_gpu(load("h100-healthy.json"), 2, needs_reset=True)
    [f] = problems(run(snap))
    assert (f.check, f.action, f.gpu, f.message) == ("gpu-lost", Action.RESET, 2,
                                                     "GPU needs a reset (NVML_ERROR_RESET_REQUIRED)")


def test_seven_of_eight_gpus_visible_asks_for_a_reboot():
    report = run("h100-7-of-8-visible.json")
    assert report.findings == (
        Finding("gpu-count", Severity.FAIL, Action.REBOOT, "7 GPUs visible, 8 expected", None, "7 of 8 GPUs visible", config_based=True),
    )
    assert report.findings[0].line() == "node gpu-count: 7 GPUs visible, 8 expected -> reboot"


def test_gpu_count_is_not_judged_without_an_expected_count():
    assert run("h100-7-of-8-visible.json", dataclasses.replace(H100, gpus=None)).findings == ()


def test_wrong_gpu_model_drains():
    findings = problems(run("a100-healthy.json", dataclasses.replace(A100, model="H100")))
    assert len(findings) == 8
    assert (findings[0].check, findings[0].action, findings[0].message) == (
        "gpu-model", Action.DRAIN, "model 'NVIDIA A100-SXM4-80GB', expected 'H100'")


def test_garbled_temperature_on_gpu2_is_a_probe_warning_not_a_thermal_verdict():
    report = run("h100-garbled-temperature-gpu2.json")
    assert report.findings == (
        Finding("probe", Severity.WARN, Action.WARN,
                "could not read temperature_c: garbled answer from nvmlDeviceGetTemperature: 4294967295 outside 0..150",
                2, "GPU 2 temperature_c unreadable", scope=Scope.GPU, urgency=Urgency.WATCH),
    )
    assert report.healthy


@pytest.mark.parametrize("context", list(Context))
def test_fields_not_supported_on_any_gpu_are_never_a_failure(context):
    unsupported = {f.name: None for f in dataclasses.fields(load("h100-healthy.json").gpus[0])
                   if f.default is None}
    assert {"nvlinks", "temperature_c", "row_remap_failure", "fabric_state", "persistence_mode"} <= set(unsupported)
    snap = load("h100-healthy.json")
    snap = dataclasses.replace(snap, gpus=tuple(dataclasses.replace(g, **unsupported) for g in snap.gpus))
    expect = dataclasses.replace(H100, ecc_uncorrectable_aggregate_max=0)
    assert run(snap, expect, context).findings == ()


# --- contexts ------------------------------------------------------------------


def test_registry_names_are_unique():
    names = [c.name for c in REGISTRY]
    assert len(names) == len(set(names))


def test_leftover_runs_only_in_the_epilog_and_busy_only_in_the_prolog():
    assert [c for c in Context if "leftover" in {k.name for k in for_context(c)}] == [Context.EPILOG]
    assert [c for c in Context if "busy" in {k.name for k in for_context(c)}] == [Context.PROLOG]


def test_the_watcher_runs_only_event_and_memory_checks():
    watch = {c.name for c in for_context(Context.WATCH)}
    assert {"xid", "gpu-lost", "ecc", "row-remap"} <= watch
    assert not watch & {"gpu-count", "pcie", "persistence", "fabric", "leftover", "busy", "throttle"}


@pytest.mark.parametrize("fixture, judged_in, not_judged_in", [
    ("h100-pcie-x8-gpu4.json", {Context.CHECK, Context.PROLOG}, {Context.EPILOG, Context.WATCH}),
    ("h100-fabric-not-started.json", {Context.CHECK, Context.PROLOG}, {Context.EPILOG, Context.WATCH}),
    ("h100-7-of-8-visible.json", {Context.CHECK, Context.PROLOG, Context.EPILOG}, {Context.WATCH}),
    ("h100-xid79-gpu3.json", set(Context), set()),
])
def test_each_fault_is_judged_in_the_contexts_its_check_belongs_to(fixture, judged_in, not_judged_in):
    for context in judged_in:
        assert problems(run(fixture, context=context)), context
    for context in not_judged_in:
        assert problems(run(fixture, context=context)) == [], context


# --- job GPU selection ---------------------------------------------------------


def test_job_on_the_faulty_gpu_by_index_sees_the_fault():
    [f] = problems(run("h100-xid79-gpu3.json", context=Context.PROLOG, gpus=["2", "3"]))
    assert (f.check, f.gpu) == ("xid", 3)


def test_job_on_other_gpus_does_not_see_the_fault():
    assert run("h100-xid79-gpu3.json", context=Context.PROLOG, gpus=["0", "1"]).findings == ()


def test_job_gpus_given_as_uuids_select_by_uuid_in_any_case():
    snap = load("h100-xid79-gpu3.json")
    uuid3 = snap.gpu(3).uuid
    [f] = problems(run(snap, context=Context.PROLOG, gpus=[snap.gpu(0).uuid, uuid3.upper()]))
    assert (f.check, f.gpu) == ("xid", 3)
    assert run(snap, context=Context.PROLOG, gpus=[snap.gpu(0).uuid]).findings == ()


def test_select_gpus_maps_indexes_and_uuids_and_reports_the_missing():
    snap = load("h100-7-of-8-visible.json")
    gone = load("h100-healthy.json").gpu(4).uuid
    assert engine.select_gpus(snap, ["0", snap.gpu(5).uuid, "0", "9", gone, "bogus", " "]) == (
        (0, 5), ["9", gone, "bogus"], [])


def test_a_job_gpu_index_that_is_not_on_the_node_asks_for_a_reboot():
    report = run("h100-healthy.json", context=Context.PROLOG, gpus=["7", "8"])
    assert report.findings == (
        Finding("gpu-count", Severity.FAIL, Action.REBOOT, "job GPU 8 is not visible on this node", None,
                "GPU 8 missing"),
    )


def test_a_job_gpu_uuid_that_fell_off_the_bus_is_missing():
    gone = load("h100-healthy.json").gpu(4).uuid
    findings = problems(run("h100-7-of-8-visible.json", context=Context.PROLOG, gpus=[gone]))
    assert [f.message for f in findings] == [f"job GPU {gone} is not visible on this node",
                                             "7 GPUs visible, 8 expected"]


@pytest.mark.parametrize("value, expected", [
    (None, None), ("", None), ("NoDevFiles", None), ("0,3", ["0", "3"]), (" 1 , 2 ,", ["1", "2"]),
    ("GPU-6e4fbadc-10d9-a63a-8988-9a0d320ff1a0", ["GPU-6e4fbadc-10d9-a63a-8988-9a0d320ff1a0"]),
])
def test_parse_gpu_list_reads_slurm_job_gpus_and_cuda_visible_devices(value, expected):
    assert engine.parse_gpu_list(value) == expected


def test_epilog_ignores_xids_the_prolog_baseline_already_had():
    snap = load("h100-xid79-gpu3.json")
    assert run(snap, context=Context.EPILOG, baseline=snap).findings == ()
    assert [f.check for f in run(snap, context=Context.EPILOG, baseline=load("h100-healthy.json")).findings] == ["xid"]
    # The periodic check has no baseline to subtract.
    assert [f.check for f in run(snap, context=Context.CHECK, baseline=snap).findings] == ["xid"]


# --- the engine never raises ----------------------------------------------------


def _boom(inp):
    raise RuntimeError("field 'ecc' is not a number")


def _xid_check():
    return next(c for c in REGISTRY if c.name == "xid")


def test_a_check_that_raises_becomes_a_fail_finding_and_the_others_still_run():
    report = run("h100-xid79-gpu3.json", checks=[Check("boom", _boom), _xid_check()])
    assert [(f.check, f.severity, f.action) for f in report.findings] == [
        ("boom", Severity.FAIL, Action.DRAIN), ("xid", Severity.FAIL, Action.REBOOT)]
    assert report.findings[0].message == "check crashed: RuntimeError: field 'ecc' is not a number"
    assert report.findings[0].summary == "check boom crashed"


def test_a_crashing_check_takes_the_configured_action():
    report = run("h100-healthy.json", checks=[Check("boom", _boom)], on_check_error=Action.WARN)
    [f] = report.findings
    assert (f.severity, f.action) == (Severity.FAIL, Action.WARN)
    assert report.drain_findings() == ()


def test_a_check_that_crashes_halfway_keeps_what_it_found():
    def half(inp):
        yield Finding("half", Severity.WARN, Action.WARN, "first", 0)
        raise KeyError("gpu")

    report = run("h100-healthy.json", checks=[Check("half", half)])
    assert [(f.check, f.message) for f in report.findings] == [("half", "first"), ("half", "check crashed: KeyError: 'gpu'")]


def test_crashed_check_summaries_are_deduplicated_in_the_drain_reason():
    report = run("h100-xid79-gpu3.json", checks=[_xid_check(), Check("boom", _boom), Check("boom", _boom)])
    assert engine.drain_summary(report) == "XID 79 on GPU 3; check boom crashed"


class RaisingProbe:
    name = "nvml"

    def snapshot(self):
        raise RuntimeError("NVML_ERROR_DRIVER_NOT_LOADED")


def test_a_probe_that_raises_gives_one_fail_finding():
    report = engine.run(RaisingProbe(), "gpu017", engine.JudgeRequest(H100, Context.CHECK, deadline_s=5))
    assert report.findings == (
        Finding("gpu-probe", Severity.FAIL, Action.DRAIN, "cannot read GPUs: RuntimeError: NVML_ERROR_DRIVER_NOT_LOADED",
                None, "GPU probe failed", scope=Scope.NODE, urgency=Urgency.JOB_END),
    )


def test_a_node_level_probe_error_is_one_finding_even_when_gpu_count_is_not_run():
    snap = NodeSnapshot("gpu017", "nvml", error="NVML: driver/library version mismatch")
    report = run(snap, context=Context.WATCH)
    assert [(f.check, f.message) for f in report.findings] == [
        ("gpu-probe", "cannot read GPUs: NVML: driver/library version mismatch")]


class HangingProbe:
    name = "nvml"

    def __init__(self):
        self.release = threading.Event()

    def snapshot(self):
        self.release.wait(10)
        return load("h100-healthy.json")


def test_a_probe_that_hangs_past_probe_timeout_is_a_fail_did_not_answer():
    probe = HangingProbe()
    started = time.monotonic()
    try:
        report = engine.run(probe, "gpu017", engine.JudgeRequest(H100, Context.PROLOG, deadline_s=30, probe_timeout_s=0.2))
    finally:
        probe.release.set()
    assert time.monotonic() - started < 5
    [f] = report.findings
    assert (f.check, f.severity, f.action) == ("gpu-probe", Severity.FAIL, Action.DRAIN)
    assert "did not answer within 0.2s" in f.message
    assert not report.healthy


def test_a_probe_that_hangs_for_the_whole_deadline_is_one_did_not_answer_finding():
    probe = HangingProbe()
    try:
        report = engine.run(probe, "gpu017", engine.JudgeRequest(H100, Context.CHECK, deadline_s=0.3))  # probe timeout = deadline
    finally:
        probe.release.set()
    [f] = report.findings
    assert (f.check, f.severity, f.action) == ("gpu-probe", Severity.FAIL, Action.DRAIN)
    assert "did not answer within 0.3s" in f.message


def test_checks_after_the_deadline_are_reported_as_not_run():
    def slow(inp):
        time.sleep(0.3)
        return ()

    report = run("h100-xid79-gpu3.json", deadline_s=0.2, checks=[Check("slow", slow), _xid_check()])
    assert [(f.check, f.severity, f.action, f.message) for f in report.findings] == [
        ("xid", Severity.FAIL, Action.DRAIN, "not run: deadline of 0.2s passed")]


# --- drain reasons -----------------------------------------------------------------


def test_drain_summary_lists_the_worst_first():
    snap = load("h100-pcie-x8-gpu4.json")
    snap = replace_gpu(snap, 3, xids=load("h100-xid79-gpu3.json").gpu(3).xids)
    report = run(snap)
    assert engine.drain_summary(report) == "XID 79 on GPU 3; PCIe x8 on GPU 4"
    assert format_reason(engine.drain_summary(report), report.worst_action) == \
        "slurm-hooks: XID 79 on GPU 3; PCIe x8 on GPU 4 [reboot]"


def test_drain_summary_leaves_out_warnings():
    report = run("h100-thermal-96c-gpu7.json")
    assert engine.drain_summary(report) == "GPU 7 at 96 C"


def test_a_long_drain_reason_is_cut_to_fit_and_keeps_its_action():
    report = run("h100-fabric-not-started.json")
    reason = format_reason(engine.drain_summary(report), report.worst_action)
    assert len(reason) <= 120
    assert reason.startswith("slurm-hooks: fabric not_started on GPU 0; ")
    assert reason.endswith("... [drain]")
    summary, action = parse_reason(reason)
    assert action is Action.DRAIN and summary.endswith("...")


def test_format_reason_replaces_control_characters():
    assert format_reason("XID 79\non GPU 3\t", Action.REPLACE) == "slurm-hooks: XID 79 on GPU 3 [replace]"


@pytest.mark.parametrize("reason, parsed", [
    ("slurm-hooks: GPU 5 lost [replace]", ("GPU 5 lost", Action.REPLACE)),
    ("slurm-hooks: written by an older version", ("written by an older version", None)),
    ("slurm-hooks: tag [bogus]", ("tag [bogus]", None)),
    ("maintenance by bob", None),
    ("Prolog error", None),
    ("slurm-operator: node cordoned", None),
])
def test_parse_reason_reads_only_our_reasons(reason, parsed):
    assert parse_reason(reason) == parsed


def test_findings_and_reports_survive_json():
    report = run("h100-xid79-gpu3.json")
    data = json.loads(json.dumps(report.to_dict()))
    assert [Finding.from_dict(f) for f in data["findings"]] == list(report.findings)
    assert (data["healthy"], data["action"], data["context"]) == (False, "reboot", "check")


def test_actions_are_ordered_from_harmless_to_most_disruptive():
    order = [Action.NONE, Action.WARN, Action.DRAIN, Action.RESET, Action.REBOOT, Action.REPLACE]
    assert sorted(Action, key=lambda a: a.rank) == order
    assert [a.takes_node_out for a in order] == [False, False, True, True, True, True]


def test_the_report_names_the_checks_that_ran():
    names = [c.name for c in for_context(Context.CHECK)]
    assert run("h100-healthy.json").checks_run == ("gpu-probe", *(n for n in names if n != "dcgm"))  # no diag run
    diag = DcgmResult(1, True, True, (), "")
    with_diag = run("h100-healthy.json", expect=dataclasses.replace(H100, dcgm_level_check=1),
                    dcgm=lambda level, timeout: diag)
    assert with_diag.checks_run == ("gpu-probe", *names)
    assert run(NodeSnapshot("gpu017", "nvml", error="NVML down")).checks_run == ("gpu-probe",)


def test_if_idle_judges_what_is_left_on_every_gpu_apart_from_the_verdict():
    snap = replace_gpu(load("h100-healthy.json"), 6, processes=(GpuProcess(4242, 1024, "python3"),))
    report = run(snap, context=Context.CHECK, if_idle=True)
    assert report.healthy and "leftover" not in {f.check for f in report.findings}
    assert [(f.check, f.gpu, f.message) for f in report.if_idle] == [
        ("leftover", 6, "1 process(es) left after the job (pid 4242)")]
    assert run(snap, context=Context.CHECK).if_idle == ()
