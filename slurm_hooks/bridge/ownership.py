"""What the bridge did to a node, written on the node itself.

The record lives in the ``slurm-hooks.io/remediation`` annotation (JSON), next
to the ``slurm-hooks.io/owned=true`` label that lets one LIST find every node we
hold. Being on the node, it survives a restart of the bridge, and it says
exactly what to undo: we uncordon only a node we cordoned, remove only our
taint, and withdraw only the replacement request we made.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from slurm_hooks.bridge.api import OWNER_ANNOTATION, OWNER_LABEL, Obj, annotations_of, labels_of

VERSION = 1


class ReleaseReason(str, Enum):
    """Why the node may be drained (the annotation keeps these values)."""

    NOT_YET = ""  # Slurm jobs are still on it
    NO_JOBS = "no jobs"
    FORCED = "forced"  # max_job_wait passed
    NO_SLURM_NODE = "no Slurm node"  # none maps here any more


class Drained(str, Enum):
    NOT_YET = ""
    DONE = "done"
    TIMEOUT = "timeout"  # drain_timeout passed (PDBs, pods not deleted)
    SKIPPED = "skipped"  # [bridge] drain = false


class VerdictKept(str, Enum):
    """Where our verdict is besides the annotation; a refused write is ``failed: <why>`` (free text)."""

    NOT_YET = ""
    SLURM = "slurm"  # in the Slurm node's Extra
    FOREIGN = "foreign"  # Extra is someone else's: left alone


def _enum(kind: type[Enum], value: Any) -> Any:
    try:
        return kind(value or "")
    except ValueError:
        return value  # a newer bridge's value, or free text: kept as it was


@dataclass
class Ownership:
    slurm_node: str
    reason: str
    action: str
    #: When we took the node (cordoned it): the circuit breaker's clock.
    since: float
    #: We set spec.unschedulable (it was schedulable before): only then do we uncordon.
    cordoned: bool = False
    tainted: bool = False
    condition: bool = False
    #: Non-empty while an opt-out (a pod label, ...) holds us to cordon-and-alert.
    opt_out: str = ""
    #: Why the node may be drained (:class:`ReleaseReason`).
    released: ReleaseReason = ReleaseReason.NOT_YET
    #: The Slurm job ids last seen on the node while waiting; ``None`` when it never waited.
    waiting_jobs: list[str] | None = None
    drain_started: float | None = None
    #: Pods evicted (``ns/name`` -> UID): the drain is over once none of them is listed any more.
    evicted: dict[str, str] = field(default_factory=dict)
    drained: Drained = Drained.NOT_YET
    backend: str = ""
    #: What the backend asked for ("nodeclaim/x deleted"); "" until asked.
    replacement: str = ""
    #: Events already posted on the node (their names are deterministic, see reconciler).
    events: list[str] = field(default_factory=list)
    #: Our verdict in the Slurm node's Extra (:class:`VerdictKept`, or ``failed: ...``).
    verdict: str = VerdictKept.NOT_YET
    #: When the incident closed (the Slurm node back in service on another machine); this
    #: machine stays cordoned for its repair and no longer counts as held by the breaker.
    closed: float | None = None
    #: The Node's ``status.nodeInfo.bootID`` when a repair that keeps the machine (a reboot) was
    #: asked for: the machine is back once it reports another one (a kubelet after the reboot).
    boot_id: str = ""

    @property
    def complete(self) -> bool:
        return not self.opt_out and bool(self.drained) and bool(self.replacement)

    def to_json(self) -> str:
        # Shallow: every field is a str, number, bool, None or a flat list/dict of those
        # (dataclasses.asdict's deep copy cost a millisecond a record at 500 nodes a pass).
        data: dict[str, Any] = {"v": VERSION, **{name: getattr(self, name) for name in _FIELDS}}
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Ownership | None:
        try:
            data = json.loads(text)
        except (TypeError, ValueError):
            return None
        if not isinstance(data, dict) or not data.get("slurm_node"):
            return None
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        try:
            record = cls(**kwargs)
        except TypeError:
            return None
        record.since = float(record.since or 0.0)
        record.released = _enum(ReleaseReason, record.released)
        record.drained = _enum(Drained, record.drained)
        record.verdict = _enum(VerdictKept, record.verdict)
        record.events = list(record.events or [])
        record.evicted = dict(record.evicted or {})
        return record

    @classmethod
    def of(cls, node: Obj) -> Ownership | None:
        text = annotations_of(node).get(OWNER_ANNOTATION)
        return cls.from_json(text) if text else None


_FIELDS = tuple(f.name for f in dataclasses.fields(Ownership))


def is_owned(node: Obj) -> bool:
    return labels_of(node).get(OWNER_LABEL) == "true" or OWNER_ANNOTATION in annotations_of(node)
