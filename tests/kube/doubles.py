"""Small doubles for the bridge's tests: a clock that only moves when told (Slurm is tests/fakes/slurm.py).

Also what the reconciler's tests against the in-memory API share: the drain reason that asks for a
replacement, the bridge's taint, a GPU node with its pods, and a reconciler on the test's clock.
"""

from __future__ import annotations

from typing import Any

from slurm_hooks.bridge.reconciler import Reconciler
from slurm_hooks.observe.audit import AuditLog

#: slurm-hooks' drain reason for a GPU fallen off the bus: the bridge replaces the node.
XID79 = "slurm-hooks: XID 79 on GPU 3 [replace]"
#: The taint the bridge puts on a node it takes (``[bridge] taint_key``'s default).
TAINT = "slurm-hooks.io/gpu-unhealthy"


class Clock:
    """Wall and monotonic time that only moves when a test (or a backoff sleep) says so."""

    def __init__(self, start: float = 1_700_000_000.0):
        self.now = start
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds

    def advance(self, seconds: float) -> None:
        self.now += seconds


def read_audit(path: str) -> list[dict[str, Any]]:
    return list(AuditLog(path).read())


def records(audit_path: str, kind: str) -> list[dict[str, Any]]:
    return [r for r in read_audit(audit_path) if r["kind"] == kind]


def controlled_by(kind: str = "ReplicaSet", name: str = "train", **metadata: Any) -> dict[str, Any]:
    """Pod metadata naming its controller (``controller: true``), as a Deployment's or a Job's pods have."""
    ref = {"apiVersion": "apps/v1", "kind": kind, "name": name, "uid": f"uid-{kind}-{name}", "controller": True}
    return {"metadata": {**metadata, "ownerReferences": [ref]}}


def add_gpu_node(kube, name: str) -> None:
    """Node ``name`` with a training pod (``jobs/job-<name>``, a ReplicaSet's) and a DaemonSet pod (``gpu/dcgm-<name>``)."""
    kube.add_node(name)
    kube.add_pod(f"job-{name}", name, "jobs", **controlled_by())
    kube.add_pod(f"dcgm-{name}", name, "gpu", metadata={"ownerReferences": [{"kind": "DaemonSet", "name": "dcgm"}]})


def make_reconciler(slurm, kube, settings, clock: Clock, audit_path: str, **kw: Any) -> Reconciler:
    """A :class:`Reconciler` whose wall clock, monotonic clock and sleep are all ``clock``, auditing to ``audit_path``."""
    return Reconciler(slurm, kube, settings, audit=AuditLog(audit_path), clock=clock, monotonic=clock,
                      sleep=clock.sleep, **kw)
