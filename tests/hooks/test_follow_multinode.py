"""A requeued multi-node job is made eligible only once Slurm's credential revocation is behind it.

``StartTime=now`` skips Slurm's requeue delay, which is what keeps a restart apart from the
revocation of the job's credential on its nodes (slurmd refuses a credential not newer than the
revocation, to the second): a multi-node job started again within that second on one of its old
nodes is refused and killed. Simulated GPUs and the shared in-memory Slurm.
"""

from __future__ import annotations

import time
from dataclasses import replace

from fakes.config import sim_config, sim_node

from slurm_hooks.hooks import healthcheck, jobhooks
from slurm_hooks.probes import sim
from slurm_hooks.remedy import follower


def _two_node_job_requeued(tmp_path):
    cfg = sim_config(tmp_path, "[expect]\ngpus = 8")
    slurm, w = sim_node(cfg, "MIXED")
    slurm.add_job(40, "n[1-2]")
    sim.inject(cfg.gpu.sim_dir, "n1", 3, xid=79)
    healthcheck.run(w, follow="none")
    assert [(c[0], str(c[1])) for c in slurm.called("requeue")] == [("requeue", "40")]
    return slurm, w


def test_a_requeued_two_node_job_is_recorded_with_its_node_count(tmp_path):
    slurm, w = _two_node_job_requeued(tmp_path)
    rec = follower.read_record(w, "40")
    assert (rec.phase, rec.nodes) == (follower.Phase.REQUEUED, 2)
    assert rec.ts >= rec.fault_at > 0


def test_a_two_node_job_is_not_started_within_the_revocation_delay_and_is_after_it(tmp_path):
    slurm, w = _two_node_job_requeued(tmp_path)
    slurm.add_job(40, "", "PENDING", restarts=1)
    follower.write_record(w, replace(follower.read_record(w, "40"), ts=time.time()))
    assert follower.finish_followed(w) == {"40": "timed out"}  # left for the next look
    assert slurm.called("start_now") == []
    follower.write_record(w, replace(follower.read_record(w, "40"), ts=time.time() - follower.CRED_REVOKE_DELAY_S))
    assert follower.finish_followed(w) == {"40": "ok"}
    assert [(c[0], str(c[1])) for c in slurm.called("start_now")] == [("start_now", "40")]


def test_a_one_node_job_is_started_at_once(tmp_path):
    cfg = sim_config(tmp_path, "[expect]\ngpus = 8")
    slurm, w = sim_node(cfg, "MIXED", 41)
    sim.inject(cfg.gpu.sim_dir, "n1", 3, xid=79)
    healthcheck.run(w, follow="none")
    slurm.add_job(41, "", "PENDING", restarts=1)
    assert follower.read_record(w, "41").nodes == 1
    assert follower.finish_followed(w) == {"41": "ok"}
    assert [(c[0], str(c[1])) for c in slurm.called("start_now")] == [("start_now", "41")]


def test_a_two_node_job_the_prolog_refused_waits_from_when_it_is_pending_again_not_from_the_refusal(tmp_path,
                                                                                                      monkeypatch):
    # Slurm requeues a job its prolog refused only once the prolog has exited (after its AdminComment, its
    # follower's start): the revocation lies after the record's ts, by however long that took on a loaded
    # node. Counting from ts started it within the revocation's second on a slow prolog.
    cfg = sim_config(tmp_path, "[expect]\ngpus = 8")
    slurm, w = sim_node(cfg, "MIXED")
    sim.inject(cfg.gpu.sim_dir, "n1", 3, xid=79)
    slurm.add_job(42, "n[1-2]")
    real = follower.follow_jobs
    monkeypatch.setattr(follower, "follow_jobs", lambda w, refs, how, **kw: real(w, refs, "none", **kw))  # no process
    assert jobhooks.prolog(w, {"SLURM_JOB_ID": "42", "SLURM_JOB_GPUS": "3", "SLURM_JOB_NODELIST": "n[1-2]"}) == 1
    rec = follower.read_record(w, "42")
    assert (rec.nodes, rec.refused) == (2, True)
    follower.write_record(w, replace(rec, ts=time.time() - 60))  # a prolog that took long to exit
    slurm.add_job(42, "", "PENDING", restarts=1)  # Slurm requeued it just now
    assert follower.finish_followed(w) == {"42": "timed out"}
    assert slurm.called("start_now") == []
    rec = follower.read_record(w, "42")
    assert rec.pending_at > 0
    follower.write_record(w, replace(rec, pending_at=rec.pending_at - follower.CRED_REVOKE_DELAY_S))
    assert follower.finish_followed(w) == {"42": "ok"}
    assert [(c[0], str(c[1])) for c in slurm.called("start_now")] == [("start_now", "42")]
