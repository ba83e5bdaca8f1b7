"""Audit log: JSON lines, one record per alert and per action, flushed per record.

Several writers on one node (health check, prolog, epilog, watcher) append to
one file. Each record is written with a single ``write`` on an ``O_APPEND``
descriptor under ``flock`` (held for the append only), then ``fsync``ed, so records never interleave and
a crash loses at most the record being written.

The action comes first: a record never blocks it. The lock is waited for at most
``LOCK_WAIT_S`` and the whole append (open, lock, write, fsync) at most
``WRITE_BOUND_S``, in a daemon thread; a record that could not be written in time
goes to stderr (slurmd's log) as one line instead.
"""

from __future__ import annotations

import fcntl
import json
import os
import queue
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

_MODE = 0o640
#: How long a writer waits for another one's lock (records take microseconds to write).
LOCK_WAIT_S = 0.5
#: How long an append may take before the caller goes on without it (a hung log filesystem).
WRITE_BOUND_S = 1.0
_LOCK_RETRY_S = 0.005


class AuditLog:
    def __init__(self, path: str):
        self.path = path
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._writer: tuple[int, threading.Thread] | None = None
        self._unfinished: threading.Event | None = None

    def write(self, kind: str, **fields: Any) -> dict[str, Any]:
        record = {"ts": round(time.time(), 6), "kind": kind, **fields}
        line = json.dumps(record, sort_keys=False, default=str, separators=(",", ":")) + "\n"
        if self._unfinished is not None and not self._unfinished.is_set():
            _say(f"cannot write audit log {self.path}: an earlier write still hangs; not logged: {line.strip()}")
            return record
        done, problem = threading.Event(), []
        self._start_writer()
        self._requests.put((line, done, problem))
        if not done.wait(WRITE_BOUND_S):
            self._unfinished = done
            _say(f"cannot write audit log {self.path}: no answer within {WRITE_BOUND_S:g}s (hung filesystem?); "
                 f"not logged: {line.strip()}")
        elif problem:
            _say(f"cannot write audit log {self.path}: {problem[0]}; not logged: {line.strip()}")
        return record

    def _start_writer(self) -> None:
        """One writer thread per log and process (a forked child has none), started on first use."""
        if self._writer is not None and self._writer[0] == os.getpid() and self._writer[1].is_alive():
            return
        self._requests = queue.SimpleQueue()
        worker = threading.Thread(target=self._serve, args=(self._requests,), name="audit-writer", daemon=True)
        worker.start()
        self._writer = (os.getpid(), worker)

    def _serve(self, requests: queue.SimpleQueue) -> None:
        while True:
            line, done, problem = requests.get()
            try:
                self._append(line, problem)
            finally:
                done.set()

    def _append(self, line: str, problem: list[str]) -> None:
        try:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), mode=0o750, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, _MODE)
            try:
                if not _lock(fd, LOCK_WAIT_S):
                    problem.append(f"locked by another process for over {LOCK_WAIT_S:g}s")
                    return
                try:
                    size = os.fstat(fd).st_size
                    if size and os.pread(fd, 1, size - 1) != b"\n":
                        line = "\n" + line  # a writer died mid-line: end its torn line, keep ours whole
                    os.write(fd, line.encode())
                finally:
                    # The lock guards the torn-line check and the append only: an fsync under it made
                    # every other writer wait for this one's disk (8 writers on a loaded disk ran past
                    # LOCK_WAIT_S and lost records). O_APPEND keeps the line whole without it.
                    fcntl.flock(fd, fcntl.LOCK_UN)
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            problem.append(str(exc.strerror or exc))

    def read(self) -> Iterator[dict[str, Any]]:
        try:
            fh = open(self.path, encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return
        with fh:
            for line in fh:
                line = line.strip()
                if not line:
                    continue
                try:
                    yield json.loads(line)
                except ValueError:
                    continue  # a torn last line after a crash: skip it, keep the rest


def _lock(fd: int, wait_s: float) -> bool:
    """``flock`` without blocking, retried for up to ``wait_s``."""
    give_up = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= give_up:
                return False
            time.sleep(_LOCK_RETRY_S)


def _say(message: str) -> None:
    """Losing the audit line must not stop a drain; say so on stderr instead."""
    print(f"slurm-hooks: {message}", file=sys.stderr, flush=True)
