"""What XIDs this node has had lately, kept across runs.

A health check run is short-lived, so two things need memory: escalation (the
third XID 119 in a day on one GPU is hardware, not bad luck) and "never act twice
on one event" (the kernel log still holds yesterday's XID 79 after the node came
back). One small JSON file per node, rewritten atomically under a lock.

Each event is kept under its key with the GPU it happened on (its UUID where known,
see ``models.gpu_identity``), so escalation counts per GPU and across reboots.
Timestamps are when *we* recorded an event (wall clock), not the event's own
``ts``, which for kernel log records is seconds since boot.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterable
from typing import Any, Callable

from slurm_hooks import fsutil
from slurm_hooks.errors import PermanentError
from slurm_hooks.models import XidEvent

VERSION = 2
KEEP_S = 7 * 86400
MAX_EVENTS = 2000
MAX_SEEN = 5000


class XidHistory:
    def __init__(self, path: str):
        self.path = path

    def recorded(self) -> dict[str, tuple[str, int, float]]:
        """Every event kept: key -> (GPU identity, code, when recorded); ``CheckInput.xid_history``."""
        return {e["key"]: (e["id"], e["code"], e["t"]) for e in self._read()["events"]}

    def record(self, events: Iterable[XidEvent], now: float | None = None) -> list[XidEvent]:
        """Remember ``events`` (once per key); returns the ones not recorded before."""
        now = time.time() if now is None else now
        events = list(events)
        try:
            known = {e["key"] for e in self._read()["events"]}
        except PermanentError:
            known = set()  # unreadable: the write below says why
        if known and all(event.key in known for event in events):
            return []  # the usual case on a node with an old XID in its log: no write, no fsync
        new: list[XidEvent] = []

        def change(state: dict[str, Any]) -> None:
            known = {e["key"] for e in state["events"]}
            for event in events:
                if event.key not in known:
                    known.add(event.key)
                    new.append(event)
                    state["events"].append({"key": event.key, "code": event.code, "gpu": event.gpu,
                                            "id": event.gpu_id, "t": now})

        self._update(change, now)
        return new

    def seen(self, key: str) -> bool:
        """Whether an action was already taken on the event with this key."""
        return key in self._read()["seen"]

    def mark_seen(self, keys: Iterable[str], now: float | None = None) -> None:
        now = time.time() if now is None else now
        keys = list(keys)

        def change(state: dict[str, Any]) -> None:
            for key in keys:
                state["seen"].setdefault(key, now)

        self._update(change, now)

    def acked(self) -> frozenset[str]:
        """Keys of events an admin has dealt with: the XID check ignores them."""
        return frozenset(self._read()["acked"])

    def ack(self, keys: Iterable[str], now: float | None = None) -> None:
        now = time.time() if now is None else now
        keys = list(keys)

        def change(state: dict[str, Any]) -> None:
            for key in keys:
                state["acked"].setdefault(key, now)

        self._update(change, now)

    def _read(self) -> dict[str, Any]:
        state = _parse(self._load())
        if state is None:
            try:
                with fsutil.locked(self.path):
                    state = self._load_or_reset()
            except OSError as exc:
                raise PermanentError(f"cannot reset XID history {self.path}: {exc.strerror or exc}") from None
        return state

    def _update(self, change: Callable[[dict[str, Any]], None], now: float) -> None:
        try:
            with fsutil.locked(self.path):
                state = self._load_or_reset()
                change(state)
                _prune(state, now)
                fsutil.atomic_write(self.path, json.dumps(state, separators=(",", ":")), mode=0o600)
        except OSError as exc:
            raise PermanentError(f"cannot write XID history {self.path}: {exc.strerror or exc}") from None

    def _load(self) -> str | None:
        try:
            with open(self.path, encoding="utf-8", errors="replace") as fh:
                return fh.read()  # undecodable bytes: a corrupt file, set aside like any other
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise PermanentError(f"cannot read XID history {self.path}: {exc.strerror or exc}") from None

    def _load_or_reset(self) -> dict[str, Any]:
        """Call with the lock held: a corrupt file goes aside as ``.corrupt``."""
        text = self._load()
        state = _parse(text)
        if state is None:
            with contextlib.suppress(FileNotFoundError):
                os.replace(self.path, self.path + ".corrupt")
            state = _empty()
        return state


def _empty() -> dict[str, Any]:
    return {"version": VERSION, "events": [], "seen": {}, "acked": {}}


def _parse(text: str | None) -> dict[str, Any] | None:
    """The state in ``text``; an empty state for no file; ``None`` if it is corrupt."""
    if text is None:
        return _empty()
    try:
        state = json.loads(text)
        rename = _v1_key if state.get("version", 1) < 2 else str
        events = [{"key": rename(e["key"]), "code": int(e["code"]),
                   "gpu": None if e.get("gpu") is None else int(e["gpu"]), "t": float(e["t"])}
                  for e in state["events"]]
        for event, raw in zip(events, state["events"]):
            event["id"] = str(raw.get("id") or (f"gpu{event['gpu']}" if event["gpu"] is not None else ""))
        seen = {rename(k): float(v) for k, v in state["seen"].items()}
        acked = {rename(k): float(v) for k, v in state.get("acked", {}).items()}
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    return {"version": VERSION, "events": events, "seen": seen, "acked": acked}


def _v1_key(key: Any) -> str:
    """Version 1 kernel-log keys carried the GPU index (``kmsg:<boot>:<seq>@<ts>:<gpu>:<code>``);
    version 2 keys hold only what the log line says: drop it, so that an event acknowledged
    before the upgrade stays acknowledged."""
    key = str(key)
    if key.startswith("kmsg:") and key.count(":") >= 3:
        head, _gpu, code = key.rsplit(":", 2)
        return f"{head}:{code}"
    return key


def _prune(state: dict[str, Any], now: float) -> None:
    oldest = now - KEEP_S
    events = [e for e in state["events"] if e["t"] >= oldest]
    state["events"] = sorted(events, key=lambda e: e["t"])[-MAX_EVENTS:]
    seen = sorted(((t, k) for k, t in state["seen"].items() if t >= oldest))[-MAX_SEEN:]
    state["seen"] = {k: t for t, k in seen}
    # Acknowledged events stay in the kernel log until a reboot, however old: keep them by count only.
    acked = sorted((t, k) for k, t in state["acked"].items())[-MAX_SEEN:]
    state["acked"] = {k: t for t, k in acked}
