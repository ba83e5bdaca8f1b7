"""The one way this project runs a subprocess: argv list, no shell, bounded time."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Callable

from slurm_hooks.errors import CommandError, CommandTimeout


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
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
