"""``validate`` says whether the watcher answers NVRx's node health check: off, or on and answering
a real RunHealthCheck on its socket. A socket that is set but not served is a FAIL: NVRx skips its
check when the socket is missing and counts one that does not answer as healthy, so nobody would
otherwise learn that the job's restarts go unguarded."""

from __future__ import annotations

import os
import shutil
import socket
import sys
import tempfile
import threading

import pytest

pytest.importorskip("grpc")
pytest.importorskip("google.protobuf")

from fakes.config import sim_config  # noqa: E402
from fakes.slurm import FakeSlurm  # noqa: E402

from slurm_hooks.hooks.watch import Watcher  # noqa: E402
from slurm_hooks.interop import nvhcd  # noqa: E402
from slurm_hooks.lab.waiting import poll  # noqa: E402
from slurm_hooks.observe.audit import AuditLog  # noqa: E402
from slurm_hooks.preflight import Status  # noqa: E402
from slurm_hooks.preflight.environment import check_nvrx  # noqa: E402
from slurm_hooks.probes import sim  # noqa: E402
from slurm_hooks.remedy.ownership import DrainMarker  # noqa: E402
from slurm_hooks.remedy.wiring import Wiring  # noqa: E402


@pytest.fixture
def sock(tmp_path):
    directory = tempfile.mkdtemp(prefix="nvhcd", dir="/tmp")  # a socket's path fits in 108 bytes
    yield os.path.join(directory, "nvhcd.sock")
    shutil.rmtree(directory, ignore_errors=True)


def _config(tmp_path, sock, extra=""):
    return sim_config(tmp_path, f'[interop]\nnvrx_socket = "{sock}"\n{extra}')


def test_off_says_off(tmp_path):
    [r] = check_nvrx(sim_config(tmp_path))
    assert r.status is Status.PASS and "off" in r.message


def test_on_and_answering_the_watchers_socket_passes_and_shows_its_answer(tmp_path, sock):
    cfg = _config(tmp_path, sock)
    slurm = FakeSlurm()
    slurm.add_node("n1", "DRAIN")
    sim.init(cfg.gpu.sim_dir, "n1")
    w = Wiring(cfg, "n1", AuditLog(cfg.log.audit), slurm_override=slurm)
    DrainMarker(reason="slurm-hooks: XID 79 on GPU 3 [reboot]", ts=1.0).save(w.drained_marker())
    logs, stop = [], threading.Event()

    class Idle:
        def backlog(self):
            return []

        def follow(self, stop_event, on_event):
            stop_event.wait()

    thread = threading.Thread(target=Watcher(w, Idle(), log=logs.append).run, args=(stop,), daemon=True)
    thread.start()
    try:
        assert poll(lambda: any("answering NVRx" in m for m in logs), 10.0), logs
        [r] = check_nvrx(cfg)
    finally:
        stop.set()
        thread.join(10)
    assert r.status is Status.PASS, r.line()
    assert "mode 0660" in r.message and "UNHEALTHY: slurm-hooks: XID 79 on GPU 3 [reboot]" in r.message


def test_set_but_not_served_fails(tmp_path, sock):
    [r] = check_nvrx(_config(tmp_path, sock))
    assert r.status is Status.FAIL and "skips its check" in r.message and "slurm-hooks watch" in r.fix


def test_a_socket_nobody_answers_on_fails(tmp_path, sock):
    left = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    left.bind(sock)  # a watcher that died left it
    left.close()
    [r] = check_nvrx(_config(tmp_path, sock))
    assert r.status is Status.FAIL and "does not answer" in r.message


def test_a_socket_opened_wider_than_0660_warns(tmp_path, sock):
    server = nvhcd.serve(sock, lambda args, left: nvhcd.Answer(True, "fine"))
    try:
        os.chmod(sock, 0o666)
        [r] = check_nvrx(_config(tmp_path, sock))
    finally:
        server.stop()
    assert r.status is Status.WARN and "0666, not 0660" in r.message


def test_a_group_that_does_not_exist_fails(tmp_path, sock):
    [r] = check_nvrx(_config(tmp_path, sock, 'nvrx_group = "no-such-group-here"\n'))
    assert r.status is Status.FAIL and "no-such-group-here" in r.message


def test_without_grpcio_it_fails_and_names_the_extra(tmp_path, sock, monkeypatch):
    monkeypatch.setitem(sys.modules, "grpc", None)  # as where the nvrx extra is not installed
    [r] = check_nvrx(_config(tmp_path, sock))
    assert r.status is Status.FAIL and "grpcio is not installed" in r.message and "slurm-hooks[nvrx]" in r.fix
