"""Small doubles for the bridge's tests: a Slurm that only lists nodes, a clock that only moves when told."""

from __future__ import annotations

from typing import Any

from slurm_hooks.audit import AuditLog
from slurm_hooks.slurm import NodeInfo


class FakeSlurm:
    """The one call the bridge makes on Slurm: ``nodes()``."""

    def __init__(self, *nodes: NodeInfo):
        self.by_name = {n.name: n for n in nodes}
        self.error: Exception | None = None

    def nodes(self) -> list[NodeInfo]:
        if self.error:
            raise self.error
        return list(self.by_name.values())

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
