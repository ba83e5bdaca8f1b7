"""Pending actions: remediation that failed for a transient reason is finished by the next run.

Simulated GPUs and the shared in-memory Slurm (tests/fakes/slurm.py); the same on the
real testbed with slurmctld stopped is in tests/hooks/test_e2e_pending.py.
"""

from __future__ import annotations

import json
import os
import stat
import threading
import time
from types import SimpleNamespace

import pytest
from conftest import wait_for
from fakes.config import sim_config, sim_node, write_sim_config

from slurm_hooks import config
from slurm_hooks.errors import PermanentError
from slurm_hooks.hooks import healthcheck, jobhooks
from slurm_hooks.hooks.watch import SimSource, Watcher
from slurm_hooks.observe import events, timeline
from slurm_hooks.observe.audit import AuditLog
from slurm_hooks.probes import sim
from slurm_hooks.remedy import pending
from slurm_hooks.remedy.wiring import Wiring
from slurm_hooks.slurm.scontrol import ScontrolSlurm, SlurmUnavailable

DOWN = SlurmUnavailable("scontrol: slurm_load_node error: Unable to contact slurm controller (connect failure)")
XID79_REASON = "slurm-hooks: XID 79 on GPU 3 [reboot]"


@pytest.fixture
def t(tmp_path):
    cfg = sim_config(tmp_path, "[expect]\ngpus = 8")
    slurm, w = sim_node(cfg, "MIXED", 7)
    return SimpleNamespace(w=w, slurm=slurm, sim_dir=cfg.gpu.sim_dir, state=cfg.state.dir, audit=w.audit)


def pending_records(t):
    return [r for r in t.audit.read() if r.get("action") == "pending"]


def controller_down(t):
    t.slurm.fail("node", DOWN)
    t.slurm.fail("drain", DOWN)


def controller_back(t):
    t.slurm.fail("node", None)
    t.slurm.fail("drain", None)


def make_due(t):
    """Skip the backoff wait (the retry would come a second or more later)."""
    rec = pending.load(t.state, "n1")
    pending.save(t.state, pending.Pending(**{**rec.__dict__, "next_at": 0.0}))


def fail_while_down(t):
    sim.inject(t.sim_dir, "n1", 3, xid=79)
    controller_down(t)
    report, outcome = healthcheck.run(t.w, follow="none")
    assert not outcome.drained and outcome.pending == "retry"
    return report, outcome


def test_a_drain_that_fails_while_slurmctld_is_down_stays_pending_on_disk(t):
    fail_while_down(t)
    rec = pending.load(t.state, "n1")
    assert rec.steps == ("drain", "requeue") and rec.attempts == 1
    assert rec.reason == XID79_REASON and "Unable to contact" in rec.last_error
    assert stat.S_IMODE(os.stat(pending.path(t.state, "n1")).st_mode) == 0o600
    [queued] = pending_records(t)
    assert queued["result"] == "queued" and queued["pending"] == rec.id


def test_the_next_check_finishes_it_once_slurmctld_is_back(t):
    fail_while_down(t)
    controller_back(t)
    _, outcome = healthcheck.run(t.w, follow="none")
    assert outcome.drained and outcome.requeued == ["7"] and outcome.pending == "done"
    assert t.slurm.peek("n1").reason == XID79_REASON
    assert pending.load(t.state, "n1") is None
    assert [r["result"] for r in pending_records(t)] == ["queued", "done"]


def test_retries_back_off_up_to_thirty_seconds():
    assert [pending.backoff(n) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]
    timeout = "scontrol timed out after 10s (-o show node n1): controller not answering"
    assert pending.backoff(9, timeout) == 30  # a controller too busy to answer gets room


def test_a_controller_that_is_not_there_at_all_is_tried_again_every_second():
    # Each try already waits out scontrol's connect loop; a refused connection costs slurmctld nothing.
    assert pending.backoff(9, str(DOWN)) == 1


def test_a_retry_that_fails_again_counts_the_attempt_and_keeps_the_incident(t):
    sim.inject(t.sim_dir, "n1", 3, xid=79)
    t.slurm.fail("node", SlurmUnavailable("scontrol: Socket timed out on send/recv operation"))
    healthcheck.run(t.w, follow="none")
    first = pending.load(t.state, "n1")
    make_due(t)
    assert healthcheck.finish_pending(t.w, follow="none", respect_backoff=True) == "retry"
    again = pending.load(t.state, "n1")
    assert again.id == first.id and again.attempts == 2 and again.next_at > time.time() + 1.0
    # Not due yet: a backoff-respecting runner (the watcher, a prolog) leaves it alone.
    assert healthcheck.finish_pending(t.w, follow="none", respect_backoff=True) is None
    assert [r["result"] for r in pending_records(t)] == ["queued", "retry"]


def test_an_admins_own_drain_before_the_retry_supersedes_it(t):
    fail_while_down(t)
    controller_back(t)
    t.slurm.set_node("n1", state="MIXED+DRAIN", reason="admin: swapping PSU")
    assert healthcheck.finish_pending(t.w, follow="none") == "superseded"
    assert t.slurm.called("drain") == [] and t.slurm.called("requeue") == []
    assert t.slurm.peek("n1").reason == "admin: swapping PSU"
    assert pending.load(t.state, "n1") is None
    last = pending_records(t)[-1]
    assert last["result"] == "superseded" and "admin: swapping PSU" in last["detail"]


def test_an_admin_resume_after_our_drain_supersedes_the_pending_requeue(t):
    sim.inject(t.sim_dir, "n1", 3, xid=79)
    t.slurm.fail("jobs_on_node", DOWN)
    _, outcome = healthcheck.run(t.w, follow="none")
    assert outcome.drained and pending.load(t.state, "n1").steps == ("requeue",)
    t.slurm.fail("jobs_on_node", None)
    t.slurm.resume("n1")  # the admin
    assert healthcheck.finish_pending(t.w, follow="none") == "superseded"
    assert t.slurm.called("requeue") == [] and not t.slurm.peek("n1").reason


def test_a_fault_that_is_gone_supersedes_it(t):
    fail_while_down(t)
    controller_back(t)
    sim.init(t.sim_dir, "n1", 8)  # rebooted: the kernel log no longer holds the XID
    t.w = Wiring(t.w.config, "n1", t.audit, slurm_override=t.slurm, probe_override=None)
    rec = pending.load(t.state, "n1")
    pending.save(t.state, pending.Pending(**{**rec.__dict__, "events": ()}))  # a probe-visible fault only
    assert healthcheck.finish_pending(t.w, follow="none") == "superseded"
    assert t.slurm.called("drain") == [] and not t.slurm.peek("n1").drained
    assert "fault is gone" in pending_records(t)[-1]["detail"]


def test_a_permanent_failure_on_retry_is_recorded_once_and_dropped(t):
    fail_while_down(t)
    controller_back(t)
    t.slurm.fail("node", PermanentError("Invalid node name specified"))
    assert healthcheck.finish_pending(t.w, follow="none") == "dropped"
    assert pending.load(t.state, "n1") is None
    assert healthcheck.finish_pending(t.w, follow="none") is None
    assert [r["result"] for r in pending_records(t)] == ["queued", "dropped"]


def test_a_job_that_ended_meanwhile_is_not_requeued(t):
    fail_while_down(t)
    controller_back(t)
    t.slurm.job_states(7, ["COMPLETED"])
    t.slurm.job(7)
    assert healthcheck.finish_pending(t.w, follow="none") == "done"
    assert t.slurm.called("requeue") == [] and t.slurm.peek("n1").drained


def test_an_unreadable_pending_record_is_dropped_not_replayed(t):
    os.makedirs(t.state, exist_ok=True)
    with open(pending.path(t.state, "n1"), "w") as fh:
        fh.write("{not json")
    assert healthcheck.finish_pending(t.w, follow="none") is None
    assert not os.path.exists(pending.path(t.state, "n1")) and t.slurm.calls == []


def test_the_prolog_finishes_a_pending_action_on_its_healthy_path(t):
    fail_while_down(t)
    controller_back(t)
    make_due(t)
    assert jobhooks.prolog(t.w, {"SLURM_JOB_ID": "9", "SLURM_JOB_GPUS": "0"}) == 0  # its own GPU is fine
    assert t.slurm.peek("n1").reason == XID79_REASON and t.slurm.called("requeue") == [("requeue", 7)]
    assert pending.load(t.state, "n1") is None


def test_a_prolog_drain_that_fails_stays_pending_without_a_requeue(t):
    sim.inject(t.sim_dir, "n1", 2, xid=79)
    controller_down(t)
    assert jobhooks.prolog(t.w, {"SLURM_JOB_ID": "9", "SLURM_JOB_GPUS": "2"}) == 1
    assert pending.load(t.state, "n1").steps == ("drain",)


def test_the_prolog_healthy_path_costs_no_slurm_call_and_leaves_no_pending_file(t):
    assert jobhooks.prolog(t.w, {"SLURM_JOB_ID": "9", "SLURM_JOB_GPUS": "0"}) == 0
    assert jobhooks.epilog(t.w, {"SLURM_JOB_ID": "9", "SLURM_JOB_GPUS": "0"}) == 0
    assert t.slurm.calls == [] and not os.path.exists(pending.path(t.state, "n1"))


def test_the_watcher_retries_in_the_background_and_keeps_judging_new_events(t):
    sim.inject(t.sim_dir, "n1", 3, xid=79)
    controller_down(t)
    watcher = Watcher(t.w, SimSource(t.sim_dir, "n1", 0.05), log=lambda m: None, retry_poll=0.05)
    stop = threading.Event()
    runner = threading.Thread(target=watcher.run, args=(stop,), daemon=True)
    runner.start()
    try:
        wait_for(lambda: pending.load(t.state, "n1") is not None, 15, "a pending record", 0.02)
        sim.inject(t.sim_dir, "n1", 5, xid=48)  # another GPU fails while the first action waits
        wait_for(lambda: any(r.get("xid") == 48 for r in t.audit.read() if r["kind"] == "watch"), 15,
                 "XID 48 judged while the drain is pending", 0.02)
        assert len(pending.load(t.state, "n1").events) == 2
        controller_back(t)
        # The record's end is the audit line, written after the file goes (an fsync on a loaded CI disk
        # took seconds between the two): wait for that, not for the file.
        wait_for(lambda: any(r["result"] == "done" for r in pending_records(t)), 20, "the pending record's done line", 0.02)
        assert pending.load(t.state, "n1") is None
    finally:
        stop.set()
        runner.join(20)
    assert not runner.is_alive()
    assert t.slurm.peek("n1").reason == "slurm-hooks: XID 79 on GPU 3; XID 48 on GPU 5 [reboot]"
    assert t.slurm.called("requeue") == [("requeue", 7)]
    results = [r["result"] for r in pending_records(t)]
    assert results[0] == "queued" and results[-1] == "done"
    [incident] = events.incidents(events.select(t.audit.read(), "n1"))
    assert any(line.strip().endswith("(drain+requeue finished)") for line in timeline.render([(None, incident)]))


def test_a_restarted_watcher_finishes_what_the_last_one_left_pending(t):
    fail_while_down(t)
    controller_back(t)
    make_due(t)
    assert Watcher(t.w, SimSource(t.sim_dir, "n1", 0.05), log=lambda m: None).retry_pending() == "done"
    assert t.slurm.peek("n1").reason == XID79_REASON


def test_events_keep_a_long_outage_in_one_incident():
    base = {"node": "n1", "kind": "action", "action": "pending", "target": "n1", "steps": ["drain", "requeue"],
            "pending": "n1-1"}
    records = [
        {"ts": 100.0, "kind": "alert", "node": "n1", "gpu": 3, "check": "xid", "message": "XID 79", "action": "replace"},
        {**base, "ts": 101.0, "result": "queued", "attempt": 1, "error": "Unable to contact slurm controller",
         "detail": "next try in 1s"},
        {**base, "ts": 900.0, "result": "retry", "attempt": 9, "error": "Unable to contact slurm controller",
         "detail": "next try in 30s"},
        {**base, "ts": 1500.0, "result": "done", "attempt": 10, "detail": "drain+requeue finished"},
        {"ts": 5000.0, "kind": "alert", "node": "n1", "gpu": 1, "check": "thermal", "message": "hot", "action": "warn"},
    ]
    groups = events.incidents(records)
    assert [len(g) for g in groups] == [4, 1]
    lines = timeline.render([(None, g) for g in groups[:1]])
    assert "pending drain+requeue waits: Unable to contact slurm controller (next try in 1s)" in lines[2]
    assert "retry 9 failed" in lines[3] and "done after 10 attempt(s)" in lines[4]


# --- one deadline for the whole run -------------------------------------------------------


def _hanging_bin(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    for tool in ("scontrol", "squeue", "sinfo"):
        # `scontrol --version` is answered locally, without the controller: only the RPCs hang.
        (fake / tool).write_text('#!/bin/sh\n[ "$1" = --version ] && { echo "slurm 22.05.8"; exit 0; }\nexec sleep 60\n')
        (fake / tool).chmod(0o755)
    return fake


def test_a_hanging_slurm_is_cut_to_the_runs_deadline_and_the_drain_stays_pending(tmp_path):
    path = write_sim_config(tmp_path, "[expect]\ngpus = 8\n[check]\ndeadline = 3\n[slurm]\ntimeout = 2.5")
    path.write_text(path.read_text().replace('backend = "sim"', 'backend = "sim"\nprobe_timeout = 1'))
    cfg = config.load(str(path))
    sim.init(cfg.gpu.sim_dir, "n1", 8)
    sim.inject(cfg.gpu.sim_dir, "n1", 3, xid=79)
    w = Wiring(cfg, "n1", AuditLog(cfg.log.audit), slurm_override=ScontrolSlurm(bin_dir=str(_hanging_bin(tmp_path))))
    started = time.monotonic()
    _, outcome = healthcheck.run(w, follow="none")
    took = time.monotonic() - started
    assert took < 4.5, took  # not 10 s per call, not 3 + 2N calls
    assert outcome.pending == "retry" and not outcome.drained
    rec = pending.load(cfg.state.dir, "n1")
    assert rec.steps == ("drain", "requeue") and "timed out" in rec.last_error


def test_without_a_deadline_a_slurm_call_keeps_its_own_timeout(tmp_path):
    slurm = ScontrolSlurm(bin_dir=str(_hanging_bin(tmp_path)), timeout=5)
    assert slurm.deadline is None
    bounded = slurm.bounded(time.monotonic() + 0.2)
    assert slurm.deadline is None and bounded.deadline is not None  # the original is untouched
    started = time.monotonic()
    with pytest.raises(SlurmUnavailable):
        bounded.node("n1")
    assert time.monotonic() - started < 2.5  # cut to the deadline, not the call's own 5 s
    time.sleep(0.3)
    with pytest.raises(SlurmUnavailable, match="no time left"):
        bounded.node("n1")


def test_pending_record_round_trips_and_ignores_unknown_keys(tmp_path):
    state = str(tmp_path)
    rec = pending.record_failure(state, "n1", steps=["requeue", "drain"], context="watch", reason="r",
                                 events=[{"code": 79, "gpu": 3}], error="boom", now=1000.0)
    assert rec.steps == ("drain", "requeue") and rec.next_at == 1001.0
    data = json.load(open(pending.path(state, "n1")))
    data["from_a_newer_version"] = 1
    json.dump(data, open(pending.path(state, "n1"), "w"))
    assert pending.load(state, "n1") == rec
