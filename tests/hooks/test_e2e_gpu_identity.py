"""One GPU, one identity on the real testbed: Slurm numbers the GPUs in gres.conf's File= order,
written here in reverse (``testbed up --gres-order 7,...,0``), so Slurm's GRES index K is the sim's
(NVML's) GPU 7-K. A fault requeues the job on the GPU it really hits, and never a CPU-only job.
"""

from __future__ import annotations

import dataclasses
import time

import pytest
from conftest import SlurmTestbed, own_testbed
from hooks.test_e2e_slurm import TRAP_JOB, actions, drained_by_us, healthcheck, wait_running_elsewhere, wait_started

from slurm_hooks.lab.testbed import LabSettings
from slurm_hooks.probes import sim

pytestmark = pytest.mark.slurm

REVERSE = tuple(range(7, -1, -1))
#: Both module testbeds: two nodes of 8 GPUs with the hooks, gres.conf's File= lines in reverse.
SETTINGS = LabSettings(nodes=2, gpus=8, hooks=True, kill_wait=2, requeue_grace=3.0, gres_order=REVERSE)


def nvml_of(gres: int) -> int:
    return REVERSE[gres]


@pytest.fixture(scope="module")
def reverse_testbed(tmp_path_factory):
    with own_testbed(tmp_path_factory, "testbed-reverse", dataclasses.replace(SETTINGS, shards=2)) as tb:
        yield SlurmTestbed(tb)


@pytest.fixture
def tb(reverse_testbed):
    reverse_testbed.set_hooks(True)
    reverse_testbed.reset()
    return reverse_testbed


def started_on_n1(tb, *argv_sets: tuple[str, ...]) -> list[tuple[int, int | None]]:
    """Submit one job per argv set (Slurm's first choice is n1); [(job, its first GRES index or None)]
    once all run there."""
    jobs = [tb.sbatch(TRAP_JOB, "--requeue", "--open-mode=append", *argv) for argv in argv_sets]
    out = []
    for job in jobs:
        deadline = time.monotonic() + 20
        while "start restart=0" not in tb.job_output(job):
            assert time.monotonic() < deadline, f"job {job} never started: {tb.job_output(job)!r}"
            time.sleep(0.05)
        line = next(x for x in tb.job_output(job).splitlines() if x.startswith("start restart=0"))
        assert " on n1 " in line, line
        gpus = line.split("gpus=", 1)[1].strip()
        out.append((job, int(gpus.split(",")[0]) if gpus else None))
    return out


def test_xid79_on_the_gpu_a_job_really_holds_requeues_that_job_and_not_its_neighbour(tb):
    (hit, gres), (spared, other) = started_on_n1(tb, ("--gres=gpu:1",), ("--gres=gpu:1",))
    assert tb.slurm.job_gpus(hit, "n1") == (gres,) and other != gres
    sim.inject(tb.sim_dir, "n1", nvml_of(gres), xid=79)  # the GPU behind the job's GRES index
    detected = time.monotonic()
    res = healthcheck(tb, "n1")
    assert res.returncode == 1, res.stderr
    assert drained_by_us(tb.slurm.node("n1"))
    again = wait_running_elsewhere(tb, hit, "n1", timeout=30)  # at once, not after the 121 s requeue delay
    assert time.monotonic() - detected < 30 and (again.nodes, again.restarts) == ("n2", 1)
    job = tb.slurm.job(spared)
    assert (job.base_state, job.nodes, job.restarts) == ("RUNNING", "n1", 0), job
    assert "got SIGTERM" not in tb.job_output(spared)
    assert [r["target"] for r in actions(tb, "requeue") if r["result"] == "ok"] == [str(hit)]


def test_cpu_only_job_beside_a_gpu_job_keeps_running_when_a_gpu_neither_holds_fails(tb):
    (gpu_job, gres), (cpu_job, none) = started_on_n1(tb, ("--gres=gpu:1",), ())
    assert none is None and tb.slurm.job_gpus(cpu_job, "n1") == ()
    idle = next(k for k in range(8) if k != nvml_of(gres))
    sim.inject(tb.sim_dir, "n1", idle, xid=79)
    res = healthcheck(tb, "n1")
    assert res.returncode == 1, res.stderr
    time.sleep(2)
    for job in (gpu_job, cpu_job):
        info = tb.slurm.job(job)
        assert (info.base_state, info.nodes, info.restarts) == ("RUNNING", "n1", 0), info
        assert "got SIGTERM" not in tb.job_output(job)
    assert sorted(r["target"] for r in actions(tb, "requeue") if r["result"] == "spared") == sorted(
        [str(gpu_job), str(cpu_job)])


def test_shard_job_on_the_faulty_gpu_is_requeued_and_one_on_another_gpu_is_not(tb):
    # Two shards per GPU: shard:2 takes one GPU's both, so the two jobs hold different GPUs.
    (hit, gres), (spared, other) = started_on_n1(tb, ("--gres=shard:2",), ("--gres=shard:2",))
    assert other != gres
    sim.inject(tb.sim_dir, "n1", nvml_of(gres), xid=79)
    res = healthcheck(tb, "n1")
    assert res.returncode == 1, res.stderr
    assert wait_running_elsewhere(tb, hit, "n1", timeout=10).restarts == 1
    info = tb.slurm.job(spared)
    assert (info.base_state, info.nodes, info.restarts) == ("RUNNING", "n1", 0), info


def test_prolog_refuses_a_job_whose_gres_index_names_the_bad_gpu(tb):
    sim.inject(tb.sim_dir, "n1", nvml_of(0), xid=79)  # Slurm's first pick on n1 is GRES 0
    job = tb.sbatch(TRAP_JOB, "--gres=gpu:1", "--requeue")
    node, _ = wait_started(tb, job, timeout=30, restart=1)
    assert node == "n2"
    assert tb.slurm.node("n1").reason == f"slurm-hooks: XID 79 on GPU {nvml_of(0)} [reboot]"


# --- MIG: each of a GPU's instances is its own GRES index (`testbed up --mig 2`) -----------------


@pytest.fixture(scope="module")
def mig_testbed(tmp_path_factory):
    with own_testbed(tmp_path_factory, "testbed-mig", dataclasses.replace(SETTINGS, mig=2)) as tb:
        yield SlurmTestbed(tb)


@pytest.fixture
def mtb(mig_testbed):
    mig_testbed.set_hooks(True)
    mig_testbed.reset()
    return mig_testbed


def mig_of(gres: int) -> tuple[int, int]:
    """(NVML GPU, MIG GPU instance id) behind a GRES index: two instances per GPU, GPUs in reverse."""
    return REVERSE[gres // 2], gres % 2 + 1


def test_mig_indexed_prolog_never_drains_and_its_job_runs(mtb):
    [(job, first)] = started_on_n1(mtb, ("--gres=gpu:13",))  # GRES 0..12: instances up to GPU 1's
    assert first == 0 and mtb.slurm.job_gpus(job, "n1") == tuple(range(13))
    assert not mtb.slurm.node("n1").drained
    assert not [r for r in mtb.audit_events() if r.get("kind") in ("alert", "action")]


def test_xid79_on_a_mig_gpu_requeues_the_jobs_on_all_its_instances_and_no_other(mtb):
    placed = started_on_n1(mtb, ("--gres=gpu:1",), ("--gres=gpu:1",), ("--gres=gpu:1",))
    on = {job: mig_of(gres) for job, gres in placed}
    bad = on[placed[0][0]][0]
    hit = [job for job, (gpu, _) in on.items() if gpu == bad]
    spared = [job for job, (gpu, _) in on.items() if gpu != bad]
    assert len(hit) == 2 and len(spared) == 1, on  # Slurm packs GRES 0, 1 (one GPU's two instances), 2
    sim.inject(mtb.sim_dir, "n1", bad, xid=79)
    assert healthcheck(mtb, "n1").returncode == 1
    for job in hit:
        assert wait_running_elsewhere(mtb, job, "n1", timeout=10).restarts == 1
    info = mtb.slurm.job(spared[0])
    assert (info.base_state, info.nodes, info.restarts) == ("RUNNING", "n1", 0), info


def test_a_fault_of_one_mig_instance_requeues_that_instances_job_only(mtb):
    placed = started_on_n1(mtb, ("--gres=gpu:1",), ("--gres=gpu:1",))
    (gpu_a, gi_a), (gpu_b, gi_b) = (mig_of(gres) for _, gres in placed)
    assert gpu_a == gpu_b and gi_a != gi_b
    sim.inject(mtb.sim_dir, "n1", gpu_a, xid=95, instance=gi_a)  # the kernel line names GPU-I:<gi_a>
    assert healthcheck(mtb, "n1").returncode == 1
    assert mtb.slurm.node("n1").reason == f"slurm-hooks: XID 95 on GPU {gpu_a} instance {gi_a} [reset]"
    assert wait_running_elsewhere(mtb, placed[0][0], "n1", timeout=10).restarts == 1
    info = mtb.slurm.job(placed[1][0])
    assert (info.base_state, info.nodes, info.restarts) == ("RUNNING", "n1", 0), info
