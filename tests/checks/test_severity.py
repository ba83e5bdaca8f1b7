"""The severity table: scope and urgency of every finding, the driver's verdict, config overrides,
the drain reason's urgency, the job GPU indexes Slurm gives, and the README's generated table."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest
from fakes import FakeNvml
from paths import ROOT
from test_checks import H100, load, run

from slurm_hooks import config, engine
from slurm_hooks.checks.recovery import verdict_from_text
from slurm_hooks.errors import ConfigError
from slurm_hooks.models import Action, Context, Finding, Scope, Severity, Urgency, XidEvent
from slurm_hooks.probes.nvml import NvmlProbe
from slurm_hooks.severity import CHECK_RULES, Severities
from slurm_hooks.slurm import format_reason, parse_reason, waits_for_job_end
from slurm_hooks.slurm.scontrol import parse_job_gpus
from slurm_hooks.xid.catalog import lookup


def gpu(snap, index, **changes):
    return dataclasses.replace(snap, gpus=tuple(dataclasses.replace(g, **changes) if g.index == index else g
                                                for g in snap.gpus))


def test_catalogue_defaults_xid79_and_48_now_on_their_gpu_63_and_92_at_job_end_13_watched():
    assert (lookup(79).scope, lookup(79).urgency) == (Scope.GPU, Urgency.NOW)
    assert (lookup(48).scope, lookup(48).urgency) == (Scope.GPU, Urgency.NOW)
    assert (lookup(95).urgency, lookup(94).urgency) == (Urgency.NOW, Urgency.WATCH)
    assert lookup(63).urgency is lookup(92).urgency is Urgency.JOB_END
    assert lookup(13).urgency is Urgency.WATCH
    assert lookup(45).scope is Scope.NODE  # "Solo: RESTART_FM": the fabric manager is the node's


def test_row_remap_pending_is_job_end_on_its_gpu_and_a_remap_failure_acts_now():
    report = run(gpu(load("h100-healthy.json"), 6, row_remap_pending=True))
    [f] = report.drain_findings()
    assert (f.scope, f.urgency, f.gpu) == (Scope.GPU, Urgency.JOB_END, 6)
    assert not report.urgent() and report.requeue_gpus() == frozenset()
    report = run(gpu(load("h100-healthy.json"), 6, row_remap_failure=True))
    assert report.urgent() and report.requeue_gpus() == frozenset({6})


def test_a_finding_tied_to_no_gpu_is_node_scope_and_requeues_every_job():
    report = run(load("h100-7-of-8-visible.json"), dataclasses.replace(H100, gpus=8))
    assert report.requeue_gpus() is None


def test_an_unreadable_node_drains_at_job_end_and_requeues_nothing():
    report = engine.judge(dataclasses.replace(load("h100-healthy.json"), error="NVML down"),
                          engine.JudgeRequest(H100, Context.CHECK, deadline_s=5))
    assert report.drain_findings() and report.requeue_gpus() == frozenset()


def test_config_override_changes_urgency_scope_and_action():
    sev = config.parse('[severity.xid.79]\nurgency = "job-end"\n[severity.check.row-remap]\n'
                       'urgency = "now"\nscope = "node"\n[severity.xid.92]\naction = "reset"\n').severities
    snap = gpu(load("h100-xid79-gpu3.json"), 6, row_remap_pending=True)
    report = run(snap, severities=sev)
    by = {f.check: f for f in report.findings}
    assert by["xid"].urgency is Urgency.JOB_END and by["row-remap"].scope is Scope.NODE
    assert report.requeue_gpus() is None
    sbe = XidEvent(92, gpu=1, source="sim", seq=1)
    report = run(gpu(load("h100-healthy.json"), 1, xids=(sbe,)), severities=sev)
    [f] = report.findings
    assert (f.action, f.severity, f.urgency) == (Action.RESET, Severity.FAIL, Urgency.JOB_END)


def test_watch_urgency_takes_nothing_out():
    sev = Severities({"xid.79": {"urgency": "watch"}})
    report = run("h100-xid79-gpu3.json", severities=sev)
    assert report.findings and not report.drain_findings() and report.worst_action is Action.REBOOT


@pytest.mark.parametrize("text, line, what", [
    ('[severity.xid.79]\nurgency = "soon"\n', 2, "must be one of now, job-end, watch"),
    ('[severity.xid.x79]\nurgency = "now"\n', 1, "XID must be a number"),
    ('\n[severity.check.row-remapp]\nurgency = "now"\n', 2, "unknown check rule"),
    ('[severity.check.ecc]\nwhen = "now"\n', 2, "unknown key (known: scope, urgency, action)"),
    ('[severity.check.ecc]\naction = "explode"\n', 2, "must be one of none, warn"),
    ('[severity.gpu.1]\nurgency = "now"\n', 1, "unknown table"),
])
def test_bad_severity_override_is_one_error_with_file_and_line(text, line, what):
    with pytest.raises(ConfigError) as err:
        config.parse(text, "/etc/slurm-hooks/config.toml")
    assert str(err.value).startswith(f"/etc/slurm-hooks/config.toml:{line}: ") and what in str(err.value)


def test_reason_says_at_job_end_and_still_parses_to_its_action():
    reason = format_reason("row remap pending on GPU 6", Action.RESET, at_job_end=True)
    assert reason == "slurm-hooks: row remap pending on GPU 6 [reset, at job end]"
    assert parse_reason(reason) == ("row remap pending on GPU 6", Action.RESET)
    assert waits_for_job_end(reason) and not waits_for_job_end("slurm-hooks: XID 79 on GPU 3 [replace]")
    long = format_reason("x" * 300, Action.REBOOT, at_job_end=True)
    assert len(long) <= 120 and parse_reason(long)[1] is Action.REBOOT


@pytest.mark.parametrize("text, node, want", [
    ("JobId=7 JobName=a UserId=u(1) JOB_GRES=gpu:2   Nodes=n1 CPU_IDs=0 Mem=0 GRES=gpu:2(IDX:0-1) MinCPUsNode=1",
     "n1", (0, 1)),
    ("JobId=7 JOB_GRES=gpu:6   Nodes=n1 CPU_IDs=2 Mem=0 GRES=gpu:3(IDX:3-5)   Nodes=n2 CPU_IDs=0 Mem=0 "
     "GRES=gpu:3(IDX:0-2) MinCPUsNode=1", "n2", (0, 1, 2)),
    ("     Nodes=gpu[001-002] CPU_IDs=0-7 Mem=0 GRES=gpu:a100:2(IDX:0,3),gpu:h100:1(IDX:6),nic:1(IDX:0)",
     "gpu002", (0, 3, 6)),
    ("     Nodes=n1 CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:N/A)", "n1", None),
    ("     Nodes=n1 CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:3)", "n2", None),
    ("JobId=7 JobName=wrap JobState=RUNNING", "n1", None),
])
def test_job_gpu_indexes_from_literal_scontrol_lines(text, node, want):
    assert parse_job_gpus(text, node) == want


def test_nvml_recovery_action_read_where_the_driver_has_it_and_absent_is_no_error():
    fake = FakeNvml.healthy(gpus=2)
    snap = NvmlProbe("n1", kmsg_path="/nonexistent", nvml=fake).snapshot()
    assert [g.recovery_action for g in snap.gpus] == ["none", "none"]
    fake.set(0, recovery_action=None)  # a driver before 565: the field is unknown
    snap = NvmlProbe("n1", kmsg_path="/nonexistent", nvml=fake).snapshot()
    assert snap.gpus[0].recovery_action is None and not snap.gpus[0].errors
    fake.set(1, recovery_action=2)
    snap = NvmlProbe("n1", kmsg_path="/nonexistent", nvml=fake).snapshot()
    assert snap.gpus[1].recovery_action == "node_reboot"
    fake.remove("nvmlDeviceGetFieldValues")
    snap = NvmlProbe("n1", kmsg_path="/nonexistent", nvml=fake).snapshot()
    assert snap.gpus[1].recovery_action is None and not snap.gpus[1].errors


def test_the_drivers_verdict_raises_the_action():
    report = run(gpu(load("h100-healthy.json"), 2, recovery_action="node_reboot"))
    [f] = report.drain_findings()
    assert (f.check, f.action, f.scope, f.urgency) == ("recovery-action", Action.REBOOT, Scope.NODE, Urgency.NOW)
    report = run(gpu(load("h100-healthy.json"), 2, recovery_action="drain_and_reset"))
    assert report.drain_findings()[0].urgency is Urgency.JOB_END


def test_xid154_text_names_the_verdict():
    assert verdict_from_text("GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)") \
        == "node_reboot"
    assert verdict_from_text("GPU recovery action changed from 0x2 (Node Reboot Required) to 0x0 (None)") == "none"
    event = XidEvent(154, gpu=4, source="sim", seq=9, message="changed from 0x0 (None) to 0x1 (GPU Reset Required)")
    report = run(gpu(load("h100-healthy.json"), 4, xids=(event,)))
    assert [(f.rule, f.action) for f in report.drain_findings()] == [("driver-reset", Action.RESET)]


def test_each_check_rule_names_the_worst_action_its_check_gives():
    """The table's action column is what the checks suggest (a check's own literal is tested there)."""
    snap = load("h100-healthy.json")
    faults = {
        "row-remap": dict(row_remap_pending=True), "row-remap-failure": dict(row_remap_failure=True),
        "retired-pages": dict(retired_pages_pending=True), "ecc": dict(ecc_volatile_uncorrectable=1),
        "gpu-lost": dict(lost=True), "gpu-reset-required": dict(needs_reset=True), "thermal": dict(temperature_c=120),
        "driver-reset": dict(recovery_action="gpu_reset"), "driver-reboot": dict(recovery_action="node_reboot"),
    }
    for rule, change in faults.items():
        found = [f for f in run(gpu(snap, 0, **change)).findings if f.rule_key == rule]
        assert found and max(f.action.rank for f in found) == CHECK_RULES[rule].action.rank, rule


def test_readme_table_is_generated_from_the_code():
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "gen_severity_table.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, "regenerate: python tools/gen_severity_table.py"


def test_finding_round_trips_with_scope_urgency_and_rule():
    f = Finding("xid", Severity.FAIL, Action.REPLACE, "m", 3, "s", scope=Scope.GPU, urgency=Urgency.JOB_END,
                rule="xid.79")
    assert Finding.from_dict(f.to_dict()) == f
