"""Slurm adapter: one small interface, two backends (scontrol CLI, pyslurm).

Hooks and the bridge talk to Slurm only through :class:`Slurm`. The scontrol
backend takes its command runner from outside, so tests give it a real local
cluster. Reason ownership lives here too: we drain only with our prefix, never
overwrite a reason that is not ours, and resume only nodes we drained.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from slurm_hooks import REASON_PREFIX


@dataclass(frozen=True)
class NodeInfo:
    name: str
    #: Full state as scontrol prints it, e.g. "IDLE+DRAIN", "MIXED", "DOWN*+DRAIN".
    state: str
    reason: str = ""
    comment: str = ""
    gres: str = ""
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def flags(self) -> frozenset[str]:
        return frozenset(part.rstrip("*~#!%$@^-") for part in self.state.upper().split("+"))

    @property
    def base_state(self) -> str:
        return self.state.upper().split("+")[0].rstrip("*~#!%$@^-")

    @property
    def drained(self) -> bool:
        """DRAIN flag set (draining or drained) or a DRAINED/DRAINING base state."""
        return bool({"DRAIN", "DRAINED", "DRAINING"} & self.flags)

    @property
    def ours(self) -> bool:
        return self.reason.startswith(REASON_PREFIX)


@dataclass(frozen=True)
class JobInfo:
    job_id: int
    name: str
    state: str
    nodes: str = ""
    requeue: bool = True
    batch: bool = True
    restarts: int = 0
    reason: str = ""
    extra: dict = field(default_factory=dict, compare=False, hash=False)


class Slurm(Protocol):
    def node(self, name: str) -> NodeInfo: ...

    def nodes(self) -> list[NodeInfo]: ...

    def drain(self, name: str, reason: str) -> None: ...

    def resume(self, name: str) -> None: ...

    def jobs_on_node(self, name: str) -> list[JobInfo]: ...

    def job(self, job_id: int) -> JobInfo: ...

    def requeue(self, job_id: int) -> None: ...

    def release(self, job_id: int) -> None: ...

    def start_now(self, job_id: int) -> None: ...

    def signal(self, job_id: int, signal: str) -> None: ...


def may_drain(node: NodeInfo) -> bool:
    """Drain unless someone else already drained it with a reason of their own."""
    return not node.drained or not node.reason or node.ours


def may_resume(node: NodeInfo) -> bool:
    """Resume only a node we drained ourselves."""
    return node.drained and node.ours
