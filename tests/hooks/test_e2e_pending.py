"""slurmctld away when an XID hits a running job, with the watcher as the only detector.

The real testbed with hooks off (no HealthCheckProgram, prolog or epilog), so nothing but
the watcher can drain the node: the drain it cannot make while the controller is down stays
pending and is finished once the controller is back, even across a restart of the watcher,
unless an admin has taken the node meanwhile.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from slurm_hooks.probes import sim
from slurm_hooks.remedy import pending

pytestmark = pytest.mark.slurm

SLEEPER = "#!/bin/sh\nsleep 600\n"
#: How long slurmctld stays away in the outage tests (the issue's scenario).
OUTAGE_S = 20.0


def start_watcher(tb, node):
    since = len(tb.audit_events())
    proc = subprocess.Popen([sys.executable, "-m", "slurm_hooks", "watch", "--node", node], env=tb.env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: any(r.get("message") == "watcher started" for r in tb.audit_events()[since:]), 10,
             "watcher did not start", proc)
    return proc


def stop(proc):
    proc.terminate()
    proc.wait(10)


def wait_for(predicate, timeout, what, proc=None):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc is None or proc.poll() is None, f"{what}: the watcher exited {proc.returncode}"
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


@pytest.fixture
def outage(clean_testbed):
    """A job running on one node; yields (testbed, job id, its node); the controller is always back after."""
    tb = clean_testbed
    job = tb.sbatch(SLEEPER, "--gres=gpu:1", "--requeue")
    where = tb.wait_job(job, ("RUNNING",), timeout=20).nodes
    try:
        yield tb, job, where
    finally:
        tb.start_controller()


def fault_while_down(tb, where):
    """Stop slurmctld, inject XID 79 on ``where`` and wait until the watcher's drain is pending."""
    tb.stop_controller()
    down_at = time.monotonic()
    sim.inject(tb.sim_dir, where, 0, xid=79)
    wait_for(lambda: pending.load(tb.hooks_state_dir, where) is not None, 15, "no pending action written")
    return down_at


def assert_finished_after_return(tb, job, where, back_at):
    """Node drained by us, the job running on the other node soon after the controller's return
    (bounded at 30 s, far below the 121 s requeue delay; how soon is bench/'s to measure, not a test's)."""
    while True:
        moved = tb.slurm.job(job)
        if moved.state == "RUNNING" and moved.restarts >= 1 and moved.nodes not in ("", where):
            break
        assert time.monotonic() - back_at < 30, (f"job {job} {moved.state} ({moved.reason}) on {moved.nodes or '-'} "
                                                 f"30 s after the return; audit: {tb.audit_events()}")
        time.sleep(0.1)
    node = tb.slurm.node(where)
    assert node.drained and node.reason == "slurm-hooks: XID 79 on GPU 0 [reboot]", node
    assert pending.load(tb.hooks_state_dir, where) is None
    results = [r["result"] for r in tb.audit_events() if r.get("action") == "pending"]
    assert results[0] == "queued" and results[-1] == "done", results


@pytest.mark.parametrize("restart", [False, True], ids=["watcher-running", "watcher-restarted-meanwhile"])
def test_a_drain_that_slurmctld_missed_is_finished_soon_after_its_return(outage, restart):
    tb, job, where = outage
    watcher = start_watcher(tb, where)
    try:
        down_at = fault_while_down(tb, where)
        if restart:  # a new process: only the pending action on disk remembers
            stop(watcher)
            watcher = start_watcher(tb, where)
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down_at)))
        tb.start_controller()
        assert_finished_after_return(tb, job, where, time.monotonic())
    finally:
        stop(watcher)


def test_an_admins_own_drain_before_the_retry_is_not_replayed_over(outage):
    tb, job, where = outage
    watcher = start_watcher(tb, where)
    try:
        fault_while_down(tb, where)
    finally:
        stop(watcher)
    tb.start_controller()
    tb.scontrol("update", f"NodeName={where}", "State=DRAIN", "Reason=admin: reseating GPU 0")
    watcher = start_watcher(tb, where)
    try:
        wait_for(lambda: pending.load(tb.hooks_state_dir, where) is None, 15, "pending action never settled", watcher)
        time.sleep(1.0)
        node = tb.slurm.node(where)
        assert node.drained and node.reason == "admin: reseating GPU 0"
        running = tb.slurm.job(job)
        assert running.state == "RUNNING" and running.nodes == where and running.restarts == 0
        last = [r for r in tb.audit_events() if r.get("action") == "pending"][-1]
        assert last["result"] == "superseded" and "admin: reseating GPU 0" in last["detail"]
        assert not [r for r in tb.audit_events() if r.get("action") == "requeue"]
    finally:
        stop(watcher)
