"""The smallest training harness that survives a requeue: checkpoints and SIGTERM.

When slurm-hooks finds a bad GPU under a running job it requeues the job:
Slurm sends SIGTERM, waits ``KillWait`` seconds, then SIGKILL, and starts the
job again elsewhere with ``SLURM_JOB_RESTART_COUNT`` raised by one. A job
survives that if it (1) saves a checkpoint when SIGTERM arrives and (2) resumes
from the newest checkpoint on start. ``examples/train.py`` shows both.

Exit code after a SIGTERM save: :data:`EXIT_REQUEUE` (75, EX_TEMPFAIL, "try
again later"). With ``scontrol requeue`` (what slurm-hooks does) Slurm requeues
whatever the exit code. Non-zero keeps accounting honest (an interrupted run
is not COMPLETED), and a code of its own tells "checkpoint saved" apart from 143
(killed by SIGTERM before saving). Put ``RequeueExit=75`` in slurm.conf to have
Slurm requeue on it by itself, e.g. after ``scancel --signal=TERM``.

Checkpoints are JSON (the state must be JSON-serialisable), written to a
temp file, fsynced, renamed over, and the directory fsynced: a node that dies
mid-save leaves the previous checkpoint intact. Runs on Python 3.9.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
from typing import Any

from slurm_hooks import fsutil

EXIT_REQUEUE = 75

_NAME = re.compile(r"^ckpt-(\d{10})\.json$")


class Checkpointer:
    def __init__(self, directory: str, keep: int = 3):
        if keep < 1:
            raise ValueError("keep must be at least 1")
        self.directory = directory
        self.keep = keep

    def _path(self, step: int) -> str:
        return os.path.join(self.directory, f"ckpt-{step:010d}.json")

    def steps(self) -> list[int]:
        """Saved steps, oldest first."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        return sorted(int(m.group(1)) for m in map(_NAME.match, names) if m)

    def load_latest(self) -> tuple[int, Any] | None:
        """(step, state) of the newest readable checkpoint, or None when there is none.

        A checkpoint that does not parse (a disk that lied about fsync) is skipped
        in favour of the one before it.
        """
        for step in reversed(self.steps()):
            data = fsutil.read_json(self._path(step), missing=None, error=None)
            try:
                return int(data["step"]), data["state"]
            except (ValueError, KeyError, TypeError):
                continue
        return None

    def save(self, step: int, state: Any) -> str:
        """Write the checkpoint for ``step`` atomically; keep the newest ``keep``."""
        if step < 0:
            raise ValueError("step must not be negative")
        os.makedirs(self.directory, exist_ok=True)
        payload = json.dumps({"step": step, "state": state, "saved_at": time.time()}).encode()
        path = self._path(step)
        fsutil.atomic_write(path, payload, mode=0o600)  # 0o600: what tempfile.mkstemp made before
        _fsync_dir(self.directory)
        for old in self.steps()[: -self.keep]:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path(old))
        return path


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class StopRequest:
    """Set by the signal handler; the training loop polls it between steps."""

    def __init__(self) -> None:
        self.signum: int | None = None

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def __bool__(self) -> bool:
        return self.requested


def install_sigterm_handler(signals: tuple[int, ...] = (signal.SIGTERM,)) -> StopRequest:
    """Turn SIGTERM (and any other ``signals``, e.g. SIGUSR1 from ``--signal``) into a flag.

    The handler only records the signal: the loop finishes its step, saves a
    checkpoint and exits with :data:`EXIT_REQUEUE`. Saving inside the handler
    could interrupt a save already in progress.
    """
    stop = StopRequest()

    def handler(signum: int, frame: Any) -> None:
        stop.signum = signum

    for signum in signals:
        signal.signal(signum, handler)
    return stop


def restart_count(environ: dict[str, str] | None = None) -> int:
    """How many times Slurm has requeued this job (0 outside Slurm).

    A batch job sees SLURM_RESTART_COUNT (set once the job has been restarted);
    prolog and epilog see SLURM_JOB_RESTART_COUNT. Accept either.
    """
    env = environ if environ is not None else os.environ
    value = env.get("SLURM_RESTART_COUNT") or env.get("SLURM_JOB_RESTART_COUNT") or "0"
    try:
        return int(value)
    except ValueError:
        return 0
