"""The job's own checkpoint on the real testbed (KillWait 30, as a site's): each framework's
contract through an XID 79 under the job, found by the health check as slurmd runs it.

The jobs (:mod:`slurm_hooks.lab.contracts`) take a step every 0.1 s and log each one, so the
work lost is read back: the step reached at the fault minus the step the job resumed from.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time

import pytest
from conftest import wait_for

from slurm_hooks.lab import contracts
from slurm_hooks.probes import sim

pytestmark = pytest.mark.slurm

#: The most work a fault may cost a job that checkpoints on its signal (the issue's bound).
MAX_LOST_S = 2.0
#: [requeue] checkpoint_grace on this cluster: short, so that a job that does not requeue itself
#: is requeued by us within the test's time.
GRACE_S = 8.0


@pytest.fixture(scope="module")
def slow(tmp_path_factory):
    """A two-node cluster with slurm-hooks wired in and KillWait 30 s, as a site runs it."""
    from conftest import TESTBED_SETTINGS, SlurmTestbed, own_testbed

    settings = dataclasses.replace(TESTBED_SETTINGS, hooks=True, kill_wait=30, requeue_grace=35.0,
                                   checkpoint_grace=GRACE_S)
    with own_testbed(tmp_path_factory, "testbed-ckpt", settings) as tb:
        yield SlurmTestbed(tb)


@pytest.fixture
def tb(slow):
    slow.set_hooks(True)
    slow.reset(timeout=75.0)  # a job step killed under KillWait 30 can take that long to leave
    return slow


def healthcheck(tb, node: str) -> subprocess.CompletedProcess:
    """The HealthCheckProgram as slurmd runs it: the wrapper, no PATH, SLURMD_NODENAME only."""
    return subprocess.run([os.path.join(tb.state_dir, "bin", "healthcheck")], env={"SLURMD_NODENAME": node},
                          capture_output=True, text=True, timeout=60)


def actions(tb, name: str) -> list[dict]:
    """The audit's records of ``name``, but for another run's look at a job already being seen to
    (slurmd's own periodic health check runs too: "already" in its grace or requeued, "skipped"
    while it completes)."""
    return [r for r in tb.audit_events() if r.get("kind") == "action" and r.get("action") == name
            and r.get("result") not in ("already", "skipped")]


def start_line(text: str, restart: int) -> dict[str, str] | None:
    for line in text.splitlines():
        if line.startswith(f"start restart={restart} "):
            fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
            fields["on"] = line.split(" on ")[1].split()[0]
            return fields
    return None


def fault_under(tb, ref: str, workdir: str, steps: int = 20) -> tuple[str, float, int]:
    """Once the job has done ``steps`` steps: XID 79 on its GPU, and the health check on its node.
    Returns (node, fault time, step reached at the fault)."""
    wait_for(lambda: len(contracts.steps(workdir)) >= steps, 60, f"job {ref} running {steps} steps")
    job = tb.slurm.job(ref)
    bad = job.nodes
    gpu = tb.slurm.job_gpus(ref, bad)[0]
    sim.inject(tb.sim_dir, bad, gpu, xid=79)
    fault = time.time()
    res = healthcheck(tb, bad)
    assert res.returncode == 1, res.stderr
    return bad, fault, contracts.step_at(workdir, fault)


def running_elsewhere(tb, ref: str, bad: str, timeout: float):
    def look():
        info = tb.slurm.job(ref)
        return info if info.base_state == "RUNNING" and info.nodes and info.nodes != bad else None
    return wait_for(look, timeout, f"job {ref} RUNNING off {bad}")


def test_a_stock_submitit_job_checkpoints_on_usr2_requeues_itself_once_and_loses_under_2s(tb, tmp_path):
    folder, work = str(tmp_path / "submitit"), str(tmp_path / "work")
    os.makedirs(work)
    env = {**tb.env, "PATH": f"{os.path.dirname(sys.executable)}:/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", contracts.SUBMITIT_DRIVER, folder, work], env=env,
                         capture_output=True, text=True, timeout=60, check=True)
    ref = out.stdout.split()[-1]
    bad, fault, reached = fault_under(tb, ref, work)
    [sent] = actions(tb, "signal")
    assert (sent["result"], sent["signal"], sent["source"], sent["via"]) == ("ok", "USR2@90", "script", "steps")
    again = running_elsewhere(tb, ref, bad, timeout=GRACE_S + 10)
    assert again.restarts == 1
    resumed = wait_for(lambda: start_line(contracts.submitit_output(folder, ref), 1), 30, "the restart's start line")
    assert resumed["on"] == again.nodes
    assert contracts.work_lost(reached, int(resumed["step"])) <= MAX_LOST_S, (reached, resumed)
    assert "Caught signal SIGUSR2" in contracts.submitit_output(folder, ref)  # submitit's own handler
    requeues = actions(tb, "requeue")
    assert [(r["result"], r.get("requeued_by")) for r in requeues] == [("self", "self")], requeues
    assert requeues[0]["signal"] == "USR2@90" and 0 < requeues[0]["seconds_from_fault"] < GRACE_S
    assert [r["result"] for r in actions(tb, "start_now")] == ["ok"]
    time.sleep(2.0)
    assert tb.slurm.job(ref).restarts == 1  # exactly once: nobody requeued it again
    assert "requeued itself" in tb.slurm.admin_comment(ref)


def submit_contract(tb, tmp_path, contract: str, **kw) -> tuple[int, str]:
    work = str(tmp_path / contract)
    job = tb.sbatch(contracts.batch_script(contract, work, **kw), "--gres=gpu:1")
    return job, work


@pytest.mark.parametrize("contract", ["lightning", "megatron"])
def test_lightning_and_megatron_contract_jobs_each_lose_at_most_2s(tb, tmp_path, contract):
    job, work = submit_contract(tb, tmp_path, contract)
    bad, fault, reached = fault_under(tb, str(job), work)
    again = running_elsewhere(tb, str(job), bad, timeout=GRACE_S + 15)
    assert again.restarts == 1
    resumed = wait_for(lambda: start_line(tb.job_output(job), 1), 30, "the restart's start line")
    assert contracts.work_lost(reached, int(resumed["step"])) <= MAX_LOST_S, (reached, resumed, tb.job_output(job))
    requeues = [(r["result"], r.get("requeued_by")) for r in actions(tb, "requeue")]
    if contract == "lightning":  # SIGUSR1 first, and it requeued itself
        assert [r["signal"] for r in actions(tb, "signal")] == ["USR1@90"]
        assert requeues == [("self", "self")]
    else:  # no --signal: today's path, SIGTERM through our requeue, at once
        assert actions(tb, "signal") == []
        assert requeues == [("ok", "ours")]
    assert "got SIGUSR1" in tb.job_output(job) if contract == "lightning" else "got SIGTERM" in tb.job_output(job)


def test_a_job_without_scontrol_gets_its_signal_fails_its_own_requeue_and_is_requeued_once_after_the_grace(
        tb, tmp_path):
    job, work = submit_contract(tb, tmp_path, "lightning", no_scontrol=True)
    bad, fault, reached = fault_under(tb, str(job), work)
    again = running_elsewhere(tb, str(job), bad, timeout=GRACE_S + 20)
    took = time.time() - fault
    assert again.restarts == 1
    output = tb.job_output(job)
    assert "got SIGUSR1" in output and "requeue rc=not run" in output, output
    requeues = actions(tb, "requeue")
    assert [(r["result"], r.get("requeued_by")) for r in requeues] == [("ok", "ours")], requeues
    assert "no checkpoint: requeued after the grace" in requeues[0]["detail"]
    assert requeues[0]["seconds_from_fault"] >= GRACE_S - 0.5
    assert took >= GRACE_S
    resumed = wait_for(lambda: start_line(tb.job_output(job), 1), 30, "the restart's start line")
    # It saved on its signal: what it lost is the grace it kept running, no more.
    assert contracts.work_lost(reached, int(resumed["step"])) <= MAX_LOST_S
    time.sleep(2.0)
    assert tb.slurm.job(str(job)).restarts == 1
    assert "no checkpoint: requeued after the grace" in tb.slurm.admin_comment(str(job))


#: A batch shell that handles USR1 itself (``B:``), then requeues itself.
BATCH_TRAP = """#!/bin/bash
#SBATCH --signal=B:USR1@60
#SBATCH --open-mode=append
me=$SLURM_JOB_ID
[ -n "$SLURM_ARRAY_JOB_ID" ] && me=${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}
trap 'echo "batch shell got USR1 task=${SLURM_ARRAY_TASK_ID:-none}"; scontrol requeue $me' USR1
echo "start restart=${SLURM_RESTART_COUNT:-0} step=0 on $SLURMD_NODENAME"
while true; do sleep 0.1; done
"""


def test_a_b_usr1_job_gets_the_signal_in_its_batch_shell(tb):
    job = tb.sbatch(BATCH_TRAP, "--gres=gpu:1")
    wait_for(lambda: start_line(tb.job_output(job), 0), 30, "job started")
    bad = tb.slurm.job(job).nodes
    sim.inject(tb.sim_dir, bad, tb.slurm.job_gpus(str(job), bad)[0], xid=79)
    assert healthcheck(tb, bad).returncode == 1
    [sent] = actions(tb, "signal")
    assert (sent["signal"], sent["via"]) == ("B:USR1@60", "batch")
    running_elsewhere(tb, str(job), bad, timeout=GRACE_S + 10)
    assert "batch shell got USR1 task=none" in tb.job_output(job)
    assert [r["result"] for r in actions(tb, "requeue")] == ["self"]


def test_an_array_task_gets_its_signal_alone(tb):
    array = tb.sbatch(BATCH_TRAP, "--array=0-3", "--gres=gpu:4")

    def all_running():
        tasks = [j for n in tb.nodes for j in tb.slurm.jobs_on_node(n) if j.array_job_id == array]
        return tasks if len(tasks) == 4 and all(j.base_state == "RUNNING" for j in tasks) else None

    tasks = wait_for(all_running, 30, "4 tasks running")
    for task in tasks:
        wait_for(lambda task=task: start_line(tb.job_output(task.job_id), 0), 30, f"task {task.ref} started")
    target = tasks[0]
    bad = target.nodes
    sim.inject(tb.sim_dir, bad, tb.slurm.job_gpus(target.ref, bad)[0], xid=79)
    assert healthcheck(tb, bad).returncode == 1
    assert [r["target"] for r in actions(tb, "signal")] == [target.ref]
    # Requeued (by itself); the other node is full with the other tasks, so it waits there.
    wait_for(lambda: tb.slurm.job(target.ref).restarts == 1, GRACE_S + 10, f"task {target.ref} requeued")
    time.sleep(1.0)
    for task in tasks:
        now, output = tb.slurm.job(task.ref), tb.job_output(task.job_id)
        if task.ref == target.ref:
            assert now.restarts == 1, now
            assert f"batch shell got USR1 task={task.array_task_id}" in output
        else:
            assert (now.base_state, now.restarts) == ("RUNNING", 0), now
            assert "got USR1" not in output, output


#: The late-hit submitit job's time limit (minutes). submitit's has_timed_out() is true once elapsed >=
#: min(0.8 x limit, limit - 600 s): under 10 minutes that is the whole run, so a fault at any moment of a
#: 5-minute job meets exactly what one at 85% of a long job meets, without waiting for it. (Waiting for
#: 85% of a short limit does not work either: Slurm sends the job's own USR2 up to 60 s before its
#: @TIME, so it lands first.)
LATE_LIMIT_MIN = 5


def test_a_submitit_job_hit_in_its_timed_out_window_fails_on_usr2_and_is_requeued_by_us_from_its_checkpoint(
        tb, tmp_path):
    """submitit's handler, late in the limit (85% of it, or any moment of a limit under 10 minutes),
    raises "timed-out and not checkpointable": the job ends FAILED in its grace. It must run again
    (from what it saved), never be left FAILED."""
    folder, work = str(tmp_path / "submitit"), str(tmp_path / "work")
    os.makedirs(work)
    env = {**tb.env, "PATH": f"{os.path.dirname(sys.executable)}:/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", contracts.SUBMITIT_DRIVER, folder, work, str(LATE_LIMIT_MIN),
                          "plain"], env=env, capture_output=True, text=True, timeout=60, check=True)
    ref = out.stdout.split()[-1]
    bad, fault, reached = fault_under(tb, ref, work)
    [sent] = actions(tb, "signal")
    assert (sent["result"], sent["signal"]) == ("ok", "USR2@90")
    again = running_elsewhere(tb, ref, bad, timeout=GRACE_S + 30)
    assert again.restarts == 1
    text = contracts.submitit_output(folder, ref)
    assert "this job is timed-out" in text and "timed-out and not checkpointable" in text, text
    resumed = wait_for(lambda: start_line(contracts.submitit_output(folder, ref), 1), 30, "the restart's start line")
    assert resumed["on"] == again.nodes
    # From its own checkpoint, not from zero: one it wrote (every 10 steps) before it failed, which may lie
    # after the fault's step, since the job trains on until its signal's handler runs.
    did = max(s for s, _ in contracts.steps(work, restart=0))
    assert 0 < int(resumed["step"]) <= did and int(resumed["step"]) % 10 == 0, (resumed, reached, did)
    requeues = actions(tb, "requeue")
    assert [(r["result"], r.get("requeued_by"), r.get("ended")) for r in requeues] == [("ok", "ours", "FAILED")], \
        requeues
    assert "ended FAILED in its grace" in tb.slurm.admin_comment(ref)
