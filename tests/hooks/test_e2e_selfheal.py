"""Jobs that heal themselves, on the real testbed: work with the job's own resilience.

A real PyTorch job under torchrun (Debian's python3-torch, gloo on CPU) with elastic membership
goes on without a node we drain and is never requeued; with fixed membership it is requeued once
as any job. Megatron-LM's exit 16 is requeued once without its node, which becomes a suspect;
NVRx's exit 93 is never requeued; a Lightning job requeues itself on its SIGUSR1, once.
The health check runs as slurmd runs it; the epilog is slurmd's own.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import time

import pytest
from conftest import wait_for

from slurm_hooks.lab import ddp_train
from slurm_hooks.probes import sim
from slurm_hooks.slurm import hostlist

pytestmark = pytest.mark.slurm

#: torch's import and gloo's rendezvous take seconds per rank on a loaded 2-core machine.
START_S = 120.0


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    from conftest import TESTBED_SETTINGS, SlurmTestbed, own_testbed

    settings = dataclasses.replace(TESTBED_SETTINGS, nodes=2, hooks=True, kill_wait=15, requeue_grace=20.0,
                                   checkpoint_grace=8.0, in_job_grace=60.0)
    with own_testbed(tmp_path_factory, "testbed-selfheal", settings) as tb:
        yield SlurmTestbed(tb)


@pytest.fixture
def tb(bed):
    bed.reset(timeout=60.0)
    return bed


@pytest.fixture
def torchrun_job(tb):
    why_not = ddp_train.torchrun_missing()
    if why_not:
        pytest.skip(why_not)
    return tb


def healthcheck(tb, node: str) -> subprocess.CompletedProcess:
    return subprocess.run([os.path.join(tb.state_dir, "bin", "healthcheck")], env={"SLURMD_NODENAME": node},
                          capture_output=True, text=True, timeout=60)


def steps(workdir: str) -> list[tuple[int, float, str, int]]:
    """Rank 0's log under torchrun: (step, time, restart, world size)."""
    out = []
    try:
        with open(os.path.join(workdir, "steps.log"), encoding="utf-8") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) == 4:
                    out.append((int(parts[0]), float(parts[1]), parts[2], int(parts[3])))
    except OSError:
        pass
    return out


def actions(tb, name: str, result: str | None = None) -> list[dict]:
    return [r for r in tb.audit_events() if r.get("kind") == "action" and r.get("action") == name
            and (result is None or r.get("result") == result)]


def fault_on_second_node(tb, job: int) -> tuple[str, str, float]:
    used = hostlist.expand(tb.slurm.job(job).nodes)
    assert len(used) == 2
    bad, good = used[1], used[0]  # the batch script runs on the first: the job can leave the second
    sim.inject(tb.sim_dir, bad, tb.slurm.job_gpus(str(job), bad)[0], xid=79)
    fault = time.time()
    healthcheck(tb, bad)
    return bad, good, fault


def test_an_elastic_torchrun_job_hit_on_one_node_goes_on_without_it_and_is_not_requeued(torchrun_job, tmp_path):
    """Its ranks on the bad node get SIGTERM, torchrun re-forms on the other node and trains on
    (world size 1), Slurm's restart count stays 0, the node is drained, and the audit log and
    the AdminComment say it healed in place. A requeue of the job, or a window that never sees
    the ranks leave, fails this test."""
    tb = torchrun_job
    work = str(tmp_path / "elastic")
    job = tb.sbatch(ddp_train.torchrun_script(work, nodes="1:2"))
    wait_for(lambda: len([s for s in steps(work) if s[3] == 2]) >= 20, START_S, f"job {job} training on 2 nodes")
    bad, good, fault = fault_on_second_node(tb, job)
    wait_for(lambda: [s for s in steps(work) if s[3] == 1 and s[1] > fault][10:], 90,
             f"job {job} training on without {bad}")
    healed = wait_for(lambda: actions(tb, "requeue", "healed"), 30, "the follower's healed record")
    assert healed[0]["target"] == str(job)
    info = tb.slurm.job(job)
    assert info.running and info.restarts == 0
    assert tb.slurm.node(bad).drained
    assert "healed in place" in tb.slurm.admin_comment(job)
    told = actions(tb, "signal", "ok")
    assert told and told[0]["via"] == "ranks" and "torchrun" in told[0]["heals"]
    healthcheck(tb, bad)  # the drained node's next check leaves the healed job be
    time.sleep(1.0)
    assert tb.slurm.job(job).restarts == 0 and not actions(tb, "requeue", "ok")


def test_a_torchrun_job_of_fixed_size_hit_on_one_node_is_requeued_once(torchrun_job, tmp_path):
    """``--nnodes=2``: it cannot go on without the node, so it is requeued at once, as any job."""
    tb = torchrun_job
    work = str(tmp_path / "fixed")
    job = tb.sbatch(ddp_train.torchrun_script(work, nodes="2"))
    wait_for(lambda: len(steps(work)) >= 20, START_S, f"job {job} training on 2 nodes")
    bad, _, _ = fault_on_second_node(tb, job)
    wait_for(lambda: tb.slurm.job(job).restarts >= 1, 60, f"job {job} requeued")
    assert not actions(tb, "signal", "ok")
    healthcheck(tb, bad)
    time.sleep(1.0)
    assert tb.slurm.job(job).restarts == 1


def exiting(code: int, then: str = "exit 0") -> str:
    return ("#!/bin/sh\n#SBATCH --gres=gpu:1\n#SBATCH --requeue\n#SBATCH --open-mode=append\n"
            f'echo "run ${{SLURM_RESTART_COUNT:-0}} on $SLURMD_NODENAME"\n'
            f'if [ "${{SLURM_RESTART_COUNT:-0}}" = 0 ]; then exit {code}; fi\n{then}\n')


def test_a_megatron_job_exiting_16_is_requeued_once_without_its_node_which_becomes_a_suspect(tb):
    job = tb.sbatch(exiting(16), "--comment=heals=megatron")
    first = wait_for(lambda: tb.slurm.job(job).nodes if tb.slurm.job(job).restarts == 0 else None, 30,
                     f"job {job} placed")
    done = wait_for(lambda: (lambda j: j if j.finished else None)(tb.slurm.job(job)), 90, f"job {job} done again")
    assert done.completed and done.restarts == 1
    assert f"run 1 on {first}" not in tb.job_output(job) and "run 1 on " in tb.job_output(job)
    suspects = actions(tb, "suspect", "recorded")
    assert [s["target"] for s in suspects] == [first] and suspects[0]["exit_code"] == "16:0"
    assert first in tb.slurm.job_record(job).excluded
    assert len(actions(tb, "requeue", "ok")) == 1


def test_an_nvrx_job_exiting_93_is_not_requeued(tb):
    job = tb.sbatch(exiting(93), "--comment=heals=nvrx")
    done = wait_for(lambda: (lambda j: j if j.finished else None)(tb.slurm.job(job)), 30, f"job {job} done")
    wait_for(lambda: actions(tb, "requeue", "not requeued"), 15, "the epilog's record")
    time.sleep(1.0)
    assert done.failed and tb.slurm.job(job).restarts == 0
    assert "exit 93" in actions(tb, "requeue", "not requeued")[0]["detail"]


def lightning_script(tb) -> str:
    """What Lightning's SLURM connector does: every rank traps SIGUSR1 and saves, rank 0 runs
    ``scontrol requeue $SLURM_JOB_ID`` itself; no ``--signal`` (the job says it is Lightning)."""
    scontrol = os.path.join(tb.slurm_bin, "scontrol")
    rank = (f'trap "echo saved on \\$SLURMD_NODENAME; [ \\$SLURM_PROCID = 0 ] && {scontrol} requeue \\$SLURM_JOB_ID; '
            'exit 0" USR1; echo trapped on $SLURMD_NODENAME; while :; do sleep 0.2; done')
    return ("#!/bin/sh\n#SBATCH --gres=gpu:1\n#SBATCH --requeue\n#SBATCH --open-mode=append\n"
            'echo "run ${SLURM_RESTART_COUNT:-0} on $SLURMD_NODENAME"\n'
            'if [ "${SLURM_RESTART_COUNT:-0}" != 0 ]; then exit 0; fi\n'
            f"RANK='{rank}'\nexec srun sh -c \"$RANK\"\n")


def test_a_lightning_job_requeues_itself_on_its_sigusr1_once(tb):
    job = tb.sbatch(lightning_script(tb), "--comment=heals=lightning")
    node = wait_for(lambda: (lambda j: j.nodes if j.running else None)(tb.slurm.job(job)), 30, f"job {job} running")
    wait_for(lambda: f"trapped on {node}" in tb.job_output(job), 30, f"job {job}'s rank trapping SIGUSR1",
             seen=lambda: f"it wrote {tb.job_output(job)!r}")
    sim.inject(tb.sim_dir, node, tb.slurm.job_gpus(str(job), node)[0], xid=79)
    healthcheck(tb, node)
    done = wait_for(lambda: (lambda j: j if j.finished else None)(tb.slurm.job(job)), 90, f"job {job} done again")
    assert done.completed and done.restarts == 1
    assert f"saved on {node}" in tb.job_output(job)
    requeues = [r for r in actions(tb, "requeue") if r.get("result") in ("ok", "self")]
    assert [r["result"] for r in requeues] == ["self"]
