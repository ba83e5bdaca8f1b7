"""Suspects from failed multi-node jobs, counted per node (slurm_hooks.remedy.suspect): a node in
``[isolate] suspect_jobs`` failed multi-node jobs within the window is suspected, whatever their
other nodes; one failed job never is; the isolate started targets the suspected nodes alone."""

from __future__ import annotations

import pytest
from fakes.config import sim_config
from fakes.slurm import FakeSlurm

from slurm_hooks.observe.audit import AuditLog
from slurm_hooks.remedy import suspect
from slurm_hooks.remedy.suspect import Failure, failures, starter, suspected
from slurm_hooks.remedy.wiring import Wiring
from slurm_hooks.slurm import JobState


def rec(job, nodes, ts=1000.0, node=None):
    return {"ts": ts, "job": str(job), "nodes": list(nodes), "node": node or nodes[0], "exit_code": "1:0"}


def test_a_job_recorded_by_each_of_its_nodes_counts_once_and_old_ones_leave_the_window():
    entries = [rec(1, ["n3", "n4"], node="n3"), rec(1, ["n3", "n4"], 1001.0, node="n4"),
               rec(2, ["n4", "n5"], 1500.0), rec(3, ["n1", "n2"], 100.0), rec(4, ["n9"], 1500.0)]
    got = failures(entries, now=2000.0, window=1800.0)
    assert got == [Failure("1", ("n3", "n4"), 1000.0), Failure("2", ("n4", "n5"), 1500.0)]


def test_a_node_in_two_failed_jobs_with_different_partners_is_suspected_and_its_partners_are_not():
    failed = [Failure("1", ("n3", "n4"), 1.0), Failure("2", ("n4", "n5"), 2.0), Failure("3", ("n4", "n6", "n7"), 3.0)]
    assert suspected(failed, 2) == {"n4": ("1", "2", "3")}
    assert suspected(failed, 3) == {"n4": ("1", "2", "3")}
    assert suspected(failed, 4) == {}


def test_one_failed_job_is_no_pattern_whatever_its_size_or_the_setting():
    assert suspected([Failure("1", tuple(f"n{i}" for i in range(64)), 1.0)], 1) == {}


def test_the_job_s_first_suspected_node_starts_it():
    assert starter(["n3", "n4", "n5"], {"n5": (), "n4": ()}) == "n4"
    assert starter(["n3", "n5"], {"n4": ()}) is None


class Started:
    """What would have started an isolate (the detached process is the testbed test's)."""

    def __init__(self):
        self.calls = []

    def __call__(self, w, nodes, partition, jid, said):
        self.calls.append((w.node, nodes, partition, jid))
        return f"isolate started on {', '.join(nodes)}"


def node_wiring(tmp_path, node, slurm, auto=True, extra=""):
    """``node``'s hooks: a state dir and audit log of its own (a site's nodes share neither)."""
    (tmp_path / node).mkdir(exist_ok=True)
    cfg = sim_config(tmp_path / node, f"[isolate]\nauto = {'true' if auto else 'false'}\nwindow = 3600.0\n{extra}")
    return Wiring(cfg, node, AuditLog(cfg.log.audit), slurm_override=slurm)


@pytest.fixture
def slurm():
    fake = FakeSlurm()
    for n in ("n3", "n4", "n5", "n6"):
        fake.add_node(n)
    for job in range(1, 8):
        fake.add_job(job, "n4", JobState.FAILED)
    return fake


def epilog(w, job, nodes, started, code="1"):
    env = {"SLURM_JOB_EXIT_CODE": code, "SLURM_JOB_NODELIST": ",".join(nodes), "SLURM_JOB_PARTITION": "gpu"}
    return suspect.after_job(w, env, str(job), start=started)


def test_a_node_failing_with_different_partners_starts_an_isolate_of_itself_alone(tmp_path, slurm):
    started = Started()
    n3, n4, n5 = (node_wiring(tmp_path, n, slurm) for n in ("n3", "n4", "n5"))
    assert epilog(n3, 1, ["n3", "n4"], started) == "suspect recorded"
    assert epilog(n4, 1, ["n3", "n4"], started) == "suspect recorded"  # once is no pattern
    assert epilog(n5, 2, ["n4", "n5"], started) == "suspect recorded"  # n5 saw one failed job: n4's first for it
    said = epilog(n4, 2, ["n4", "n5"], started)
    assert said == "isolate started on n4"
    assert started.calls == [("n4", ["n4"], "gpu", "2")]
    assert [r["node"] for r in n4.audit.read() if r.get("action") == "suspect"] == ["n4", "n4"]


def test_the_same_nodes_failing_twice_start_one_isolate_from_the_first_of_them(tmp_path, slurm):
    started = Started()
    n3, n4 = (node_wiring(tmp_path, n, slurm) for n in ("n3", "n4"))
    for job in (1, 2):
        epilog(n3, job, ["n3", "n4"], started)
        said = epilog(n4, job, ["n3", "n4"], started)
    assert started.calls == [("n3", ["n3", "n4"], "gpu", "2")]
    assert "n3 starts isolate" in said


def test_a_node_already_targeted_within_the_window_is_not_isolated_again(tmp_path, slurm):
    started = Started()
    n4 = node_wiring(tmp_path, "n4", slurm)
    for job, other in ((1, "n3"), (2, "n5"), (3, "n6")):
        said = epilog(n4, job, ["n4", other], started)
    assert started.calls == [("n4", ["n4"], "gpu", "2")]
    assert said.endswith("isolate already started for them within the window")


def test_with_auto_off_a_suspected_node_is_named_and_nothing_starts(tmp_path, slurm):
    started = Started()
    n4 = node_wiring(tmp_path, "n4", slurm, auto=False)
    epilog(n4, 1, ["n3", "n4"], started)
    assert epilog(n4, 2, ["n4", "n5"], started) == "suspected: n4 (jobs 1, 2); [isolate] auto is off"
    assert started.calls == []


def test_k_is_a_setting(tmp_path, slurm):
    started = Started()
    n4 = node_wiring(tmp_path, "n4", slurm, extra="suspect_jobs = 3\n")
    assert [epilog(n4, job, ["n4", other], started) for job, other in ((1, "n3"), (2, "n5"))] == \
        ["suspect recorded", "suspect recorded"]
    assert epilog(n4, 3, ["n4", "n6"], started) == "isolate started on n4"


def test_a_failed_job_that_was_requeued_counts(tmp_path, slurm):
    started = Started()
    n4 = node_wiring(tmp_path, "n4", slurm)
    slurm.job_states(1, [JobState.PENDING], restarts=1)
    slurm.job_states(2, [JobState.PENDING], restarts=3)
    env = {"SLURM_JOB_RESTART_COUNT": "0"}
    epilog(n4, 1, ["n3", "n4"], started)
    assert suspect.after_job(n4, {**env, "SLURM_JOB_EXIT_CODE": "1", "SLURM_JOB_NODELIST": "n4,n5",
                                  "SLURM_JOB_PARTITION": "gpu"}, "2", start=started) == "isolate started on n4"


def test_a_job_our_requeue_ended_for_a_finding_on_another_node_is_no_suspect(tmp_path, slurm):
    started = Started()
    n4 = node_wiring(tmp_path, "n4", slurm)
    slurm.admin_comments[1] = "requeued from n3, XID 79 on GPU 2 (fell off the bus), 2026-01-01T00:00Z"
    slurm.admin_comments[2] = "requeued from n3, XID 79 on GPU 2 (fell off the bus), 2026-01-01T00:05Z"
    assert epilog(n4, 1, ["n3", "n4"], started) == "not a suspect: job 1 was requeued for a finding on n3"
    assert epilog(n4, 2, ["n3", "n4"], started).startswith("not a suspect")
    assert [r for r in n4.audit.read() if r.get("action") == "suspect"] == []
    assert started.calls == []


def test_a_successful_or_single_node_job_records_nothing(tmp_path, slurm):
    started = Started()
    n4 = node_wiring(tmp_path, "n4", slurm)
    assert epilog(n4, 1, ["n3", "n4"], started, code="0") == ""
    assert epilog(n4, 2, ["n4"], started) == ""
    assert epilog(n4, 3, ["n4"], started) == ""
    assert [r for r in n4.audit.read() if r.get("action") == "suspect"] == []


def test_isolates_own_failed_tests_are_no_suspects(tmp_path, slurm):
    """isolate's test jobs fail on the culprit by design: counted, they would suspect every partner
    it was tested with and start isolates of healthy nodes."""
    started = Started()
    n4 = node_wiring(tmp_path, "n4", slurm)
    for job, other in ((11, "n3"), (12, "n5")):
        slurm.add_job(job, "n4", JobState.FAILED, name="slurm-hooks-isolate")
        assert epilog(n4, job, ["n4", other], started) == f"not a suspect: job {job} is our own test " \
                                                          "(slurm-hooks-isolate)"
    assert started.calls == [] and [r for r in n4.audit.read() if r.get("action") == "suspect"] == []


def test_after_an_isolate_ends_without_a_culprit_the_next_failure_of_its_node_starts_another(tmp_path, slurm):
    """The suspects stay recorded: the run that did not reproduce the failure leaves n4 suspected,
    and its next failed job (one, not two more) starts the next isolate."""
    started = Started()
    n4 = node_wiring(tmp_path, "n4", slurm)
    for job, other in ((1, "n3"), (2, "n5")):
        said = epilog(n4, job, ["n4", other], started)
    assert said == "isolate started on n4"
    assert epilog(n4, 3, ["n4", "n6"], started).endswith("isolate already started for them within the window")
    suspect.isolate_ended(n4, ["n4", "n3", "n5", "n6"], "inconclusive")
    assert suspect.recorded(n4, ["n3", "n4"]) == {"n4": ("1", "2", "3")}
    assert epilog(n4, 4, ["n4", "n9"], started) == "isolate started on n4"
    assert started.calls == [("n4", ["n4"], "gpu", "2"), ("n4", ["n4"], "gpu", "4")]

