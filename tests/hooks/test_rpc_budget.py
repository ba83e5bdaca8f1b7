"""What one health check asks of slurmctld, counted as Slurm adapter calls (tests/fakes/slurm.py).

A storm leaves many nodes drained by us, and slurmd runs the check on each of them every
HealthCheckInterval: a node already drained by us must not be drained again, nor its node and
jobs read twice, every round (bench/bench_storm32.py counts the real RPCs with sdiag).
"""

from __future__ import annotations

from fakes.config import sim_config, sim_node

from slurm_hooks.hooks import healthcheck
from slurm_hooks.probes import sim

#: The adapter calls that only read; every other call changes something in Slurm.
READS = {"node", "nodes", "jobs_on_node", "job_gpus", "job_detail", "job_record", "jobs", "job", "admin_comment",
         "drained_count"}
#: The reads of one job (each one ``scontrol show job``).
JOB_READS = ("job_detail", "job_record", "admin_comment")
REASON = "slurm-hooks: XID 79 on GPU 0 [reboot]"


def node(tmp_path, state, *jobs):
    cfg = sim_config(tmp_path, "[expect]\ngpus = 8")
    slurm, w = sim_node(cfg, state, *jobs)
    return cfg, slurm, w


def one_check(slurm, w):
    slurm.calls.clear()
    healthcheck.run(w, follow="none")
    calls = list(slurm.calls)
    return [c for c in calls if c[0] in READS], [c for c in calls if c[0] not in READS]


def test_a_check_on_an_idle_node_we_drained_reads_the_node_once_and_writes_nothing(tmp_path):
    cfg, slurm, w = node(tmp_path, "IDLE")
    sim.inject(cfg.gpu.sim_dir, "n1", 0, xid=79)
    healthcheck.run(w, follow="none")
    assert slurm.peek("n1").reason == REASON
    for _ in range(3):  # every later round of the storm
        reads, writes = one_check(slurm, w)
        assert (reads, writes) == ([("node", "n1")], [])
    assert slurm.peek("n1").reason == REASON  # still ours, still drained


def test_a_check_on_a_drained_node_still_running_a_spared_job_reads_node_and_jobs_once_each(tmp_path):
    cfg, slurm, w = node(tmp_path, "MIXED", 12)
    slurm.set_job_gpus(12, (5,))  # not on the faulty GPU 0: left to run
    sim.inject(cfg.gpu.sim_dir, "n1", 0, xid=79)
    healthcheck.run(w, follow="none")
    assert slurm.called("requeue") == []
    reads, writes = one_check(slurm, w)
    assert writes == []
    assert [c[0] for c in reads].count("node") == 1
    assert [c[0] for c in reads].count("jobs_on_node") == 1
    assert len(reads) <= 3, reads


def test_the_first_check_of_a_storm_drains_and_requeues_once_within_its_budget(tmp_path):
    cfg, slurm, w = node(tmp_path, "ALLOCATED", 12)
    sim.inject(cfg.gpu.sim_dir, "n1", 0, xid=79)
    reads, writes = one_check(slurm, w)
    assert [c[0] for c in writes].count("drain") == 1
    assert [c[0] for c in writes].count("requeue") == 1
    assert [c[0] for c in reads].count("node") <= 2  # before the drain, and its ReasonTime after
    # the job's GPUs, what it says of itself (does it heal in place?) and its AdminComment in one read:
    # neither is read again to say why
    assert [c[0] for c in reads if c[0] in JOB_READS] == ["job_detail"]
    assert len(reads) + len(writes) <= 8, reads + writes


def test_a_node_wide_fault_reads_each_job_it_requeues_once(tmp_path):
    cfg = sim_config(tmp_path, "[expect]\ngpus = 9")  # one GPU short: the whole node
    slurm, w = sim_node(cfg, "ALLOCATED", 12)
    reads, writes = one_check(slurm, w)
    assert [c[0] for c in writes] == ["drain", "requeue", "set_admin_comment"]
    # what the job says of itself and its AdminComment, from one read (no GPU to ask about)
    assert [c[0] for c in reads if c[0] in JOB_READS] == ["job_record"]


def test_an_admins_resume_is_seen_though_the_drain_reuses_the_checks_read(tmp_path):
    cfg, slurm, w = node(tmp_path, "IDLE")
    sim.inject(cfg.gpu.sim_dir, "n1", 0, xid=79)
    healthcheck.run(w, follow="none")
    slurm.resume("n1")  # a person mended it and resumed it
    reads, writes = one_check(slurm, w)
    assert [c[0] for c in writes].count("drain") == 0  # the XID it was drained for is acknowledged
    assert "DRAIN" not in slurm.peek("n1").state


def test_with_the_repair_ladder_on_its_look_before_the_drain_is_the_drains(tmp_path):
    cfg = sim_config(tmp_path, "[expect]\ngpus = 8\n[repair]\nenabled = true\n")
    slurm, w = sim_node(cfg, "ALLOCATED", 12)
    sim.inject(cfg.gpu.sim_dir, "n1", 0, xid=79)
    reads, writes = one_check(slurm, w)
    assert [c[0] for c in writes] == ["drain", "requeue", "set_admin_comment"]
    # the ladder's look, which the drain reuses; its ReasonTime after the drain; the ladder's after the requeue
    assert [c[0] for c in reads].count("node") == 3
    assert [c[0] for c in reads].count("jobs_on_node") == 2  # the requeue's, and the ladder's after it
    assert len(reads) + len(writes) <= 10, reads + writes
