"""One run's Slurm adapter (slurm_hooks.slurm.recording): a read is reused until a write of the run's
may have changed it, a failed call is noted (transient or not), and nothing is reused once the run ends."""

from __future__ import annotations

import pytest
from fakes.slurm import FakeSlurm

from slurm_hooks.errors import PermanentError, TransientError
from slurm_hooks.slurm import JobRecord
from slurm_hooks.slurm.recording import Record, RecordingSlurm

DOWN = TransientError("slurm_load_node error: Unable to contact slurm controller")


@pytest.fixture
def fake():
    slurm = FakeSlurm()
    slurm.add_node("n1", "MIXED")
    slurm.add_node("n2", "IDLE")
    slurm.add_job(12, "n1")
    slurm.set_job_gpus(12, (0,))
    slurm.admin_comments[12] = "site: budget 42"
    return slurm


def reads(slurm, method):
    return len(slurm.called(method))


def test_a_node_is_read_once_until_a_write_to_it_or_to_a_job(fake):
    s = RecordingSlurm(fake, Record())
    assert s.node("n1") is s.node("n1") and reads(fake, "node") == 1
    s.node("n2")
    s.drain("n2", "slurm-hooks: x [reboot]")
    assert s.node("n1").state == "MIXED" and reads(fake, "node") == 2  # n1 kept: the drain was n2's
    assert "DRAIN" in s.node("n2").state and reads(fake, "node") == 3  # after our drain: Slurm's answer
    s.requeue(12)  # a node's state follows its jobs'
    s.node("n1")
    assert reads(fake, "node") == 4


def test_someone_elses_change_is_seen_by_the_next_run_not_within_this_one(fake):
    s = RecordingSlurm(fake, Record())
    s.node("n1")
    fake.set_node("n1", state="MIXED+DRAIN", reason="admin: bad fan")
    assert s.node("n1").reason == ""  # reused within the run
    assert RecordingSlurm(fake, Record()).node("n1").reason == "admin: bad fan"  # the next run reads


def test_job_lists_and_gpus_are_reused_until_a_write_to_a_job(fake):
    s = RecordingSlurm(fake, Record())
    assert [j.job_id for j in s.jobs_on_node("n1")] == [12] and s.jobs_on_node("n1") == s.jobs_on_node("n1")
    assert s.job_gpus("12", "n1") == (0,) and s.job_gpus("12", "n1") == (0,)
    assert (reads(fake, "jobs_on_node"), reads(fake, "job_detail")) == (1, 1)
    s.requeue("12")
    s.jobs_on_node("n1")
    s.job_gpus("12", "n1")
    assert (reads(fake, "jobs_on_node"), reads(fake, "job_detail")) == (2, 2)


def test_the_admin_comment_comes_with_the_jobs_gpus_and_outlives_only_its_requeue(fake):
    s = RecordingSlurm(fake, Record())
    s.job_gpus("12", "n1")
    s.requeue("12")
    assert s.admin_comment("12") == "site: budget 42" and reads(fake, "admin_comment") == 0
    s.set_admin_comment("12", "site: budget 42; slurm-hooks: requeued")
    assert s.admin_comment("12") == "site: budget 42; slurm-hooks: requeued" and reads(fake, "admin_comment") == 1
    # A signal opens a grace (minutes): the AdminComment is read afresh after it.
    s.job_gpus("12", "n1")
    s.signal("12", "USR1", "batch")
    s.admin_comment("12")
    assert reads(fake, "admin_comment") == 2


def test_what_a_job_says_of_itself_comes_with_its_gpus_and_is_read_afresh_after_a_write_to_it(fake):
    fake.records[12] = JobRecord(comment="heals=nvrx", batch_host="n2")
    s = RecordingSlurm(fake, Record())
    s.job_gpus("12", "n1")
    assert s.job_record("12").comment == "heals=nvrx" and reads(fake, "job_record") == 0
    s.exclude_nodes("12", "n1")
    assert s.job_record("12").excluded == "n1" and reads(fake, "job_record") == 1
    assert s.job_record("12").excluded == "n1" and reads(fake, "job_record") == 1
    s.requeue("12")
    s.job_record("12")
    assert reads(fake, "job_record") == 2


def test_a_job_read_for_what_it_says_of_itself_says_its_admin_comment_too(fake):
    s = RecordingSlurm(fake, Record())
    s.job_record("12")
    assert s.admin_comment("12") == "site: budget 42" and reads(fake, "admin_comment") == 0
    s.set_admin_comment("12", "site: budget 42; slurm-hooks: requeued")
    s.job_record("12")  # read afresh: the cached one had the AdminComment from before
    assert s.admin_comment("12") == "site: budget 42; slurm-hooks: requeued"
    assert (reads(fake, "job_record"), reads(fake, "admin_comment")) == (2, 0)


def test_the_polled_reads_are_never_reused(fake):
    s = RecordingSlurm(fake, Record())
    s.job("12")
    s.job("12")
    s.jobs(["12"])
    s.jobs(["12"])
    assert (reads(fake, "job"), reads(fake, "jobs")) == (2, 2)


def test_errors_are_noted_and_a_failed_read_is_not_kept(fake):
    record = Record()
    s = RecordingSlurm(fake, record)
    fake.fail("node", DOWN)
    with pytest.raises(TransientError):
        s.node("n1")
    fake.fail("node", None)
    assert s.node("n1").state == "MIXED" and reads(fake, "node") == 2
    fake.fail("requeue", PermanentError("Requested operation is presently disabled"))
    with pytest.raises(PermanentError):
        s.requeue("12")
    assert record.transient() and not record.transient(since=1)
    assert record.last_error() == str(DOWN) and record.last_error(since=1) == ""
    assert [type(e) for e in record.errors] == [TransientError, PermanentError]


def test_nothing_is_reused_once_the_run_ends(fake):
    record = Record()
    s = RecordingSlurm(fake, record)
    s.node("n1")
    s.job_gpus("12", "n1")
    record.end()
    s.node("n1")
    s.node("n1")
    s.admin_comment("12")
    assert (reads(fake, "node"), reads(fake, "admin_comment")) == (3, 1)
    fake.fail("node", DOWN)
    with pytest.raises(TransientError):
        s.node("n1")
    assert record.transient()  # still noted


def test_bounded_keeps_the_runs_record(fake):
    record = Record()
    s = RecordingSlurm(fake, record).bounded(None)
    s.node("n1")
    RecordingSlurm(fake, record).node("n1")
    assert reads(fake, "node") == 1
