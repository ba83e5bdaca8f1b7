"""Scope and urgency on the real testbed: a fault requeues only the jobs it touches, when it must.

Two 1-GPU jobs share n1 (Slurm's first choice); the health check runs as slurmd runs it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from hooks.test_e2e_slurm import TRAP_JOB, actions, drained_by_us, healthcheck, wait_running_elsewhere, wait_started

from slurm_hooks.probes import sim

pytestmark = pytest.mark.slurm

#: A job that runs a few seconds and ends on its own (or says it got SIGTERM).
SHORT_JOB = TRAP_JOB.replace("while true; do sleep 0.1; done", "sleep 6; echo finished")


def two_jobs_on_n1(tb) -> list[tuple[int, int]]:
    """Two 1-GPU requeueable jobs on n1: [(job, its GPU index)]."""
    jobs = [tb.sbatch(TRAP_JOB, "--gres=gpu:1", "--requeue", "--open-mode=append") for _ in range(2)]
    placed = [(job, *wait_started(tb, job)) for job in jobs]
    assert [node for _, node, _ in placed] == ["n1", "n1"], placed
    return [(job, gpu) for job, _, gpu in placed]


def explain(tb, node: str) -> dict:
    r = subprocess.run([sys.executable, "-m", "slurm_hooks", "check", "--explain", "--json", "--node", node],
                       env=tb.env, capture_output=True, text=True, timeout=60)
    assert r.returncode in (0, 1), r.stderr
    return json.loads(r.stdout)


@pytest.fixture
def override(hooked_testbed):
    """Append a [severity] table to the testbed's config for one test, then put the file back."""
    with open(hooked_testbed.config_path, encoding="utf-8") as fh:
        original = fh.read()

    def write(text: str) -> None:
        with open(hooked_testbed.config_path, "w", encoding="utf-8") as fh:
            fh.write(original + "\n" + text)

    yield write
    with open(hooked_testbed.config_path, "w", encoding="utf-8") as fh:
        fh.write(original)


def test_scontrol_gres_idx_is_the_gpu_the_job_sees_in_slurm_job_gpus(hooked_testbed):
    tb = hooked_testbed
    for job, gpu in two_jobs_on_n1(tb):
        assert tb.slurm.job_gpus(job, "n1") == (gpu,)
        assert tb.slurm.job_gpus(job, "n2") is None


def test_xid79_on_one_jobs_gpu_requeues_that_job_alone_and_the_other_runs_on(hooked_testbed):
    tb = hooked_testbed
    (hit, gpu), (spared, _) = two_jobs_on_n1(tb)
    sim.inject(tb.sim_dir, "n1", gpu, xid=79)
    shown = explain(tb, "n1")  # acts on nothing
    [xid] = [f for f in shown["findings"] if f["check"] == "xid"]
    assert (xid["scope"], xid["urgency"], xid["action"], xid["requeues"]) == ("gpu", "now", "reboot", [str(hit)])
    # (not "n1 not drained" here: slurmd's own HealthCheckProgram, every 30 s on this testbed, may
    # drain it between the inject and this line; --explain is a dry run, as the unit tests show)
    detected = time.monotonic()
    res = healthcheck(tb, "n1")
    assert res.returncode == 1, res.stderr
    node = tb.slurm.node("n1")
    assert drained_by_us(node) and node.reason == f"slurm-hooks: XID 79 on GPU {gpu} [reboot]", node
    again = wait_running_elsewhere(tb, hit, "n1", timeout=30)  # at once, not after the 121 s requeue delay
    assert time.monotonic() - detected < 30
    assert (again.nodes, again.restarts) == ("n2", 1)
    other = tb.slurm.job(spared)
    assert (other.base_state, other.nodes, other.restarts) == ("RUNNING", "n1", 0), other
    assert "got SIGTERM" not in tb.job_output(spared)
    assert [r["target"] for r in actions(tb, "requeue") if r["result"] == "ok"] == [str(hit)]
    assert [r["target"] for r in actions(tb, "requeue") if r["result"] == "spared"] == [str(spared)]
    newcomer = tb.sbatch(TRAP_JOB, "--gres=gpu:1")
    assert wait_started(tb, newcomer)[0] == "n2"  # n1 takes no new job


def test_a_job_end_fault_drains_and_lets_the_running_job_finish(hooked_testbed):
    tb = hooked_testbed
    job = tb.sbatch(SHORT_JOB, "--gres=gpu:1", "--requeue")
    node, gpu = wait_started(tb, job)
    sim.inject(tb.sim_dir, node, gpu, row_remap_pending=True)
    res = healthcheck(tb, node)
    assert res.returncode == 1, res.stderr
    info = tb.slurm.node(node)
    assert drained_by_us(info) and info.reason == f"slurm-hooks: row remap pending on GPU {gpu} [reset, at job end]"
    done = tb.wait_job(job, ("COMPLETED",), timeout=30)
    assert tb.slurm.job(job).restarts == 0, done
    assert "finished" in tb.job_output(job) and "got SIGTERM" not in tb.job_output(job)
    assert not actions(tb, "requeue")
    assert tb.slurm.node(node).drained  # kept for a person (or the repair ladder) once empty


def test_a_node_scope_fault_requeues_every_job_on_the_node(hooked_testbed):
    tb = hooked_testbed
    (first, gpu), (second, _) = two_jobs_on_n1(tb)
    sim.inject(tb.sim_dir, "n1", gpu, recovery_action="node_reboot")  # the driver says: reboot the node
    res = healthcheck(tb, "n1")
    assert res.returncode == 1, res.stderr
    assert tb.slurm.node("n1").reason.endswith("[reboot]")
    for job in (first, second):
        assert wait_running_elsewhere(tb, job, "n1", timeout=15).restarts == 1
    assert sorted(r["target"] for r in actions(tb, "requeue") if r["result"] == "ok") == sorted([str(first), str(second)])


def test_config_making_xid79_job_end_leaves_its_job_running(hooked_testbed, override):
    tb = hooked_testbed
    override('[severity.xid.79]\nurgency = "job-end"\n')
    (hit, gpu), _ = two_jobs_on_n1(tb)
    sim.inject(tb.sim_dir, "n1", gpu, xid=79)
    res = healthcheck(tb, "n1")
    assert res.returncode == 1, res.stderr
    assert tb.slurm.node("n1").reason == f"slurm-hooks: XID 79 on GPU {gpu} [reboot, at job end]"
    time.sleep(2)
    job = tb.slurm.job(hit)
    assert (job.base_state, job.nodes, job.restarts) == ("RUNNING", "n1", 0), job
    assert not actions(tb, "requeue")
