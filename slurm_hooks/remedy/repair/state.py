"""The repair ladder's memory, ``<state dir>/repair-<node>.json``, as frozen values.

The JSON is today's: ``attempts`` (a list of ``{rung, t, result, gpus, summary}``) and, while a
repair is under way, one of ``active`` (:class:`Active`: a reboot we asked for), ``validating``
(:class:`Validating`: a diagnostic before return to service), ``replaced`` (:class:`Replaced`: left
for a person), and ``stopped`` (:class:`Stopped`: services a worker stopped around a reset). Keys
this version does not know ride along unchanged, both ways, at every level. A change is a new
value (``replace()``), never an edit of the one read.
An unreadable file raises :class:`RepairStateUnreadable` (as :class:`DrainMarker.load` does):
starting afresh would forget the attempts, and the ladder would climb from its foot again.
"""

from __future__ import annotations

from enum import Enum

from slurm_hooks import fsutil
from slurm_hooks.errors import SlurmHooksError
from slurm_hooks.values import dataclass, field, replace

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any

VERSION = 1
#: Reason tag of a node left for a person because its diagnostic did not run in full.
UNVERIFIED = "unverified"


class RepairStateUnreadable(SlurmHooksError):
    """The repair state file is there but cannot be read: the caller says so and does not act."""


#: What :func:`load` reads for a state file that is not there (a ``null`` one is malformed).
_NO_STATE = object()


class Phase(str, Enum):
    """Where a node is on the ladder; the value is the JSON key that holds the phase's record."""

    IDLE = "idle"
    REBOOTING = "active"
    VALIDATING = "validating"
    UNVERIFIED = "unverified"
    REPLACED = "replaced"


def _object(data: Any, what: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ValueError(f"{what} is not an object")
    return data


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} is not a number: {value!r:.40}")
    return value


def _rest(data: Mapping[str, Any], known: Iterable[str]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k not in known}


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

    _KEYS = ("rung", "t", "result", "gpus", "summary")

    @classmethod
    def from_json(cls, data: Any) -> Attempt:
        if not isinstance(data, dict) or not isinstance(data.get("rung"), str) \
                or not isinstance(data.get("gpus", []), list):
            raise ValueError(f"malformed attempt {data!r:.80}")
        return cls(data["rung"], _number(data.get("t", 0), "an attempt's time"), str(data.get("result", "")),
                   tuple(str(g) for g in data.get("gpus", [])), str(data.get("summary", "")),
                   _rest(data, cls._KEYS))

    def to_json(self) -> dict[str, Any]:
        return {"rung": self.rung, "t": self.t, "result": self.result, "gpus": list(self.gpus),
                "summary": self.summary, **self.extra}


@dataclass(frozen=True)
class Active:
    """A reboot we asked Slurm for: judged on the first check of a boot other than ``boot``."""

    t: float = 0.0
    boot: str = ""
    #: Slurm's reason we set with it (``... [reboot 1/2]``), why the ladder chose it, the fault.
    reason: str = ""
    why: str = ""
    summary: str = ""
    #: (index, identity) of the GPUs at fault, as :class:`.planner.Plan` names them.
    gpus: tuple[tuple[int | None, str], ...] = ()
    #: (check, GPU index) of the findings it was for: a new urgent one is not (:func:`.worker.new_urgent`).
    findings: tuple[tuple[str, int | None], ...] = ()
    rung: str = "reboot"
    extra: Mapping[str, Any] = field(default_factory=dict)

    _KEYS = ("rung", "t", "boot", "reason", "why", "summary", "gpus", "findings")

    @classmethod
    def from_json(cls, data: Any) -> Active:
        data = _object(data, "'active'")
        try:
            gpus = tuple((i, str(g)) for i, g in data.get("gpus", []))
            findings = tuple((str(c), g) for c, g in data.get("findings", []))
        except (TypeError, ValueError):
            raise ValueError("'active' names its GPUs or findings in a shape not the ladder's") from None
        return cls(_number(data.get("t", 0), "'active' time"), str(data.get("boot", "")), str(data.get("reason", "")),
                   str(data.get("why", "")), str(data.get("summary", "")), gpus, findings,
                   str(data.get("rung", "reboot")), _rest(data, cls._KEYS))

    def to_json(self) -> dict[str, Any]:
        return {"rung": self.rung, "t": self.t, "boot": self.boot, "reason": self.reason, "why": self.why,
                "summary": self.summary, "gpus": [list(g) for g in self.gpus],
                "findings": [list(f) for f in self.findings], **self.extra}


@dataclass(frozen=True)
class Validating:
    """A diagnostic before return to service (``result`` "running"), or one that could not run in
    full (``result`` "unverified": the node waits for a person)."""

    t: float = 0.0
    #: What it validates: "reset", "reboot", "request" (a person's), "replacement".
    after: str = ""
    #: How often a worker started it (one that died does not finish it).
    tries: int = 0
    summary: str = ""
    result: str = "running"
    reason: str = ""
    detail: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)

    _KEYS = ("t", "after", "tries", "summary", "result", "reason", "detail")

    @property
    def unverified(self) -> bool:
        return self.result == UNVERIFIED

    @classmethod
    def from_json(cls, data: Any) -> Validating:
        data = _object(data, "'validating'")
        return cls(_number(data.get("t", 0), "'validating' time"), str(data.get("after", "")),
                   int(_number(data.get("tries", 0), "'validating' tries")), str(data.get("summary", "")),
                   str(data.get("result", "running")), str(data.get("reason", "")), str(data.get("detail", "")),
                   _rest(data, cls._KEYS))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"t": self.t, "after": self.after, "tries": self.tries, "summary": self.summary,
                               "result": self.result}
        out.update({k: v for k, v in (("reason", self.reason), ("detail", self.detail)) if v})
        return {**out, **self.extra}


@dataclass(frozen=True)
class Replaced:
    """The node left drained ``[replace]`` for a person (or new hardware)."""

    t: float = 0.0
    reason: str = ""
    #: The identities of the GPUs put on the RMA list (none when taken from Slurm's reason).
    gpus: tuple[str, ...] = ()
    #: Taken from Slurm's reason: the state dir had been lost.
    recalled: bool = False
    #: When a person returned the node to service with these GPUs still in it (0: not yet). The mark
    #: stays: only new hardware (new UUIDs) or ``slurm-hooks rma clear`` ends it.
    resumed: float = 0.0
    extra: Mapping[str, Any] = field(default_factory=dict)

    _KEYS = ("t", "reason", "gpus", "recalled", "resumed")

    @classmethod
    def from_json(cls, data: Any) -> Replaced:
        data = _object(data, "'replaced'")
        if not isinstance(data.get("gpus", []), list):
            raise ValueError("'replaced' gpus is not a list")
        return cls(_number(data.get("t", 0), "'replaced' time"), str(data.get("reason", "")),
                   tuple(str(g) for g in data.get("gpus", [])), bool(data.get("recalled", False)),
                   _number(data.get("resumed", 0), "'replaced' resumed"), _rest(data, cls._KEYS))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"t": self.t, "reason": self.reason, "gpus": list(self.gpus)}
        if self.recalled:
            out["recalled"] = True
        if self.resumed:
            out["resumed"] = self.resumed
        return {**out, **self.extra}


@dataclass(frozen=True)
class Stopped:
    """Services a repair worker stopped around a reset, recorded before it stops them."""

    services: tuple[str, ...] = ()
    t: float = 0.0
    pid: int = 0
    extra: Mapping[str, Any] = field(default_factory=dict)

    _KEYS = ("services", "t", "pid")

    @classmethod
    def from_json(cls, data: Any) -> Stopped:
        data = _object(data, "'stopped'")
        if not isinstance(data.get("services", []), list):
            raise ValueError("'stopped' services is not a list")
        return cls(tuple(str(s) for s in data.get("services", [])), _number(data.get("t", 0), "'stopped' time"),
                   int(_number(data.get("pid", 0), "'stopped' pid")), _rest(data, cls._KEYS))

    def to_json(self) -> dict[str, Any]:
        return {"services": list(self.services), "t": self.t, "pid": self.pid, **self.extra}


#: The phase records, by their JSON key. An empty object for the last three reads as none (the
#: ladder always weighed them by truth); ``active`` is there when its key is.
_RECORDS: dict[str, Any] = {"active": Active, "validating": Validating, "replaced": Replaced, "stopped": Stopped}
_KNOWN = ("version", "attempts", *_RECORDS)


@dataclass(frozen=True)
class RepairState:
    """The ladder's memory (``None``: no such record)."""

    attempts: tuple[Attempt, ...] = ()
    active: Active | None = None
    validating: Validating | None = None
    replaced: Replaced | None = None
    stopped: Stopped | None = None
    version: int = VERSION
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def phase(self) -> Phase:
        """In the order the ladder weighs them: a reboot under way, a validation, a [replace]."""
        if self.active is not None:
            return Phase.REBOOTING
        if self.validating is not None:
            return Phase.UNVERIFIED if self.validating.unverified else Phase.VALIDATING
        if self.replaced is not None:
            return Phase.REPLACED
        return Phase.IDLE

    @property
    def busy(self) -> bool:
        """A repair under way: a reboot, stopped services or a validation."""
        return self.active is not None or self.stopped is not None or self.validating is not None

    def with_attempt(self, attempt: Attempt) -> RepairState:
        return replace(self, attempts=(*self.attempts, attempt))

    def settled(self, attempt: Attempt, result: str) -> RepairState:
        """This attempt (the last one equal to it) with its result now known."""
        for i in range(len(self.attempts) - 1, -1, -1):
            if self.attempts[i] == attempt:
                done = replace(attempt, result=result)
                return replace(self, attempts=(*self.attempts[:i], done, *self.attempts[i + 1:]))
        return self.with_attempt(replace(attempt, result=result))

    def since(self, oldest: float) -> RepairState:
        """Without the attempts older than ``oldest``."""
        kept = tuple(a for a in self.attempts if a.t >= oldest)
        return self if len(kept) == len(self.attempts) else replace(self, attempts=kept)

    @classmethod
    def from_json(cls, data: Any) -> RepairState:
        """Raises ValueError on a shape that is not the ladder's."""
        if not isinstance(data, dict) or not isinstance(data.get("attempts"), list):
            raise ValueError("not a repair state (no list of attempts)")
        records: dict[str, Any] = {}
        for key, kind in _RECORDS.items():
            value = data.get(key)
            if value is not None and not isinstance(value, dict):
                raise ValueError(f"{key!r} is not an object")
            if value is not None and (value or key == "active"):
                records[key] = kind.from_json(value)
        version = data.get("version", VERSION)
        return cls(tuple(Attempt.from_json(a) for a in data["attempts"]), version=version,
                   extra=_rest(data, _KNOWN), **records)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"version": self.version, "attempts": [a.to_json() for a in self.attempts]}
        for key in _RECORDS:
            value = getattr(self, key)
            if value is not None:
                out[key] = value.to_json()
        out.update(self.extra)
        return out


def load(path: str) -> RepairState:
    """The state at ``path``; an empty one when there is none. Raises :class:`RepairStateUnreadable`."""
    data = fsutil.read_json(path, missing=_NO_STATE, error=RepairStateUnreadable,
                            message="{path}: unreadable repair state ({reason})")
    if data is _NO_STATE:
        return RepairState()
    try:
        return RepairState.from_json(data)
    except ValueError as exc:
        raise RepairStateUnreadable(f"{path}: malformed repair state ({exc})") from None
