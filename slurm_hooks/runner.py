"""The one way this project runs a subprocess: argv list, no shell, bounded time.

Output is decoded as UTF-8 with ``errors="replace"``: Slurm prints what users
wrote (a job name such as ``bad\\377name``) byte for byte, and one invalid byte
must not turn a listing of jobs into an exception. Nothing read back is ever
passed on as an argument by its bytes (jobs are addressed by the ids Slurm
prints, which are ASCII), so a lossy U+FFFD costs nothing, whereas
``surrogateescape`` would hand lone surrogates to every later ``.encode()``
(the audit log, a Kubernetes patch) and raise there instead.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import IO, TYPE_CHECKING, Callable

from slurm_hooks.errors import CommandError, CommandTimeout
from slurm_hooks.values import dataclass

if TYPE_CHECKING:
    import subprocess


@dataclass(frozen=True)
class Completed:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


#: Signature of an injectable runner (tests give adapters a real one or a recorder).
Runner = Callable[..., Completed]


def run_command(
    argv: Sequence[str],
    timeout: float,
    *,
    check: bool = True,
    env: Mapping[str, str] | None = None,
    input: str | None = None,
) -> Completed:
    """Run ``argv`` in a new session; on timeout kill its whole process group.

    Raises CommandTimeout on timeout, CommandError on a non-zero exit when
    ``check``, and CommandError (returncode None) when the program is missing.
    """
    import subprocess  # here: a healthy check or prolog runs no command, and subprocess costs ~3 ms

    argv = [str(a) for a in argv]
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            env=dict(env) if env is not None else None,
            text=True,
            encoding="utf-8",
            errors="replace",
        )
    except OSError as exc:
        raise CommandError(argv, None, "", exc.strerror or str(exc)) from None
    try:
        out, err = proc.communicate(input=input, timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        try:
            out, err = proc.communicate(timeout=1.0)
        except subprocess.TimeoutExpired:
            # A descendant that left the process group still holds the pipes: stop waiting for it.
            out, err = "", ""
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
            proc.wait(timeout=1.0)
        raise CommandTimeout(argv, None, out or "", err or "", timed_out=True) from None
    if check and proc.returncode != 0:
        raise CommandError(argv, proc.returncode, out, err)
    return Completed(tuple(argv), proc.returncode, out, err)


def _kill_group(proc: subprocess.Popen) -> None:
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


#: How :func:`python_argv` starts a module: ``-I`` keeps the current directory (slurmd's log dir, an
#: admin's /tmp) and PYTHONPATH off sys.path, so the package comes from where the caller loaded it.
_BOOT = ("import sys, importlib; sys.path.insert(0, sys.argv.pop(1)); "
         "sys.exit(importlib.import_module(sys.argv.pop(1)).main(sys.argv[1:]))")


def package_parent() -> str:
    """The directory this package was loaded from (what a helper puts first on sys.path)."""
    import slurm_hooks

    return os.path.dirname(os.path.dirname(os.path.abspath(slurm_hooks.__file__)))


def python_argv(module: str, *args: str, python: str | None = None) -> list[str]:
    """argv that runs ``module.main(args)`` with this interpreter and this copy of the package."""
    import sys

    return [python or sys.executable, "-I", "-c", _BOOT, package_parent(), module, *args]


#: Environment variable naming the pipe a helper started by :func:`spawn_detached` writes
#: one byte to once it is running (see :func:`signal_ready`).
READY_FD_ENV = "SLURM_HOOKS_READY_FD"


@dataclass
class Spawned:
    """A detached helper: ``proc`` while it runs, ``error`` (one line) when it did not start."""

    argv: tuple[str, ...]
    proc: subprocess.Popen | None
    error: str = ""

    @property
    def started(self) -> bool:
        return self.proc is not None and not self.error

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM the helper, wait up to ``timeout`` s, then kill its process group."""
        if self.proc is None or self.proc.poll() is not None:
            return
        import subprocess

        self.proc.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            _kill_group(self.proc)


def spawn_detached(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | None = "/",
    output: str | None = None,
    ready_timeout: float | None = None,
) -> Spawned:
    """Start ``argv`` in a new session so that it outlives the caller; never raises.

    ``output``: a file that gets the helper's stdout and stderr (appended, mode
    0600); without it they go to /dev/null. With ``ready_timeout`` the helper is
    handed a pipe (its fd number in ``$SLURM_HOOKS_READY_FD``) and must write one
    byte to it once it runs (:func:`signal_ready`); until then its stderr comes
    to us, so a helper that dies on the way (a missing interpreter, an import
    error) is reported with its last line of stderr instead of vanishing.
    """
    import subprocess

    argv = tuple(str(a) for a in argv)
    env = dict(env) if env is not None else dict(os.environ)
    out: IO[bytes] | int = subprocess.DEVNULL
    ready_r = ready_w = err_r = -1
    try:
        if output:
            out = open(os.open(output, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "ab")
        pass_fds: tuple[int, ...] = ()
        stderr: IO[bytes] | int = out
        if ready_timeout is not None:
            ready_r, ready_w = os.pipe()
            env[READY_FD_ENV] = str(ready_w)
            pass_fds = (ready_w,)
            if not output:
                err_r, err_w = os.pipe()
                stderr = err_w
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=stderr, env=env, cwd=cwd,
                                    start_new_session=True, close_fds=True, pass_fds=pass_fds)
        finally:
            for fd in (ready_w, stderr):
                if isinstance(fd, int) and fd > 2:
                    os.close(fd)
    except OSError as exc:
        for fd in (ready_r, err_r):
            if fd >= 0:
                os.close(fd)
        return Spawned(argv, None, f"{argv[0]}: cannot start: {exc.strerror or exc}")
    finally:
        if not isinstance(out, int):
            out.close()
    if ready_timeout is None:
        return Spawned(argv, proc)
    return _await_ready(argv, proc, ready_r, err_r, ready_timeout)


def _await_ready(argv: tuple[str, ...], proc: subprocess.Popen, ready_r: int, err_r: int, timeout: float) -> Spawned:
    """Wait for the ready byte; on EOF or timeout, say why with the helper's last stderr line."""
    import select
    import subprocess

    deadline = time.monotonic() + timeout
    stderr = b""
    ready = False
    open_fds = [fd for fd in (ready_r, err_r) if fd >= 0]
    try:
        while ready_r in open_fds and not ready:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            readable, _, _ = select.select(open_fds, [], [], left)
            for fd in readable:
                chunk = os.read(fd, 4096)
                if not chunk:
                    open_fds.remove(fd)
                elif fd == ready_r:
                    ready = True
                else:
                    stderr = (stderr + chunk)[-4096:]
    finally:
        for fd in (ready_r, err_r):
            if fd >= 0:
                os.close(fd)
    if ready:
        return Spawned(argv, proc)
    try:
        how = f"exited {proc.wait(timeout=0.2)}"
    except subprocess.TimeoutExpired:
        how = f"not ready after {timeout:g}s"
        _kill_group(proc)  # a helper that cannot say it runs is not trusted to act
    lines = stderr.decode("utf-8", "replace").strip().splitlines()
    detail = f": {lines[-1]}" if lines else ""
    return Spawned(argv, proc, f"{os.path.basename(argv[0])} {how}{detail}")


def signal_ready() -> bool:
    """In a helper started by :func:`spawn_detached`: say it runs, and let go of the caller's pipes.

    Writes the ready byte (when asked for one) and points stdout and stderr at
    /dev/null, so that nothing the helper prints later can fail on a closed pipe.
    """
    fd_text = os.environ.pop(READY_FD_ENV, "")
    if not fd_text.isdigit():
        return False
    fd = int(fd_text)
    try:
        os.write(fd, b"1")
        os.close(fd)
    except OSError:
        return False
    null = os.open(os.devnull, os.O_WRONLY)
    for target in (1, 2):
        os.dup2(null, target)
    os.close(null)
    return True
