"""Remediation through the hooks: drain with an owned reason, requeue, follow, resume.

Simulated GPUs (the real sim backend, from the config) and the shared in-memory
Slurm (tests/fakes/slurm.py), which records every call.
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pynvml
import pytest
from fakes import FakeNvml
from fakes.config import nvml_wiring, sim_config, sim_node
from fakes.slurm import FakeSlurm

from slurm_hooks import config
from slurm_hooks.errors import PermanentError, TransientError
from slurm_hooks.hooks import healthcheck, jobhooks
from slurm_hooks.hooks.watch import Watcher
from slurm_hooks.models import NodeSnapshot, snapshot_from_dict
from slurm_hooks.observe.audit import AuditLog
from slurm_hooks.probes import sim
from slurm_hooks.remedy import drain, follower
from slurm_hooks.remedy.outcome import Outcome
from slurm_hooks.remedy.requeue import requeue_jobs
from slurm_hooks.remedy.wiring import Wiring

XID79_REASON = "slurm-hooks: XID 79 on GPU 3 [reboot]"
SOCKET_TIMEOUT = TransientError("slurm_update error: Socket timed out on send/recv operation")


@pytest.fixture
def t(tmp_path):
    cfg = sim_config(tmp_path, "[expect]\ngpus = 8")
    slurm, w = sim_node(cfg, "IDLE")
    return SimpleNamespace(w=w, cfg=cfg, slurm=slurm, sim_dir=cfg.gpu.sim_dir, audit=w.audit, tmp=tmp_path)


def inject(t, gpu, **fault):
    sim.inject(t.sim_dir, "n1", gpu, **fault)


def check(t):
    return healthcheck.run(t.w, follow="none")


def records(t, kind=None, **match):
    return [r for r in t.audit.read()
            if (kind is None or r["kind"] == kind) and all(r.get(k) == v for k, v in match.items())]


def steps(t, action):
    return [(r["target"], r["result"]) for r in records(t, "action", action=action)]


def drained_by_us(t):
    inject(t, 3, xid=79)
    report, outcome = check(t)
    assert outcome.drained and os.path.exists(t.w.drained_marker())
    return report


# --- drain ---------------------------------------------------------------------------


def test_xid79_on_gpu3_drains_with_our_reason_and_writes_the_audit(t):
    inject(t, 3, xid=79)
    report, outcome = check(t)
    assert (outcome.drained, outcome.failed) == (True, [])
    node = t.slurm.peek("n1")
    assert (node.state, node.reason) == ("IDLE+DRAIN", XID79_REASON)
    assert t.slurm.called("drain") == [("drain", "n1", XID79_REASON)]
    [alert] = records(t, "alert")
    assert (alert["node"], alert["context"], alert["gpu"], alert["check"], alert["action"]) == (
        "n1", "check", 3, "xid", "reboot")
    assert alert["message"] == "XID 79 (GPU has fallen off the bus)"
    [drain] = records(t, "action", action="drain")
    assert (drain["target"], drain["result"], drain["reason"]) == ("n1", "ok", XID79_REASON)
    assert drain["duration_s"] >= 0
    assert os.path.exists(t.w.drained_marker())


def test_an_alert_names_its_gpu_by_uuid_serial_and_bus_id_for_the_rma_list(t):
    inject(t, 3, xid=79)
    report, _ = check(t)
    [alert] = records(t, "alert")
    gpu = report.snapshot.gpu(3)
    assert gpu.serial and gpu.uuid
    assert (alert["uuid"], alert["serial"], alert["pci_bus_id"]) == (gpu.uuid, gpu.serial, gpu.pci_bus_id)


def test_a_node_already_drained_with_our_reason_is_not_drained_again(t):
    drained_by_us(t)
    _, outcome = check(t)
    assert outcome.drained
    assert len(t.slurm.called("drain")) == 1
    assert steps(t, "drain") == [("n1", "ok"), ("n1", "already")]


def test_a_new_fault_replaces_our_own_older_reason(t):
    drained_by_us(t)
    inject(t, 5, ecc_uncorrectable=2)
    check(t)
    assert t.slurm.peek("n1").reason == "slurm-hooks: XID 79 on GPU 3; ECC uncorrectable 2 on GPU 5 [reboot]"


def test_drain_disabled_in_config_records_alerts_and_calls_no_slurm(t, tmp_path):
    cfg = config.parse(f'[gpu]\nbackend = "sim"\nsim_dir = "{t.sim_dir}"\n[state]\ndir = "{tmp_path}/s"\n'
                       '[check]\ndrain = false\n')
    w = Wiring(cfg, "n1", t.audit, slurm_override=t.slurm)
    inject(t, 3, xid=79)
    report, outcome = healthcheck.run(w, follow="none")
    assert not report.healthy and not outcome.drained
    assert t.slurm.calls == []
    assert [r["check"] for r in records(t, "alert")] == ["xid"]


def test_dry_run_neither_acts_nor_audits(t):
    inject(t, 3, xid=79)
    report, outcome = healthcheck.run(t.w, dry_run=True, follow="none")
    assert not report.healthy
    assert (t.slurm.calls, list(t.audit.read())) == ([], [])


@pytest.mark.parametrize("state, reason", [
    ("IDLE+DRAIN", "maintenance by bob"),
    ("MIXED+DRAIN", "Prolog error"),
    ("IDLE+DRAIN", "Epilog error"),
    ("MIXED+DRAIN", "Kill task failed"),
    ("IDLE+DRAIN", "slurm-operator: node cordoned by kubectl"),
])
def test_someone_elses_drain_is_never_overwritten(t, state, reason):
    t.slurm.set_node("n1", state=state, reason=reason)
    inject(t, 3, xid=79)
    _, outcome = check(t)
    assert not outcome.drained
    assert t.slurm.called("drain") == []
    assert (t.slurm.peek("n1").state, t.slurm.peek("n1").reason) == (state, reason)
    [skipped] = records(t, "action", action="drain")
    assert skipped["result"] == "skipped"
    assert skipped["detail"] == f"already drained by someone else: {reason!r}"
    assert not os.path.exists(t.w.drained_marker())


def test_someone_elses_drain_is_never_resumed(t):
    t.slurm.set_node("n1", state="IDLE+DRAIN", reason="maintenance by bob")
    inject(t, 3, xid=79)
    check(t)
    sim.clear(t.sim_dir, "n1")
    _, outcome = check(t)
    assert not outcome.resumed
    assert t.slurm.called("resume") == []
    assert t.slurm.peek("n1").reason == "maintenance by bob"


def test_a_node_we_drained_and_an_admin_then_took_over_is_not_resumed(t):
    drained_by_us(t)
    t.slurm.set_node("n1", reason="maintenance by bob: replacing GPU 3")
    sim.clear(t.sim_dir, "n1")
    _, outcome = check(t)
    assert not outcome.resumed
    assert t.slurm.called("resume") == []
    assert steps(t, "resume") == [("n1", "skipped")]
    assert not os.path.exists(t.w.drained_marker())


# --- resume ----------------------------------------------------------------------------


def test_a_healthy_node_we_drained_is_resumed(t):
    drained_by_us(t)
    sim.clear(t.sim_dir, "n1")
    _, outcome = check(t)
    assert outcome.resumed
    assert t.slurm.called("resume") == [("resume", "n1")]
    assert (t.slurm.peek("n1").state, t.slurm.peek("n1").reason) == ("IDLE", "")
    [resume] = records(t, "action", action="resume")
    assert (resume["result"], resume["reason"]) == ("ok", XID79_REASON)
    assert not os.path.exists(t.w.drained_marker())


def test_a_healthy_node_asks_slurm_at_most_once_an_hour(t):
    report, outcome = check(t)
    assert report.healthy
    assert t.slurm.calls == [("node", "n1")]  # is a drain of ours left that we lost the record of?
    for _ in range(3):
        check(t)
    assert t.slurm.calls == [("node", "n1")]
    assert list(t.audit.read()) == []


def test_our_drain_without_our_marker_is_resumed_once_healthy(t):
    # The state dir was lost (slurmd pod restarted, node reimaged): Slurm still says it was us.
    t.slurm.set_node("n1", state="IDLE+DRAIN", reason=XID79_REASON)
    _, outcome = check(t)
    assert outcome.resumed
    assert t.slurm.called("resume") == [("resume", "n1")]


def test_a_dcgm_drain_without_our_marker_waits_for_a_person(t):
    t.slurm.set_node("n1", state="IDLE+DRAIN", reason="slurm-hooks: DCGM diag L2 failed on GPU 3 [reset]")
    _, outcome = check(t)
    assert not outcome.resumed and t.slurm.called("resume") == []


def test_a_newer_drain_of_ours_than_our_record_is_not_resumed(t):
    # Drained for heat, then the epilog's DCGM diagnostic drained it again and its record was
    # not written (full disk): our record still says thermal, the node says DCGM.
    thermal = "slurm-hooks: GPU 3 at 95 C [drain]"
    dcgm = "slurm-hooks: DCGM diag L2 failed on GPU 3 [reset]"
    t.slurm.set_node("n1", state="IDLE+DRAIN", reason=dcgm)
    os.makedirs(os.path.dirname(t.w.drained_marker()), exist_ok=True)
    with open(t.w.drained_marker(), "w") as fh:
        json.dump({"ts": 1.0, "reason": thermal, "xids": [], "context": "check", "checks": ["thermal"]}, fh)
    _, outcome = check(t)
    assert not outcome.resumed and t.slurm.called("resume") == []
    [skipped] = records(t, "action", action="resume")
    assert skipped["result"] == "skipped" and thermal in skipped["detail"] and skipped["reason"] == dcgm


def test_an_unreadable_record_resumes_only_through_what_slurm_says(t):
    # A corrupt record names no reason: Slurm's is taken, and a DCGM drain waits for a person.
    t.slurm.set_node("n1", state="IDLE+DRAIN", reason="slurm-hooks: DCGM diag L2 failed on GPU 3 [reset]")
    os.makedirs(os.path.dirname(t.w.drained_marker()), exist_ok=True)
    with open(t.w.drained_marker(), "w") as fh:
        fh.write("{torn")
    _, outcome = check(t)
    assert not outcome.resumed and t.slurm.called("resume") == []


def test_an_unreadable_record_of_a_mended_xid_drain_is_resumed_after_asking_slurm(t):
    t.slurm.set_node("n1", state="IDLE+DRAIN", reason=XID79_REASON)
    os.makedirs(os.path.dirname(t.w.drained_marker()), exist_ok=True)
    with open(t.w.drained_marker(), "w") as fh:
        fh.write("{torn")
    _, outcome = check(t)
    assert outcome.resumed and t.slurm.called("resume") == [("resume", "n1")]


def test_a_node_resumed_by_someone_else_only_loses_our_marker(t):
    drained_by_us(t)
    sim.clear(t.sim_dir, "n1")
    t.slurm.set_node("n1", state="IDLE", reason="")
    _, outcome = check(t)
    assert not outcome.resumed
    assert t.slurm.called("resume") == []
    assert not os.path.exists(t.w.drained_marker())


def test_an_idle_drained_node_with_leftover_gpu_processes_is_not_resumed(t):
    jobhooks.prolog(t.w, {"SLURM_JOB_ID": "700", "SLURM_JOB_GPUS": "2"})
    inject(t, 2, process=31337)
    assert jobhooks.epilog(t.w, {"SLURM_JOB_ID": "700", "SLURM_JOB_GPUS": "2"}) == 0
    assert t.slurm.peek("n1").state == "IDLE+DRAIN"
    report, outcome = check(t)  # the periodic check does not judge processes: healthy
    assert report.healthy and not outcome.resumed
    assert t.slurm.called("resume") == []
    [skipped] = records(t, "action", action="resume")
    assert skipped["result"] == "skipped"
    assert skipped["detail"] == "still 1 process(es) left after the job (pid 31337) on an idle node"
    sim.clear(t.sim_dir, "n1", 2)
    _, outcome = check(t)
    assert outcome.resumed


def test_processes_of_running_jobs_do_not_keep_a_mended_node_drained(t):
    t.slurm.set_node("n1", state="MIXED")
    drained_by_us(t)
    assert t.slurm.peek("n1").state == "MIXED+DRAIN"
    sim.clear(t.sim_dir, "n1")
    inject(t, 0, process=4242)  # a job still running on GPU 0
    _, outcome = check(t)
    assert outcome.resumed


def test_an_admin_resume_acknowledges_the_xids_we_drained_for(t):
    drained_by_us(t)
    t.slurm.set_node("n1", state="IDLE", reason="")  # scontrol update state=resume, GPU reset by hand
    report, outcome = check(t)  # XID 79 is still in the (simulated) kernel log
    assert report.healthy and not outcome.drained
    assert len(t.slurm.called("drain")) == 1
    [ack] = records(t, "action", action="ack-xids")
    assert ack["result"] == "ok"
    inject(t, 3, xid=79)  # a new event is a new fault
    _, outcome = check(t)
    assert outcome.drained


def test_an_admin_resume_does_not_hide_faults_that_are_state(t):
    inject(t, 5, ecc_uncorrectable=2)
    check(t)
    t.slurm.set_node("n1", state="IDLE", reason="")
    _, outcome = check(t)
    assert outcome.drained
    assert t.slurm.peek("n1").reason == "slurm-hooks: ECC uncorrectable 2 on GPU 5 [reset]"


# --- jobs ----------------------------------------------------------------------------------


def test_batch_jobs_are_requeued_and_the_others_skipped_with_a_reason(t):
    t.slurm.set_node("n1", state="MIXED")
    t.slurm.add_job(101, "n1")
    t.slurm.add_job(102, "n1", batch=False, name="interactive")
    t.slurm.add_job(103, "n1", requeue=False)
    t.slurm.add_job(104, "n2")
    inject(t, 3, xid=79)
    _, outcome = check(t)
    assert outcome.requeued == ["101"]
    assert t.slurm.called("requeue") == [("requeue", 101)]
    by_job = {r["target"]: r for r in records(t, "action", action="requeue")}
    assert by_job["101"]["result"] == "ok"
    assert (by_job["102"]["result"], by_job["102"]["detail"]) == (
        "skipped", "interactive job (srun/salloc) cannot be requeued; it will fail with the node")
    assert "104" not in by_job
    assert outcome.ok


def test_a_no_requeue_job_is_left_running_with_a_warning_not_a_failure(t):
    t.slurm.add_job(103, "n1", requeue=False)
    inject(t, 3, xid=79)
    _, outcome = check(t)
    assert outcome.drained and outcome.ok and outcome.requeued == []
    assert t.slurm.called("requeue") == [] and t.slurm.called("signal") == []
    [rec] = records(t, "action", action="requeue")
    assert (rec["target"], rec["result"], rec["level"]) == ("103", "not requeued", "warning")
    assert rec["detail"].startswith("not requeued: --no-requeue") and "left running on the drained node" in rec["detail"]
    assert t.slurm.peek_job(103).state == "RUNNING"


def test_one_array_task_is_requeued_and_followed_by_its_task_ref_never_the_array_id(t):
    # Array 100: the task carrying the array's id (unique id 100 = 100_3) runs here; 101 (100_0) elsewhere.
    t.slurm.add_job(100, "n1", array_job_id=100, array_task_id="3")
    t.slurm.add_job(101, "n2", array_job_id=100, array_task_id="0")
    t.slurm.job_states(100, ["RUNNING", "PENDING"], reason="BeginTime")
    inject(t, 3, xid=79)
    _, outcome = healthcheck.run(t.w, follow="inline")
    assert outcome.requeued == ["100_3"]
    assert t.slurm.called("requeue") == [("requeue", "100_3")]
    assert t.slurm.called("start_now") == [("start_now", "100_3")]
    assert t.slurm.peek_job(101).state == "RUNNING" and t.slurm.peek_job(101).restarts == 0


def test_a_het_job_is_requeued_once_through_its_leader(t):
    t.slurm.add_job(7, "n2", het_job_id=7)
    t.slurm.add_job(8, "n1", het_job_id=7)
    t.slurm.add_job(9, "n1", het_job_id=7)
    inject(t, 3, xid=79)
    _, outcome = check(t)
    assert outcome.requeued == ["7"]
    assert t.slurm.called("requeue") == [("requeue", 7)]


@pytest.mark.parametrize("state", ["COMPLETING", "COMPLETED"])
def test_a_completing_or_finished_job_is_never_requeued(t, state):
    t.slurm.add_job(101, "n1", state=state)
    listed = [j.job_id for j in t.slurm.jobs_on_node("n1")]
    inject(t, 3, xid=79)
    _, outcome = check(t)
    assert t.slurm.called("requeue") == [] and outcome.ok
    if listed:  # the fake, like squeue -t, lists a COMPLETING job as on the node
        [rec] = records(t, "action", action="requeue")
        assert rec["result"] == "skipped" and "would run it again" in rec["detail"]


def test_a_multi_node_job_requeued_by_the_other_nodes_run_is_not_requeued_again(t):
    t.slurm.add_node("n2", "MIXED")
    t.slurm.add_job(101, "n[1-2]")
    t.slurm.requeue(101)  # the run on n2 got there first: the job is COMPLETING, its requeue under way
    t.slurm.calls.clear()
    inject(t, 3, xid=79)
    _, outcome = check(t)
    assert t.slurm.called("requeue") == [] and outcome.ok
    assert t.slurm.peek_job(101).restarts == 1


def test_requeue_disabled_in_config_leaves_jobs_alone(t, tmp_path):
    cfg = config.parse(f'[gpu]\nbackend = "sim"\nsim_dir = "{t.sim_dir}"\n[state]\ndir = "{tmp_path}/s"\n'
                       '[remediation]\nrequeue = false\n[repair]\nenabled = false\n')
    w = Wiring(cfg, "n1", t.audit, slurm_override=t.slurm)
    t.slurm.add_job(101, "n1")
    inject(t, 3, xid=79)
    _, outcome = healthcheck.run(w, follow="none")
    assert outcome.drained
    assert t.slurm.called("jobs_on_node") == [] and t.slurm.called("requeue") == []


def test_inline_follow_makes_the_requeued_job_start_now_once_pending(t):
    t.slurm.add_job(101, "n1")
    t.slurm.job_states(101, ["COMPLETING", "PENDING"], reason="BeginTime")
    inject(t, 3, xid=79)
    _, outcome = healthcheck.run(t.w, follow="inline")
    assert outcome.requeued == ["101"]
    assert [c[0] for c in t.slurm.calls if c[0] in ("requeue", "jobs", "release", "start_now")] == [
        "requeue", "jobs", "jobs", "start_now"]
    assert steps(t, "start_now") == [("101", "ok")]


def test_follow_releases_the_hold_our_prolog_refusal_caused_then_starts_it_now(t):
    t.slurm.add_job(101, "n1")
    t.slurm.job_states(101, ["COMPLETING", "COMPLETING", "PENDING"], reason="launch failed requeued held",
                       priority="0", restarts=1)
    results = follower.follow_requeued(t.w, [101], timeout=5, poll=0.01)
    assert results == {"101": "ok"}
    assert [c for c in t.slurm.calls if c[0] != "jobs"] == [("release", 101), ("start_now", 101)]
    assert len(t.slurm.called("jobs")) == 3
    assert steps(t, "release") == [("101", "ok")]
    assert steps(t, "start_now") == [("101", "ok")]


@pytest.mark.parametrize("reason, priority", [("JobHeldAdmin", "0"), ("JobHeldUser", "4294901759"),
                                              ("BeginTime", "0")])
def test_follow_never_releases_an_admins_or_users_hold_nor_a_priority_zero_job(t, reason, priority):
    t.slurm.add_job(101, "n1")
    t.slurm.job_states(101, ["PENDING"], reason=reason, priority=priority)
    assert follower.follow_requeued(t.w, [101], timeout=5, poll=0.01) == {"101": f"held: {reason}"}
    assert t.slurm.called("release") == [] and t.slurm.called("start_now") == []
    [rec] = records(t, "action", action="start_now")
    assert rec["result"] == "skipped" and "left held" in rec["detail"]


def test_follow_polls_all_its_jobs_in_one_call_and_stops_once_all_are_settled(t):
    for job_id in (101, 102, 103):
        t.slurm.add_job(job_id, "n1")
        t.slurm.job_states(job_id, ["COMPLETING", "PENDING"], reason="BeginTime")
    results = follower.follow_requeued(t.w, [101, 102, 103], timeout=30, poll=0.01)
    assert results == {"101": "ok", "102": "ok", "103": "ok"}
    assert t.slurm.called("jobs") == [("jobs", ("101", "102", "103"))] * 2
    assert t.slurm.called("job") == []


def test_follow_does_not_release_a_job_that_is_not_held(t):
    t.slurm.add_job(101, "n1")
    t.slurm.job_states(101, ["PENDING"], reason="BeginTime")
    assert follower.follow_requeued(t.w, [101], timeout=5, poll=0.01) == {"101": "ok"}
    assert t.slurm.called("release") == []


def test_follow_leaves_a_job_that_ended(t):
    t.slurm.add_job(101, "n1")
    t.slurm.job_states(101, ["COMPLETING", "CANCELLED by 1000"])
    assert follower.follow_requeued(t.w, [101], timeout=5, poll=0.01) == {"101": "ended CANCELLED by 1000"}
    assert t.slurm.called("start_now") == []
    [skipped] = records(t, "action", action="start_now")
    assert skipped["result"] == "skipped"


def test_follow_stops_when_the_job_already_runs_on_another_node(t):
    t.slurm.add_job(101, "n1")
    t.slurm.job_states(101, ["RUNNING"], nodes="n2", restarts=1)
    assert follower.follow_requeued(t.w, [101], timeout=5, poll=0.01) == {"101": "already running"}
    assert t.slurm.called("start_now") == []


def test_follow_stops_when_the_job_runs_on_a_node_whose_name_contains_ours(t):
    t.slurm.add_job(101, "n1")
    t.slurm.job_states(101, ["RUNNING"], nodes="n10", restarts=1)
    assert follower.follow_requeued(t.w, [101], timeout=0.5, poll=0.01) == {"101": "already running"}


def test_follow_gives_up_after_its_timeout_and_says_so(t):
    t.slurm.add_job(101, "n1")  # never leaves RUNNING on n1
    assert follower.follow_requeued(t.w, [101], timeout=0.3, poll=0.01) == {"101": "timed out"}
    [failed] = records(t, "action", action="start_now")
    assert (failed["result"], failed["error"]) == ("failed", "job not PENDING again within 0.3s")


def test_follow_handles_several_jobs_independently(t):
    for job_id in (101, 102, 103):
        t.slurm.add_job(job_id, "n1")
    t.slurm.job_states(101, ["PENDING"], reason="BeginTime")
    t.slurm.job_states(102, ["COMPLETING", "COMPLETED"])
    t.slurm.job_states(103, ["COMPLETING", "COMPLETING", "PENDING"], reason="BeginTime")
    results = follower.follow_requeued(t.w, [101, 102, 103], timeout=5, poll=0.01)
    assert results == {"101": "ok", "102": "ended COMPLETED", "103": "ok"}
    assert t.slurm.called("start_now") == [("start_now", 101), ("start_now", 103)]


def test_a_job_made_eligible_is_recorded_running_only_when_a_later_look_sees_it_run_elsewhere(t):
    """Made eligible (StartTime=now) is not running: 101 waits PENDING (Resources) after it; the look
    the follower makes anyway for 102 sees it running on n2, and only then is it recorded running."""
    for job_id in (101, 102):
        t.slurm.add_job(job_id, "n1")
    t.slurm.job_states(101, ["PENDING", "PENDING", "RUNNING"], reason="Resources", nodes="n2", restarts=1)
    t.slurm.job_states(102, ["COMPLETING", "COMPLETING", "COMPLETING", "PENDING"], reason="BeginTime")
    results = follower.follow_requeued(t.w, [101, 102], timeout=5, poll=0.01)
    assert results == {"101": "ok", "102": "ok"}
    done = [(r["action"], r["target"]) for r in t.audit.read() if r.get("kind") == "action"]
    assert done.index(("start_now", "101")) < done.index(("running", "101"))
    [running] = [r for r in t.audit.read() if r.get("action") == "running"]
    assert running["nodes"] == "n2"
    assert ("running", "102") not in done  # its look is over: never recorded as running unseen


# --- Slurm errors are recorded, never raised -----------------------------------------------


def test_a_failed_drain_is_recorded_as_a_failed_action_not_raised(t):
    t.slurm.fail("drain", SOCKET_TIMEOUT)
    inject(t, 3, xid=79)
    _, outcome = check(t)
    assert not outcome.drained
    assert outcome.failed == [f"drain: {SOCKET_TIMEOUT}"]
    [failed] = records(t, "action", action="drain")
    assert (failed["result"], failed["error"], failed["reason"]) == ("failed", str(SOCKET_TIMEOUT), XID79_REASON)
    assert not os.path.exists(t.w.drained_marker())
    t.slurm.fail("drain", None)
    _, outcome = check(t)  # the next run tries again
    assert outcome.drained


def test_a_drain_that_timed_out_but_took_effect_is_resumed_after_the_repair(t):
    inject(t, 3, xid=79)
    t.slurm.fail("drain", TransientError("scontrol timed out"))
    check(t)
    t.slurm.fail("drain", None)
    t.slurm.set_node("n1", state="IDLE+DRAIN", reason=XID79_REASON)  # slurmctld applied it after all
    _, outcome = check(t)
    assert outcome.drained and steps(t, "drain")[-1] == ("n1", "already")
    sim.clear(t.sim_dir, "n1")
    _, outcome = check(t)
    assert outcome.resumed


def test_an_unreachable_slurmctld_on_node_lookup_is_recorded(t):
    t.slurm.fail("node", TransientError("slurm_load_node error: Unable to contact slurm controller"))
    inject(t, 3, xid=79)
    _, outcome = check(t)
    assert outcome.failed[0] == "drain: slurm_load_node error: Unable to contact slurm controller"


def test_failing_to_list_jobs_is_recorded(t):
    t.slurm.fail("jobs_on_node", SOCKET_TIMEOUT)
    inject(t, 3, xid=79)
    _, outcome = check(t)
    assert outcome.drained
    assert outcome.failed == [f"list jobs: {SOCKET_TIMEOUT}"]
    assert steps(t, "requeue") == [("n1", "failed")]


def test_one_job_failing_to_requeue_does_not_stop_the_others(t):
    t.slurm.add_job(101, "n1")
    t.slurm.add_job(102, "n1")
    t.slurm.add_job(103, "n1", state="COMPLETED")  # ends while we look: not on the node any more
    t.slurm.fail("requeue", PermanentError("Job has already finished"), target=101)
    inject(t, 3, xid=79)
    _, outcome = check(t)
    assert outcome.requeued == ["102"]
    assert outcome.failed == ["requeue 101: Job has already finished"]
    assert steps(t, "requeue") == [("101", "failed"), ("102", "ok")]


def test_a_failed_resume_keeps_our_marker_so_the_next_run_retries(t):
    drained_by_us(t)
    sim.clear(t.sim_dir, "n1")
    t.slurm.fail("resume", SOCKET_TIMEOUT)
    _, outcome = check(t)
    assert not outcome.resumed and outcome.failed == [f"resume: {SOCKET_TIMEOUT}"]
    assert os.path.exists(t.w.drained_marker())
    t.slurm.fail("resume", None)
    _, outcome = check(t)
    assert outcome.resumed


def test_a_failed_start_now_is_recorded(t):
    t.slurm.add_job(101, "n1")
    t.slurm.job_states(101, ["PENDING"], reason="BeginTime")
    t.slurm.fail("start_now", SOCKET_TIMEOUT)
    assert follower.follow_requeued(t.w, [101], timeout=5, poll=0.01) == {"101": f"failed: {SOCKET_TIMEOUT}"}
    [failed] = records(t, "action", action="start_now")
    assert (failed["result"], failed["error"]) == ("failed", str(SOCKET_TIMEOUT))


def test_follow_reports_the_slurm_error_when_it_never_got_an_answer(t):
    t.slurm.add_job(101, "n1")
    t.slurm.fail("jobs", SOCKET_TIMEOUT)
    assert follower.follow_requeued(t.w, [101], timeout=0.3, poll=0.01) == {"101": f"failed: {SOCKET_TIMEOUT}"}


# --- prolog and epilog ---------------------------------------------------------------------


def baseline_path(t, job_id):
    return t.w.state_path("jobs", f"n1-{job_id}.json")


def test_prolog_on_healthy_gpus_makes_no_slurm_call_and_saves_a_baseline(t):
    assert jobhooks.prolog(t.w, {"SLURM_JOB_ID": "555", "SLURM_JOB_GPUS": "0,1"}) == 0
    assert t.slurm.calls == []
    with open(baseline_path(t, 555)) as fh:
        base = snapshot_from_dict(json.load(fh))
    assert isinstance(base, NodeSnapshot) and len(base.gpus) == 8
    assert list(t.audit.read()) == []


def test_prolog_of_a_job_without_gpus_does_nothing(t):
    inject(t, 3, xid=79)
    assert jobhooks.prolog(t.w, {"SLURM_JOB_ID": "556"}) == 0
    assert jobhooks.prolog(t.w, {"SLURM_JOB_ID": "557", "CUDA_VISIBLE_DEVICES": "NoDevFiles"}) == 0
    assert t.slurm.calls == []
    assert not os.path.exists(baseline_path(t, 556))


def test_prolog_on_a_bad_job_gpu_drains_and_returns_1(t, capsys):
    inject(t, 3, xid=79)
    assert jobhooks.prolog(t.w, {"SLURM_JOB_GPUS": "2,3"}) == 1
    assert t.slurm.peek("n1").reason == XID79_REASON
    assert t.slurm.called("requeue") == []  # Slurm requeues a job whose prolog failed
    [alert] = records(t, "alert")
    assert (alert["context"], alert["gpu"], alert["check"]) == ("prolog", 3, "xid")
    assert "slurm-hooks prolog: gpu3 xid: XID 79 (GPU has fallen off the bus) -> reboot" in capsys.readouterr().err


def test_prolog_finds_the_bad_gpu_by_its_uuid(t):
    uuid3 = sim.read(t.sim_dir, "n1")["gpus"][3]["uuid"]
    inject(t, 3, lost=True)
    assert jobhooks.prolog(t.w, {"CUDA_VISIBLE_DEVICES": uuid3}) == 1
    assert t.slurm.peek("n1").reason == "slurm-hooks: GPU 3 lost [replace]"


def test_prolog_ignores_a_bad_gpu_that_is_not_the_jobs(t):
    inject(t, 3, xid=79)
    assert jobhooks.prolog(t.w, {"SLURM_JOB_ID": "558", "SLURM_JOB_GPUS": "0,1"}) == 0
    assert t.slurm.calls == []


def test_prolog_on_a_job_gpu_that_is_missing_drains(t):
    assert jobhooks.prolog(t.w, {"SLURM_JOB_GPUS": "9"}) == 1
    assert t.slurm.peek("n1").reason == "slurm-hooks: GPU 9 missing [reboot]"


def test_epilog_flags_leftover_processes_and_drains(t):
    env = {"SLURM_JOB_ID": "600", "SLURM_JOB_GPUS": "0,1"}
    assert jobhooks.prolog(t.w, env) == 0
    inject(t, 1, process=48213)
    assert jobhooks.epilog(t.w, env) == 0
    node = t.slurm.peek("n1")
    assert node.state == "IDLE+DRAIN"
    assert node.reason.startswith("slurm-hooks: ") and "GPU 1" in node.reason and node.reason.endswith(" [drain]")
    [alert] = records(t, "alert")
    assert (alert["context"], alert["check"], alert["gpu"], alert["job"]) == ("epilog", "leftover", 1, "600")
    assert alert["message"] == "1 process(es) left after the job (pid 48213)"
    assert not os.path.exists(baseline_path(t, 600))


def test_epilog_judges_only_xids_new_since_the_prolog(t):
    env = {"SLURM_JOB_ID": "601", "SLURM_JOB_GPUS": "0"}
    inject(t, 0, xid=13)  # the previous job's application error
    assert jobhooks.prolog(t.w, env) == 0
    inject(t, 0, xid=13)
    inject(t, 0, xid=48)
    assert jobhooks.epilog(t.w, env) == 0
    assert t.slurm.peek("n1").reason == "slurm-hooks: XID 48 on GPU 0 [reset]"
    assert [r["message"] for r in records(t, "alert", context="epilog")] == [
        # once: the one before the job is not alerted again; it is history, but seconds before this one:
        # one burst (NVSentinel's 15 s window), no repeat; the XID 48 resets the GPU anyway
        "XID 13 (Graphics Engine Exception)",
        "XID 48 (Double Bit ECC Error)",
    ]


def test_epilog_with_nothing_new_makes_no_slurm_call(t):
    env = {"SLURM_JOB_ID": "602", "SLURM_JOB_GPUS": "0,1"}
    inject(t, 5, xid=79)  # not this job's GPU
    assert jobhooks.prolog(t.w, env) == 0
    assert jobhooks.epilog(t.w, env) == 0
    assert t.slurm.calls == []


def test_epilog_returns_1_when_it_could_not_drain(t):
    env = {"SLURM_JOB_ID": "603", "SLURM_JOB_GPUS": "2"}
    jobhooks.prolog(t.w, env)
    inject(t, 2, process=777)
    t.slurm.fail("drain", SOCKET_TIMEOUT)
    assert jobhooks.epilog(t.w, env) == 1  # Slurm then drains it as "Epilog error"
    assert steps(t, "drain") == [("n1", "failed")]


def test_remediate_drain_can_be_called_with_a_report_directly(t):
    inject(t, 4, pcie_width=8)
    report = healthcheck.judge(t.w, healthcheck.Context.CHECK, acknowledge=False)
    outcome = Outcome()
    drain.drain(t.w, report, outcome, job="42")
    assert outcome.ok and outcome.drained
    assert t.slurm.peek("n1").reason == "slurm-hooks: PCIe x8 on GPU 4 [drain, at job end]"
    [rec] = records(t, "action", action="drain")
    assert rec["job"] == "42"


def test_a_job_requeued_a_moment_ago_by_another_run_is_not_a_failure(tmp_path):
    from fakes.slurm import FakeSlurm

    from slurm_hooks.observe.audit import AuditLog
    from slurm_hooks.remedy.wiring import Wiring
    from slurm_hooks.slurm.errors import AlreadyRequeued

    cfg = sim_config(tmp_path)
    slurm = FakeSlurm()
    slurm.add_node("n1", "MIXED")
    slurm.add_job(44, "n1")
    slurm.fail("requeue", AlreadyRequeued("scontrol requeue 44: Job is pending execution for job 44"))
    w = Wiring(cfg, "n1", AuditLog(cfg.log.audit), slurm_override=slurm)
    outcome = Outcome()
    requeue_jobs(w, outcome, follow="none")
    assert outcome.ok and outcome.requeued == []
    assert [(r["action"], r["result"]) for r in w.audit.read()] == [("requeue", "already")]



def test_a_later_check_that_finds_our_requeued_job_completing_adds_no_record(tmp_path):
    """One requeue record per job and fault: slurmd's periodic check (or the watcher) that runs while
    the job we requeued is still COMPLETING on the node sees our following record and stays silent;
    a job that completes without one (it ended by itself) is still said to be skipped."""
    cfg = sim_config(tmp_path)
    slurm = FakeSlurm()
    slurm.add_node("n1", "MIXED")
    slurm.add_job(44, "n1")
    slurm.add_job(45, "n1", state="COMPLETING")
    w = Wiring(cfg, "n1", AuditLog(cfg.log.audit), slurm_override=slurm)
    requeue_jobs(w, Outcome(), follow="none")
    assert slurm.job(44).state == "COMPLETING"  # the requeue is under way
    later = Outcome()
    requeue_jobs(w, later, follow="none")
    assert later.requeued == [] and later.failed == []
    assert [(r["target"], r["result"]) for r in w.audit.read() if r["action"] == "requeue"] == [
        ("44", "ok"), ("45", "skipped")]  # 45's second look is a repeat of its first (one line)
    assert slurm.called("requeue") == [("requeue", 44)]

# --- the drain guard: a wrong value in the config must not drain the fleet ------------------------


def _guard_wiring(tmp_path, expect_gpus: int, already: int):
    from fakes.slurm import FakeSlurm

    from slurm_hooks.observe.audit import AuditLog
    from slurm_hooks.remedy.wiring import Wiring

    cfg = sim_config(tmp_path, f"[expect]\ngpus = {expect_gpus}")
    sim.init(cfg.gpu.sim_dir, "n9", 8)
    slurm = FakeSlurm()
    slurm.add_node("n9", "MIXED")
    slurm.add_job(90, "n9")
    for i in range(already):
        slurm.add_node(f"n{i}", "IDLE+DRAIN", f"slurm-hooks: 8 of {expect_gpus} GPUs visible [reboot]")
    return Wiring(cfg, "n9", AuditLog(cfg.log.audit), slurm_override=slurm), slurm


def test_a_config_typo_stops_draining_once_three_nodes_carry_the_same_expectation_fault(tmp_path):
    w, slurm = _guard_wiring(tmp_path, expect_gpus=9, already=3)  # gpus = 9 where every node has 8
    report, outcome = healthcheck.run(w, follow="none")
    assert not report.healthy and outcome.guarded
    assert slurm.called("drain") == [] and slurm.called("requeue") == []
    [guard] = [r for r in w.audit.read() if r.get("action") == "drain"]
    assert guard["result"] == "guarded" and guard["level"] == "critical"
    assert "wrong value in the config" in guard["detail"]
    # the job in the launch path is not refused for it either
    assert jobhooks.prolog(w, {"SLURM_JOB_ID": "91", "SLURM_JOB_GPUS": "0"}) == 0


def test_the_guard_lets_the_first_nodes_drain(tmp_path):
    w, slurm = _guard_wiring(tmp_path, expect_gpus=9, already=2)
    _, outcome = healthcheck.run(w, follow="none")
    assert outcome.drained and slurm.peek("n9").reason == "slurm-hooks: 8 of 9 GPUs visible [reboot]"


def test_the_guard_never_holds_back_a_fault_the_hardware_reports_itself(tmp_path):
    w, slurm = _guard_wiring(tmp_path, expect_gpus=8, already=0)
    for i in range(5):
        slurm.add_node(f"x{i}", "IDLE+DRAIN", "slurm-hooks: XID 79 on GPU 3 [reboot]")
    sim.inject(w.config.gpu.sim_dir, "n9", 3, xid=79)
    _, outcome = healthcheck.run(w, follow="none")
    assert outcome.drained and not outcome.guarded
    assert slurm.called("drained_count") == []


# --- the detached follower reports, and what it leaves is finished by the next hook run -----------


def test_a_follower_that_cannot_start_is_audited_and_the_hook_follows_the_job_itself(t):
    t.slurm.add_job(101, "n1")
    t.slurm.job_states(101, ["COMPLETING", "PENDING"], reason="BeginTime", restarts=1)
    spawned = follower.follow_jobs(t.w, ["101"], "detached", python="/nonexistent/python3")
    assert spawned is not None and not spawned.started
    [rec] = records(t, "action", action="follow")
    assert (rec["target"], rec["result"], rec["level"]) == ("101", "failed", "error")
    assert "/nonexistent/python3: cannot start: No such file or directory" in rec["error"]
    assert t.slurm.called("start_now") == [("start_now", 101)]
    assert steps(t, "start_now") == [("101", "ok")]
    assert follower.finish_followed(t.w) == {}  # nothing left over


def test_a_job_its_follower_left_waiting_is_made_eligible_by_the_next_hook_run(t, monkeypatch):
    monkeypatch.setattr(follower, "FOLLOW_FALLBACK_S", 0.2)
    t.slurm.add_job(101, "n1")
    t.slurm.job_states(101, ["COMPLETING"], restarts=1)  # still ending while the hook could wait
    follower.follow_jobs(t.w, ["101"], "detached", python="/nonexistent/python3")
    assert t.slurm.called("start_now") == []
    assert [r["result"] for r in records(t, "action", action="follow")] == ["failed"]
    t.slurm.job_states(101, ["PENDING"], reason="BeginTime", restarts=1)
    check(t)  # the next health check on the node (healthy or not)
    assert t.slurm.called("start_now") == [("start_now", 101)]
    t.slurm.calls.clear()
    check(t)
    assert t.slurm.called("jobs") == []  # done: the record is gone


def test_the_next_prolog_finishes_a_held_job_a_dead_follower_left(t, monkeypatch):
    monkeypatch.setattr(follower, "FOLLOW_FALLBACK_S", 0.0)
    t.slurm.add_job(101, "n1")
    t.slurm.job_states(101, ["COMPLETING", "PENDING"], reason="launch failed requeued held", priority="0",
                       restarts=1)  # the hook's own one look sees it still completing
    follower.follow_jobs(t.w, ["101"], "detached", python="/nonexistent/python3")
    assert t.slurm.called("start_now") == []
    t.slurm.calls.clear()
    jobhooks.prolog(t.w, env={})  # a job without GPUs: the prolog still finishes the follower's work
    assert [c[0] for c in t.slurm.calls] == ["jobs", "release", "start_now"]


def test_with_nothing_left_to_follow_the_prolog_never_calls_slurm(t):
    jobhooks.prolog(t.w, env={"SLURM_JOB_ID": "5", "SLURM_JOB_GPUS": "0"})
    assert t.slurm.calls == []


def test_jobs_a_live_follower_is_following_are_left_to_it(t):
    t.slurm.add_job(101, "n1")
    t.slurm.job_states(101, ["COMPLETING"], restarts=1)
    follower.follow_jobs(t.w, ["101"], "thread")  # the watcher's way: this process owns the record
    assert follower.finish_followed(t.w) == {}  # not {"101": "timed out"}: nothing looked at


# --- from the review: root code, races with the watcher, admin drains and resumes -----------------

ALL_GPUS = "0,1,2,3,4,5,6,7"


def test_detached_follower_does_not_import_code_from_the_current_directory(tmp_path):
    # Once fixed, the real follower runs: no Slurm binaries and the shortest follow time keep it cheap.
    cfg = sim_config(tmp_path, f'[slurm]\nbin_dir = "{tmp_path}/no-bin"\n[remediation]\nrequeue_grace = 0.0\n')
    w = Wiring(cfg, "n1", AuditLog(cfg.log.audit))
    evil = tmp_path / "cwd"
    (evil / "slurm_hooks").mkdir(parents=True)
    proof = tmp_path / "planted-code-ran"
    (evil / "slurm_hooks" / "__init__.py").write_text("")
    (evil / "slurm_hooks" / "__main__.py").write_text(f"open({str(proof)!r}, 'w').write('root')\n")
    before = os.getcwd()
    os.chdir(evil)  # an admin running `slurm-hooks check` from /tmp, or slurmd's log dir owned by SlurmUser
    try:
        spawned = follower.follow_jobs(w, [4242], "detached")
    finally:
        os.chdir(before)
    # The follower said it runs (spawn_detached's ready pipe): our code started it, not the planted
    # __main__ (which never says so, and writes its proof first). It would follow job 4242 for a minute.
    assert spawned is not None and spawned.started, spawned
    spawned.stop()
    assert not proof.exists()


class ProbeRacedByWatcher:
    """The sim probe; right after it took its (healthy) snapshot, an XID 79 arrives and the watcher acts."""

    name = "sim"

    def __init__(self, t):
        self.t, self.fired = t, False

    def snapshot(self):
        snap = sim.SimProbe(self.t.sim_dir, "n1").snapshot()
        if not self.fired:
            self.fired = True
            sim.inject(self.t.sim_dir, "n1", 3, xid=79)
            watch_wiring = Wiring(self.t.cfg, "n1", self.t.w.audit, slurm_override=self.t.slurm)
            [event] = [e for g in sim.SimProbe(self.t.sim_dir, "n1").snapshot().gpus for e in g.xids]
            Watcher(watch_wiring, source=None, log=lambda m: None).handle(event)
        return snap


def test_health_check_does_not_resume_a_drain_the_watcher_made_during_the_check(t):
    check_wiring = Wiring(t.cfg, "n1", t.w.audit, probe_override=ProbeRacedByWatcher(t), slurm_override=t.slurm)
    healthcheck.run(check_wiring, follow="none")
    assert t.slurm.called("drain"), "the watcher drained the node during the check"
    node = t.slurm.peek("n1")
    assert node.drained and node.reason == "slurm-hooks: XID 79 on GPU 3 [reboot]"


def test_nvml_library_mismatch_does_not_requeue_running_jobs(tmp_path):
    slurm = FakeSlurm()
    slurm.add_node("n1", "MIXED")
    slurm.add_job(7, "n1")
    nvml = FakeNvml.healthy(8).fail("nvmlInit", code=pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH)
    w = nvml_wiring(tmp_path, slurm, nvml, tmp_path / "kmsg")
    healthcheck.run(w, follow="none")
    assert slurm.called("requeue") == []


@pytest.mark.parametrize("state", ["DOWN", "IDLE+FAIL"])
def test_admin_down_or_fail_reason_is_never_overwritten(t, state):
    t.slurm.set_node("n1", state=state, reason="PSU swap, do not touch - bob")
    sim.inject(t.sim_dir, "n1", 3, xid=79)
    healthcheck.run(t.w, follow="none")
    assert t.slurm.peek("n1").reason == "PSU swap, do not touch - bob"


@pytest.mark.slurm
def test_admin_down_node_stays_down_on_real_slurm(hooked_testbed):
    tb = hooked_testbed
    reason = "PSU swap, do not touch - bob"
    tb.scontrol("update", "NodeName=n1", "State=DOWN", f"Reason={reason}")
    sim.inject(tb.sim_dir, "n1", 3, xid=79)
    w = Wiring.load(tb.config_path, "n1", slurm_override=tb.slurm)
    healthcheck.run(w, follow="none")
    first = tb.slurm.node("n1")
    sim.clear(tb.sim_dir, "n1")  # the GPU is fixed; the admin's maintenance is not over
    healthcheck.run(w, follow="none")
    node = tb.slurm.node("n1")
    assert node.reason == reason and "DOWN" in node.state.upper(), (
        f"after the fault: {first.state} {first.reason!r}; after the fix: {node.state} {node.reason!r}")


def test_admin_resume_after_our_drain_is_not_undone_by_the_next_prolog(t):
    sim.inject(t.sim_dir, "n1", 3, xid=119)  # GSP timeout: the admin resets the GPU and resumes, no reboot
    healthcheck.run(t.w, follow="none")
    assert t.slurm.peek("n1").drained
    t.slurm.resume("n1")
    rc = jobhooks.prolog(t.w, {"SLURM_JOB_GPUS": ALL_GPUS})  # the first job after the resume
    assert rc == 0 and not t.slurm.peek("n1").drained


def test_our_drain_is_resumed_when_mended_even_without_the_local_marker(t):
    t.slurm.set_node("n1", state="IDLE+DRAIN", reason="slurm-hooks: GPU 3 at 96 C [drain]")
    assert not os.path.exists(t.w.drained_marker())
    healthcheck.run(t.w, follow="none")  # every GPU healthy now
    assert not t.slurm.peek("n1").drained
