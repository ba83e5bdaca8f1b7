"""Audit log: JSON lines, one record per alert and per action, flushed per record.

Several writers on one node (health check, prolog, epilog, watcher) append to
one file. Each record is written with a single ``write`` on an ``O_APPEND``
descriptor under ``flock`` (held for the append only), then ``fsync``ed, so records never interleave and
a crash loses at most the record being written.

The action comes first: a record never blocks it. The lock is waited for at most
``LOCK_WAIT_S`` and the whole append (open, lock, write, fsync) at most
``WRITE_BOUND_S``, in a daemon thread; a record that could not be written in time
goes to stderr (slurmd's log) as one line instead.

**Repeats** (:func:`repeatable`): an alert, or a step that changed nothing (``already``,
``skipped``), written again for a node with nothing new in between is not a new line: it is
counted in ``<log>.repeats.json`` (under the same lock) and written as one ``repeat`` record
(count, first and last seen) when the node's next change is written, or every
``REPEAT_SUMMARY_S`` while it lasts (then followed by the record itself again). A node waiting two weeks for an RMA writes a few dozen
lines, not thousands; :meth:`AuditLog.history` also yields the counts not yet written.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
import threading
import time
from collections.abc import Iterator

from slurm_hooks import fsutil
from slurm_hooks.values import compile_later

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing (~3 ms of each start)
if TYPE_CHECKING:
    import queue
    from typing import Any

_MODE = 0o640
#: How long a writer waits for another one's lock (records take microseconds to write).
LOCK_WAIT_S = 0.5
#: How long an append may take before the caller goes on without it (a hung log filesystem).
WRITE_BOUND_S = 1.0
_LOCK_RETRY_S = 0.005
#: A repeat still going on is written as a ``repeat`` record at least this often.
REPEAT_SUMMARY_S = 6 * 3600.0
#: A repeat not seen for this long is forgotten: the next one is a new line.
REPEAT_FORGET_S = 3600.0
#: Action results that change nothing: written again, they are repeats.
_NO_CHANGE = frozenset({"already", "skipped", "spared", "monitor-only", "guarded", "not requeued"})
#: Fields that differ between two repeats of one record.
_VOLATILE = frozenset({"ts", "duration_s", "seconds_from_fault"})
_ROTATED = compile_later(r"\.(\d+)(?:\.gz)?$")


def repeatable(record: dict[str, Any]) -> bool:
    """A record that says again what an earlier one said: an alert, Slurm's view, a step that changed nothing."""
    if not record.get("node"):
        return False
    kind = record.get("kind")
    return kind in ("alert", "slurm-view") or (kind == "action" and record.get("result") in _NO_CHANGE)


def signature(record: dict[str, Any]) -> str:
    import hashlib  # only for a record that may repeat: not on a healthy run's path

    same = {k: v for k, v in record.items() if k not in _VOLATILE}
    return hashlib.sha1(json.dumps(same, sort_keys=True, default=str).encode()).hexdigest()[:16]


class AuditLog:
    def __init__(self, path: str):
        self.path = path
        self._requests: queue.SimpleQueue | None = None  # made with the writer (queue: ~1 ms, not on a quiet run)
        self._writer: tuple[int, threading.Thread] | None = None
        self._unfinished: threading.Event | None = None

    def write(self, kind: str, **fields: Any) -> dict[str, Any]:
        record = {"ts": round(time.time(), 6), "kind": kind, **fields}
        line = json.dumps(record, sort_keys=False, default=str, separators=(",", ":")) + "\n"
        if self._unfinished is not None and not self._unfinished.is_set():
            _say(f"cannot write audit log {self.path}: an earlier write still hangs; not logged: {line.strip()}")
            return record
        done, problem = threading.Event(), []
        requests = self._start_writer()
        requests.put((record, line, done, problem))
        if not done.wait(WRITE_BOUND_S):
            self._unfinished = done
            _say(f"cannot write audit log {self.path}: no answer within {WRITE_BOUND_S:g}s (hung filesystem?); "
                 f"not logged: {line.strip()}")
        elif problem:
            _say(f"cannot write audit log {self.path}: {problem[0]}; not logged: {line.strip()}")
        return record

    def _start_writer(self) -> queue.SimpleQueue:
        """One writer thread per log and process (a forked child has none), started on first use; its queue."""
        if (self._requests is not None and self._writer is not None and self._writer[0] == os.getpid()
                and self._writer[1].is_alive()):
            return self._requests
        import queue

        self._requests = queue.SimpleQueue()
        worker = threading.Thread(target=self._serve, args=(self._requests,), name="audit-writer", daemon=True)
        worker.start()
        self._writer = (os.getpid(), worker)
        return self._requests

    def _serve(self, requests: queue.SimpleQueue) -> None:
        while True:
            record, line, done, problem = requests.get()
            try:
                self._append(record, line, problem)
            finally:
                done.set()

    def _append(self, record: dict[str, Any], line: str, problem: list[str]) -> None:
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
                    line = self._fold(record, line)
                    if line:
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

    # -- repeats ------------------------------------------------------------------

    @property
    def repeats_path(self) -> str:
        return self.path + ".repeats.json"

    def _fold(self, record: dict[str, Any], line: str) -> str:
        """What to append for ``record`` (under the lock): "" for a repeat (counted instead), else its
        line, after the ``repeat`` records of its node that it ends (a change) or that are due."""
        node = record.get("node")
        if not node:
            return line
        seen = self._load_repeats()
        mine = seen.get(str(node), {})
        ts = float(record["ts"])
        out: list[dict[str, Any]] = []
        if repeatable(record):
            sig = signature(record)
            for key, entry in list(mine.items()):
                if ts - float(entry.get("last", 0)) > REPEAT_FORGET_S:
                    out.extend(_summary(node, entry))
                    del mine[key]
            entry = mine.get(sig)
            if entry is None:
                mine[sig] = {"of": {k: v for k, v in record.items() if k not in _VOLATILE}, "count": 0,
                             "first": ts, "last": ts, "since": ts}
                line_out: str | None = line
            elif ts - float(entry.get("since", ts)) >= REPEAT_SUMMARY_S:
                # Summed up, and the record itself again: a reader that knows only its kind (a daily
                # monitor-only message) still sees it while it lasts.
                out.extend(_summary(node, entry))
                entry.update(count=0, since=ts, first=ts, last=ts)
                line_out = line
            else:
                entry["count"] = int(entry.get("count", 0)) + 1
                entry["last"] = ts
                line_out = None
        else:
            for entry in mine.values():
                out.extend(_summary(node, entry))
            mine = {}
            line_out = line
        if mine:
            seen[str(node)] = mine
        else:
            seen.pop(str(node), None)
        self._save_repeats(seen)
        text = "".join(json.dumps(r, default=str, separators=(",", ":")) + "\n" for r in out)
        return text + (line_out or "")

    def _load_repeats(self) -> dict[str, dict[str, dict[str, Any]]]:
        data = fsutil.read_json(self.repeats_path, missing={}, error={})
        return data if isinstance(data, dict) else {}

    def _save_repeats(self, seen: dict[str, Any]) -> None:
        if not seen and not os.path.exists(self.repeats_path):
            return
        tmp = f"{self.repeats_path}.{os.getpid()}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, _MODE)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(seen, fh, separators=(",", ":"), default=str)
            os.replace(tmp, self.repeats_path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)

    # -- reading --------------------------------------------------------------------

    def read(self) -> Iterator[dict[str, Any]]:
        """The records of the live file, as written."""
        yield from read_file(self.path)

    def history(self) -> Iterator[dict[str, Any]]:
        """Every record kept: the rotated files (``<log>.2.gz``, ``<log>.1``, oldest first), the live
        file, then the repeats counted and not yet written (``repeat`` records)."""
        for path in rotated(self.path):
            yield from read_file(path)
        yield from self.read()
        yield from self.counted()

    def counted(self) -> Iterator[dict[str, Any]]:
        """The repeats counted and not yet written, as ``repeat`` records."""
        for node, mine in sorted(self._load_repeats().items()):
            for entry in mine.values():
                yield from _summary(node, entry)


def rotated(path: str) -> list[str]:
    """``<path>.N`` and ``<path>.N.gz`` (logrotate's names), oldest (highest N) first."""
    import glob

    found = []
    for p in glob.glob(glob.escape(path) + ".*"):
        m = _ROTATED.search(p[len(path):])
        if m and m.start() == 0:
            found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found, reverse=True)]


def read_file(path: str) -> Iterator[dict[str, Any]]:
    import gzip

    try:
        fh = gzip.open(path, "rt", encoding="utf-8", errors="replace") if path.endswith(".gz") else \
            open(path, encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return
    with fh:
        try:
            for line in fh:
                line = line.strip()
                if not line:
                    continue
                try:
                    yield json.loads(line)
                except ValueError:
                    continue  # a torn last line after a crash: skip it, keep the rest
        except (OSError, EOFError):
            return  # a truncated .gz: what was read stands


def _summary(node: str, entry: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``repeat`` record for a count (none for a count of 0)."""
    count = int(entry.get("count", 0))
    if count <= 0:
        return []
    last = float(entry.get("last", 0))
    return [{"ts": last, "kind": "repeat", "node": node, "count": count, "first_ts": float(entry.get("first", last)),
             "last_ts": last, "of": entry.get("of") or {}}]


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
