"""The wiring: which config, node, probe, Slurm adapter and audit log a hook uses.

Hooks receive a :class:`Wiring` instead of building their collaborators, so
tests give them a real testbed (or another probe) without patching globals.
The Slurm adapter is created on first use: the prolog's healthy path never
touches slurmctld. A hook run sets one deadline (:meth:`Wiring.start_deadline`);
from then on every Slurm call's timeout is cut to the time left.
"""

from __future__ import annotations

import os
import time

from slurm_hooks import config as config_mod
from slurm_hooks.observe.audit import AuditLog
from slurm_hooks.slurm import nodename
from slurm_hooks.values import dataclass, field
from slurm_hooks.xid.history import XidHistory

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing (~3 ms of each start)
if TYPE_CHECKING:
    from typing import Any

    from slurm_hooks.config import Config
    from slurm_hooks.probes import Probe
    from slurm_hooks.slurm import Slurm


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
        drain = bool(config.check.drain)
        return cls(may_drain=drain, may_requeue=drain and bool(config.remediation.requeue),
                   may_repair=drain and bool(config.repair.enabled))


@dataclass
class Wiring:
    config: Config
    node: str
    audit: AuditLog
    probe_override: Any = None
    slurm_override: Any = None
    _slurm: Any = field(default=None, repr=False)
    #: ``time.monotonic()`` by which this run must be done (None: no deadline, the watcher).
    deadline: float | None = None

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
        if self.slurm_override is not None:
            base = self.slurm_override
        else:
            if self._slurm is None:
                from slurm_hooks.slurm.factory import from_config

                self._slurm = from_config(self.config)
            base = self._slurm
        bounded = getattr(base, "bounded", None)
        return base if self.deadline is None or bounded is None else bounded(self.deadline)

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
