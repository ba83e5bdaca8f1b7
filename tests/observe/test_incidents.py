"""The incident lifecycle from audit records: opened, acting, waiting (for what), closed (by whom)."""

from __future__ import annotations

from slurm_hooks.observe import incidents, records
from slurm_hooks.observe.audit import AuditLog

T0 = 1_764_000_000.0
GPU0 = {"index": 0, "uuid": "GPU-8f2c", "serial": "1650923012345", "pci_bus_id": "00000000:17:00.0"}


def rec(dt, kind, **fields):
    return {"ts": T0 + dt, "kind": kind, "node": "n1", **fields}


def xid79_to_replace():
    return [
        rec(0, "alert", check="xid", gpu=0, action="reboot", severity="fail", message="XID 79 (fell off the bus)"),
        rec(1, "action", action="drain", result="ok", reason="slurm-hooks: XID 79 on GPU 0 [reboot]"),
        rec(2, "action", action="repair-reboot", result="start", reason="slurm-hooks: XID 79 on GPU 0 [reboot 1/1]",
            gpu_ids=[GPU0], detail="scontrol reboot ASAP nextstate=DOWN"),
        rec(300, "action", action="repair-reboot", result="failed", detail="still XID 79 after the reboot"),
        rec(301, "action", action="repair-replace", result="ok", reason="slurm-hooks: XID 79 on GPU 0 [replace]",
            why="still XID 79 after the reboot", gpu_ids=[GPU0], rma=["GPU-8f2c"],
            evidence="/var/lib/slurm-hooks/evidence/n1/20251124T160501Z-replace"),
    ]


def test_a_replace_written_by_the_repair_ladder_is_an_escalation_and_waits_for_a_person():
    [inc] = incidents.build(xid79_to_replace())
    assert [a for _, a in inc.escalations] == ["replace"]
    assert inc.action == "replace" and inc.reason == "slurm-hooks: XID 79 on GPU 0 [replace]"
    assert inc.stage is records.Stage.WAITING and inc.waits_for_person
    assert inc.step == "replace" and inc.step_since == T0 + 301
    assert "GPU 0 (GPU-8f2c, serial 1650923012345)" in inc.todo
    assert inc.rma == [GPU0] and inc.evidence == ["/var/lib/slurm-hooks/evidence/n1/20251124T160501Z-replace"]
    # The finding borrows the GPU's identity from the repair record: the message names UUID and serial.
    assert (inc.findings[0].uuid, inc.findings[0].serial) == ("GPU-8f2c", "1650923012345")


def test_a_reboot_started_after_a_plain_drain_is_an_escalation_and_waits_for_the_reboot():
    log = [rec(0, "action", action="drain", result="ok", reason="slurm-hooks: GPU lost [drain]"),
           rec(5, "action", action="repair-reboot", result="start", reason="slurm-hooks: GPU lost [reboot 1/1]")]
    [inc] = incidents.build(log)
    assert [a for _, a in inc.escalations] == ["reboot"]
    assert inc.waiting_for == records.WaitingFor.REBOOT.value and not inc.waits_for_person


def test_the_tracker_fed_in_batches_sees_the_replace_escalation_too():
    tracker = incidents.Tracker()
    log = xid79_to_replace()
    tracker.feed(log[:3])
    tracker.feed(log[3:])
    assert [a for _, a in tracker.open["n1"].escalations] == ["replace"]


def test_a_persons_resume_closes_the_incident_with_who_and_how_long():
    log = [*xid79_to_replace(),
           rec(3600, "incident", stage="closed", by="person", user="alice", detail="node IDLE: resumed by alice")]
    [inc] = incidents.build(log)
    assert not inc.open and inc.resolved_by == "alice" and inc.closed_by == "person"
    assert inc.mttr == 3599 and inc.stage is records.Stage.CLOSED
    assert incidents.summary(inc)["rma"] == [GPU0]


def test_a_persons_resume_with_no_name_is_a_person():
    log = [rec(0, "action", action="drain", result="ok", reason="slurm-hooks: XID 48 on GPU 1 [reset]"),
           rec(60, "incident", stage="closed", by="person")]
    [inc] = incidents.build(log)
    assert inc.resolved_by == "a person" and inc.mttr == 60


def test_new_hardware_validated_and_resumed_by_us_closes_as_new_hardware_once():
    log = [*xid79_to_replace(),
           rec(7200, "action", action="repair-replace", result="ended",
               detail="GPU(s) GPU-8f2c no longer in the node: the hardware was replaced; the ladder starts afresh"),
           rec(7201, "action", action="repair-validate", result="start"),
           rec(7260, "action", action="resume", result="ok")]
    built = incidents.build(log)
    assert len(built) == 1 and not built[0].open
    assert built[0].closed_by == "new hardware" and built[0].resolved_by == "slurm-hooks"


def test_a_drain_the_periodic_check_cannot_judge_again_waits_for_a_person_and_says_why():
    why = "drained for dcgm, which the periodic check does not run: resume by hand (scontrol update State=RESUME)"
    log = [rec(0, "action", action="drain", result="ok", reason="slurm-hooks: DCGM diag L2 failed on GPU 5 [reset]"),
           rec(10, "action", action="resume", result="skipped", detail=why)]
    [inc] = incidents.build(log)
    assert inc.waits_for_person and inc.why == why
    assert inc.todo == "mend it, then resume it: scontrol update NodeName=n1 State=RESUME"
    assert incidents.summary(inc)["waiting_for"] == "a person"


def test_a_drain_at_job_end_waits_for_the_jobs():
    log = [rec(0, "action", action="drain", result="ok", reason="slurm-hooks: row remap pending on GPU 3 [reset, at job end]")]
    [inc] = incidents.build(log)
    assert inc.waiting_for == records.WaitingFor.JOBS.value


def test_every_record_kind_parses_to_its_declared_fields_and_keeps_unknown_keys():
    alert = records.parse(rec(0, "alert", gpu=2, check="ecc", uuid="GPU-1", serial="S1", pci_bus_id="0:1", new_key=3))
    assert isinstance(alert, records.Alert) and (alert.gpu, alert.serial, alert.extra) == (2, "S1", {"new_key": 3})
    step = records.parse(rec(0, "action", action="repair-replace", result="ok", gpu_ids=[GPU0]))
    assert isinstance(step, records.Action) and records.escalates_to(step) == "replace"
    assert isinstance(records.parse(rec(0, "incident", stage="closed")), records.Lifecycle)
    assert type(records.parse(rec(0, "bridge_replace"))) is records.Record


def test_a_lifecycle_record_with_an_undeclared_field_is_refused_where_it_is_written():
    import pytest

    with pytest.raises(TypeError, match="not a field"):
        records.lifecycle(records.Stage.CLOSED, whom="alice")


def test_record_person_resume_writes_one_closing_record(tmp_path):
    log = AuditLog(str(tmp_path / "audit.jsonl"))
    log.write("action", node="n1", action="drain", result="ok", reason="slurm-hooks: XID 79 on GPU 0 [reboot]")
    incidents.record_person_resume(log, "n1", reason="", state="IDLE")
    [inc] = incidents.build(log.read())
    assert not inc.open and inc.resolved_by == "a person"


def test_the_bridge_closing_the_node_closes_its_incident_once_told_by_the_bridges_own_message():
    log = [*xid79_to_replace(),
           rec(900, "bridge_incident_closed", kube_node="k8s-1", back_on="k8s-7", state="IDLE"),
           rec(901, "bridge_incident_closed", kube_node="k8s-1", back_on="k8s-7", state="IDLE")]
    built = incidents.build(log)
    assert len(built) == 1 and not built[0].open and built[0].closed_by == "bridge"
    assert built[0].told.resolved  # notify's RESOLVED is the bridge's record, not a second one


def test_a_dry_run_of_the_bridge_closes_nothing():
    [inc] = incidents.build([*xid79_to_replace(), rec(900, "bridge_incident_closed", dry_run=True)])
    assert inc.open


def test_a_field_written_as_none_is_its_default_not_an_undeclared_key():
    alert = records.parse(rec(0, "alert", gpu=None, job=None, check="xid"))
    assert alert.gpu is None and alert.job is None and alert.extra == {}


def test_a_record_with_a_field_of_the_wrong_type_is_kept_aside_and_the_incident_still_builds():
    odd = xid79_to_replace()
    odd[1] = rec(1, "action", action="drain", result="ok", reason=5, duration_s="slow")  # a hand-edited line
    [inc] = incidents.build(odd)  # the drain's reason unread: a plain drain, then the ladder's rungs
    assert [a for _, a in inc.escalations] == ["reboot", "replace"] and inc.action == "replace"
    parsed = records.parse(odd[1])
    assert (parsed.reason, parsed.extra["reason"], parsed.extra["duration_s"]) == ("", 5, "slow")
