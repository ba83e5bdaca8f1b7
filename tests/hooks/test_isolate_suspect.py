"""Suspects from failed multi-node jobs (slurm_hooks.remedy.suspect), on the real testbed with
slurm-hooks wired in: a job failed by a hung rank on n4 (no XID) leaves a suspect on its nodes and
no drain; n4 failing a second job, with another partner, with ``[isolate] auto = true`` starts one
isolate of n4 (its partners were in one failed job each: not suspected), which waits for it to be
idle, adds idle peers, and drains n4 alone."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import sys

import pytest
from conftest import wait_for

from slurm_hooks.hooks import collective
from slurm_hooks.hooks import isolate as isolating

pytestmark = pytest.mark.slurm
#: The isolate's own bounds: it starts no wave past BUDGET, and cancels a test TEST_TIMEOUT (plus its
#: start margin) after it started, so its summary record is written within ISOLATE_BOUND of its start.
TEST_TIMEOUT, BUDGET = 20.0, 180.0
ISOLATE_BOUND = BUDGET + TEST_TIMEOUT + isolating.START_MARGIN_S + 30.0
HANG_OR_RUN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fakes", "hang_or_run.py")


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    from conftest import TESTBED_SETTINGS, SlurmTestbed, own_testbed

    settings = dataclasses.replace(TESTBED_SETTINGS, nodes=5, gpus=1, hooks=True, own_addresses=True)
    with own_testbed(tmp_path_factory, "testbed-suspect", settings) as tb:
        yield SlurmTestbed(tb)


def set_isolate(tb, auto: bool) -> None:
    """The testbed's own config (the hooks read it) with an [isolate] table: the TCP all-reduce."""
    with open(tb.config_path, encoding="utf-8") as fh:
        text = fh.read().split("\n[isolate]\n")[0]
    # A rank waits 12 s for its peers: srun starts a pair's two ranks seconds apart on a loaded 2-core
    # machine, and at 6 s a healthy node paired to confirm a suspect could "not complete" (Debian 13).
    # ratio = 0.1: the "nodes" share one machine's CPUs and loopback, so a pair's bandwidth says how the
    # scheduler treated its two ranks (0.15 to 0.32 GB/s between healthy pairs under load), not its links;
    # these tests are about a hang, and a healthy pair judged slow by that noise is no finding.
    command = [sys.executable, HANG_OR_RUN, "--fault-dir", tb.faults_dir, sys.executable, collective.__file__,
               "--backend", "tcp", "--timeout", "12", "--size-mb", "1"]
    with open(tb.config_path, "w", encoding="utf-8") as fh:
        fh.write(text + "\n[isolate]\n" + f"command = {json.dumps(command)}\n"
                 f"auto = {'true' if auto else 'false'}\ntest_timeout = {TEST_TIMEOUT:g}\nbudget = {BUDGET:g}\n"
                 "window = 3600.0\nratio = 0.1\n")


@pytest.fixture
def tb(bed):
    bed.reset(timeout=60.0)
    yield bed
    set_isolate(bed, auto=False)


def failing_job(tb, partner: str = "n3") -> int:
    """A two-rank all-reduce on ``partner`` and n4 (a GPU each): with n4 hung, the partner's rank gives
    up and the job fails."""
    argv = [sys.executable, HANG_OR_RUN, sys.executable, collective.__file__, "--backend", "tcp", "--timeout", "4",
            "--size-mb", "1"]
    script = f"#!/bin/sh\nexec srun --kill-on-bad-exit=1 {' '.join(shlex.quote(a) for a in argv)}\n"
    job = tb.sbatch(script, "-N2", "-w", f"{partner},n4", "--gres=gpu:1")
    tb.wait_job(job, ["FAILED"], timeout=60)
    return job


def records(tb, action: str) -> list[dict]:
    return [r for r in tb.audit_events() if r.get("kind") == "action" and r.get("action") == action]


def test_a_multinode_job_failed_by_a_hung_rank_is_a_suspect_on_its_nodes_and_drains_nothing(tb):
    set_isolate(tb, auto=False)
    tb.set_fault("n4", "hang")
    job = failing_job(tb)
    found = wait_for(lambda: len(records(tb, "suspect")) >= 2 and records(tb, "suspect"), 30, "both epilogs' suspects")
    assert sorted(r["node"] for r in found) == ["n3", "n4"]
    assert all(r["jobs"] == [str(job)] and r["nodes"] == ["n3", "n4"] and r["result"] == "recorded" for r in found)
    assert "ended with exit code " in found[0]["detail"] and "no finding of ours" in found[0]["detail"]
    assert [n.name for n in tb.slurm.nodes() if n.drained] == []
    assert records(tb, "isolate-start") == []


def test_a_node_in_two_failed_jobs_with_different_partners_starts_one_isolate_that_drains_it_alone(tb):
    set_isolate(tb, auto=True)
    tb.set_fault("n4", "hang")
    first = failing_job(tb, "n3")
    wait_for(lambda: len(records(tb, "suspect")) >= 2, 30, "the first job's suspects")
    assert records(tb, "isolate-start") == []  # once is no pattern
    second = failing_job(tb, "n5")
    [started] = wait_for(lambda: records(tb, "isolate-start"), 30, "the isolate started by an epilog")
    assert (started["node"], started["result"], started["target"]) == ("n4", "ok", "n4")
    assert f"n4 (jobs {first}, {second})" in started["detail"]
    # The isolate ends within its own bounds (6 test jobs in 3 waves take 40-60 s here, more under CI's load):
    # wait for its summary, not for a guess at its duration.
    [done] = wait_for(lambda: records(tb, "isolate"), ISOLATE_BOUND, "the isolate's summary record")
    assert done["result"] == "found", done["detail"]
    # Three idle peers (AUTO_PEERS) to confirm n4 against.
    target = done["target"].split(",")
    assert len(target) == 4 and "n4" in target, target
    n4 = tb.wait_node("n4", lambda n: n.drained, timeout=10)
    assert n4.reason.startswith("slurm-hooks: collective test failed on n4 (did not complete")
    assert "; failed with " in n4.reason  # three partners, each of which had passed
    assert n4.reason.endswith("[isolate]")
    drained = {n.name: n.reason for n in tb.slurm.nodes() if n.drained}
    assert list(drained) == ["n4"], drained
    assert len(records(tb, "isolate-start")) == 1  # n5's epilog did not start a second one
