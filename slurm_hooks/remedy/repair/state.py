"""The repair ladder's memory, ``<state dir>/repair-<node>.json``, as a frozen value.

The JSON is today's: ``attempts`` (a list of ``{rung, t, result, gpus, summary}``) and, while a
repair is under way, one of ``active`` (a reboot we asked for), ``validating`` (a diagnostic
before return to service), ``replaced`` (left for a person), and ``stopped`` (services a worker
stopped around a reset). Keys this version does not know ride along unchanged, both ways.
An unreadable file raises :class:`RepairStateUnreadable` (as :class:`DrainMarker.load` does):
starting afresh would forget the attempts, and the ladder would climb from its foot again.
"""

from __future__ import annotations

import json
from enum import Enum

from slurm_hooks.errors import SlurmHooksError
from slurm_hooks.values import dataclass, field, replace

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

VERSION = 1
#: Reason tag of a node left for a person because its diagnostic did not run in full.
UNVERIFIED = "unverified"


class RepairStateUnreadable(SlurmHooksError):
    """The repair state file is there but cannot be read: the caller says so and does not act."""


class Phase(str, Enum):
    """Where a node is on the ladder; the value is the JSON key that holds the phase's record."""

    IDLE = "idle"
    REBOOTING = "active"
    VALIDATING = "validating"
    UNVERIFIED = "unverified"
    REPLACED = "replaced"


_KNOWN = ("version", "attempts", "active", "validating", "replaced", "stopped")
_ATTEMPT_KEYS = ("rung", "t", "result", "gpus", "summary")


@dataclass(frozen=True)
class Attempt:
    """One rung tried (or started: a worker that dies is counted) on some GPUs."""

    rung: str
    t: float
    result: str
    gpus: tuple[str, ...] = ()
    summary: str = ""
    #: Keys this version does not know, kept as read.
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Any) -> Attempt:
        if not isinstance(data, dict) or not isinstance(data.get("rung"), str) \
                or not isinstance(data.get("gpus", []), list) or isinstance(data.get("t", 0), bool) \
                or not isinstance(data.get("t", 0), (int, float)):
            raise ValueError(f"malformed attempt {data!r:.80}")
        return cls(data["rung"], data.get("t", 0), str(data.get("result", "")),
                   tuple(str(g) for g in data.get("gpus", [])), str(data.get("summary", "")),
                   {k: v for k, v in data.items() if k not in _ATTEMPT_KEYS})

    def to_json(self) -> dict[str, Any]:
        return {"rung": self.rung, "t": self.t, "result": self.result, "gpus": list(self.gpus),
                "summary": self.summary, **self.extra}


@dataclass(frozen=True)
class RepairState:
    """The ladder's memory; the phase records are today's JSON objects (``None``: not in it)."""

    attempts: tuple[Attempt, ...] = ()
    active: Mapping[str, Any] | None = None
    validating: Mapping[str, Any] | None = None
    replaced: Mapping[str, Any] | None = None
    stopped: Mapping[str, Any] | None = None
    version: int = VERSION
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def phase(self) -> Phase:
        """In the order the ladder weighs them: a reboot under way, a validation, a [replace]."""
        if self.active is not None:
            return Phase.REBOOTING
        if self.validating:
            return Phase.UNVERIFIED if self.validating.get("result") == UNVERIFIED else Phase.VALIDATING
        if self.replaced:
            return Phase.REPLACED
        return Phase.IDLE

    @property
    def busy(self) -> bool:
        """A repair under way: a reboot, stopped services or a validation."""
        return self.active is not None or bool(self.stopped) or bool(self.validating)

    def with_attempt(self, attempt: Attempt) -> RepairState:
        return replace(self, attempts=(*self.attempts, attempt))

    @classmethod
    def from_json(cls, data: Any) -> RepairState:
        """Raises ValueError on a shape that is not the ladder's."""
        if not isinstance(data, dict) or not isinstance(data.get("attempts"), list):
            raise ValueError("not a repair state (no list of attempts)")
        records = {}
        for key in ("active", "validating", "replaced", "stopped"):
            value = data.get(key)
            if value is not None and not isinstance(value, dict):
                raise ValueError(f"{key!r} is not an object")
            records[key] = None if key not in data else value
        version = data.get("version", VERSION)
        return cls(tuple(Attempt.from_json(a) for a in data["attempts"]), version=version,
                   extra={k: v for k, v in data.items() if k not in _KNOWN}, **records)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"version": self.version, "attempts": [a.to_json() for a in self.attempts]}
        for key in ("active", "validating", "replaced", "stopped"):
            value = getattr(self, key)
            if value is not None:
                out[key] = dict(value)
        out.update(self.extra)
        return out


def load(path: str) -> RepairState:
    """The state at ``path``; an empty one when there is none. Raises :class:`RepairStateUnreadable`."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        return RepairState()
    except (OSError, ValueError) as exc:
        raise RepairStateUnreadable(f"{path}: unreadable repair state ({exc})") from None
    try:
        return RepairState.from_json(data)
    except ValueError as exc:
        raise RepairStateUnreadable(f"{path}: malformed repair state ({exc})") from None
