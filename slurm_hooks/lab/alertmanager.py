"""A private Prometheus Alertmanager for the lab: the fleet's notification path, rehearsed.

Debian's ``prometheus-alertmanager`` (installed with apt-get when missing, like the Slurm
packages), started on a free port of 127.0.0.1 with its own storage and clustering off
(``--cluster.listen-address=``), so it touches no system Alertmanager. Its configuration is
``slurm-hooks render alertmanager``'s route; tests point its receiver at a local webhook.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
import urllib.error
import urllib.request

from slurm_hooks import fsutil
from slurm_hooks.errors import SlurmHooksError
from slurm_hooks.lab import packages
from slurm_hooks.runner import Spawned, spawn_detached

BINARY = "/usr/bin/prometheus-alertmanager"
AMTOOL = "/usr/bin/amtool"
PACKAGES = ("prometheus-alertmanager",)


class AlertmanagerError(SlurmHooksError):
    """Alertmanager could not be installed or started."""


def ensure_installed() -> None:
    packages.ensure([BINARY, AMTOOL], PACKAGES, AlertmanagerError)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LabAlertmanager:
    """One Alertmanager under ``workdir``; :meth:`stop` and :meth:`start` again keep its port
    (what the nodes were told) and its storage (the alerts it holds)."""

    def __init__(self, workdir: str, config_text: str):
        self.dir = os.path.abspath(workdir)
        self.config_text = config_text
        self.port = _free_port()
        self.proc: Spawned | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
        ensure_installed()
        os.makedirs(os.path.join(self.dir, "data"), mode=0o700, exist_ok=True)
        conf = os.path.join(self.dir, "alertmanager.yml")
        fsutil.atomic_write(conf, self.config_text, mode=0o600)
        argv = [BINARY, f"--config.file={conf}", f"--storage.path={os.path.join(self.dir, 'data')}",
                f"--web.listen-address=127.0.0.1:{self.port}", "--cluster.listen-address=", "--log.level=info"]
        self.proc = spawn_detached(argv, output=os.path.join(self.dir, "alertmanager.log"), cwd=self.dir)
        if not self.proc.started:
            raise AlertmanagerError(f"alertmanager did not start: {self.proc.error}")
        deadline = time.monotonic() + timeout
        while not self.ready():
            if time.monotonic() > deadline or (self.proc.proc is not None and self.proc.proc.poll() is not None):
                raise AlertmanagerError(f"alertmanager not ready on {self.url} after {timeout:g}s: {self.log_tail()}")
            time.sleep(0.1)

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:  # noqa: S310 - our own 127.0.0.1
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def pause(self) -> None:
        """Unreachable but alive (SIGSTOP): a request connects and gets no answer, as across a network
        fault; the alerts it holds stay (Alertmanager keeps alerts in memory only)."""
        if self.proc is not None and self.proc.proc is not None:
            os.kill(self.proc.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc is not None and self.proc.proc is not None:
            os.kill(self.proc.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        self.resume()
        if self.proc is not None:
            self.proc.stop()
            self.proc = None

    def log_tail(self, lines: int = 5) -> str:
        with contextlib.suppress(OSError), open(os.path.join(self.dir, "alertmanager.log"), encoding="utf-8") as fh:
            return " | ".join(fh.read().splitlines()[-lines:])
        return ""
