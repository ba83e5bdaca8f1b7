"""How many queries each backend makes to read the jobs a follower asks for at one look:
one, whatever the number of jobs; and to read what a fault's requeue needs of one job (its GPUs
here, what it says of itself, its AdminComment): one ``scontrol -d show job``. The scontrol backend's commands are counted through its
runner (argv and output as squeue 22.05.8 gives them); pyslurm's through a module with
pyslurm's load calls. The RPCs each command costs slurmctld are counted by sdiag in
bench/bench_storm32.py and in the slurm-tier adapter tests.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from slurm_hooks.errors import CommandError
from slurm_hooks.runner import Completed
from slurm_hooks.slurm.pyslurm_backend import PyslurmSlurm
from slurm_hooks.slurm.scontrol import ScontrolSlurm

UNKNOWN = "slurm_load_jobs error: Invalid job id specified\n"
#: ``scontrol --local -d show job`` and ``scontrol --local show job`` of a running job (Slurm 22.05.8, the
#: testbed): its script, ``--comment``, ``--exclude`` and an AdminComment an admin set.
FIXTURES = Path(__file__).parent.parent / "fixtures" / "slurm"
SHOW_JOB_D = (FIXTURES / "scontrol-d-show-job-22.05-record.txt").read_text()
SHOW_JOB = (FIXTURES / "scontrol-show-job-22.05-record.txt").read_text()


def scontrol(answers: dict[str, tuple[int, str]]) -> tuple[ScontrolSlurm, list[tuple[str, ...]]]:
    """A scontrol backend whose squeue answers ``answers[<its -j argument>]`` (exit code, text)."""
    seen: list[tuple[str, ...]] = []

    def run(argv, timeout, **kw):
        seen.append(tuple(argv))
        code, text = answers[argv[argv.index("-j") + 1]]
        if code:
            raise CommandError(list(argv), code, "", text)
        return Completed(tuple(argv), 0, text, "")

    return ScontrolSlurm(bin_dir="/usr/bin", runner=run), seen


def test_one_job_slurm_no_longer_knows_is_asked_for_once_per_look():
    slurm, seen = scontrol({"101": (1, UNKNOWN)})
    assert slurm.jobs(["101"]) == []
    assert len(seen) == 1


def test_every_job_read_is_this_clusters_own_without_asking_the_federation():
    slurm, seen = scontrol({"101,102": (0, "101|101|N/A|N/A|PENDING||1|1|1|5|BeginTime|root|x|101\n")})
    [job] = slurm.jobs(["101", "102"])
    assert (job.job_id, job.pending) == (101, True)
    [argv] = seen
    assert "--local" in argv  # squeue without it asks slurmctld for the federation as well


class Loads:
    """pyslurm's ``Job.load`` / ``Jobs.load``, counted, over a table of jobs."""

    def __init__(self, *ids: int):
        self.calls: list[str] = []
        self.table = {i: SimpleNamespace(id=i, name="x", state="PENDING", allocated_nodes="", is_requeueable=True,
                                         is_batch_job=True, requeue_count=1, state_reason="BeginTime")
                      for i in ids}
        loads = self

        class Job:
            @staticmethod
            def load(job_id):
                loads.calls.append(f"Job.load {job_id}")
                return loads.table[job_id]

        class Jobs:
            @staticmethod
            def load():
                loads.calls.append("Jobs.load")
                return dict(loads.table)

        self.module = SimpleNamespace(Job=Job, Jobs=Jobs)


def test_pyslurm_reads_several_jobs_in_one_load():
    loads = Loads(101, 102, 103, 900)
    found = PyslurmSlurm(module=loads.module).jobs(["101", "102", "103", "104"])
    assert sorted(j.job_id for j in found) == [101, 102, 103]
    assert loads.calls == ["Jobs.load"]


def test_pyslurm_reads_one_job_alone():
    loads = Loads(101, 900)
    [job] = PyslurmSlurm(module=loads.module).jobs(["101"])
    assert job.job_id == 101 and loads.calls == ["Job.load 101"]


def test_the_nameless_squeue_format_is_the_named_one_without_the_name_alone():
    """The fallback squeue asks when a job name broke a line: every field but the name, the owner's
    (UserName, which holds "Name") included."""
    from slurm_hooks.slurm.scontrol import SQUEUE_JOB_FORMAT, SQUEUE_JOB_FORMAT_NO_NAME

    named = SQUEUE_JOB_FORMAT.split(",")
    assert SQUEUE_JOB_FORMAT_NO_NAME.split(",") == [f for f in named if f != "Name:|"]
    assert "UserName:|" in SQUEUE_JOB_FORMAT_NO_NAME.split(",")


def test_a_test_job_asks_for_every_gpu_of_its_nodes_in_the_job_itself():
    """isolate's test job: the step's --gres is within the job's, so the job asks for the GPUs too."""
    seen: list[tuple[str, ...]] = []

    def run(argv, timeout, **kw):
        seen.append(tuple(argv))
        return Completed(tuple(argv), 0, "42\n", "")

    slurm = ScontrolSlurm(bin_dir="/usr/bin", runner=run)
    assert slurm.submit(["true"], name="t", node=["n1", "n2"], reservation="r", minutes=1, gpus_per_node=8) == "42"
    assert "--gres=gpu:8" in seen[-1] and "--exclusive" in seen[-1]
    slurm.submit(["true"], name="t", node=["n1"], reservation="r", minutes=1)
    assert not any(a.startswith("--gres") for a in seen[-1])  # a node without GPUs asks for none


def shows_job(text: str) -> tuple[ScontrolSlurm, list[tuple[str, ...]]]:
    """A scontrol backend whose ``scontrol show job`` answers ``text``."""
    seen: list[tuple[str, ...]] = []

    def run(argv, timeout, **kw):
        seen.append(tuple(argv))
        return Completed(tuple(argv), 0, text, "")

    return ScontrolSlurm(bin_dir="/usr/bin", runner=run), seen


def test_one_detailed_show_job_says_the_jobs_gpus_what_it_says_of_itself_and_its_admin_comment():
    slurm, seen = shows_job(SHOW_JOB_D)
    detail = slurm.job_detail("1", "n1")
    assert detail.gpus == (0, 1) and detail.admin_comment == "site: budget 42"
    rec = detail.record
    assert (rec.comment, rec.command, rec.batch_host, rec.exit_code, rec.excluded) == (
        "heals=nvrx nightly run", "/tmp/tb/tb/jobs/train.sh", "n1", 0, "n2")
    assert [argv[1:] for argv in seen] == [("--local", "-d", "show", "job", "1")]
    # the plain read (a fault on the whole node asks no GPUs) says the same record
    plain, seen = shows_job(SHOW_JOB)
    assert plain.job_record("1") == rec and [argv[1:] for argv in seen] == [("--local", "show", "job", "1")]


def test_pyslurm_reads_the_job_detail_through_the_one_scontrol_command():
    cli, seen = shows_job(SHOW_JOB_D)
    detail = PyslurmSlurm(module=Loads().module, cli=cli).job_detail("1", "n1")
    assert detail == cli.job_detail("1", "n1") and len(seen) == 2
    assert PyslurmSlurm(module=Loads().module).job_detail("1", "n1").record is None  # without scontrol: unknown
