"""The job says why: a line in its AdminComment when we requeue it or the prolog refuses it.

The adapter is FakeSlurm here; tests/hooks/test_e2e_slurm.py reads the line back from the real
slurmctld (``scontrol show job``), with an AdminComment set before kept.
"""

from __future__ import annotations

import re
import time

import pytest
from fakes.config import sim_config, sim_node

from slurm_hooks.errors import TransientError
from slurm_hooks.hooks import healthcheck, jobhooks
from slurm_hooks.probes import sim
from slurm_hooks.remedy.audit import annotate_jobs
from slurm_hooks.slurm import ADMIN_COMMENT_MAX, join_admin_comment
from slurm_hooks.slurm.scontrol import parse_admin_comment

#: ``scontrol show job`` as 22.05 prints it: a free-text value ends in one space.
SHOW_JOB = "\n".join([
    "JobId=7 JobName=train",
    "   UserId=alice(1000) GroupId=alice(1000) MCS_label=N/A",
    "   WorkDir=/home/alice",
    "   AdminComment=site: budget 42; slurm-hooks: requeued from n2, XID 48 on GPU 1, 2026-11-30T08:00Z ",
    "   Comment=user note ",
    "   StdErr=/home/alice/7.out",
    "",
])


def test_the_admin_comment_is_read_from_scontrol_show_job():
    assert parse_admin_comment(SHOW_JOB) == ("site: budget 42; slurm-hooks: requeued from n2, XID 48 on GPU 1, "
                                             "2026-11-30T08:00Z")
    assert parse_admin_comment(SHOW_JOB.replace("   AdminComment=", "   Other=")) == ""
    # A value with a newline (set by hand) runs on until the next key line.
    assert parse_admin_comment("JobId=7\n   AdminComment=a=b\nsecond \n   Comment=x \n") == "a=b\nsecond"
    # The next job's AdminComment is not this one's.
    assert parse_admin_comment("JobId=7\n   Comment=x \n\nJobId=8\n   AdminComment=theirs \n") == ""


def test_a_line_is_appended_keeping_what_is_there_within_the_limit():
    assert join_admin_comment("", "slurm-hooks: requeued from n1") == "slurm-hooks: requeued from n1"
    assert join_admin_comment("site: budget 42", "slurm-hooks: x") == "site: budget 42; slurm-hooks: x"
    assert join_admin_comment("site: budget 42; slurm-hooks: x", "slurm-hooks: x") == "site: budget 42; slurm-hooks: x"
    # Short of room: our own oldest lines go first, never what others wrote.
    theirs = "t" * 900
    full = f"slurm-hooks: {'o' * 100}; {theirs}; slurm-hooks: {'p' * 50}"
    joined = join_admin_comment(full, "slurm-hooks: new")
    assert joined == f"{theirs}; slurm-hooks: {'p' * 50}; slurm-hooks: new" and len(joined) <= ADMIN_COMMENT_MAX
    assert join_admin_comment("t" * 1020, "slurm-hooks: new") is None


@pytest.fixture
def node(tmp_path):
    cfg = sim_config(tmp_path, "[expect]\ngpus = 8")
    slurm, w = sim_node(cfg, "MIXED", 12)
    slurm.admin_comments[12] = "site: budget 42"
    return w, slurm


def annotations(w):
    return [r for r in w.audit.read() if r.get("action") == "annotate"]


def test_a_requeued_job_is_told_why_after_its_requeue(node):
    w, slurm = node
    sim.inject(w.config.gpu.sim_dir, "n1", 3, xid=79)
    _, outcome = healthcheck.run(w, follow="none")
    assert outcome.requeued == ["12"]
    comment = slurm.admin_comments[12]
    assert comment.startswith("site: budget 42; slurm-hooks: requeued from n1, XID 79 on GPU 3, ")
    assert re.fullmatch(r".*, \d{4}-\d\d-\d\dT\d\d:\d\dZ", comment)  # the UTC minute
    methods = [c[0] for c in slurm.calls]
    # Written after the requeue, joined to the AdminComment read with the job's GPUs (one read of the job).
    assert methods.index("job_detail") < methods.index("requeue") < methods.index("set_admin_comment")
    assert "admin_comment" not in methods
    assert [(r["target"], r["result"]) for r in annotations(w)] == [("12", "ok")]


def test_an_admin_comment_that_cannot_be_written_is_a_warning_not_a_pending_requeue(node):
    w, slurm = node
    slurm.fail("set_admin_comment", TransientError("slurm_update error: Socket timed out on send/recv operation"))
    sim.inject(w.config.gpu.sim_dir, "n1", 3, xid=79)
    _, outcome = healthcheck.run(w, follow="none")
    assert outcome.ok and outcome.requeued == ["12"] and outcome.pending == ""
    [r] = annotations(w)
    assert r["result"] == "failed" and r["level"] == "warning" and "Socket timed out" in r["error"]
    assert "XID 79 on GPU 3" in r["comment"]
    assert slurm.admin_comments[12] == "site: budget 42"


def test_no_admin_comment_when_the_deadline_is_spent(node):
    w, slurm = node
    w.deadline = time.monotonic() + 0.5
    annotate_jobs(w, ["12"], "requeued from n1, XID 79 on GPU 3")
    assert not slurm.called("admin_comment")
    assert [(r["result"], r["level"]) for r in annotations(w)] == [("skipped", "warning")]


def test_a_job_the_prolog_refuses_is_told_why(node):
    w, slurm = node
    sim.inject(w.config.gpu.sim_dir, "n1", 3, xid=79)
    env = {"SLURM_JOB_ID": "12", "SLURM_JOB_GPUS": "3"}
    assert jobhooks.prolog(w, env) == 1
    assert slurm.admin_comments[12].startswith("site: budget 42; slurm-hooks: refused by the prolog on n1, "
                                               "XID 79 on GPU 3, ")


def test_a_periodic_check_during_the_refused_jobs_prolog_leaves_it_to_slurms_requeue(node):
    """slurmd's HealthCheckProgram may run while our prolog refuses a job: the job still shows on the
    node (Slurm requeues it when the prolog exits). The check requeues it no second time, and the
    job's AdminComment keeps saying that the prolog refused it."""
    w, slurm = node
    sim.inject(w.config.gpu.sim_dir, "n1", 3, xid=79)
    assert jobhooks.prolog(w, {"SLURM_JOB_ID": "12", "SLURM_JOB_GPUS": "3"}) == 1
    _, outcome = healthcheck.run(w, follow="none")
    assert outcome.requeued == [] and not slurm.called("requeue")
    assert [r for r in w.audit.read() if r.get("action") == "requeue"] == []
    assert "slurm-hooks: refused by the prolog on n1, XID 79 on GPU 3, " in slurm.admin_comments[12]
    assert "requeued from" not in slurm.admin_comments[12]


def test_a_summary_of_two_findings_is_one_entry_and_a_retry_never_duplicates_it():
    line = "slurm-hooks: requeued from n1, XID 79 on GPU 3; XID 48 on GPU 1, 2026-12-01T10:02Z"
    once = join_admin_comment("site: budget 42", line)
    assert once == "site: budget 42; slurm-hooks: requeued from n1, XID 79 on GPU 3, XID 48 on GPU 1, 2026-12-01T10:02Z"
    # The same run retried (the same minute, or the next one): nothing added.
    assert join_admin_comment(once, line) == once
    assert join_admin_comment(once, line.replace("10:02Z", "10:03Z")) == once
    # Each entry is ours or theirs as a whole: short of room, our own entry goes, theirs stays.
    theirs = "t" * 900
    joined = join_admin_comment(f"{once}; {theirs}", "slurm-hooks: requeued from n2, XID 74 on GPU 0, 2026-12-01T11:00Z")
    assert joined == f"site: budget 42; {theirs}; slurm-hooks: requeued from n2, XID 74 on GPU 0, 2026-12-01T11:00Z"
