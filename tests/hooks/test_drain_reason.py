"""One stable drain reason for one set of findings, whichever hook judged the node last.

The check judges every GPU, the prolog and epilog only the job's: a node drained by the check for
two faults keeps that reason through an epilog that sees one of them, instead of flapping
between the two texts. A requeued job's AdminComment names only what touched its GPUs.
Simulated GPUs and the shared in-memory Slurm (tests/fakes/slurm.py).
"""

from __future__ import annotations

from fakes.config import sim_config, sim_node

from slurm_hooks.hooks import healthcheck, jobhooks
from slurm_hooks.models import Action, Finding, Scope, Severity
from slurm_hooks.probes import sim
from slurm_hooks.remedy import drain

BOTH = "slurm-hooks: XID 48 on GPU 0; row remap pending on GPU 3 [reset]"


def _node(tmp_path, state="IDLE", *jobs):
    cfg = sim_config(tmp_path, "[expect]\ngpus = 8")
    slurm, w = sim_node(cfg, state, *jobs)
    sim.inject(cfg.gpu.sim_dir, "n1", 3, row_remap_pending=True)
    sim.inject(cfg.gpu.sim_dir, "n1", 0, xid=48)
    return cfg, slurm, w


def test_the_reason_stays_the_checks_through_an_epilog_that_sees_one_of_its_two_faults(tmp_path):
    cfg, slurm, w = _node(tmp_path)
    healthcheck.run(w, follow="none")
    assert slurm.peek("n1").reason == BOTH
    jobhooks.epilog(w, {"SLURM_JOB_ID": "700", "SLURM_JOB_GPUS": "0"})
    assert slurm.peek("n1").reason == BOTH
    healthcheck.run(w, follow="none")
    assert slurm.peek("n1").reason == BOTH
    assert [c for c in slurm.called("drain")] == [("drain", "n1", BOTH)]  # written once, never rewritten


def test_a_new_fault_still_widens_the_reason(tmp_path):
    cfg, slurm, w = _node(tmp_path)
    jobhooks.epilog(w, {"SLURM_JOB_ID": "700", "SLURM_JOB_GPUS": "0"})
    assert slurm.peek("n1").reason == "slurm-hooks: XID 48 on GPU 0 [reset]"
    healthcheck.run(w, follow="none")
    assert slurm.peek("n1").reason == BOTH


def _finding(gpu, summary, action=Action.RESET):
    return Finding("x", Severity.FAIL, action, summary, gpu=gpu, summary=summary, scope=Scope.GPU)


def test_one_set_of_findings_reads_the_same_in_any_order():
    found = [_finding(3, "row remap pending on GPU 3"), _finding(0, "XID 48 on GPU 0"),
             _finding(None, "PCIe gone", Action.REBOOT), _finding(0, "XID 48 on GPU 0")]
    texts = {drain.findings_summary(order) for order in (found, found[::-1], found[1:] + found[:1])}
    assert texts == {"PCIe gone; XID 48 on GPU 0; row remap pending on GPU 3"}


def test_our_wider_reason_covers_a_narrower_one_and_not_the_other_way():
    narrow = "slurm-hooks: XID 48 on GPU 0 [reset]"
    assert drain.covers(BOTH, narrow)
    assert not drain.covers(narrow, BOTH)
    assert not drain.covers(BOTH, "slurm-hooks: XID 48 on GPU 0 [reboot]")  # a stronger action
    assert not drain.covers(BOTH.replace("[reset]", "[reset, at job end]"), narrow)  # sooner now
    assert not drain.covers("admin: bad fan", narrow)


def test_each_requeued_jobs_admin_comment_names_only_what_touched_its_gpus(tmp_path):
    cfg = sim_config(tmp_path, "[expect]\ngpus = 8")
    slurm, w = sim_node(cfg, "MIXED", 12, 13)
    slurm.set_job_gpus(12, (0,))
    slurm.set_job_gpus(13, (3,))
    sim.inject(cfg.gpu.sim_dir, "n1", 0, xid=79)
    sim.inject(cfg.gpu.sim_dir, "n1", 3, xid=79)
    healthcheck.run(w, follow="none")
    assert slurm.peek("n1").reason == "slurm-hooks: XID 79 on GPU 0; XID 79 on GPU 3 [reboot]"
    first, second = slurm.admin_comments[12], slurm.admin_comments[13]
    assert first.startswith("slurm-hooks: requeued from n1, XID 79 on GPU 0, ") and "GPU 3" not in first, first
    assert second.startswith("slurm-hooks: requeued from n1, XID 79 on GPU 3, ") and "GPU 0" not in second, second


def test_the_check_narrows_our_reason_once_one_of_its_faults_is_gone(tmp_path):
    # The check judges every GPU: what it no longer finds must leave the reason. Keeping the wider text is
    # for the prolog and epilog, which judge only a job's GPUs; a check that kept it named GPU 3's row remap
    # until the node was wholly healthy (a person replaces the wrong GPU).
    cfg, slurm, w = _node(tmp_path)
    healthcheck.run(w, follow="none")
    assert slurm.peek("n1").reason == BOTH
    sim.clear(cfg.gpu.sim_dir, "n1", 3)
    healthcheck.run(w, follow="none")
    assert slurm.peek("n1").reason == "slurm-hooks: XID 48 on GPU 0 [reset]"
