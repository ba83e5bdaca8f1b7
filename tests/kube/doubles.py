"""Small doubles for the bridge's tests: a Slurm that lists nodes and jobs, a clock that only moves when told."""

from __future__ import annotations

from typing import Any

from slurm_hooks.observe.audit import AuditLog
from slurm_hooks.slurm import JobInfo, NodeInfo


class FakeSlurm:
    """The two calls the bridge makes on Slurm: ``nodes()`` and ``jobs_on_node()``."""

    def __init__(self, *nodes: NodeInfo):
        self.by_name = {n.name: n for n in nodes}
        self.error: Exception | None = None
        #: node name -> job ids running there.
        self.jobs: dict[str, list[int]] = {}
        self.jobs_error: Exception | None = None
        self.job_calls: list[str] = []

    def nodes(self) -> list[NodeInfo]:
        if self.error:
            raise self.error
        return list(self.by_name.values())

    def jobs_on_node(self, name: str) -> list[JobInfo]:
        self.job_calls.append(name)
        if self.jobs_error:
            raise self.jobs_error
        return [JobInfo(job_id=j, name=f"job{j}", state="RUNNING", nodes=name) for j in self.jobs.get(name, ())]

    def set(self, name: str, state: str = "IDLE", reason: str = "", comment: str = "") -> None:
        self.by_name[name] = NodeInfo(name=name, state=state, reason=reason, comment=comment)

    def drain(self, name: str, reason: str = "slurm-hooks: XID 79 on GPU 3 [replace]") -> None:
        old = self.by_name.get(name)
        self.set(name, "IDLE+DRAIN", reason, old.comment if old else "")

    def resume(self, name: str) -> None:
        old = self.by_name.get(name)
        self.set(name, "IDLE", "", old.comment if old else "")


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


def controlled_by(kind: str = "ReplicaSet", name: str = "train", **metadata: Any) -> dict[str, Any]:
    """Pod metadata naming its controller (``controller: true``), as a Deployment's or a Job's pods have."""
    ref = {"apiVersion": "apps/v1", "kind": kind, "name": name, "uid": f"uid-{kind}-{name}", "controller": True}
    return {"metadata": {**metadata, "ownerReferences": [ref]}}
