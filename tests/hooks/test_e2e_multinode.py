"""The job that spans nodes, on the real testbed: a real PyTorch DDP job (gloo on CPU, one rank
per node, :mod:`slurm_hooks.lab.ddp_train`) hit by an XID 79 on one of its nodes.

The watcher runs on both of the job's nodes, as on a site, and finds the XID; the health check
then runs on both nodes as slurmd would. Work lost is read back from rank 0's step log: the step
reached at the fault minus the step the job resumed from, at 0.1 s a step.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import time

import pytest
from conftest import wait_for

from slurm_hooks.lab import ddp_train
from slurm_hooks.probes import sim
from slurm_hooks.slurm import hostlist

pytestmark = pytest.mark.slurm

MAX_LOST_S = 2.0
STEP_S = 0.1
#: torch's import and gloo's rendezvous take seconds per rank on a loaded 2-core machine.
START_S = 120.0

@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    """Three nodes, slurm-hooks wired in, KillWait 15 s (a DDP rank saves and exits well within)."""
    why_not = ddp_train.torch_missing()  # here, not at import: collecting the no-root tier starts no torch
    if why_not:
        pytest.skip(why_not)
    from conftest import TESTBED_SETTINGS, SlurmTestbed, own_testbed

    settings = dataclasses.replace(TESTBED_SETTINGS, nodes=3, hooks=True, kill_wait=15, requeue_grace=20.0,
                                   checkpoint_grace=8.0, own_addresses=True)
    with own_testbed(tmp_path_factory, "testbed-multinode", settings) as tb:
        yield SlurmTestbed(tb)


@pytest.fixture
def tb(bed):
    bed.reset(timeout=60.0)
    return bed


def steps(workdir: str) -> list[tuple[int, float, str]]:
    out = []
    try:
        with open(os.path.join(workdir, "steps.log"), encoding="utf-8") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) == 3:
                    out.append((int(parts[0]), float(parts[1]), parts[2]))
    except OSError:
        pass
    return out


def starts(output: str, restart: int) -> dict[str, dict[str, str]]:
    """rank -> the fields of its ``start restart=<restart> ...`` line."""
    # Two ranks' lines through one srun can share a line of the output file (``...backend=gloostart
    # restart=1 ...``): look for every start within a line, not at its beginning only.
    found = {}
    for m in re.finditer(rf"start restart={restart} step=(\d+) on (\S+) rank=(\d+)", output):
        found[m.group(3)] = {"restart": str(restart), "step": m.group(1), "on": m.group(2), "rank": m.group(3)}
    return found


def watcher(tb, node: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "slurm_hooks", "watch", "--node", node], env=tb.env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def healthcheck(tb, node: str) -> subprocess.CompletedProcess:
    return subprocess.run([os.path.join(tb.state_dir, "bin", "healthcheck")], env={"SLURMD_NODENAME": node},
                          capture_output=True, text=True, timeout=60)


def acted(tb, name: str) -> list[dict]:
    return [r for r in tb.audit_events() if r.get("kind") == "action" and r.get("action") == name
            and r.get("result") not in ("already", "skipped")]


def test_a_ddp_job_on_two_nodes_hit_by_xid79_on_one_is_requeued_once_and_resumes_on_the_two_healthy_nodes(
        tb, tmp_path):
    work = str(tmp_path / "ddp")
    job = tb.sbatch(ddp_train.batch_script(work, nodes=2, step_s=STEP_S))
    wait_for(lambda: len(steps(work)) >= 20, START_S, f"DDP job {job} training 20 steps")
    first = tb.slurm.job(job)
    used = hostlist.expand(first.nodes)
    assert len(used) == 2 and set(starts(tb.job_output(job), 0)) == {"0", "1"}
    bad, good = used[1], used[0]  # the fault is on the node without the batch step
    watchers = [watcher(tb, n) for n in used]
    try:
        wait_for(lambda: sum(r.get("message") == "watcher started" for r in tb.audit_events()) >= 2, 30,
                 "both watchers started")
        sim.inject(tb.sim_dir, bad, tb.slurm.job_gpus(str(job), bad)[0], xid=79)
        fault = time.time()

        def requeued_off_bad():
            info = tb.slurm.job(job)
            return info if info.base_state == "RUNNING" and info.restarts >= 1 and bad not in \
                hostlist.expand(info.nodes) else None

        again = wait_for(requeued_off_bad, 90, f"job {job} running again off {bad}")
        # The other node's hooks, and the bad node's own health check, look again: nothing more.
        assert healthcheck(tb, good).returncode == 0
        healthcheck(tb, bad)
        resumed = wait_for(lambda: starts(tb.job_output(job), 1).get("0"), START_S, "the restart's rank 0 start")
        time.sleep(2.0)
        assert tb.slurm.job(job).restarts == 1  # exactly once
    finally:
        for proc in watchers:
            proc.terminate()
            proc.wait(timeout=10)
    assert sorted(hostlist.expand(again.nodes)) == sorted(set(tb.nodes) - {bad})
    reached = max((s for s, t, r in steps(work) if r == "0" and t <= fault), default=0)
    assert (reached - int(resumed["step"])) * STEP_S <= MAX_LOST_S, (reached, resumed)
    output = tb.job_output(job)
    # Every rank stops at one step, its checkpoint's; Slurm signals the two nodes' steps apart, so a rank
    # may stop on its peer's signal before its own arrives: at least one rank got SIGTERM itself.
    stopped = {rank: step for step, rank in re.findall(r"stopping at step=(\d+) on \S+ rank=(\d) on ", output)}
    assert set(stopped) == {"0", "1"} and len(set(stopped.values())) == 1, output
    assert re.search(rf"got SIGTERM at step={stopped['0']} on \S+ rank=\d\b", output), output
    assert f"saved step={stopped['0']} " in output
    requeues = acted(tb, "requeue")
    assert [(r["result"], r.get("requeued_by")) for r in requeues] == [("ok", "ours")], requeues
    drained = {n.name: n for n in tb.slurm.nodes()}
    assert drained[bad].drained and drained[bad].reason.startswith("slurm-hooks:")
    assert [n for n in tb.nodes if n != bad and drained[n].drained] == []  # the healthy node it left too
