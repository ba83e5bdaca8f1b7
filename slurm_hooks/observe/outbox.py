"""The notifier's outbox: one 0600 file per (message, receiver), bounded in count and age.

Crash safety, in order: a message is a file before the log cursor moves past its records; a
delivered one is noted in the ledger before its file goes. Bounds, so that a receiver down for a
month costs neither disk nor a flood on its return: at most ``max_queued`` per receiver and none
older than ``max_age`` (the oldest go, counted per receiver and said in its next message); only
the latest reminder (or Alertmanager re-post) of an incident waits; ``failed/`` keeps the last
:data:`FAILED_KEEP`. A file that cannot be read is moved to ``bad/`` (and reported once), so it
neither blocks the others nor keeps the notifier busy for ever.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

from slurm_hooks import fsutil
from slurm_hooks.observe.destinations import COALESCED, RESOLVED
from slurm_hooks.values import dataclass, field

#: Delivered message ids remembered (far more than a flood of incidents produces between restarts).
LEDGER_SIZE = 5000
#: The longest message id kept whole in a file name (with ``--<receiver>.json`` and atomic_write's
#: temporary ``.<name>.<pid>.<n>.tmp`` it stays within a file system's 255 bytes).
NAME_MAX = 160
#: Refused messages kept in ``failed/`` for a look (``notify status``); older ones are removed.
FAILED_KEEP = 200


@dataclass
class Entry:
    """One message waiting for one receiver."""

    id: str
    dest: str
    kind: str
    message: dict[str, Any]
    created: float
    #: The incident it is about ("" for none): reminders coalesce per incident, delivery keeps its order.
    incident: str = ""
    attempts: int = 0
    next_at: float = 0.0
    last_error: str = ""
    #: Its place among the messages made in the same pass (same ``created``): an incident's
    #: messages go in the order they were made, not in their file names' (``escalated-reset``
    #: would follow ``escalated-reboot``).
    seq: int = 0
    path: str = field(default="", compare=False)

    @property
    def order(self) -> tuple[float, int, str]:
        return (self.created, self.seq, self.path)

    @property
    def key(self) -> str:
        return f"{self.id}@{self.dest}"

    def to_json(self) -> str:
        # Not dataclasses.asdict: its deep copy of the message was a fifth of a notifier's pass in an outage.
        return json.dumps({"id": self.id, "dest": self.dest, "kind": self.kind, "message": self.message,
                           "created": self.created, "incident": self.incident, "attempts": self.attempts,
                           "next_at": self.next_at, "last_error": self.last_error, "seq": self.seq})

    @classmethod
    def load(cls, path: str) -> Entry:
        """The entry in ``path``; ``ValueError`` when it is not one (truncated, edited, another version)."""
        data = fsutil.read_json(path, missing=FileNotFoundError, error=ValueError)
        if not isinstance(data, dict) or not isinstance(data.get("message"), dict):
            raise ValueError("not an outbox entry")
        try:
            return cls(id=str(data["id"]), dest=str(data["dest"]), kind=str(data["kind"]), message=data["message"],
                       created=float(data["created"]), incident=str(data.get("incident") or ""),
                       attempts=int(data.get("attempts", 0)), next_at=float(data.get("next_at", 0.0)),
                       last_error=str(data.get("last_error") or ""), seq=int(data.get("seq", 0)), path=path)
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not an outbox entry ({type(exc).__name__}: {exc})") from None


def _read_json(path: str, default: Any) -> Any:
    """The document in ``path`` when it is of ``default``'s type; else ``default``."""
    data = fsutil.read_json(path, missing=default, error=default)
    return data if isinstance(data, type(default)) else default


class Outbox:
    def __init__(self, directory: str, max_queued: int, max_age: float):
        """``max_queued``, ``max_age``: ``[notify]``'s caps (:class:`slurm_hooks.config.NotifySection`)."""
        self.dir = directory
        self.box = os.path.join(directory, "outbox")
        self.failed = os.path.join(directory, "failed")
        self.bad = os.path.join(directory, "bad")
        self.ledger_path = os.path.join(directory, "delivered.json")
        self.dropped_path = os.path.join(directory, "dropped.json")
        self.max_queued, self.max_age = max_queued, max_age
        #: Files moved to ``bad/`` by this process (the notifier reports each once).
        self.moved_aside: list[str] = []
        self._ledger: list[str] | None = None
        self._index: dict[str, Entry] | None = None
        self._seen: tuple[int, int] | None = None
        #: Messages queued by this process (each entry's ``seq``).
        self._puts = 0

    def forget(self) -> None:
        """Another process may have changed the box since: read it again (the ledger always; the
        entries only when the directory changed since this process last looked: reading 500 files
        every second of an outage would cost a node a fifth of a core)."""
        self._ledger = None
        if self._index is not None and self._stamp() != self._seen:
            self._index = None

    def _stamp(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.box)
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns)

    def _changed(self) -> None:
        """This process changed the box: what it holds in memory is what is there."""
        self._seen = self._stamp()

    # -- the ledger

    def ledger(self) -> list[str]:
        if self._ledger is None:
            self._ledger = [str(x) for x in _read_json(self.ledger_path, [])]
        return self._ledger

    def was_delivered(self, entry: Entry) -> bool:
        return entry.key in self.ledger()

    def delivered(self, entry: Entry) -> None:
        """Note it in the ledger first, then remove the file: a crash in between sends nothing again."""
        ledger = self.ledger()
        ledger.append(entry.key)
        del ledger[:-LEDGER_SIZE]
        fsutil.atomic_write(self.ledger_path, json.dumps(ledger), mode=0o600)
        self._remove(entry)

    # -- what waits

    def _name(self, mid: str, dest: str) -> str:
        safe = "".join(c if c.isalnum() or c in "-._" else "_" for c in mid)
        if len(safe) > NAME_MAX:
            # A Kubernetes node name may be 253 characters: past the file system's 255 for a name,
            # put() would fail every pass and hold every message back. Its head, and a hash of all.
            import hashlib

            safe = f"{safe[:NAME_MAX - 17]}-{hashlib.sha256(mid.encode()).hexdigest()[:16]}"
        return os.path.join(self.box, f"{safe}--{dest}.json")

    def _entries(self) -> dict[str, Entry]:
        if self._index is None:
            self._seen = self._stamp()
            self._index = {}
            try:
                names = sorted(n for n in os.listdir(self.box) if n.endswith(".json") and not n.startswith("."))
            except FileNotFoundError:
                names = []
            for name in names:
                path = os.path.join(self.box, name)
                try:
                    entry = Entry.load(path)
                except FileNotFoundError:
                    continue
                except (OSError, ValueError):
                    self._move_aside(path)
                    continue
                self._index[path] = entry
        return self._index

    def entries(self) -> list[Entry]:
        """Every readable entry, oldest first (an unreadable file is moved to ``bad/``)."""
        return sorted(self._entries().values(), key=lambda e: e.order)

    def waiting(self) -> int:
        return len(self._entries())

    def in_order(self) -> list[Entry]:
        """Delivery order: the newest incident first (after an outage what matters is now), each
        incident's messages in the order they were made (opened before resolved)."""
        groups: dict[str, list[Entry]] = {}
        for e in self.entries():
            groups.setdefault(e.incident or e.id, []).append(e)
        ordered = sorted(groups.values(), key=lambda g: -max(e.created for e in g))
        return [e for g in ordered for e in g]

    def _move_aside(self, path: str) -> None:
        os.makedirs(self.bad, mode=0o700, exist_ok=True)
        try:
            os.replace(path, os.path.join(self.bad, os.path.basename(path)))
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(path)
        self.moved_aside.append(path)

    def discard(self, entry: Entry) -> None:
        """Remove a file the ledger already has (a crash between the two steps of :meth:`delivered`)."""
        self._remove(entry)

    def _remove(self, entry: Entry) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(entry.path)
        if self._index is not None:
            self._index.pop(entry.path, None)
            self._changed()

    def put(self, mid: str, kind: str, message: dict[str, Any], incident: str, dest: str, now: float) -> bool:
        """Queue a message for ``dest`` unless it is queued or was delivered already. A reminder
        replaces the incident's older one; a resolution takes its reminders away; past
        ``max_queued`` the oldest go (counted)."""
        path = self._name(mid, dest)
        index = self._entries()
        if f"{mid}@{dest}" in self.ledger() or path in index or os.path.exists(path):
            return False
        if incident and (kind in COALESCED or kind == RESOLVED):
            for old in [e for e in index.values() if e.dest == dest and e.incident == incident and e.kind in COALESCED]:
                self._remove(old)
        self._puts += 1
        entry = Entry(id=mid, dest=dest, kind=kind, message=message, created=now, incident=incident,
                      next_at=now, seq=self._puts, path=path)
        os.makedirs(self.box, mode=0o700, exist_ok=True)
        fsutil.atomic_write(path, entry.to_json(), mode=0o600)
        index[path] = entry
        self._changed()
        mine = sorted((e for e in index.values() if e.dest == dest), key=lambda e: e.order)
        if len(mine) > self.max_queued:
            for old in mine[: len(mine) - self.max_queued]:
                self._remove(old)
            self.count_dropped(dest, len(mine) - self.max_queued)
        return True

    def expire(self, now: float) -> int:
        """Drop what waited longer than ``max_age`` (counted per receiver)."""
        gone = 0
        for e in self.entries():
            if e.created < now - self.max_age:
                self._remove(e)
                self.count_dropped(e.dest, 1)
                gone += 1
        return gone

    def sync(self) -> None:
        """The outbox directory's entries on disk (a file's fsync does not make its name durable)."""
        try:
            fd = os.open(self.box, os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)

    # -- what was dropped (said in the receiver's next message)

    def dropped(self, dest: str) -> int:
        return int(_read_json(self.dropped_path, {}).get(dest, 0))

    def count_dropped(self, dest: str, n: int) -> None:
        counts = _read_json(self.dropped_path, {})
        counts[dest] = int(counts.get(dest, 0)) + n
        counts = {k: v for k, v in counts.items() if v > 0}
        fsutil.atomic_write(self.dropped_path, json.dumps(counts), mode=0o600)

    # -- retries and refusals

    def retry(self, entry: Entry, error: str, next_at: float) -> None:
        """Count a failed try. Synced: the file replaced is the message itself, and a rename that
        reaches the disk before its data (XFS, ext4 without ``auto_da_alloc``) would leave an empty
        file after a power loss, moved to ``bad/``: the message lost. One fsync per failed try."""
        entry.attempts += 1
        entry.next_at, entry.last_error = next_at, error
        fsutil.atomic_write(entry.path, entry.to_json(), mode=0o600)
        if self._index is not None:
            self._changed()

    def release(self, dest: str, now: float) -> int:
        """``dest`` answers again: its waiting messages are due ``now`` (not at their backoff's next try).
        Returns how many wait for it."""
        mine = [e for e in self.entries() if e.dest == dest]
        for e in mine:
            if e.next_at > now:
                e.next_at = now
                fsutil.atomic_write(e.path, e.to_json(), mode=0o600)
        if mine and self._index is not None:
            self._changed()
        return len(mine)

    def give_up(self, entry: Entry, error: str) -> None:
        entry.last_error = error
        os.makedirs(self.failed, mode=0o700, exist_ok=True)
        fsutil.atomic_write(os.path.join(self.failed, os.path.basename(entry.path)), entry.to_json(), mode=0o600)
        self._remove(entry)
        self.prune_failed()

    def failed_entries(self) -> list[Entry]:
        out = []
        with contextlib.suppress(FileNotFoundError):
            for name in sorted(os.listdir(self.failed)):
                with contextlib.suppress(OSError, ValueError):
                    out.append(Entry.load(os.path.join(self.failed, name)))
        return sorted(out, key=lambda e: e.created)

    def prune_failed(self, keep: int = FAILED_KEEP) -> int:
        """Keep the newest ``keep`` refused messages."""
        try:
            names = [os.path.join(self.failed, n) for n in os.listdir(self.failed)]
        except FileNotFoundError:
            return 0
        by_age = sorted(names, key=lambda p: os.stat(p).st_mtime if os.path.exists(p) else 0.0)
        gone = by_age[: max(0, len(by_age) - keep)]
        for path in gone:
            with contextlib.suppress(OSError):
                os.unlink(path)
        return len(gone)
