"""The audit record kinds and their fields, declared once; and an incident's lifecycle words.

Every line of the audit log is a JSON object with ``ts``, ``kind`` and ``node``. What each
kind carries is written here, as frozen dataclasses read back with :func:`parse` (unknown
keys kept in ``extra``, missing ones at their default), so a reader asks a typed record,
not ``r.get("some key")``. The writers still call ``AuditLog.write(kind, **fields)``; a new
field is added here first.

An incident moves opened -> acting -> waiting -> closed (:class:`Stage`); each step is
one record of kind ``incident`` (:class:`Lifecycle`) where the hooks know it directly (a
person's resume), or follows from the action records (our drain opens, a repair rung acts,
``[replace]`` waits for a person, our resume closes): :mod:`.incidents` folds both.
"""

from __future__ import annotations

import enum
from dataclasses import fields as dc_fields
from typing import Any, ClassVar

from slurm_hooks.models import reason_tag
from slurm_hooks.values import dataclass, field


class Kind(str, enum.Enum):
    ALERT = "alert"
    ACTION = "action"
    WATCH = "watch"
    SLURM_VIEW = "slurm-view"
    #: A lifecycle step the hooks saw directly (:class:`Lifecycle`).
    INCIDENT = "incident"
    #: Repeats of one record that were not written one by one (:class:`Repeat`).
    REPEAT = "repeat"
    #: A receiver of the notifications out, or back (:class:`ReceiverState`).
    RECEIVER = "receiver"


class Stage(str, enum.Enum):
    OPENED = "opened"
    ACTING = "acting"
    WAITING = "waiting"
    CLOSED = "closed"


class WaitingFor(str, enum.Enum):
    JOBS = "jobs to leave"
    REBOOT = "a reboot"
    VALIDATION = "validation"
    PERSON = "a person"


class ClosedBy(str, enum.Enum):
    US = "slurm-hooks"
    PERSON = "person"
    HARDWARE = "new hardware"
    BRIDGE = "bridge"


#: Harmless to most disruptive, as in :class:`slurm_hooks.models.Action`.
ACTIONS = ("none", "warn", "drain", "reset", "reboot", "replace")
def action_rank(action: str | None) -> int:
    return ACTIONS.index(action) if action in ACTIONS else 0


def reason_action(reason: str) -> str:
    """The action our reason names (``[reboot 1/1] : reboot timed out`` is a reboot); "drain" else."""
    return reason_tag(reason)[0]


def at_job_end(reason: str) -> bool:
    return reason_tag(reason)[1]


@dataclass(frozen=True)
class Record:
    KIND: ClassVar[str] = ""
    ts: float = 0.0
    node: str = ""
    context: str = ""
    #: Keys this declaration does not name (kept, never lost on a read).
    extra: dict = field(default_factory=dict, compare=False)
    #: How many times it was seen (a :class:`Repeat` folded in), and the last time.
    count: int = 1
    last_ts: float = 0.0
    #: The job it is about (the prolog's, the epilog's), its owner, or each job's owner by id.
    job: Any = None
    user: str = ""
    users: dict = field(default_factory=dict)
    #: Each job's name by id (bounded and printable: :func:`job_name`).
    names: dict = field(default_factory=dict)
    #: ``warning``, ``error``, ``critical`` where the record is more than information (on
    #: ``repair-validate``: the DCGM diag level, a number).
    level: Any = ""
    #: Found and recorded, not acted on (``[check] drain = false``).
    monitor_only: bool = False


@dataclass(frozen=True)
class Alert(Record):
    """One finding as a hook saw it, with the GPU's identity (index, UUID, serial, PCI bus id)."""

    KIND: ClassVar[str] = Kind.ALERT.value
    check: str = ""
    #: The severity table's key of the finding (``xid.79``, ``kernel-log``).
    rule: str = ""
    severity: str = ""
    action: str = ""
    message: str = ""
    gpu: int | None = None
    uuid: str = ""
    serial: str = ""
    pci_bus_id: str = ""
    xid: int | None = None


@dataclass(frozen=True)
class Watch(Record):
    """The watcher's account of one XID event (or its own news: ``message``)."""

    KIND: ClassVar[str] = Kind.WATCH.value
    xid: int | None = None
    gpu: int | None = None
    event: str = ""
    drained: bool = False
    requeued: list = field(default_factory=list)
    signalled: list = field(default_factory=list)
    failed: list = field(default_factory=list)
    duration_s: float = 0.0
    message: str = ""


@dataclass(frozen=True)
class Action(Record):
    """One step taken (drain, requeue, resume, repair-<rung>, ...) and its result."""

    KIND: ClassVar[str] = Kind.ACTION.value
    action: str = ""
    target: str = ""
    result: str = ""
    duration_s: float = 0.0
    reason: str = ""
    detail: str = ""
    error: str = ""
    why: str = ""
    jobs: list = field(default_factory=list)
    #: A requeue: the job's GPUs here (Slurm's numbering), who requeued it, seconds from the fault.
    gpus: list = field(default_factory=list)
    requeued_by: str = ""
    seconds_from_fault: float | None = None
    #: A checkpoint signal sent (``USR2@90``), where it came from, how, and the grace left to the job.
    signal: str = ""
    source: str = ""
    via: str = ""
    grace_s: float | None = None
    #: A GPU-scoped fault that fell back to node scope for a job, and why.
    scope: str = ""
    fallback: str = ""
    #: The AdminComment line written to a job.
    comment: str = ""
    #: A pending action (``pending``: its id): its steps, which attempt, its budget.
    pending: str = ""
    steps: list = field(default_factory=list)
    attempt: int | None = None
    budget_s: float | None = None
    #: A repair: after what it validates, its timeout, the services it stopped, the worker's pid and rungs.
    after: str = ""
    timeout_s: float | None = None
    services: list = field(default_factory=list)
    backend: str = ""
    pid: int | None = None
    repairs: list = field(default_factory=list)
    #: The GPUs a repair rung names, each {index, uuid, serial, pci_bus_id}.
    gpu_ids: list = field(default_factory=list)
    #: Where a repair kept its evidence (a directory under the state dir).
    evidence: str = ""
    rma: list = field(default_factory=list)
    #: A drain that holds the node for a person (too many remediations on it): why, and the node's
    #: remediations within the window, each ``{t, what, action, gpus, subjects, context}``.
    held: str = ""
    history: list = field(default_factory=list)
    #: Where a requeued job was seen running again (``running``: its node list).
    nodes: str = ""


@dataclass(frozen=True)
class Lifecycle(Record):
    """A lifecycle step the hooks saw directly: ``stage`` closed ``by`` a person, who (``user``)."""

    KIND: ClassVar[str] = Kind.INCIDENT.value
    stage: str = ""
    by: str = ""
    user: str = ""
    waiting_for: str = ""
    why: str = ""
    todo: str = ""
    reason: str = ""
    detail: str = ""
    #: When it happened as its source saw it (Slurm, the watcher), where that is not ``ts``: a person's
    #: resume seen by the next health check happened before the check's clock says.
    at: float | None = None


@dataclass(frozen=True)
class Repeat(Record):
    """``count`` more records like ``of`` (its kind and fields, without ``ts``) up to ``last_ts``."""

    KIND: ClassVar[str] = Kind.REPEAT.value
    of: dict = field(default_factory=dict)
    first_ts: float = 0.0


@dataclass(frozen=True)
class ReceiverState(Record):
    """A receiver of the notifications out (``state`` out: since when, the error) or back (how long
    it was out, the tries that failed, the messages still waiting): :mod:`.receivers`."""

    KIND: ClassVar[str] = Kind.RECEIVER.value
    receiver: str = ""
    where: str = ""
    state: str = ""
    since: float = 0.0
    until: float | None = None
    out_s: float | None = None
    tries: int = 0
    waiting: int = 0
    error: str = ""
    #: The event in words (what ``events`` shows).
    message: str = ""


_BY_KIND: dict[str, type[Record]] = {c.KIND: c for c in (Alert, Watch, Action, Lifecycle, Repeat, ReceiverState)}
_NAMES: dict[type[Record], frozenset[str]] = {}


#: A declared field's annotation -> the JSON types its value may have (others are not checked).
_ACCEPTS: dict[str, tuple[type, ...]] = {
    "str": (str,), "float": (int, float), "float | None": (int, float), "int": (int,), "int | None": (int,),
    "bool": (bool,),
    "list": (list,), "dict": (dict,), "tuple": (list, tuple),
}
_TYPES: dict[type[Record], dict[str, tuple[type, ...]]] = {}


def _types(cls: type[Record]) -> dict[str, tuple[type, ...]]:
    types = _TYPES.get(cls)
    if types is None:
        types = _TYPES[cls] = {f.name: _ACCEPTS[str(f.type)] for f in dc_fields(cls)
                               if f.name not in ("extra", "ts") and str(f.type) in _ACCEPTS}
    return types


def parse(r: dict[str, Any]) -> Record:
    """A record of the audit log as its declared kind (a :class:`Record` for any other). A declared
    field whose value has the wrong JSON type (a hand-edited line, another tool's record) is kept
    under ``extra``, never read as that field: one odd line must not stop ``events`` or ``report``."""
    cls = _BY_KIND.get(str(r.get("kind")), Record)
    names = _NAMES.get(cls)
    if names is None:
        names = _NAMES[cls] = frozenset(f.name for f in dc_fields(cls)) - {"extra"}
    types = _types(cls)
    known: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for k, v in r.items():
        if k in names:
            if v is None:
                continue
            if k in types and not isinstance(v, types[k]):
                extra[k] = v
            else:
                known[k] = v
        elif k != "kind":
            extra[k] = v
    try:
        known["ts"] = float(known.get("ts", 0.0))
        return cls(**known, extra=extra)
    except (TypeError, ValueError):
        return Record(ts=float(r.get("ts") or 0) if isinstance(r.get("ts"), (int, float)) else 0.0,
                      node=str(r.get("node") or ""), extra=dict(r))


#: A job's name in a record and a message at most this long (Slurm allows far longer ones).
JOB_NAME_MAX = 40


def job_name(name: str) -> str:
    """A job's name as records and messages carry it: its non-printable characters as ``?``, at most
    :data:`JOB_NAME_MAX` characters (a name is the job owner's text: it must not forge a line)."""
    clean = "".join(ch if ch.isprintable() else "?" for ch in str(name or ""))
    return clean if len(clean) <= JOB_NAME_MAX else clean[: JOB_NAME_MAX - 3] + "..."


def targets(r: Action) -> list[str]:
    """The jobs an action is about: its ``jobs``, else its ``target``."""
    return [str(j) for j in r.jobs] if r.jobs else ([r.target] if r.target else [])


def escalates_to(r: Record) -> str:
    """The action this record puts the node under, wherever it is recorded: our drain (its reason's
    tag), a reboot started, a ``[replace]`` made; "" for any other record."""
    if not isinstance(r, Action):
        return ""
    if r.action == "drain" and r.result == "ok":
        return reason_action(r.reason)
    if r.action == "repair-reboot" and r.result == "start":
        return "reboot"
    if r.action == "repair-replace" and r.result == "ok":
        return "replace"
    return ""


def lifecycle(stage: Stage, **fields: Any) -> dict[str, Any]:
    """The fields of a :class:`Lifecycle` record (for ``AuditLog.write(Kind.INCIDENT.value, ...)``)."""
    declared = {f.name for f in dc_fields(Lifecycle)}
    unknown = set(fields) - declared
    if unknown:
        raise TypeError(f"not a field of an incident record: {', '.join(sorted(unknown))}")
    return {"stage": stage.value, **{k: v for k, v in fields.items() if v not in (None, "")}}
