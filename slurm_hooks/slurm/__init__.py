"""Slurm adapter: one small interface, two backends (scontrol CLI, pyslurm).

Hooks and the bridge talk to Slurm only through :class:`Slurm`. The scontrol
backend takes its command runner from outside, so tests give it a real local
cluster. Reason ownership lives here too: we drain only with our prefix, never
overwrite a reason that is not ours, and resume only nodes we drained.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Protocol

from slurm_hooks import REASON_PREFIX
from slurm_hooks.models import Action


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

    def drained_count(self, reason: str) -> int:
        """How many nodes are drained (or down) with exactly this reason."""
        ...

    def resume(self, name: str) -> None: ...

    def jobs_on_node(self, name: str) -> list[JobInfo]: ...

    def job(self, job_id: int) -> JobInfo: ...

    def requeue(self, job_id: int) -> None: ...

    def release(self, job_id: int) -> None: ...

    def start_now(self, job_id: int) -> None: ...

    def signal(self, job_id: int, signal: str) -> None: ...


def may_drain(node: NodeInfo) -> bool:
    """Drain unless the node carries someone else's reason: an admin's DRAIN, DOWN or FAIL,
    or Slurm's own (``Not responding``, ``Prolog error``). Ours we may replace."""
    return not node.reason or node.ours


def may_resume(node: NodeInfo) -> bool:
    """Resume only a node we drained ourselves."""
    return node.drained and node.ours


_ACTION_TAG = re.compile(r"\s\[({})\]$".format("|".join(a.value for a in Action)))


def format_reason(summary: str, action: Action, limit: int = 120) -> str:
    """``slurm-hooks: XID 79 on GPU 3 [replace]``: what broke, then what it needs.

    The bracketed action is how the bridge, which sees only Slurm's node state,
    knows whether a node needs a reboot or a replacement.
    """
    summary = "".join(ch if ch.isprintable() else " " for ch in summary).strip()
    tag = f" [{action.value}]"
    room = limit - len(REASON_PREFIX) - 1 - len(tag)
    if len(summary) > room:
        summary = summary[: room - 3].rstrip() + "..."
    return f"{REASON_PREFIX} {summary}{tag}"


def parse_reason(reason: str) -> tuple[str, Action | None] | None:
    """Inverse of :func:`format_reason`; ``None`` when the reason is not ours."""
    if not reason.startswith(REASON_PREFIX):
        return None
    body = reason[len(REASON_PREFIX):].strip()
    m = _ACTION_TAG.search(body)
    if not m:
        return body, None
    return body[: m.start()].strip(), Action(m.group(1))
