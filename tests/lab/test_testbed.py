"""The local Slurm testbed itself: up, status, GPUs, hooks wiring, down."""

from __future__ import annotations

import json
import os
import shlex
import signal
import stat
import subprocess
import sys
import time

import pytest

from slurm_hooks.lab.testbed import (
    FORCE_REQUEUE_ON_FAIL_SINCE,
    HOOKS,
    MARKER,
    LabSettings,
    Testbed,
    TestbedError,
    default_state_dir,
    missing_programs,
    slurm_version,
)
from slurm_hooks.runner import run_command
from slurm_hooks.slurm.version import parse_version

pytestmark = pytest.mark.slurm


def test_up_again_is_a_no_op_that_says_already_up(clean_testbed):
    before = clean_testbed.status().daemons
    said: list[str] = []
    again = Testbed(clean_testbed.state_dir, progress=said.append)
    started = time.monotonic()
    status = again.up()
    assert time.monotonic() - started < 2
    assert any("already up" in line for line in said), said
    assert status.daemons == before and status.up


def test_status_lists_every_daemon_and_both_nodes_idle_with_eight_gpus(clean_testbed):
    status = clean_testbed.status()
    assert status.up and status.error == ""
    assert set(status.daemons) == {"munged", "slurmctld", "slurmd n1", "slurmd n2"}
    assert all(isinstance(pid, int) for pid in status.daemons.values())
    assert [(n.name, n.state, n.gres) for n in status.nodes] == [("n1", "IDLE", "gpu:8"), ("n2", "IDLE", "gpu:8")]


def test_gpus_are_char_devices_and_a_job_gets_all_eight(clean_testbed):
    tb = clean_testbed
    for i in range(8):
        st = os.stat(os.path.join(tb.state_dir, "dev", f"nvidia{i}"))
        assert stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == (195, i)
    job = tb.sbatch("#!/bin/sh\necho GPUS=$SLURM_JOB_GPUS CVD=$CUDA_VISIBLE_DEVICES\n", "-w", "n2", "--gres=gpu:8")
    tb.wait_job(job, ["COMPLETED"], timeout=20)
    assert "GPUS=0,1,2,3,4,5,6,7 CVD=0,1,2,3,4,5,6,7" in tb.job_output(job)


def test_config_points_slurm_hooks_at_the_sim_gpus_and_this_cluster(clean_testbed):
    from slurm_hooks import config as config_mod
    from slurm_hooks.probes import sim

    cfg = config_mod.load(clean_testbed.config_path)
    assert cfg.gpu.backend == "sim" and cfg.gpu.sim_dir == clean_testbed.sim_dir
    assert cfg.log.audit == clean_testbed.audit_log
    assert cfg.state.dir == os.path.join(clean_testbed.state_dir, "state")
    assert cfg.slurm.bin_dir == "/usr/bin" and cfg.remediation.requeue_grace == 3.0
    assert [len(sim.read(cfg.gpu.sim_dir, n)["gpus"]) for n in ("n1", "n2")] == [8, 8]
    assert clean_testbed.env["SLURM_CONF"] == clean_testbed.slurm_conf
    assert clean_testbed.env["SLURM_HOOKS_CONFIG"] == clean_testbed.config_path


def test_reset_clears_jobs_drains_and_injected_faults(testbed):
    from slurm_hooks.probes import sim

    testbed.set_hooks(False)
    job = testbed.sbatch("#!/bin/sh\nsleep 300\n", "-w", "n1")
    testbed.wait_job(job, ["RUNNING"])
    testbed.scontrol("update", "NodeName=n2", "State=DRAIN", "Reason=hw check by bob")
    sim.inject(testbed.sim_dir, "n1", 3, xid=79)
    started = time.monotonic()
    testbed.reset()
    print(f"reset with one job, one drain, one fault: {time.monotonic() - started:.2f}s")
    assert [(n.state, n.reason) for n in testbed.slurm.nodes()] == [("IDLE", ""), ("IDLE", "")]
    assert testbed.slurm.jobs_on_node("n1") == []
    assert sim.read(testbed.sim_dir, "n1")["gpus"][3]["xids"] == []


def test_reset_cancels_a_job_that_was_being_requeued_when_it_began(testbed):
    """A health check's requeue just before a reset: the job is COMPLETING when the reset begins
    and would come back PENDING for Slurm's requeue delay (121 s); it must be gone at once."""
    testbed.set_hooks(False)
    job = testbed.sbatch("#!/bin/sh\ntrap '' TERM\nwhile :; do sleep 0.2; done\n", "-w", "n1", "--requeue")
    testbed.wait_job(job, ["RUNNING"])
    testbed.scontrol("requeue", str(job))  # the job ignores SIGTERM: COMPLETING for KillWait (5 s)
    testbed.cancel_all(timeout=30)
    assert testbed.tb._queue() == []


def test_reset_waits_out_the_hooks_and_leaves_every_node_idle_without_a_reason(testbed):
    from slurm_hooks.probes import sim

    testbed.set_hooks(True)
    job = testbed.sbatch("#!/bin/sh\nsleep 300\n", "-w", "n1", "--gres=gpu:8")
    testbed.wait_job(job, ["RUNNING"])
    sim.inject(testbed.sim_dir, "n1", 3, xid=79)  # the epilog of the cancelled job would drain n1
    testbed.scontrol("update", "NodeName=n2", "State=DOWN", "Reason=PSU swap by bob")
    testbed.reset()
    assert [(n.name, n.state, n.reason) for n in testbed.slurm.nodes()] == [("n1", "IDLE", ""), ("n2", "IDLE", "")]
    assert testbed.tb._unclean(testbed.slurm) == {}
    assert testbed.audit_events() == []
    for node in ("n1", "n2"):  # nothing left over (GPU faults, XID history) for the next check to act on
        check = run_command([os.path.join(testbed.state_dir, "bin", "healthcheck")], 60,
                            env={"SLURMD_NODENAME": node}, check=False)
        assert check.returncode == 0, check.stderr
    assert [(n.state, n.reason) for n in testbed.slurm.nodes()] == [("IDLE", ""), ("IDLE", "")]


#: What validate judges of the settings the testbed chooses itself (not the test-only timers).
REHEARSED = ("kill-wait", "checkpoint-grace", "return-to-service", "force-requeue-on-fail", "job-requeue",
             "nohold-on-prolog-fail", "prolog-epilog-timeout", "reboot-program", "resume-timeout",
             "health-check-node-state", "health-check-interval")


@pytest.mark.parametrize("repair", [False, True], ids=["plain", "repair"])
def test_the_testbed_an_admin_brings_up_passes_validate_on_what_it_rehearses(tmp_path, repair):
    """`testbed up` with its defaults (the demo's, an admin's) runs what validate recommends:
    KillWait 120 above the 90 s checkpoint grace, ReturnToService=1, ForceRequeueOnFail where this
    Slurm has it (23.02+; 22.05's daemons refuse it): the settings `testbed up` passes."""
    tb = Testbed(str(tmp_path / "tb"), LabSettings(repair=repair, force_requeue_on_fail=True))
    tb._prepare()  # the files `up` writes; no daemon needed to judge them
    res = run_command([sys.executable, "-m", "slurm_hooks", "validate", "--json", "--config", tb.config_path,
                       "--slurm-conf", tb.slurm_conf, "--node", "n1"], 120, check=False)
    results = json.loads(res.stdout)
    has_flag = slurm_version() >= FORCE_REQUEUE_ON_FAIL_SINCE
    warned = [r for r in results if r["check"] in REHEARSED and r["status"] != "PASS"
              and (has_flag or r["check"] != "force-requeue-on-fail")]
    assert warned == [], warned
    judged = {r["check"] for r in results}
    assert {"kill-wait", "checkpoint-grace"} <= judged and ("resume-timeout" in judged) == repair
    with open(tb.slurm_conf, encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    assert "ReturnToService=1" in lines and "KillWait=120" in lines
    assert ("PrologFlags=ForceRequeueOnFail" in lines) == has_flag


def test_tests_keep_their_short_kill_wait_and_a_site_without_force_requeue_on_fail(tmp_path):
    tb = Testbed(str(tmp_path / "tb"), LabSettings(kill_wait=2, force_requeue_on_fail=False, return_to_service=2))
    tb._prepare()
    with open(tb.slurm_conf, encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    assert "KillWait=2" in lines and "ReturnToService=2" in lines
    assert not any(line.startswith("PrologFlags=") for line in lines)


def test_the_default_state_dir_is_each_users_own(tmp_path):
    assert default_state_dir({}, 0) == "/var/lib/slurm-hooks/testbed-0"
    # two admins through sudo on one host: root both, yet two clusters
    assert default_state_dir({"SUDO_UID": "1000"}, 0) != default_state_dir({"SUDO_UID": "1001"}, 0)
    runtime = tmp_path / "run-user"
    runtime.mkdir(mode=0o700)
    assert default_state_dir({"XDG_RUNTIME_DIR": str(runtime)}, os.geteuid()) == str(runtime / "slurm-hooks-testbed")
    # a runtime dir that is someone else's (kept through sudo) is not where root writes its hook programs
    assert default_state_dir({"XDG_RUNTIME_DIR": str(runtime), "SUDO_UID": "1000"}, os.geteuid() + 1) == \
        "/var/lib/slurm-hooks/testbed-1000"


def test_hooks_are_wired_in_as_absolute_root_owned_wrappers(hooked_testbed):
    tb = hooked_testbed
    bin_dir = os.path.join(tb.state_dir, "bin")
    with open(tb.slurm_conf, encoding="utf-8") as fh:
        conf = fh.read()
    for line in (f"Prolog={bin_dir}/prolog", f"Epilog={bin_dir}/epilog", f"HealthCheckProgram={bin_dir}/healthcheck",
                 "HealthCheckNodeState=ANY", "SchedulerParameters=nohold_on_prolog_fail,batch_sched_delay=0", "ReturnToService=1"):
        assert line in conf.splitlines()
    for hook, command in (("healthcheck", "check"), ("prolog", "prolog"), ("epilog", "epilog")):
        path = os.path.join(bin_dir, hook)
        st = os.stat(path)
        assert stat.S_IMODE(st.st_mode) == 0o755 and st.st_uid == 0
        # Slurm gives hooks no PATH: the wrapper must find python and slurm_hooks on its own.
        out = run_command([path, "--help"], 30, env={"SLURMD_NODENAME": "n1"})
        assert "Usage:" in out.stdout and command in out.stdout


def test_hook_wrappers_run_the_virtualenvs_interpreter_which_finds_its_packages_without_help(hooked_testbed):
    # A venv's bin/python links to the base interpreter, which may lack click and slurm_hooks;
    # run isolated (-I: no PYTHONPATH, as the detached job follower runs), only the venv's
    # own interpreter finds them.
    for hook in HOOKS:
        with open(os.path.join(hooked_testbed.state_dir, "bin", hook), encoding="utf-8") as fh:
            exec_line = next(line for line in fh if line.startswith("exec "))
        python = shlex.split(exec_line)[1]
        assert python == os.path.abspath(sys.executable), exec_line
        if sys.prefix != sys.base_prefix:  # in a virtualenv, as ./scripts/test runs
            assert python.startswith(os.path.join(sys.prefix, "")), (python, sys.prefix)
        res = subprocess.run([python, "-I", "-c", "import click, slurm_hooks"], env={}, cwd="/",
                             capture_output=True, text=True, timeout=30)
        assert res.returncode == 0, res.stderr


def test_batch_job_completes_with_slurm_hooks_as_prolog_and_epilog(hooked_testbed):
    tb = hooked_testbed
    job = tb.sbatch("#!/bin/sh\necho ran\n", "-w", "n1", "--gres=gpu:2")
    done = tb.wait_job(job, ["COMPLETED", "FAILED", "CANCELLED"], timeout=30)
    assert done.state == "COMPLETED", (done, tb.slurm.node("n1"))
    assert "ran" in tb.job_output(job)
    assert tb.slurm.node("n1").reason == ""


def test_cli_status_prints_nodes_and_exits_zero_when_up(clean_testbed, tmp_path):
    up = run_command([sys.executable, "-m", "slurm_hooks", "testbed", "status", "--state-dir", clean_testbed.state_dir],
                     30, check=False)
    assert up.returncode == 0, up.stderr
    assert "testbed up" in up.stdout and "n1" in up.stdout and "IDLE" in up.stdout and "gpu:8" in up.stdout
    down = run_command([sys.executable, "-m", "slurm_hooks", "testbed", "status", "--state-dir", str(tmp_path)],
                       30, check=False)
    assert down.returncode == 3 and "testbed down" in down.stdout


def test_second_testbed_starts_beside_the_first_and_down_leaves_nothing_running(testbed, tmp_path):
    other = Testbed(str(tmp_path / "tb"), LabSettings(nodes=1, hooks=False, kill_wait=1))
    started = time.monotonic()
    try:
        status = other.up()
        up_seconds = time.monotonic() - started
        print(f"testbed up (1 node, fresh dir): {up_seconds:.2f}s")
        assert status.up and [n.name for n in status.nodes] == ["n1"]
        assert other._ports["slurmctld"] != testbed.tb._ports["slurmctld"]
        job = other.sbatch("#!/bin/sh\nsleep 300 &\nsleep 300\n")
        other.wait_job(job, ["RUNNING"])
        time.sleep(0.3)
        ours = other._our_processes()
        assert len(ours) >= 5  # munged, slurmctld (+ scriptd), slurmd, slurmstepd, the job's shell and sleeps
    finally:
        stopped = other.down()
    assert stopped
    pid_files = os.listdir(os.path.join(other.state_dir, "run"))
    assert pid_files == []
    for pid, _ in ours:
        assert not _running(pid), f"pid {pid} still running after down"
    assert _processes_mentioning(other.state_dir) == []
    # the session's cluster is untouched
    assert testbed.status().up


def _pid_of(tb: Testbed, label: str) -> int:
    with open(tb._pidfile(label), encoding="ascii") as fh:
        return int(fh.read())


def test_up_brings_back_a_testbed_whose_slurmd_died(tmp_path):
    tb = Testbed(str(tmp_path / "tb"), LabSettings(nodes=2, hooks=False, kill_wait=1))
    try:
        tb.up()
        dead = _pid_of(tb, "slurmd n1")
        os.kill(dead, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while _running(dead) and time.monotonic() < deadline:  # a signal is delivered, not obeyed at once
            time.sleep(0.05)
        said: list[str] = []
        tb.progress = said.append
        status = tb.up()
        assert status.up and all(status.daemons.values()), (status.daemons, status.error, said)
        assert [(n.name, n.state) for n in status.nodes] == [("n1", "IDLE"), ("n2", "IDLE")]
        assert any("only partly up" in line and "slurmd n1" in line for line in said), said
    finally:
        tb.down()


def test_up_restarts_a_testbed_whose_daemons_run_but_a_node_never_answers(tmp_path):
    # After a failed start, every pid file can name a live daemon while a node is not
    # registered: `up` must not call that "already up".
    tb = Testbed(str(tmp_path / "tb"), LabSettings(nodes=2, hooks=False, kill_wait=1, slurmd_timeout=5,
                                                 message_timeout=2))
    stopped = None
    try:
        tb.up()
        stopped = _pid_of(tb, "slurmd n1")
        os.kill(stopped, signal.SIGSTOP)
        tb.wait_node("n1", lambda n: "NOT_RESPONDING" in n.flags, timeout=60, interval=0.5)
        status = tb.status()
        assert not status.up and "n1 not registered or not responding" in status.error, status
        status = tb.up()
        assert status.up and [(n.name, n.state) for n in status.nodes] == [("n1", "IDLE"), ("n2", "IDLE")]
        assert not _running(stopped)
    finally:
        if stopped and _running(stopped):
            os.kill(stopped, signal.SIGCONT)
        tb.down()


def test_a_testbed_in_a_chroot_with_the_same_state_dir_name_is_not_ours(tmp_path):
    # fresh-root runs `./scripts/demo` in a chroot that shares our /proc: its daemons carry the
    # marker of the default state dir, and the `down` of a testbed out here must leave them alone.
    if os.geteuid() != 0:
        pytest.skip("chroot needs root")
    state_dir = str(tmp_path / "tb")
    jail = tmp_path / "jail"
    jail.mkdir()
    env = {MARKER: state_dir}
    sleeper = "import os, sys, time\nif sys.argv[1:]: os.chroot(sys.argv[1])\nprint('ok', flush=True)\ntime.sleep(60)"
    inside = subprocess.Popen([sys.executable, "-c", sleeper, str(jail)], env=env, stdout=subprocess.PIPE)
    outside = subprocess.Popen([sys.executable, "-c", sleeper], env=env, stdout=subprocess.PIPE)
    try:
        assert inside.stdout.readline() == b"ok\n" and outside.stdout.readline() == b"ok\n"
        ours = {pid for pid, _ in Testbed(state_dir)._our_processes()}
        assert outside.pid in ours and inside.pid not in ours, ours
    finally:
        for proc in (inside, outside):
            proc.kill()
            proc.wait()


def test_down_of_a_testbed_that_is_not_running_is_a_no_op(tmp_path):
    assert Testbed(str(tmp_path)).down() == []


def test_settings_reject_impossible_sizes():
    with pytest.raises(TestbedError):
        LabSettings(nodes=0)
    with pytest.raises(TestbedError):
        LabSettings(gpus=65)


def test_slurm_is_installed_and_its_version_is_read():
    assert missing_programs() == []
    assert parse_version("slurm-wlm 22.05.8") == (22, 5)
    assert parse_version("slurm 25.11.0") == (25, 11)


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _processes_mentioning(state_dir: str) -> list[int]:
    """Live processes whose command line or environment names the state directory."""
    needle = state_dir.encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid() or not _running(int(entry)):
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmdline = fh.read()
            with open(f"/proc/{entry}/environ", "rb") as fh:
                environ = fh.read()
        except OSError:
            continue
        if needle in cmdline or f"{MARKER}={state_dir}".encode() in environ:
            found.append(int(entry))
    return found


@pytest.mark.slurm
def test_a_port_taken_between_the_pick_and_the_bind_starts_afresh_on_other_ports(tmp_path):
    """Another cluster on the host (a fresh root's, a second session's) may take a picked port
    while `up` is still getting ready: slurmctld then cannot bind it, and `up` picks again, once."""
    import socket

    if os.geteuid() != 0:
        pytest.skip("the Slurm testbed needs root")
    taken: list[socket.socket] = []

    class Raced(Testbed):
        def _prepare(self):
            super()._prepare()
            if not taken:
                sock = socket.socket()
                sock.bind(("0.0.0.0", self._ports["slurmctld"]))
                sock.listen(1)
                taken.append(sock)

    tb = Raced(str(tmp_path / "raced"), LabSettings(nodes=1, gpus=1, hooks=False))
    try:
        tb.up()
        assert tb.status().up and tb._ports["slurmctld"] != taken[0].getsockname()[1]
    finally:
        tb.down()
        for sock in taken:
            sock.close()


def test_sixteen_nodes_each_on_its_own_loopback_address_run_one_job_across_all(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the Slurm testbed needs root")
    tb = Testbed(str(tmp_path / "tb16"), LabSettings(nodes=16, hooks=False, own_addresses=True, kill_wait=2))
    try:
        tb.up()
        with open(tb.slurm_conf, encoding="utf-8") as fh:
            addrs = [line.split("NodeAddr=")[1].split()[0] for line in fh if line.startswith("NodeName=")]
        assert addrs == [tb.node_addr(n) for n in tb.node_names] and len(set(addrs)) == 16
        assert all(a.startswith("127.1.") and a.endswith(f".{k}") for k, a in enumerate(addrs, 1))
        job = tb.sbatch("#!/bin/sh\nsrun sh -c 'echo rank=$SLURM_PROCID on=$SLURMD_NODENAME'\n", "-N16")
        tb.wait_job(job, ["COMPLETED"], timeout=60)
        assert sorted(line.split("on=")[1] for line in tb.job_output(job).splitlines() if "on=" in line) == \
            sorted(tb.node_names)
    finally:
        tb.down()


def test_a_node_fault_is_checked_and_cleared_by_reset_and_net_faults_need_own_addresses(testbed):
    assert testbed.node_addr("n1") == "localhost"  # the session's testbed: one shared address
    testbed.set_fault("n1", "hang")
    assert testbed.faults() == {"n1": "hang"} and testbed.net_rules() == []
    for bad in ("slow 8", "drop", "net-slow", "net-slow 0", "net-loss 101", "net-drop 2"):
        with pytest.raises(TestbedError, match="fault must be|KBPS must be|PCT must be"):
            testbed.set_fault("n1", bad)
    with pytest.raises(TestbedError, match="needs nodes on their own addresses"):
        testbed.set_fault("n2", "net-drop")
    with pytest.raises(TestbedError, match="no node 'n9'"):
        testbed.set_fault("n9", "hang")
    testbed.reset()
    assert testbed.faults() == {}


# --- what an admin adds, and what the testbed tells --------------------------------------------------


def test_a_receiver_an_admin_added_to_the_testbeds_config_is_kept_by_the_next_up(tmp_path):
    """An admin adds a webhook below the kept line; `down` then `up` renders the testbed's own part
    afresh and keeps theirs, and the whole loads. A kept table that clashes with the testbed's stops
    `up` with the error, the file as it was."""
    from slurm_hooks import config as config_mod
    from slurm_hooks.lab.testbed import KEEP_BELOW

    tb = Testbed(str(tmp_path / "tb"), LabSettings(nodes=1, hooks=False, kill_wait=1))
    try:
        tb.up()
        with open(tb.config_path, encoding="utf-8") as fh:
            assert fh.read().rstrip().endswith(KEEP_BELOW)
        with open(tb.config_path, "a", encoding="utf-8") as fh:
            fh.write('[[notify.webhook]]\nurl = "https://hooks.example.org/services/T0"\nname = "oncall"\n')
        tb.down()
        tb.up()
        cfg = config_mod.load(tb.config_path)
        assert [t.get("name") for t in cfg.notify.webhook] == ["oncall"] and cfg.gpu.backend == "sim"
        assert stat.S_IMODE(os.stat(tb.config_path).st_mode) == 0o600  # it may hold a receiver's URL
        status = run_command([sys.executable, "-m", "slurm_hooks", "testbed", "status", "--state-dir", tb.state_dir],
                             30, check=False)
        assert "3 line(s) of yours kept" in status.stdout, status.stdout
        with open(tb.config_path, "a", encoding="utf-8") as fh:
            fh.write("[watch]\npoll_interval = 1.0\n")  # the testbed writes [watch] itself
        before = open(tb.config_path, encoding="utf-8").read()
        tb.down()
        with pytest.raises(TestbedError, match="clash with the testbed's own"):
            tb.up()
        assert open(tb.config_path, encoding="utf-8").read() == before
    finally:
        tb.down()


def test_cli_status_shows_the_port_each_daemon_listens_on(clean_testbed):
    st = run_command([sys.executable, "-m", "slurm_hooks", "testbed", "status", "--state-dir", clean_testbed.state_dir],
                     30, check=False)
    ports = clean_testbed.tb.ports()
    assert ports and set(ports) == {"slurmctld", "n1", "n2"}
    lines = st.stdout.splitlines()
    for label, port in (("slurmctld", ports["slurmctld"]), ("slurmd n1", ports["n1"]), ("slurmd n2", ports["n2"])):
        assert any(line.strip().startswith(label) and line.endswith(f"port {port}") for line in lines), st.stdout


def test_testbed_env_where_no_testbed_is_up_prints_no_exports_and_exits_3(clean_testbed, tmp_path):
    none = run_command([sys.executable, "-m", "slurm_hooks", "testbed", "env", "--state-dir", str(tmp_path / "none")],
                       30, check=False)
    assert none.returncode == 3 and none.stdout == ""
    assert f"no testbed up in {tmp_path / 'none'}" in none.stderr
    up = run_command([sys.executable, "-m", "slurm_hooks", "testbed", "env", "--state-dir", clean_testbed.state_dir],
                     30, check=False)
    assert up.returncode == 0 and f"export SLURM_HOOKS_CONFIG={clean_testbed.config_path}" in up.stdout
