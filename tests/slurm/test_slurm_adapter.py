"""The Slurm adapter against the real local cluster, and how its backend is chosen.

Every ``slurm``-marked test runs on the session's testbed (tests/conftest.py),
restored to two IDLE nodes with no jobs before each test.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import time
from types import SimpleNamespace

import pytest
from conftest import wait_for

from slurm_hooks.errors import ConfigError, PermanentError, SlurmHooksError, TransientError
from slurm_hooks.lab.testbed import slurm_version
from slurm_hooks.models import Action
from slurm_hooks.runner import run_command
from slurm_hooks.slurm import NodeInfo, format_reason, quirks
from slurm_hooks.slurm.factory import from_config, usable_pyslurm, versions_match
from slurm_hooks.slurm.scontrol import (
    ReasonNotOurs,
    ScontrolSlurm,
    SlurmNotFound,
    SlurmTimeout,
    SlurmUnavailable,
)

OUR_REASON = format_reason("XID 79 on GPU 3", Action.REPLACE)
SLEEP = "#!/bin/sh\nsleep 300\n"


def admin_drain(tb, node: str, reason: str) -> None:
    tb.scontrol("update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}")


# --- drain and resume: reason ownership ------------------------------------------------------


@pytest.mark.slurm
def test_drain_with_our_prefix_sets_the_reason(clean_testbed):
    slurm = clean_testbed.slurm
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

    slurm = ScontrolSlurm(timeout=10, runner=recording, env={"SLURM_CONF": tb.slurm_conf})
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
def test_redrain_of_our_own_node_replaces_our_reason(clean_testbed):
    slurm = clean_testbed.slurm
    slurm.drain("n1", OUR_REASON)
    newer = format_reason("XID 48 on GPU 1", Action.RESET)
    slurm.drain("n1", newer)
    assert slurm.node("n1").reason == newer


@pytest.mark.slurm
def test_admin_reason_is_never_overwritten_nor_resumed(clean_testbed):
    slurm = clean_testbed.slurm
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
def test_slurm_and_operator_reasons_are_left_alone(clean_testbed, foreign):
    slurm = clean_testbed.slurm
    admin_drain(clean_testbed, "n2", foreign)
    with pytest.raises(ReasonNotOurs):
        slurm.drain("n2", OUR_REASON)
    with pytest.raises(ReasonNotOurs):
        slurm.resume("n2")
    node = slurm.node("n2")
    assert node.drained and node.reason == foreign


@pytest.mark.slurm
def test_resume_of_a_node_we_drained_brings_it_back_idle(clean_testbed):
    slurm = clean_testbed.slurm
    slurm.drain("n2", OUR_REASON)
    slurm.resume("n2")
    node = clean_testbed.wait_node("n2", lambda n: n.state == "IDLE", timeout=10)
    # 23.11+ without accounting (Debian 13's 24.11) keeps the reason on the resumed node.
    assert node.reason == (OUR_REASON if clean_testbed.keeps_reasons else "") and not node.drained


@pytest.mark.slurm
def test_resume_of_a_node_nobody_drained_changes_nothing(clean_testbed):
    clean_testbed.slurm.resume("n1")
    assert clean_testbed.slurm.node("n1").state == "IDLE"


@pytest.mark.slurm
def test_drain_of_a_busy_node_keeps_its_job_running(clean_testbed):
    tb = clean_testbed
    job = tb.sbatch(SLEEP, "-w", "n1")
    tb.wait_job(job, ["RUNNING"])
    tb.slurm.drain("n1", OUR_REASON)
    node = tb.slurm.node("n1")
    assert node.drained and node.base_state in ("MIXED", "ALLOCATED")
    assert tb.slurm.job(job).state == "RUNNING"


# --- jobs ----------------------------------------------------------------------------


@pytest.mark.slurm
def test_jobs_on_node_lists_a_running_sbatch_job_only_on_its_node(clean_testbed):
    tb = clean_testbed
    job = tb.sbatch(SLEEP, "-w", "n2", "--gres=gpu:2", "-J", "train step=1")
    tb.wait_job(job, ["RUNNING"])
    on_n2 = tb.slurm.jobs_on_node("n2")
    assert [j.job_id for j in on_n2] == [job]
    assert on_n2[0].name == "train step=1" and on_n2[0].nodes == "n2" and on_n2[0].batch
    assert tb.slurm.jobs_on_node("n1") == []


@pytest.mark.slurm
def test_jobs_on_node_finds_a_two_node_job_on_both_nodes(clean_testbed):
    tb = clean_testbed
    job = tb.sbatch(SLEEP, "-N", "2")
    tb.wait_job(job, ["RUNNING"])
    assert [j.job_id for j in tb.slurm.jobs_on_node("n1")] == [job]
    assert [j.job_id for j in tb.slurm.jobs_on_node("n2")] == [job]
    assert tb.slurm.job(job).nodes == "n[1-2]"


@pytest.mark.slurm
def test_pending_jobs_are_not_on_any_node(clean_testbed):
    tb = clean_testbed
    job = tb.sbatch(SLEEP, "--begin=now+1hour")
    assert tb.wait_job(job, ["PENDING"]).reason == "BeginTime"
    assert tb.slurm.jobs_on_node("n1") == [] and tb.slurm.jobs_on_node("n2") == []


@pytest.mark.slurm
def test_requeue_then_start_now_runs_the_job_again_within_seconds(clean_testbed):
    tb = clean_testbed
    slurm = tb.slurm
    job = tb.sbatch(SLEEP, "-w", "n1")
    tb.wait_job(job, ["RUNNING"])
    requeued_at = time.monotonic()
    slurm.requeue(job)
    pending = tb.wait_job(job, ["PENDING"], timeout=20, interval=0.05)
    assert pending.reason == "BeginTime"  # Slurm holds a requeued job back ~121 s unless told otherwise
    assert pending.restarts == 1
    # Elsewhere, as after our drain: relaunched onto the node it left, 22.05 sometimes fails the
    # new run at once (FAILED, NonZeroExitCode), even once that node shows IDLE again.
    tb.scontrol("update", f"JobId={job}", "ReqNodeList=n2")
    slurm.start_now(job)
    started = time.monotonic()
    running = tb.wait_job(job, ["RUNNING"], timeout=30, interval=0.05)  # not the 121 s BeginTime
    again = time.monotonic()
    assert again - requeued_at < 60
    assert running.restarts == 1 and running.nodes == "n2"
    print(f"requeue->PENDING {started - requeued_at:.2f}s, start_now->RUNNING {again - started:.2f}s")


@pytest.mark.slurm
def test_release_frees_a_held_job(clean_testbed):
    tb = clean_testbed
    job = tb.sbatch(SLEEP, "--hold")
    assert tb.wait_job(job, ["PENDING"]).reason == "JobHeldUser"
    tb.slurm.release(job)
    tb.wait_job(job, ["RUNNING"], timeout=10)


@pytest.mark.slurm
def test_signal_term_reaches_the_batch_script_while_it_runs_a_foreground_command(clean_testbed):
    tb = clean_testbed
    script = "#!/bin/bash\ntrap 'echo checkpoint on TERM; exit 0' TERM\necho started\nsleep 300\n"
    job = tb.sbatch(script, "-w", "n1")
    tb.wait_job(job, ["RUNNING"])
    assert _eventually(lambda: "started" in tb.job_output(job), 5)
    tb.slurm.signal(job, "TERM")
    assert _eventually(lambda: "checkpoint on TERM" in tb.job_output(job), 5), tb.job_output(job)
    assert tb.wait_job(job, ["COMPLETED"], timeout=10).state == "COMPLETED"


@pytest.mark.slurm
def test_hostile_job_name_never_reaches_a_command_line_except_as_one_argument(clean_testbed):
    tb = clean_testbed
    seen: list[tuple[str, ...]] = []

    def recording(argv, timeout, **kw):
        seen.append(tuple(argv))
        return run_command(argv, timeout, **kw)

    slurm = ScontrolSlurm(timeout=10, runner=recording, env={"SLURM_CONF": tb.slurm_conf})
    name = "x; touch /tmp/pwned $(id) `id`"
    job = tb.sbatch(SLEEP, "-w", "n2", "-J", name, "--comment", "a b; rm -rf /")
    tb.wait_job(job, ["RUNNING"])
    [found] = slurm.jobs_on_node("n2")
    assert found.name == name
    slurm.signal(job, "USR1")
    assert all(name not in arg and "rm -rf" not in arg for argv in seen for arg in argv)
    assert not os.path.exists("/tmp/pwned")


@pytest.mark.slurm
def test_a_job_name_cannot_fake_the_state_nodes_or_requeue_flag_remediation_reads(clean_testbed):
    tb = clean_testbed
    name = "x UserId=nobody(65534) JobState=COMPLETED NodeList=elsewhere Requeue=0|COMPLETED|n9|0|0|0"
    job = tb.sbatch(SLEEP, "-w", "n1", "-J", name, "--requeue")
    tb.wait_job(job, ["RUNNING"])
    info = tb.slurm.job(job)
    assert (info.state, info.nodes, info.requeue, info.batch, info.restarts) == ("RUNNING", "n1", True, True, 0)
    assert info.name == name
    assert [j.job_id for j in tb.slurm.jobs_on_node("n1")] == [job]


# --- errors ----------------------------------------------------------------------------


@pytest.mark.slurm
def test_unknown_node_and_job_are_permanent_errors(clean_testbed):
    with pytest.raises(SlurmNotFound) as node_err:
        clean_testbed.slurm.node("n99")
    with pytest.raises(SlurmNotFound) as job_err:
        clean_testbed.slurm.job(999999)
    assert isinstance(node_err.value, PermanentError) and isinstance(job_err.value, PermanentError)
    with pytest.raises(PermanentError):
        clean_testbed.slurm.requeue(999999)


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
    slurm = ScontrolSlurm(timeout=10, env={"SLURM_CONF": str(dead)})
    started = time.monotonic()
    with pytest.raises(SlurmUnavailable) as err:
        slurm.node("n1")
    assert isinstance(err.value, TransientError)
    assert "Unable to contact slurm controller" in str(err.value)
    assert time.monotonic() - started < 10


@pytest.mark.slurm
def test_hung_controller_times_out_as_a_transient_error_naming_scontrol(clean_testbed):
    pid = clean_testbed.status().daemons["slurmctld"]
    slurm = ScontrolSlurm(timeout=1.0, env={"SLURM_CONF": clean_testbed.slurm_conf})
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
def test_scontrol_call_latency_is_milliseconds(clean_testbed):
    slurm = clean_testbed.slurm
    started = time.monotonic()
    for _ in range(20):
        slurm.node("n1")
    per_call = (time.monotonic() - started) / 20
    print(f"scontrol show node: {per_call * 1000:.1f} ms per call")
    assert per_call < 0.5


# --- backend choice (no Slurm needed) ----------------------------------------------------------


def _config(backend: str, path: str = "/etc/slurm-hooks/config.toml"):
    return SimpleNamespace(path=path, slurm=SimpleNamespace(backend=backend, bin_dir="/usr/bin", timeout=7.0))


@pytest.mark.parametrize("pyslurm_version, slurm_text, ok", [
    ("25.11.0", "slurm 25.11.2", True),
    ("23.2.1", "slurm-wlm 23.02.7", True),
    ("25.11.0", "slurm-wlm 22.05.8", False),
    ("24.5.0", "slurm 24.11.1", False),
    ("", "slurm 25.11.0", False),
    ("25.11.0", "garbage", False),
])
def test_pyslurm_is_used_only_for_the_same_slurm_major_minor(pyslurm_version, slurm_text, ok):
    matched, why = versions_match(pyslurm_version, slurm_text)
    assert matched is ok
    assert (why == "") is ok


def test_version_mismatch_says_which_versions_disagree():
    _, why = versions_match("25.11.0", "slurm-wlm 22.05.8")
    assert "pyslurm 25.11" in why and "Slurm 22.05" in why


def test_scontrol_backend_is_used_when_asked(tmp_path):
    slurm = from_config(_config("scontrol"))
    assert isinstance(slurm, ScontrolSlurm)
    assert slurm.timeout == 7.0 and slurm.bin_dir == "/usr/bin"


@pytest.mark.skipif(usable_pyslurm()[0] is not None, reason="pyslurm matching this Slurm is installed")
def test_auto_falls_back_to_scontrol_without_a_matching_pyslurm():
    assert isinstance(from_config(_config("auto")), ScontrolSlurm)
    assert usable_pyslurm()[1]  # says why not


@pytest.mark.skipif(usable_pyslurm()[0] is not None, reason="pyslurm matching this Slurm is installed")
def test_asking_for_pyslurm_where_it_cannot_work_is_a_config_error():
    with pytest.raises(ConfigError) as err:
        from_config(_config("pyslurm"))
    assert "[slurm] backend" in str(err.value) and "pyslurm" in str(err.value)


def _eventually(predicate, timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


@pytest.mark.slurm
def test_drained_count_counts_nodes_by_exact_reason(clean_testbed):
    tb = clean_testbed
    reason = "slurm-hooks: 8 of 9 GPUs visible [reboot]"
    assert tb.slurm.drained_count(reason) == 0
    tb.slurm.drain("n1", reason)
    tb.slurm.drain("n2", reason)
    assert tb.slurm.drained_count(reason) == 2
    tb.scontrol("update", "NodeName=n2", "State=RESUME")
    tb.scontrol("update", "NodeName=n2", "State=DRAIN", "Reason=bob | slurm-hooks: 8 of 9 GPUs visible [reboot]")
    assert tb.slurm.drained_count(reason) == 1


# --- addressing exactly one job ------------------------------------------------------------------


def _recording(tb, seen):
    def run(argv, timeout, **kw):
        seen.append(tuple(argv))
        return run_command(argv, timeout, **kw)

    return ScontrolSlurm(timeout=10, runner=run, env={"SLURM_CONF": tb.slurm_conf})


@pytest.mark.slurm
def test_requeue_of_one_array_task_leaves_the_task_carrying_the_arrays_id_running(clean_testbed):
    tb = clean_testbed
    array = tb.sbatch(SLEEP, "--array=0-1", "--gres=gpu:8")
    deadline = time.monotonic() + 15
    while len(running := [j for n in tb.nodes for j in tb.slurm.jobs_on_node(n)]) < 2:
        assert time.monotonic() < deadline, running
        time.sleep(0.1)
    base = next(j for j in running if j.job_id == array)
    other = next(j for j in running if j.job_id != array)
    assert base.ref == f"{array}_{base.array_task_id}" and other.ref == f"{array}_{other.array_task_id}"
    tb.slurm.requeue(other.ref)
    tb.wait_job(other.job_id, ["PENDING"], timeout=15)
    tb.slurm.start_now(other.ref)
    time.sleep(1.0)
    assert (tb.slurm.job(base.ref).base_state, tb.slurm.job(base.ref).restarts) == ("RUNNING", 0)
    assert tb.slurm.job(other.ref).restarts == 1


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
def test_a_newline_in_a_job_name_cannot_hide_a_job_or_fake_another(clean_testbed):
    tb = clean_testbed
    victim = tb.sbatch(SLEEP, "-w", "n1", "-J", "victim")
    tb.wait_job(victim, ["RUNNING"])
    forged = f"{victim}|{victim}|N/A|N/A|COMPLETED|elsewhere|0|0|1|1|None|root|y"
    hostile = tb.sbatch(SLEEP, "-w", "n1", "-J", f"x|0\n{forged}")
    tb.wait_job(hostile, ["RUNNING"])
    jobs = {j.job_id: j for j in tb.slurm.jobs_on_node("n1")}
    assert sorted(jobs) == sorted([victim, hostile])
    assert (jobs[victim].state, jobs[victim].nodes, jobs[victim].requeue) == ("RUNNING", "n1", True)


@pytest.mark.slurm
def test_the_slurm_version_is_asked_once_and_2205_keeps_the_one_line_output(clean_testbed):
    seen: list[tuple[str, ...]] = []
    slurm = _recording(clean_testbed, seen)
    slurm.bin_dir = "/usr/bin/"  # a key of its own in the per-process cache
    assert slurm.version() == slurm_version()  # 22.05 on Debian 12, 24.11 on Debian 13
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
