"""What the job follower asks of Slurm per look, counted as calls of the shared fake Slurm
(tests/fakes/slurm.py): one jobs-query per look for every job it follows on the node, however
many there are and however they came to it. bench/bench_storm32.py counts the same in slurmctld's
RPCs (sdiag) on a real cluster.
"""

from __future__ import annotations

import threading
import time

import pytest
from conftest import wait_for
from fakes.config import sim_config, sim_node

from slurm_hooks.remedy import follower

#: Follower threads that other tests of this process left running (daemon threads with their own
#: timeouts): not this test's, so never counted by it.
_OTHERS: set[threading.Thread] = set()


@pytest.fixture
def node(tmp_path):
    _OTHERS.clear()
    _OTHERS.update(t for t in threading.enumerate() if t.name == "follow-jobs")
    cfg = sim_config(tmp_path, "[expect]\ngpus = 8")
    slurm, w = sim_node(cfg, "ALLOCATED")
    yield slurm, w
    for thread in follower_threads():  # no follower thread of this test outlives it
        thread.join(10)


def looks(slurm):
    return [c[1] for c in slurm.called("jobs")]


def follower_threads():
    """This test's follower threads."""
    return [t for t in threading.enumerate() if t.name == "follow-jobs" and t not in _OTHERS]


def test_a_follower_of_five_jobs_asks_once_per_look_for_all_five(node):
    slurm, w = node
    refs = [str(j) for j in range(101, 106)]
    for ref in refs:
        slurm.add_job(int(ref), "n1")
        slurm.job_states(int(ref), ["COMPLETING", "COMPLETING", "COMPLETING", "PENDING"], reason="BeginTime")
    results = follower.follow_requeued(w, refs, timeout=10, poll=0.01)
    assert results == dict.fromkeys(refs, "ok")
    assert looks(slurm) == [tuple(refs)] * 4  # four looks, each one query naming every job
    assert slurm.called("job") == []


def test_a_job_touched_later_on_the_node_joins_the_running_follower_one_query_per_look_for_both(node):
    slurm, w = node
    for job_id in (101, 102):
        slurm.add_job(job_id, "n1")
        slurm.job_states(job_id, ["COMPLETING"])  # until the test says PENDING
    follower.follow_jobs(w, [101], "thread")
    wait_for(lambda: looks(slurm), 5, "the follower's first look")
    follower.follow_jobs(w, [102], "thread")  # another fault on the node, a moment later
    wait_for(lambda: ("101", "102") in looks(slurm), 5, "a look at both jobs")
    assert len(follower_threads()) == 1
    for job_id in (101, 102):
        slurm.job_states(job_id, ["PENDING"], reason="BeginTime")
    wait_for(lambda: not follower_threads(), 10, "the follower done")
    assert ("102",) not in looks(slurm)  # never a query of its own for the job that joined
    assert set(looks(slurm)) <= {("101",), ("101", "102"), ("102", "101")}
    assert slurm.called("start_now") == [("start_now", 101), ("start_now", 102)]


def test_after_its_follower_is_done_a_later_job_gets_a_follower_of_its_own(node):
    slurm, w = node
    slurm.add_job(101, "n1")
    slurm.job_states(101, ["PENDING"], reason="BeginTime")
    follower.follow_jobs(w, [101], "thread")
    wait_for(lambda: slurm.called("start_now"), 5, "job 101 started")
    wait_for(lambda: not follower_threads(), 5, "the first follower done")
    slurm.add_job(102, "n1")
    slurm.job_states(102, ["COMPLETING", "PENDING"], reason="BeginTime")
    follower.follow_jobs(w, [102], "thread")
    wait_for(lambda: len(slurm.called("start_now")) == 2, 5, "job 102 started")
    assert looks(slurm) == [("101",), ("102",), ("102",)]


def test_a_follower_that_starts_late_waits_as_if_it_had_looked_since_the_requeue(node):
    slurm, w = node
    slurm.add_job(101, "n1")
    follower.write_record(w, follower.Followed("101", "n1", ts=time.time() - 1.0))  # requeued 1 s ago
    slurm.job_states(101, ["COMPLETING", "PENDING"], reason="BeginTime")
    t0 = time.monotonic()
    assert follower.follow_requeued(w, ["101"], timeout=10) == {"101": "ok"}
    # Its second look: 0.1 s after the first for a job requeued just now, about half the second
    # since the requeue here (0.1 + 1.0 * 0.5), as a follower that had looked all along would.
    assert 0.5 <= time.monotonic() - t0 < 5
    assert looks(slurm) == [("101",), ("101",)]
