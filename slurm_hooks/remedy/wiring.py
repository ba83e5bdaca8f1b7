"""The wiring: which config, node, probe, Slurm adapter and audit log a hook uses.

Hooks receive a :class:`Wiring` instead of building their collaborators, so
tests give them a real testbed (or another probe) without patching globals.
The Slurm adapter is created on first use: the prolog's healthy path never
touches slurmctld. A hook run sets one deadline (:meth:`Wiring.start_deadline`);
from then on every Slurm call's timeout is cut to the time left (each adapter's ``bounded``).
A health check run talks through a record of its own (:meth:`Wiring.recording`): the errors its
calls raised, and the reads it reuses (:mod:`slurm_hooks.slurm.recording`).
"""

from __future__ import annotations

import os
import time

from slurm_hooks import config as config_mod
from slurm_hooks.observe.audit import AuditLog
from slurm_hooks.slurm import nodename
from slurm_hooks.values import dataclass, field, replace
from slurm_hooks.xid.history import XidHistory

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing (~3 ms of each start)
if TYPE_CHECKING:
    from typing import Any

    from slurm_hooks.config import Config
    from slurm_hooks.probes import Probe
    from slurm_hooks.slurm import NodeInfo, Slurm
    from slurm_hooks.slurm.recording import Record


@dataclass(frozen=True)
class ActionPolicy:
    """What this node side may do to Slurm, decided once from the config: every hook, command
    and check that asks "monitor-only?" reads it here (:attr:`Wiring.policy`).

    ``[check] drain = false`` is monitor-only: a fault is found, recorded and told, never acted on,
    so nothing is drained, requeued or repaired (a node side that may not drain holds nothing
    out to repair)."""

    may_drain: bool = True
    #: Requeue the jobs a fault touches ([remediation] requeue), on a node it drains.
    may_requeue: bool = True
    #: Let the repair ladder act ([repair] enabled), on a node it drains.
    may_repair: bool = False

    @property
    def monitor_only(self) -> bool:
        return not self.may_drain

    @classmethod
    def of(cls, config: Config) -> ActionPolicy:
        drain = config.check.drain
        return cls(may_drain=drain, may_requeue=drain and config.remediation.requeue,
                   may_repair=drain and config.repair.enabled)


@dataclass
class Wiring:
    config: Config
    node: str
    audit: AuditLog
    probe_override: Any = None
    slurm_override: Any = None
    #: The adapter made on first use, in a cell that this wiring's copies share (one for every run
    #: of a long-lived wiring, the watcher's).
    _slurm: list = field(default_factory=list, repr=False, compare=False)
    #: The follower thread that follows this node's jobs now, if one runs (:mod:`.follower`), in a
    #: cell its copies share: a job touched later joins it, one squeue per look for all of them.
    _following: list = field(default_factory=list, repr=False, compare=False)
    #: ``time.monotonic()`` by which this run must be done (None: no deadline, the watcher).
    deadline: float | None = None
    #: This run's record of its Slurm calls (:mod:`slurm_hooks.slurm.recording`): the errors they
    #: raised, and the reads the run reuses. None: calls go straight to the adapter.
    record: Record | None = None

    @classmethod
    def load(cls, config_path: str | None = None, node: str | None = None, **overrides: Any) -> Wiring:
        cfg = config_mod.load(config_path)
        return cls(cfg, nodename.resolve(node), AuditLog(cfg.log.audit), **overrides)

    def probe(self) -> Probe:
        if self.probe_override is not None:
            return self.probe_override
        from slurm_hooks import probes

        return probes.from_config(self.config, self.node)

    @property
    def policy(self) -> ActionPolicy:
        """What this node side may do (monitor-only or not), from the config."""
        return ActionPolicy.of(self.config)

    def start_deadline(self, seconds: float) -> None:
        """One deadline for the whole run, remediation included (unless one is already running)."""
        if self.deadline is None:
            self.deadline = time.monotonic() + float(seconds)

    def time_left(self, default: float) -> float:
        """Seconds left before the deadline (``default`` when there is none)."""
        return default if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    @property
    def slurm(self) -> Slurm:
        """The Slurm adapter, every call bounded by the run's deadline, through the run's record when
        it keeps one (:meth:`recording`)."""
        if self.slurm_override is not None:
            base = self.slurm_override
        else:
            if not self._slurm:
                from slurm_hooks.slurm.factory import from_config

                self._slurm.append(from_config(self.config))
            base = self._slurm[0]
        if self.deadline is not None:
            base = base.bounded(self.deadline)
        if self.record is not None:
            from slurm_hooks.slurm.recording import RecordingSlurm

            base = RecordingSlurm(base, self.record)
        return base

    def node_now(self) -> NodeInfo:
        """This node as Slurm shows it now, never a read reused from earlier in the run: what a
        resume or a repair rung decides on (someone may have drained or resumed it meanwhile)."""
        if self.record is not None:
            self.record.forget_node(self.node)
        return self.slurm.node(self.node)

    def recording(self) -> Wiring:
        """This wiring for one run: its Slurm calls' errors noted and its reads reused, until the
        run ends the record (:mod:`slurm_hooks.slurm.recording`). One that records already is
        returned as it is (its run goes on)."""
        if self.record is not None:
            return self
        from slurm_hooks.slurm.recording import Record

        return replace(self, record=Record())

    def state_path(self, *parts: str) -> str:
        return os.path.join(self.config.state.dir, *parts)

    def repair_state(self) -> str:
        """This node's repair ladder state (:mod:`slurm_hooks.remedy.repair`): absent while no repair ran."""
        return self.state_path(f"repair-{self.node}.json")

    def drained_marker(self) -> str:
        """Present while this node is drained by us: the health check then looks at Slurm."""
        return self.state_path(f"drained-{self.node}")


def xid_history(w: Wiring) -> XidHistory:
    """This node's XID history, shared with the watcher."""
    return XidHistory(w.state_path(f"xid-history-{w.node}.json"))
