"""Slurm accounting for the testbed: a private MariaDB and a slurmdbd, so the fleet report
is tested against real accounting data.

Everything lives under ``<testbed>/accounting`` (data, socket, logs, pid files) and
on ports of its own; nothing touches a system MariaDB or slurmdbd. slurmdbd has no
``-f``: it reads ``slurmdbd.conf`` beside ``SLURM_CONF`` (mode 0600). The daemons run
as root, so the testbed may live under a private temporary directory.

The testbed calls :func:`start` after munged is up (slurmdbd authenticates with it),
then restarts slurmctld so that it registers with the cluster just added, and
:func:`stop` first thing in ``down``. :func:`slurm_conf_lines` are the lines its
``slurm.conf`` gains.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
from collections.abc import Callable, Mapping

from slurm_hooks import fsutil
from slurm_hooks.errors import CommandError, SlurmHooksError
from slurm_hooks.lab import packages
from slurm_hooks.lab.waiting import poll
from slurm_hooks.runner import run_command, spawn_detached

PACKAGES = ("mariadb-server", "slurmdbd")
PROGRAMS = {"/usr/sbin/mariadbd": "mariadb-server", "/usr/bin/mariadb-install-db": "mariadb-server",
            "/usr/bin/mariadb": "mariadb-server", "/usr/sbin/slurmdbd": "slurmdbd", "/usr/bin/sacctmgr": "slurm-client",
            "/usr/bin/sacct": "slurm-client"}
DATABASE = "slurm_acct_db"
#: Ports for MariaDB and slurmdbd are picked from here, away from the testbed's own block and 3306/6819.
PORT_FIRST, PORT_LAST = 33000, 33999

Progress = Callable[[str], None]


class AccountingError(SlurmHooksError):
    """The testbed's accounting could not be installed, started or stopped."""


class Accounting:
    """The accounting daemons of the testbed rooted at ``state_dir``."""

    def __init__(self, state_dir: str, progress: Progress | None = None):
        self.state_dir = os.path.abspath(state_dir)
        self.dir = os.path.join(self.state_dir, "accounting")
        self.progress = progress or (lambda msg: None)

    def path(self, *parts: str) -> str:
        return os.path.join(self.dir, *parts)

    @property
    def socket(self) -> str:
        return self.path("mysqld.sock")

    def ports(self) -> dict[str, int]:
        """``{"db": ..., "dbd": ...}``: saved on first use, so slurm.conf and the daemons agree."""
        saved = self.path("ports.json")
        kept = fsutil.read_json(saved, missing=None, error=None)
        if kept is not None:
            with contextlib.suppress(ValueError):
                return {k: int(v) for k, v in kept.items()}
        free = [p for p in range(PORT_FIRST + secrets.randbelow(400) * 2, PORT_LAST) if port_free(p)][:2]
        if len(free) < 2:
            raise AccountingError(f"no two free ports in {PORT_FIRST}..{PORT_LAST}")
        ports = {"db": free[0], "dbd": free[1]}
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        fsutil.atomic_write(saved, json.dumps(ports), mode=0o600)
        return ports

    def slurm_conf_lines(self, munge_socket: str) -> list[str]:
        """For slurm.conf. AccountingStoragePass names the munge socket clients use to reach slurmdbd
        (AuthInfo covers only slurmctld and slurmd)."""
        return ["AccountingStorageType=accounting_storage/slurmdbd", "AccountingStorageHost=localhost",
                f"AccountingStoragePass={munge_socket}",
                f"AccountingStoragePort={self.ports()['dbd']}"]

    # -- up

    def start(self, cluster: str, munge_socket: str, env: Mapping[str, str]) -> None:
        """Install what is missing, start MariaDB and slurmdbd, add ``cluster``. Idempotent."""
        ensure_packages(self.progress)
        for sub in ("", "data", "log", "run"):
            os.makedirs(self.path(sub), mode=0o700, exist_ok=True)
        ports = self.ports()
        if not self._alive("mariadbd"):
            self._start_mariadb(ports["db"])
        password = self._password()
        self._sql(f"CREATE DATABASE IF NOT EXISTS {DATABASE}; "
                  f"CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '{password}'; "
                  f"CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '{password}'; "
                  f"GRANT ALL ON {DATABASE}.* TO 'slurm'@'localhost'; GRANT ALL ON {DATABASE}.* TO 'slurm'@'127.0.0.1';")
        conf = os.path.join(self.state_dir, "slurmdbd.conf")
        fsutil.atomic_write(conf, "\n".join([
            "# slurm-hooks testbed accounting. Rendered by slurm-hooks; edits are overwritten.",
            "AuthType=auth/munge", f"AuthInfo=socket={munge_socket}",
            "DbdHost=localhost", f"DbdPort={ports['dbd']}", "SlurmUser=root",
            f"LogFile={self.path('log', 'slurmdbd.log')}", f"PidFile={self.path('run', 'slurmdbd.pid')}",
            "StorageType=accounting_storage/mysql", "StorageHost=127.0.0.1", f"StoragePort={ports['db']}",
            "StorageUser=slurm", f"StoragePass={password}", f"StorageLoc={DATABASE}", "DebugLevel=info", ""]),
            mode=0o600)
        os.chown(conf, 0, 0)
        if not self._alive("slurmdbd"):
            self.progress("starting slurmdbd")
            try:
                run_command(["/usr/sbin/slurmdbd"], 30, env=env)
            except CommandError as exc:
                raise AccountingError(f"slurmdbd did not start: {exc}{self._tail('slurmdbd')}") from None
        self._wait(lambda: self._answers(env), 30, "slurmdbd does not answer sacctmgr")
        out = run_command(["/usr/bin/sacctmgr", "-n", "-P", "show", "cluster", "format=Cluster"], 15, env=env).stdout
        if cluster not in out.split():
            run_command(["/usr/bin/sacctmgr", "-i", "add", "cluster", cluster], 15, env=env)

    def _start_mariadb(self, port: int) -> None:
        data = self.path("data")
        if not os.path.isdir(os.path.join(data, "mysql")):
            self.progress("initialising MariaDB")
            try:
                run_command(["/usr/bin/mariadb-install-db", "--user=root", f"--datadir={data}",
                             "--auth-root-authentication-method=socket", "--skip-test-db"], 300)
            except CommandError as exc:
                raise AccountingError(f"mariadb-install-db failed: {exc}") from None
        self.progress("starting MariaDB")
        # A daemon that does not fork by itself: started detached, stopped by its pid file.
        argv = ["/usr/sbin/mariadbd", "--no-defaults", "--user=root", f"--datadir={data}", f"--socket={self.socket}",
                f"--port={port}", "--bind-address=127.0.0.1", f"--pid-file={self.path('run', 'mariadbd.pid')}",
                f"--log-error={self.path('log', 'mariadbd.log')}", "--skip-name-resolve",
                "--innodb-buffer-pool-size=64M"]
        spawned = spawn_detached(argv, env={"PATH": "/usr/sbin:/usr/bin:/bin"}, cwd="/")
        if not spawned.started:
            raise AccountingError(f"mariadbd did not start: {spawned.error}")
        self._wait(lambda: os.path.exists(self.socket) and self._sql_ok(), 60,
                   f"MariaDB not answering on {self.socket}{self._tail('mariadbd')}")

    def _password(self) -> str:
        path = self.path("password")
        try:
            with open(path, encoding="ascii") as fh:
                return fh.read().strip()
        except OSError:
            value = secrets.token_hex(16)
            fsutil.atomic_write(path, value, mode=0o600)
            return value

    def _sql(self, statement: str) -> str:
        try:
            return run_command(["/usr/bin/mariadb", "--no-defaults", f"--socket={self.socket}", "-uroot", "-N",
                                "-e", statement], 30).stdout
        except CommandError as exc:
            raise AccountingError(f"MariaDB: {exc}") from None

    def _sql_ok(self) -> bool:
        try:
            self._sql("SELECT 1")
            return True
        except AccountingError:
            return False

    def wait_registered(self, cluster: str, env: Mapping[str, str], timeout: float = 30.0) -> None:
        """Until slurmctld has registered with slurmdbd (the cluster row has its control port).

        The report reads the cluster from slurmdbd, so ``up`` is not done before this. (A drain right
        after ``up`` that never reached ``sacctmgr show event`` was not this but the cold-start event
        of the same second: see ``Testbed.up``.)"""
        def registered() -> bool:
            try:
                out = run_command(["/usr/bin/sacctmgr", "-n", "-P", "show", "cluster", cluster, "format=ControlPort"],
                                  10, env=env).stdout
            except CommandError:
                return False
            return any(line.strip() not in ("", "0") for line in out.splitlines())

        self._wait(registered, timeout, f"slurmctld has not registered with slurmdbd (cluster {cluster})")

    def _answers(self, env: Mapping[str, str]) -> bool:
        try:
            run_command(["/usr/bin/sacctmgr", "-n", "show", "cluster"], 10, env=env)
            return True
        except CommandError:
            return False

    # -- down

    def stop(self, timeout: float = 30.0) -> list[int]:
        """slurmdbd, then MariaDB (SIGTERM: a clean shutdown), each only if its pid file names it."""
        stopped = []
        for label in ("slurmdbd", "mariadbd"):
            pid = self._pid(label)
            if pid is None:
                continue
            self.progress(f"stopping {label}")
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            if not poll(lambda p=pid, lbl=label: self._pid(lbl) != p, timeout):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            stopped.append(pid)
        return stopped

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- helpers

    def _pid(self, label: str) -> int | None:
        try:
            with open(self.path("run", f"{label}.pid"), encoding="ascii") as fh:
                pid = int(fh.read().split()[0])
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmdline = fh.read().split(b"\0")
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
        except (OSError, ValueError, IndexError):
            return None
        if state == "Z" or os.path.basename(cmdline[0].decode(errors="replace")) != label:
            return None
        if label == "mariadbd" and not any(self.dir.encode() in arg for arg in cmdline):
            return None
        return pid

    def _alive(self, label: str) -> bool:
        return self._pid(label) is not None

    def _tail(self, label: str, lines: int = 10) -> str:
        try:
            with open(self.path("log", f"{label}.log"), encoding="utf-8", errors="replace") as fh:
                return "\n--- " + label + " log:\n" + "\n".join(fh.read().splitlines()[-lines:])
        except OSError:
            return ""

    def _wait(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        if not poll(predicate, timeout, 0.2):
            raise AccountingError(f"{what} after {timeout:g}s")


def missing_programs() -> list[str]:
    return packages.missing(PROGRAMS)


def ensure_packages(progress: Progress | None = None) -> None:
    """apt-get install MariaDB and slurmdbd when a program is missing (root only)."""
    packages.ensure(PROGRAMS, PACKAGES, AccountingError, progress)


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a TCP socket can bind ``port`` on ``host`` now (the testbed's daemons ask for any address).

    With SO_REUSEADDR, as slurmctld, slurmd and MariaDB bind: a port whose last connections linger
    in TIME_WAIT is free to them, so a restarted cluster keeps its ports (a client that read
    slurm.conf once, libslurm in a process using pyslurm, keeps reaching it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True
