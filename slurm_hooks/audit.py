"""Audit log: JSON lines, one record per alert and per action, flushed per record.

Several writers on one node (health check, prolog, epilog, watcher) append to
one file. Each record is written with a single ``write`` on an ``O_APPEND``
descriptor under ``flock``, then ``fsync``ed, so records never interleave and
a crash loses at most the record being written.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

_MODE = 0o640


class AuditLog:
    def __init__(self, path: str):
        self.path = path

    def write(self, kind: str, **fields: Any) -> dict[str, Any]:
        record = {"ts": round(time.time(), 6), "kind": kind, **fields}
        line = json.dumps(record, sort_keys=False, default=str, separators=(",", ":")) + "\n"
        try:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), mode=0o750, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, _MODE)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                size = os.fstat(fd).st_size
                if size and os.pread(fd, 1, size - 1) != b"\n":
                    line = "\n" + line  # a writer died mid-line: end its torn line, keep ours whole
                os.write(fd, line.encode())
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            # Losing the audit line must not stop a drain; say so on stderr instead.
            print(f"slurm-hooks: cannot write audit log {self.path}: {exc.strerror}", file=sys.stderr)
        return record

    def read(self) -> Iterator[dict[str, Any]]:
        try:
            fh = open(self.path, encoding="utf-8")
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
