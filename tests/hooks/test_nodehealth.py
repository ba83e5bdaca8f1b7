"""The watcher's answer to NVRx's node health check, asked over its socket by the real grpcio client
as ft_launcher asks it (tests/fakes/nvrx.py): a job that heals itself in place leaves a node we judge
faulty, hears why in our words, and is never held past its own deadline nor refused a healthy node."""

from __future__ import annotations

import grp
import os
import shutil
import stat
import sys
import tempfile
import threading
import time

import pytest

pytest.importorskip("grpc")
pytest.importorskip("google.protobuf")

from fakes import FakeNvml  # noqa: E402
from fakes.config import sim_config  # noqa: E402
from fakes.nvrx import ask  # noqa: E402
from fakes.slurm import FakeSlurm  # noqa: E402

from slurm_hooks.hooks import nodehealth  # noqa: E402
from slurm_hooks.hooks.nodehealth import Verdict, decide  # noqa: E402
from slurm_hooks.hooks.watch import SimSource, Watcher  # noqa: E402
from slurm_hooks.lab.waiting import poll  # noqa: E402
from slurm_hooks.models import Action, Context, Finding, Report, Scope, Severity  # noqa: E402
from slurm_hooks.observe.audit import AuditLog  # noqa: E402
from slurm_hooks.probes import sim  # noqa: E402
from slurm_hooks.probes.nvml import NvmlProbe  # noqa: E402
from slurm_hooks.remedy.ownership import DrainMarker  # noqa: E402
from slurm_hooks.remedy.wiring import Wiring  # noqa: E402


class Idle:
    """A source with nothing to deliver: the answer alone is under test."""

    def backlog(self):
        return []

    def follow(self, stop, on_event):
        stop.wait()


class Node:
    """One watcher running on node ``n1`` (8 sim GPUs, job 7 on it), serving its socket."""

    def __init__(self, tmp_path, sock_dir, extra="", source=None, probe=None):
        self.sock = os.path.join(sock_dir, "nvhcd.sock")
        self.cfg = sim_config(tmp_path, f'[expect]\ngpus = 8\n[interop]\nnvrx_socket = "{self.sock}"\n{extra}')
        self.slurm = FakeSlurm()
        self.slurm.add_node("n1", "MIXED")
        self.slurm.add_job(7, "n1")
        sim.init(self.cfg.gpu.sim_dir, "n1")
        self.w = Wiring(self.cfg, "n1", AuditLog(self.cfg.log.audit), slurm_override=self.slurm, probe_override=probe)
        self.logs: list[str] = []
        self.stop = threading.Event()
        src = source(self) if source else Idle()
        self.watcher = Watcher(self.w, src, log=self.logs.append)
        self.thread = threading.Thread(target=self.watcher.run, args=(self.stop,), daemon=True)
        self.thread.start()
        assert poll(lambda: any("answering NVRx" in m for m in self.logs), 10.0), self.logs

    def inject(self, gpu, **fault):
        sim.inject(self.cfg.gpu.sim_dir, "n1", gpu, **fault)

    def ask(self, *args, timeout=60.0):
        return ask(self.sock, args or ("--no-slurm", "--group", "prolog", "epilog", "logs", "gpu"), timeout=timeout)

    def audit(self, kind):
        import json

        with open(self.cfg.log.audit) as fh:
            return [r for r in map(json.loads, fh) if r["kind"] == kind]

    def close(self):
        self.stop.set()
        self.thread.join(10)


@pytest.fixture
def sock_dir():
    # A Unix socket's path must fit in 108 bytes: pytest's tmp_path may not.
    path = tempfile.mkdtemp(prefix="nvhcd", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def node(tmp_path, sock_dir):
    made = []

    def make(**kw):
        made.append(Node(tmp_path, sock_dir, **kw))
        return made[-1]

    yield make
    for n in made:
        n.close()


def test_a_healthy_node_answers_healthy_with_fail_count_0(node):
    n = node()
    r = n.ask()
    assert (r.success, r.exit_code, r.error) == (True, 0, "")
    assert r.body["fail_count"] == 0 and r.body["failed_checks"] == [] and r.healthy
    assert r.body["node"] == "n1" and r.body["scope"] == "node"
    assert n.audit("nvrx") == []  # a healthy answer is not an event


def test_a_node_the_watcher_drained_answers_unhealthy_in_our_drain_reasons_words(node):
    n = node(source=lambda n: SimSource(n.cfg.gpu.sim_dir, "n1", 0.05))
    n.inject(3, xid=79)
    assert poll(lambda: n.slurm.peek("n1").reason.startswith("slurm-hooks:"), 10.0), n.logs
    r = n.ask()
    reason = n.slurm.peek("n1").reason
    assert reason == "slurm-hooks: XID 79 on GPU 3 [reboot]"
    assert (r.success, r.exit_code, r.error) == (False, 1, reason)
    assert not r.healthy and r.body["fail_count"] >= 1 and r.body["message"] == reason
    assert any("XID 79" in c for c in r.body["failed_checks"])
    [audited] = n.audit("nvrx")
    assert (audited["healthy"], audited["reason"]) == (False, reason)
    from slurm_hooks.observe.events import describe

    assert describe(audited) == f"nvrx    answered NVRx: unhealthy (node): {reason}"  # as `slurm-hooks events` shows it


def test_our_drain_alone_refuses_the_node_while_the_last_judgement_finds_nothing(node, tmp_path):
    """The drain's record is what says the node is out: a fault the probe no longer shows (an XID
    the driver delivered once) keeps the node refused until our drain ends, and our reason is said."""
    n = node()
    assert n.ask().healthy
    DrainMarker(reason="slurm-hooks: XID 48 on GPU 5 [reboot]", ts=time.time()).save(n.w.drained_marker())
    r = n.ask()
    assert not r.healthy and r.error == "slurm-hooks: XID 48 on GPU 5 [reboot]"
    os.unlink(n.w.drained_marker())  # our resume lets go of the record
    assert n.ask().healthy


def test_a_fault_found_before_any_drain_refuses_the_node_once_the_verdict_is_judged_again(node):
    n = node(extra="nvrx_max_age = 0.2\n")
    assert n.ask().healthy
    n.inject(2, ecc_uncorrectable=4)  # uncorrectable ECC errors; nothing drains here (no event source)
    time.sleep(0.3)
    r = n.ask()
    assert not r.healthy and r.error.startswith("slurm-hooks: ") and "GPU 2" in r.error
    assert r.body["verdict_source"] == "asked" and r.body["verdict_age_s"] < 5
    assert n.slurm.called("drain") == []  # answering acts on nothing


def test_a_request_naming_the_jobs_gpus_is_answered_for_those_gpus(node):
    n = node(extra="nvrx_max_age = 0.2\n")
    n.slurm.add_job(8, "n1")
    n.slurm.set_job_gpus(7, (0, 1))
    n.slurm.set_job_gpus(8, (2, 3))
    n.inject(3, xid=79)
    time.sleep(0.3)
    mine, theirs = n.ask("--job", "7"), n.ask("--job=8")
    assert mine.healthy and mine.body["scope"] == "job 7 (GPUs 0,1)"
    assert not theirs.healthy and "GPU 3" in theirs.error and theirs.body["scope"] == "job 8 (GPUs 2,3)"
    assert n.ask("--gpus", "0,1").healthy and not n.ask("--gpus", "3").healthy
    assert not n.ask().healthy  # ft_launcher names no GPU: the whole node


def test_a_hung_probe_answers_from_the_last_verdict_and_says_its_age(node, tmp_path):
    """A driver that stops answering never holds the launcher: the answer comes within [interop]
    nvrx_wait (and within the asker's own shorter deadline), from the last verdict, with its age."""
    fake = FakeNvml.healthy(gpus=8)
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    n = node(extra="nvrx_max_age = 0.5\nnvrx_wait = 1.0\n", probe=NvmlProbe("n1", kmsg_path=str(kmsg), nvml=fake))
    assert n.ask().healthy
    hung = threading.Event()
    fake.stall("nvmlInit", hung)
    try:
        time.sleep(1.0)
        started = time.monotonic()
        r = n.ask()
        took = time.monotonic() - started
        assert r.healthy and took < 3.0
        assert r.body["verdict_age_s"] >= 1.0 and "old" in r.body["message"]
        started = time.monotonic()
        r = n.ask(timeout=0.6)  # an asker in more of a hurry than nvrx_wait: answered, not timed out
        assert r.healthy and time.monotonic() - started < 0.6
    finally:
        hung.set()


def test_the_socket_is_0660_in_the_configured_group(node):
    group = next(g for g in grp.getgrall() if g.gr_gid != os.getegid())
    n = node(extra=f'nvrx_group = "{group.gr_name}"\n')
    st = os.stat(n.sock)
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == group.gr_gid


def test_the_socket_goes_with_the_watcher_so_nvrx_finds_no_service_rather_than_a_dead_one(node):
    n = node()
    n.close()
    assert not os.path.exists(n.sock)


def test_a_socket_left_by_a_watcher_that_died_is_taken_over(tmp_path, sock_dir, node):
    import socket

    left = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    left.bind(os.path.join(sock_dir, "nvhcd.sock"))  # bound, never listening: its server is gone
    left.close()
    assert node().ask().healthy


def test_monitor_only_answers_healthy_and_says_what_it_would_have_said(node):
    n = node(extra="nvrx_max_age = 0.2\n[check]\ndrain = false\n")
    n.inject(3, xid=79)
    time.sleep(0.3)
    r = n.ask()
    assert r.healthy and "monitor-only" in r.body["message"] and "XID 79 on GPU 3" in r.body["message"]


def test_without_grpcio_the_watcher_says_so_in_one_line_and_runs_without_the_socket(tmp_path, sock_dir, monkeypatch):
    from slurm_hooks.interop import nvhcd

    monkeypatch.setitem(sys.modules, "grpc", None)  # as where the nvrx extra is not installed
    monkeypatch.setattr(nvhcd, "_MESSAGES", [])
    sock = os.path.join(sock_dir, "nvhcd.sock")
    cfg = sim_config(tmp_path, f'[interop]\nnvrx_socket = "{sock}"\n')
    slurm = FakeSlurm()
    slurm.add_node("n1", "IDLE")
    sim.init(cfg.gpu.sim_dir, "n1")
    logs, stop = [], threading.Event()

    class Once(Idle):
        def follow(self, stop_event, on_event):
            stop_event.set()

    Watcher(Wiring(cfg, "n1", AuditLog(cfg.log.audit), slurm_override=slurm), Once(), log=logs.append).run(stop)
    said = [m for m in logs if "nvrx" in m.lower()]
    assert len(said) == 1 and "grpcio is not installed" in said[0] and "running without" in said[0]
    assert not os.path.exists(sock)


# --- the answer itself, from what was gathered ---------------------------------------------------

def _report(*findings):
    return Report("n1", Context.WATCH, tuple(findings), 0.01)


XID79 = Finding("xid", Severity.FAIL, Action.REBOOT, "XID 79 (GPU has fallen off the bus)", gpu=3,
                summary="XID 79 on GPU 3", scope=Scope.GPU, rule="xid.79")


def test_a_drained_node_answers_healthy_for_gpus_the_newer_verdict_puts_no_fault_on():
    marker = DrainMarker(reason="slurm-hooks: XID 79 on GPU 3 [reboot]", ts=100.0)
    newer = Verdict(_report(XID79), 110.0, "watch")
    kw = dict(monitor_only=False, now=111.0, max_age=30.0)
    assert decide("n1", newer, marker, (0, 1), "GPUs 0,1", **kw).healthy
    assert not decide("n1", newer, marker, (3,), "GPUs 3", **kw).healthy
    assert not decide("n1", newer, marker, None, "node", **kw).healthy
    older = Verdict(_report(XID79), 90.0, "watch")  # from before the drain: it cannot speak for it
    assert not decide("n1", older, marker, (0, 1), "GPUs 0,1", **kw).healthy
    clean = Verdict(_report(), 110.0, "asked")  # nothing found that would say where the fault is
    assert not decide("n1", clean, marker, (0, 1), "GPUs 0,1", **kw).healthy


def test_a_finding_judged_against_the_config_alone_does_not_refuse_the_node():
    """A wrong [expect] value fails every node alike: refusing on it would take every NVRx job's
    every node at once (the drain guard's case); our drain, once made, still refuses."""
    wrong = Finding("gpu-count", Severity.FAIL, Action.DRAIN, "7 GPUs, expected 8", summary="7/8 GPUs",
                    config_based=True)
    verdict = Verdict(_report(wrong), 100.0, "watch")
    kw = dict(monitor_only=False, now=101.0, max_age=30.0)
    assert decide("n1", verdict, None, None, "node", **kw).healthy
    marker = DrainMarker(reason="slurm-hooks: 7/8 GPUs [drain]", ts=99.0)
    assert not decide("n1", verdict, marker, None, "node", **kw).healthy


def test_no_verdict_and_no_drain_is_healthy_and_says_so():
    said = decide("n1", None, None, None, "node", monitor_only=False, now=1.0, max_age=30.0)
    assert said.healthy and "no verdict yet" in said.message and said.details["verdict_age_s"] is None


def test_a_judgement_that_fails_keeps_the_last_verdict_and_is_said_once():
    logs, calls = [], []

    def judge():
        calls.append(1)
        raise RuntimeError("NVML went away")

    v = nodehealth.Verdicts(judge, max_age=0.0, log=logs.append)
    v.offer(_report(), "watch", at=1.0)
    assert v.fresh(2.0).at == 1.0
    assert v.fresh(2.0).at == 1.0
    assert len(calls) == 2 and len(logs) == 1 and "NVML went away" in logs[0]


# --- the real launcher ---------------------------------------------------------------------------

#: An interpreter with NVIDIA Resiliency Extension >= 0.6 (its ft_launcher asks a node-health
#: socket) and torch; docs/interop.md says how to make one.
NVRX_PYTHON_ENV = "SLURM_HOOKS_NVRX_PYTHON"


def _nvrx_python() -> str | None:
    import subprocess

    for python in (os.environ.get(NVRX_PYTHON_ENV, ""), "/usr/bin/python3"):
        if not python or not os.access(python, os.X_OK):
            continue
        probe = ("from nvidia_resiliency_ext.shared_utils.health_check import NodeHealthCheck; "
                 "import nvidia_resiliency_ext.fault_tolerance.launcher")
        try:
            if subprocess.run([python, "-c", probe], capture_output=True, timeout=120).returncode == 0:
                return python
        except subprocess.TimeoutExpired:
            continue
    return None


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_real_ft_launcher_starts_on_a_healthy_node_and_refuses_the_node_we_drained(node, tmp_path):
    import subprocess

    python = _nvrx_python()
    if python is None:
        pytest.skip(f"no NVRx >= 0.6 with torch (set {NVRX_PYTHON_ENV}; docs/interop.md)")
    n = node(source=lambda n: SimSource(n.cfg.gpu.sim_dir, "n1", 0.05))
    worker = tmp_path / "worker.py"
    worker.write_text("import pathlib, sys\npathlib.Path(sys.argv[1]).write_text('ran')\n")

    def launch(ran):
        argv = [python, "-c", "import sys; from nvidia_resiliency_ext.fault_tolerance.launcher import main; "
                "sys.exit(main())", "--nnodes=1", "--nproc-per-node=1", "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{_free_port()}", "--max-restarts=0",
                "--ft-node-health-check-endpoint", n.sock, str(worker), str(ran)]
        return subprocess.run(argv, capture_output=True, text=True, timeout=240, cwd=tmp_path)

    first = launch(tmp_path / "ran-healthy")
    assert (tmp_path / "ran-healthy").exists(), first.stderr[-3000:]
    n.inject(3, xid=79)
    assert poll(lambda: n.slurm.peek("n1").reason.startswith("slurm-hooks:"), 10.0), n.logs
    second = launch(tmp_path / "ran-drained")
    log = second.stdout + second.stderr
    assert not (tmp_path / "ran-drained").exists(), log[-3000:]
    assert "Node health check failed" in log and "slurm-hooks: XID 79 on GPU 3 [reboot]" in log, log[-3000:]
    assert "UnhealthyNodeException" in log
