"""The Slurm adapter's contract, against the real local cluster, for every backend.

Every ``slurm``-marked test runs on the session's testbed (tests/conftest.py),
restored to two IDLE nodes with no jobs before each test. A test that takes the
``slurm`` fixture (tests/slurm/conftest.py) runs once per backend, scontrol and
pyslurm: the same behaviour is asked of both. The rest are about how the scontrol
backend calls Slurm's commands. How a run picks its backend: test_backend_choice.py.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import wait_for

from slurm_hooks.errors import PermanentError, SlurmHooksError, TransientError
from slurm_hooks.models import Action
from slurm_hooks.probes import sim
from slurm_hooks.remedy import pending
from slurm_hooks.remedy.ownership import DrainMarker
from slurm_hooks.runner import run_command
from slurm_hooks.slurm import NodeInfo, format_reason, quirks
from slurm_hooks.slurm.factory import PYSLURM, backend_for
from slurm_hooks.slurm.scontrol import (
    AlreadyRequeued,
    ReasonNotOurs,
    ScontrolSlurm,
    SlurmNotFound,
    SlurmTimeout,
    SlurmUnavailable,
)

REPO = Path(__file__).resolve().parents[2]
OUR_REASON = format_reason("XID 79 on GPU 3", Action.REPLACE)
SLEEP = "#!/bin/sh\nsleep 300\n"


BACKENDS = ("scontrol", "pyslurm")


def adapter(tb, backend: str, timeout: float = 10.0):
    """The testbed's Slurm through ``backend``. The pyslurm backend needs a pyslurm built for the
    testbed's Slurm in the interpreter running the tests (PyPI has only pyslurm 25.11:
    docs/dev/testing.md builds Slurm 25.11 and runs this suite on it); elsewhere it is skipped."""
    if backend == "scontrol":
        return ScontrolSlurm(bin_dir=tb.slurm_bin, timeout=timeout, env=tb.exports())
    config = SimpleNamespace(path=None, slurm=SimpleNamespace(backend="auto", bin_dir=tb.slurm_bin, timeout=timeout))
    slurm, choice = backend_for(config, env=tb.exports())
    if choice.backend != PYSLURM:
        major, minor = tb.slurm_version
        pytest.skip(f"no Slurm {major}.{minor:02d} with pyslurm here ({choice.why}): see docs/dev/testing.md")
    return slurm


@pytest.fixture(params=BACKENDS)
def slurm(request, clean_testbed):
    """The clean testbed's Slurm through each backend in turn: the same contract for both."""
    return adapter(clean_testbed, request.param)


def admin_drain(tb, node: str, reason: str) -> None:
    tb.scontrol("update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}")


# --- drain and resume: reason ownership ------------------------------------------------------


@pytest.mark.slurm
def test_drain_with_our_prefix_sets_the_reason(slurm):
    slurm.drain("n1", OUR_REASON)
    node = slurm.node("n1")
    assert node.drained and node.ours
    assert node.reason == OUR_REASON
    assert slurm.node("n2").state == "IDLE"


@pytest.mark.slurm
def test_a_drain_given_the_node_just_read_reads_it_no_second_time(clean_testbed):
    tb = clean_testbed
    seen: list[tuple[str, ...]] = []

    def recording(argv, timeout, **kw):
        seen.append(tuple(argv[1:]))
        return run_command(argv, timeout, **kw)

    slurm = ScontrolSlurm(bin_dir=tb.slurm_bin, timeout=10, runner=recording, env=tb.exports())
    slurm.drain("n1", OUR_REASON, current=slurm.node("n1"))
    shown = ("--json", "show", "node", "n1") if quirks.scontrol_json(slurm.version()) else ("-o", "show", "node", "n1")
    assert [a for a in seen if "show" in a] == [shown]  # remediation's one read
    assert slurm.node("n1").reason == OUR_REASON
    admin_drain(tb, "n2", "bad DIMM")
    seen.clear()
    with pytest.raises(ReasonNotOurs):
        slurm.drain("n2", OUR_REASON, current=slurm.node("n2"))
    assert [a for a in seen if "update" in a] == [] and tb.slurm.node("n2").reason == "bad DIMM"


@pytest.mark.slurm
def test_redrain_of_our_own_node_replaces_our_reason(slurm):
    slurm.drain("n1", OUR_REASON)
    newer = format_reason("XID 48 on GPU 1", Action.RESET)
    slurm.drain("n1", newer)
    assert slurm.node("n1").reason == newer


@pytest.mark.slurm
def test_admin_reason_is_never_overwritten_nor_resumed(slurm, clean_testbed):
    admin_drain(clean_testbed, "n1", "hw check by bob")
    with pytest.raises(ReasonNotOurs) as drained:
        slurm.drain("n1", OUR_REASON)
    assert drained.value.reason == "hw check by bob"
    assert "already drained by someone else with reason 'hw check by bob'" in str(drained.value)
    with pytest.raises(ReasonNotOurs):
        slurm.resume("n1")
    node = slurm.node("n1")
    assert node.drained and node.reason == "hw check by bob"


@pytest.mark.slurm
@pytest.mark.parametrize("foreign", ["Prolog error", "Kill task failed", "slurm-operator: Node is cordoned"])
def test_slurm_and_operator_reasons_are_left_alone(slurm, clean_testbed, foreign):
    admin_drain(clean_testbed, "n2", foreign)
    with pytest.raises(ReasonNotOurs):
        slurm.drain("n2", OUR_REASON)
    with pytest.raises(ReasonNotOurs):
        slurm.resume("n2")
    node = slurm.node("n2")
    assert node.drained and node.reason == foreign


@pytest.mark.slurm
def test_resume_of_a_node_we_drained_brings_it_back_idle(slurm, clean_testbed):
    slurm.drain("n2", OUR_REASON)
    slurm.resume("n2")
    node = clean_testbed.wait_node("n2", lambda n: n.state == "IDLE", timeout=10)
    # 23.11+ without accounting (Debian 13's 24.11) keeps the reason on the resumed node.
    assert node.reason == (OUR_REASON if clean_testbed.keeps_reasons else "") and not node.drained


@pytest.mark.slurm
def test_resume_of_a_node_nobody_drained_changes_nothing(slurm):
    slurm.resume("n1")
    assert slurm.node("n1").state == "IDLE"


@pytest.mark.slurm
def test_drain_of_a_busy_node_keeps_its_job_running(slurm, clean_testbed):
    tb = clean_testbed
    job = tb.sbatch(SLEEP, "-w", "n1")
    tb.wait_job(job, ["RUNNING"])
    slurm.drain("n1", OUR_REASON)
    node = slurm.node("n1")
    assert node.drained and node.base_state in ("MIXED", "ALLOCATED")
    assert slurm.job(job).state == "RUNNING"


@pytest.mark.slurm
def test_an_admins_redrain_with_our_text_after_resuming_ours_reads_as_theirs(slurm, clean_testbed):
    """Our drain, the admin's resume, the admin's drain with our very text: Slurm's ReasonTime
    (whole seconds) is what tells the two drains apart (remedy/ownership.py)."""
    tb = clean_testbed
    slurm.drain("n1", OUR_REASON)
    ours = slurm.node("n1")
    marker = DrainMarker(OUR_REASON).seen(ours)
    assert marker.reason_time and marker.reason_user == "root"
    assert marker.why_not_ours(ours) == ""
    time.sleep(1.1)
    tb.scontrol("update", "NodeName=n1", "State=RESUME")
    admin_drain(tb, "n1", OUR_REASON)
    theirs = slurm.node("n1")
    assert theirs.reason == OUR_REASON and theirs.reason_time != marker.reason_time
    assert "a later party's drain with our text" in marker.why_not_ours(theirs)


@pytest.mark.slurm
def test_a_node_shows_its_extra_and_partitions(slurm):
    """The bridge reads its verdict from Extra; a sweep of named nodes reads their partitions."""
    slurm.set_node_extra("n2", "slurm-hooks verdict=ok")
    try:
        node = slurm.node("n2")
        assert node.extra_text == "slurm-hooks verdict=ok"
        assert node.extra["Partitions"] == "gpu"
        assert {n.name: n.extra_text for n in slurm.nodes()} == {"n1": "", "n2": "slurm-hooks verdict=ok"}
    finally:
        slurm.set_node_extra("n2", "")


# --- jobs ----------------------------------------------------------------------------


@pytest.mark.slurm
def test_jobs_on_node_lists_a_running_sbatch_job_only_on_its_node(slurm, clean_testbed):
    tb = clean_testbed
    job = tb.sbatch(SLEEP, "-w", "n2", "--gres=gpu:2", "-J", "train step=1")
    tb.wait_job(job, ["RUNNING"])
    on_n2 = slurm.jobs_on_node("n2")
    assert [j.job_id for j in on_n2] == [job]
    assert on_n2[0].name == "train step=1" and on_n2[0].nodes == "n2" and on_n2[0].batch
    assert (on_n2[0].ref, on_n2[0].array_task_id, on_n2[0].het_job_id) == (str(job), "", 0)
    assert slurm.jobs_on_node("n1") == []


@pytest.mark.slurm
def test_jobs_on_node_finds_a_two_node_job_on_both_nodes(slurm, clean_testbed):
    tb = clean_testbed
    job = tb.sbatch(SLEEP, "-N", "2")
    tb.wait_job(job, ["RUNNING"])
    assert [j.job_id for j in slurm.jobs_on_node("n1")] == [job]
    assert [j.job_id for j in slurm.jobs_on_node("n2")] == [job]
    assert slurm.job(job).nodes == "n[1-2]"


@pytest.mark.slurm
def test_one_read_of_a_job_says_its_gpus_here_what_it_says_of_itself_and_its_admin_comment(slurm, clean_testbed):
    tb = clean_testbed
    job = tb.sbatch(SLEEP, "-w", "n1", "--gres=gpu:2", "--comment=heals=nvrx nightly", "--exclude=n2")
    tb.wait_job(job, ["RUNNING"])
    tb.scontrol("update", f"JobId={job}", "AdminComment=site: budget 42")
    detail = slurm.job_detail(job, "n1")
    assert detail.gpus == (0, 1) and detail.admin_comment == "site: budget 42"
    assert (detail.record.comment, detail.record.batch_host, detail.record.excluded) == ("heals=nvrx nightly", "n1", "n2")
    assert slurm.job_record(job) == detail.record  # the plain read (no GPUs asked) says the same


@pytest.mark.slurm
def test_pending_jobs_are_not_on_any_node(slurm, clean_testbed):
    tb = clean_testbed
    job = tb.sbatch(SLEEP, "--begin=now+1hour")
    tb.wait_job(job, ["PENDING"])
    assert slurm.job(job).reason == "BeginTime"
    assert slurm.jobs_on_node("n1") == [] and slurm.jobs_on_node("n2") == []


@pytest.mark.slurm
def test_a_held_job_shows_priority_0(slurm, clean_testbed):
    """What the follower and the audit read to know a requeued job is held (priority 0)."""
    tb = clean_testbed
    held = tb.sbatch(SLEEP, "--hold")
    free = tb.sbatch(SLEEP, "--begin=now+1hour")
    tb.wait_job(held, ["PENDING"])
    assert slurm.job(held).priority == "0"
    assert int(slurm.job(free).priority) > 0


@pytest.mark.slurm
def test_requeue_then_start_now_runs_the_job_again_within_seconds(slurm, clean_testbed):
    tb = clean_testbed
    job = tb.sbatch(SLEEP, "-w", "n1")
    tb.wait_job(job, ["RUNNING"])
    requeued_at = time.monotonic()
    slurm.requeue(job)
    tb.wait_job(job, ["PENDING"], timeout=20, interval=0.05)
    pending = slurm.job(job)
    assert pending.reason == "BeginTime"  # Slurm holds a requeued job back ~121 s unless told otherwise
    assert pending.restarts == 1
    # Elsewhere, as after our drain: relaunched onto the node it left, 22.05 sometimes fails the
    # new run at once (FAILED, NonZeroExitCode), even once that node shows IDLE again.
    tb.scontrol("update", f"JobId={job}", "ReqNodeList=n2")
    slurm.start_now(job)
    started = time.monotonic()
    tb.wait_job(job, ["RUNNING"], timeout=30, interval=0.05)  # not the 121 s BeginTime
    again = time.monotonic()
    running = slurm.job(job)
    assert again - requeued_at < 60
    assert running.restarts == 1 and running.nodes == "n2"
    print(f"requeue->PENDING {started - requeued_at:.2f}s, start_now->RUNNING {again - started:.2f}s")


@pytest.mark.slurm
def test_release_frees_a_held_job(slurm, clean_testbed):
    tb = clean_testbed
    job = tb.sbatch(SLEEP, "--hold")
    tb.wait_job(job, ["PENDING"])
    assert slurm.job(job).held_by_user
    slurm.release(job)
    tb.wait_job(job, ["RUNNING"], timeout=10)


@pytest.mark.slurm
def test_signal_term_reaches_the_batch_script_while_it_runs_a_foreground_command(slurm, clean_testbed):
    tb = clean_testbed
    script = "#!/bin/bash\ntrap 'echo checkpoint on TERM; exit 0' TERM\necho started\nsleep 300\n"
    job = tb.sbatch(script, "-w", "n1")
    tb.wait_job(job, ["RUNNING"])
    assert _eventually(lambda: "started" in tb.job_output(job), 5)
    slurm.signal(job, "TERM")
    assert _eventually(lambda: "checkpoint on TERM" in tb.job_output(job), 5), tb.job_output(job)
    assert tb.wait_job(job, ["COMPLETED"], timeout=10).state == "COMPLETED"


@pytest.mark.slurm
def test_hostile_job_name_never_reaches_a_command_line_except_as_one_argument(clean_testbed):
    tb = clean_testbed
    seen: list[tuple[str, ...]] = []

    def recording(argv, timeout, **kw):
        seen.append(tuple(argv))
        return run_command(argv, timeout, **kw)

    slurm = ScontrolSlurm(bin_dir=tb.slurm_bin, timeout=10, runner=recording, env=tb.exports())
    name = "x; touch /tmp/pwned $(id) `id`"
    job = tb.sbatch(SLEEP, "-w", "n2", "-J", name, "--comment", "a b; rm -rf /")
    tb.wait_job(job, ["RUNNING"])
    [found] = slurm.jobs_on_node("n2")
    assert found.name == name
    slurm.signal(job, "USR1")
    assert all(name not in arg and "rm -rf" not in arg for argv in seen for arg in argv)
    assert not os.path.exists("/tmp/pwned")


@pytest.mark.slurm
def test_a_job_name_cannot_fake_the_state_nodes_or_requeue_flag_remediation_reads(slurm, clean_testbed):
    tb = clean_testbed
    name = "x UserId=nobody(65534) JobState=COMPLETED NodeList=elsewhere Requeue=0|COMPLETED|n9|0|0|0"
    job = tb.sbatch(SLEEP, "-w", "n1", "-J", name, "--requeue")
    tb.wait_job(job, ["RUNNING"])
    info = slurm.job(job)
    assert (info.state, info.nodes, info.requeue, info.batch, info.restarts) == ("RUNNING", "n1", True, True, 0)
    assert info.name == name
    assert [j.job_id for j in slurm.jobs_on_node("n1")] == [job]


# --- errors ----------------------------------------------------------------------------


@pytest.mark.slurm
def test_unknown_node_and_job_are_permanent_errors(slurm):
    with pytest.raises(SlurmNotFound) as node_err:
        slurm.node("n99")
    with pytest.raises(SlurmNotFound) as job_err:
        slurm.job(999999)
    assert isinstance(node_err.value, PermanentError) and isinstance(job_err.value, PermanentError)
    with pytest.raises(PermanentError):
        slurm.requeue(999999)
    assert slurm.jobs([999999]) == []


@pytest.mark.slurm
def test_controller_that_is_not_running_is_a_transient_error(clean_testbed, tmp_path):
    dead = tmp_path / "slurm.conf"
    with open(clean_testbed.slurm_conf, encoding="utf-8") as fh:
        text = fh.read()
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    replace = {"SlurmctldPort": f"SlurmctldPort={port}", "MessageTimeout": "MessageTimeout=2"}
    dead.write_text("\n".join(replace.get(line.split("=")[0], line) for line in text.splitlines()) + "\n")
    slurm = ScontrolSlurm(bin_dir=clean_testbed.slurm_bin, timeout=10, env={"SLURM_CONF": str(dead)})
    started = time.monotonic()
    with pytest.raises(SlurmUnavailable) as err:
        slurm.node("n1")
    assert isinstance(err.value, TransientError)
    assert "Unable to contact slurm controller" in str(err.value)
    assert time.monotonic() - started < 10


@pytest.mark.slurm
@pytest.mark.parametrize("backend", BACKENDS)
def test_hung_controller_times_out_within_the_timeout_as_a_transient_error(clean_testbed, backend):
    """1 s is shorter than libslurm waits for a controller (MessageTimeout, 5 s here), and a pyslurm
    call cannot be cut short: that backend makes such a call through scontrol."""
    pid = clean_testbed.status().daemons["slurmctld"]
    slurm = adapter(clean_testbed, backend, timeout=1.0)
    os.kill(pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(SlurmTimeout) as err:
            slurm.nodes()
        elapsed = time.monotonic() - started
    finally:
        os.kill(pid, signal.SIGCONT)
    assert isinstance(err.value, TransientError)
    assert "scontrol timed out after 1s" in str(err.value)
    assert elapsed < 3


@pytest.mark.slurm
def test_a_pyslurm_call_to_a_hung_controller_ends_at_libslurms_message_timeout(clean_testbed):
    slurm = adapter(clean_testbed, "pyslurm", timeout=10.0)
    assert slurm.message_timeout == clean_testbed.settings.message_timeout == 5
    pid = clean_testbed.status().daemons["slurmctld"]
    os.kill(pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(SlurmUnavailable) as err:
            slurm.nodes()
        elapsed = time.monotonic() - started
    finally:
        os.kill(pid, signal.SIGCONT)
    assert "pyslurm load nodes: Socket timed out" in str(err.value)
    assert 4 < elapsed < 8


@pytest.mark.slurm
def test_a_node_read_takes_milliseconds(slurm):
    started = time.monotonic()
    for _ in range(20):
        slurm.node("n1")
    per_call = (time.monotonic() - started) / 20
    print(f"{slurm.name} node read: {per_call * 1000:.1f} ms per call")
    assert per_call < 0.5


# --- helpers and counts ---------------------------------------------------------------------


def _eventually(predicate, timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


@pytest.mark.slurm
def test_drained_count_counts_nodes_by_exact_reason(slurm, clean_testbed):
    tb = clean_testbed
    reason = "slurm-hooks: 8 of 9 GPUs visible [reboot]"
    assert slurm.drained_count(reason) == 0
    slurm.drain("n1", reason)
    slurm.drain("n2", reason)
    assert slurm.drained_count(reason) == 2
    tb.scontrol("update", "NodeName=n2", "State=RESUME")
    tb.scontrol("update", "NodeName=n2", "State=DRAIN", "Reason=bob | slurm-hooks: 8 of 9 GPUs visible [reboot]")
    assert slurm.drained_count(reason) == 1


# --- addressing exactly one job ------------------------------------------------------------------


def _recording(tb, seen):
    def run(argv, timeout, **kw):
        seen.append(tuple(argv))
        return run_command(argv, timeout, **kw)

    return ScontrolSlurm(bin_dir=tb.slurm_bin, timeout=10, runner=run, env=tb.exports())


@pytest.mark.slurm
def test_requeue_of_one_array_task_leaves_the_task_carrying_the_arrays_id_running(slurm, clean_testbed):
    tb = clean_testbed
    array = tb.sbatch(SLEEP, "--array=0-1", "--gres=gpu:8")
    deadline = time.monotonic() + 15
    while len(running := [j for n in tb.nodes for j in slurm.jobs_on_node(n)]) < 2:
        assert time.monotonic() < deadline, running
        time.sleep(0.1)
    base = next(j for j in running if j.job_id == array)
    other = next(j for j in running if j.job_id != array)
    assert sorted([base.array_task_id, other.array_task_id]) == ["0", "1"]
    assert base.ref == f"{array}_{base.array_task_id}" and other.ref == f"{array}_{other.array_task_id}"
    slurm.requeue(other.ref)
    tb.wait_job(other.job_id, ["PENDING"], timeout=15)
    slurm.start_now(other.ref)
    time.sleep(1.0)
    assert (slurm.job(base.ref).base_state, slurm.job(base.ref).restarts) == ("RUNNING", 0)
    assert slurm.job(other.ref).restarts == 1


HETJOB = "#!/bin/sh\n#SBATCH -w n1\n#SBATCH hetjob\n#SBATCH -w n2\nsleep 300\n"


@pytest.mark.slurm
def test_a_heterogeneous_jobs_component_is_requeued_through_its_leader(slurm, clean_testbed):
    """Slurm requeues a het job only through its leader ("Job not heterogeneous job leader"):
    the component on the bad node answers to the leader's id."""
    tb = clean_testbed
    leader = tb.sbatch(HETJOB)
    tb.wait_job(leader, ["RUNNING"])
    [component] = wait_for(lambda: slurm.jobs_on_node("n2"), 15, "the het job's component on n2")
    assert component.job_id == leader + 1 and (component.het_job_id, component.ref) == (leader, str(leader))
    slurm.requeue(component.ref)
    tb.wait_job(leader, ["PENDING"], timeout=15)
    assert slurm.job(leader).restarts == 1 and slurm.job(component.job_id).pending
    with pytest.raises(AlreadyRequeued):
        slurm.requeue(component.ref)


@pytest.mark.slurm
def test_several_jobs_are_read_in_one_squeue_call(clean_testbed):
    tb = clean_testbed
    seen: list[tuple[str, ...]] = []
    slurm = _recording(tb, seen)
    ids = [tb.sbatch(SLEEP, "--begin=now+1hour") for _ in range(3)]
    found = slurm.jobs([*ids, 999999])
    assert sorted(j.job_id for j in found) == ids
    assert sum(1 for argv in seen if argv[0].endswith("squeue")) <= 2  # one, plus one for the unknown id


@pytest.mark.slurm
def test_a_newline_in_a_job_name_cannot_hide_a_job_or_fake_another(slurm, clean_testbed):
    tb = clean_testbed
    victim = tb.sbatch(SLEEP, "-w", "n1", "-J", "victim")
    tb.wait_job(victim, ["RUNNING"])
    forged = f"{victim}|{victim}|N/A|N/A|COMPLETED|elsewhere|0|0|1|1|None|root|y"
    hostile = tb.sbatch(SLEEP, "-w", "n1", "-J", f"x|0\n{forged}")
    tb.wait_job(hostile, ["RUNNING"])
    jobs = {j.job_id: j for j in slurm.jobs_on_node("n1")}
    assert sorted(jobs) == sorted([victim, hostile])
    assert (jobs[victim].state, jobs[victim].nodes, jobs[victim].requeue) == ("RUNNING", "n1", True)


@pytest.mark.slurm
def test_the_slurm_version_is_asked_once_and_2205_keeps_the_one_line_output(clean_testbed):
    seen: list[tuple[str, ...]] = []
    slurm = _recording(clean_testbed, seen)
    slurm.bin_dir = clean_testbed.slurm_bin + "/"  # a key of its own in the per-process cache
    assert slurm.version() == clean_testbed.slurm_version  # 22.05 on Debian 12, 24.11 on Debian 13
    slurm.node("n1")
    slurm.nodes()
    assert sum(1 for argv in seen if "--version" in argv) == 1
    # 22.05 has no `scontrol --json`: the one-line output; from 23.02 on, JSON.
    assert any("--json" in argv for argv in seen) is (slurm.version() >= quirks.SCONTROL_JSON_SINCE)


def test_a_plain_state_is_its_own_base_state():
    assert sys.version_info >= (3, 9) and NodeInfo("n1", "IDLE").base_state == "IDLE"


# --- maintenance reservations and root's own jobs across nodes (sweep, isolate) -------------------


@pytest.mark.slurm
def test_one_reservation_holds_two_nodes_and_one_job_runs_a_task_on_each_of_them(clean_testbed, tmp_path):
    tb = clean_testbed
    slurm = tb.slurm
    name = f"slurm-hooks-test-{os.getpid()}"
    slurm.create_reservation(name, ["n1", "n2"], 5)
    job = None
    try:
        shown = tb.scontrol("show", "reservation", name, "-o")
        assert "Nodes=n[1-2]" in shown or "Nodes=n1,n2" in shown, shown
        out = str(tmp_path / "job-%j.out")
        os.chmod(tmp_path, 0o755)
        job = slurm.submit(["/bin/sh", "-c", 'echo "task $SLURM_PROCID on $SLURMD_NODENAME"'], name=name,
                           node=["n1", "n2"], reservation=name, minutes=1, ntasks_per_node=1, srun=True,
                           chdir=str(tmp_path), output=out)
        assert job in slurm.jobs_named(name)
        path = tmp_path / f"job-{job}.out"
        text = wait_for(lambda: path.exists() and path.read_text().count("task ") == 2 and path.read_text(), 60,
                        f"job {job}'s two tasks")
        assert "task 0 on n1" in text and "task 1 on n2" in text, text
    finally:
        # Slurm refuses to delete a reservation while a job in it is still running or completing
        # ("Requested reservation is in use"; seen on Debian 13): let the job end first.
        if job is not None:
            with contextlib.suppress(SlurmHooksError):
                slurm.cancel(job)
            tb.wait_job(job, ("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT"), timeout=60)
        slurm.delete_reservation(name)
    assert name not in slurm.reservations()


def test_a_reservation_or_a_job_with_no_node_or_a_bad_name_is_refused_before_any_command():
    seen: list[tuple[str, ...]] = []
    slurm = ScontrolSlurm(timeout=10, runner=lambda argv, timeout, **kw: seen.append(tuple(argv)))
    for call in (lambda: slurm.create_reservation("r", [], 1),
                 lambda: slurm.create_reservation("r", ["n1", "-x"], 1),
                 lambda: slurm.submit(["true"], name="j", node=[], reservation="r", minutes=1),
                 lambda: slurm.submit(["true"], name="j", node=["n1", "n2,n3"], reservation="r", minutes=1),
                 lambda: slurm.jobs_named("--all")):
        with pytest.raises(PermanentError):
            call()
    assert seen == []


# --- a run of ours that libslurm gives no slurm.conf -------------------------------------------------


@pytest.mark.slurm
@pytest.mark.parametrize("backend", ["scontrol", "auto"])
def test_a_check_run_as_slurmd_runs_it_without_slurm_conf_keeps_its_drain_pending(clean_testbed, tmp_path, backend):
    """slurmd 25.11 runs the HealthCheckProgram with only PWD and SLURMD_NODENAME: where slurm.conf is
    not where libslurm looks, the run must live to keep its action pending (auto: pyslurm installed
    for this Slurm would be chosen, were its slurm.conf to be found)."""
    tb = clean_testbed
    if backend == "auto":
        adapter(tb, "pyslurm")  # skips where no pyslurm could be chosen at all
    config = tmp_path / "config.toml"
    with open(tb.config_path, encoding="utf-8") as fh:
        config.write_text(fh.read().replace('backend = "scontrol"', f'backend = "{backend}"'))
    sim.inject(tb.sim_dir, "n1", 0, xid=79)
    env = {"PWD": str(tmp_path), "SLURMD_NODENAME": "n1", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "slurm_hooks", "check", "--config", str(config)], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
    queued = [r for r in tb.audit_events() if r.get("action") == "pending" and r.get("result") == "queued"]
    assert queued and queued[0]["steps"][0] == "drain", (done.returncode, done.stderr[-800:], tb.audit_events())
    assert "configuration source" in queued[0]["error"]
    assert pending.load(tb.hooks_state_dir, "n1") is not None
    assert tb.slurm.node("n1").state == "IDLE"  # nothing done: the run could not reach Slurm
