"""Our verdict on a Slurm node, kept where the Slinky operator's preStop cannot touch it.

Evicting a Slinky NodeSet's slurmd pod runs its preStop hook, ``scontrol update
nodename=$(hostname) state=down reason='slurm-operator: Pod is terminating'``
(slurm-operator ``worker_app.go``): our ``slurm-hooks: ... [replace]`` reason is
gone, and the operator, which owns every reason starting ``slurm-operator: ``
(``IsNodeReasonOurs``), undrains the node when a pod registers again. So the
bridge keeps what it knows in two places the preStop does not write:

- the Kubernetes node's ownership annotation (:mod:`.ownership`), for the machine;
- the Slurm node's ``Extra`` field (Slurm 22.05+, free text, ``scontrol update
  Extra=``), as ``{"slurm-hooks": {...}}``, for the Slurm node: it outlives the
  machine (a NodeClaim deleted takes its Node object, and our annotation, with it).

``Comment`` is the operator's (its JSON names the pod and the Kubernetes node), so it
is never written. An ``Extra`` someone else wrote is never overwritten. And a
``slurm-operator: `` reason is never edited nor resumed: the bridge only reads it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace

from slurm_hooks.bridge.mapping import json_object
from slurm_hooks.slurm import NodeInfo

KEY = "slurm-hooks"
#: Reasons the Slinky operator owns (its ``IsNodeReasonOurs``): read, never edited or resumed.
OPERATOR_PREFIX = "slurm-operator: "


def operator_reason(reason: str) -> bool:
    return (reason or "").startswith(OPERATOR_PREFIX)


@dataclass(frozen=True)
class NodeVerdict:
    #: Our drain reason as the node side wrote it (``slurm-hooks: XID 79 on GPU 3 [reboot]``).
    reason: str
    action: str
    #: When the bridge took the node (the ownership record's ``since``).
    since: float
    #: The Kubernetes node the Slurm node ran on when it was taken (the machine at fault).
    kube_node: str
    #: What the backend was asked for; "" until asked. Asked once per verdict.
    requested: str = ""

    def to_text(self) -> str:
        return json.dumps({KEY: asdict(self)}, sort_keys=True, separators=(",", ":"))

    def asked(self, what: str) -> NodeVerdict:
        return replace(self, requested=what)

    @classmethod
    def parse(cls, text: str) -> NodeVerdict | None:
        data = json_object(text)
        body = data.get(KEY) if data is not None else None
        if not isinstance(body, dict):
            return None
        try:
            return cls(reason=str(body["reason"]), action=str(body["action"]), since=float(body["since"]),
                       kube_node=str(body["kube_node"]), requested=str(body.get("requested") or ""))
        except (KeyError, TypeError, ValueError):
            return None

    @classmethod
    def of(cls, node: NodeInfo) -> NodeVerdict | None:
        return cls.parse(node.extra_text)


def extra_is_foreign(node: NodeInfo) -> bool:
    """The node's Extra holds someone else's text: we leave it alone."""
    return bool(node.extra_text.strip()) and NodeVerdict.of(node) is None
