"""``[bridge]`` settings: a typed view of the loaded :class:`~slurm_hooks.config.Config`.

The keys, their types, their defaults and their checks live in
:data:`slurm_hooks.config.BRIDGE_SCHEMA` with the rest of the config; errors name the
file, the line and the key, so a typo stops the bridge before it touches a node.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from slurm_hooks import config
from slurm_hooks.config import Config, bridge_default
from slurm_hooks.errors import ConfigError
from slurm_hooks.models import Action

MAPPINGS = config.BRIDGE_ENUMS[("bridge", "mapping")]
BACKENDS = config.BRIDGE_ENUMS[("bridge.replace", "backend")]


def _top(key: str) -> Any:
    return bridge_default("bridge", key)


def _breaker(key: str) -> Any:
    return bridge_default("bridge.breaker", key)


def _replace(key: str) -> Any:
    return bridge_default("bridge.replace", key)


@dataclass(frozen=True)
class BreakerSettings:
    """``[bridge.breaker]``; what each key means: :data:`slurm_hooks.config.BRIDGE_SCHEMA`."""

    max_percent: float = _breaker("max_percent")
    max_nodes: int = _breaker("max_nodes")
    window: float = _breaker("window")


@dataclass(frozen=True)
class ReplaceSettings:
    """``[bridge.replace]``."""

    backend: str = _replace("backend")
    karpenter_version: str = _replace("karpenter_version")
    capi_version: str = _replace("capi_version")
    template: str = _replace("template")
    plural: str = _replace("plural")
    cancel_on_recovery: bool = _replace("cancel_on_recovery")


def _reboot(key: str) -> Any:
    return bridge_default("bridge.reboot", key)


@dataclass(frozen=True)
class RebootSettings:
    """``[bridge.reboot]``: how a node drained ``[reboot]`` is asked to reboot."""

    backend: str = _reboot("backend")
    template: str = _reboot("template")
    plural: str = _reboot("plural")
    annotation: str = _reboot("annotation")
    cancel_on_recovery: bool = _reboot("cancel_on_recovery")


@dataclass(frozen=True)
class CapiSettings:
    """``[bridge.capi]``: where Cluster API's Machines live when the management cluster is not this one."""

    #: The management cluster's kubeconfig ("" = this cluster: a self-hosted management cluster).
    kubeconfig: str = config.bridge_default("bridge.capi", "kubeconfig")
    context: str = config.bridge_default("bridge.capi", "context")


@dataclass(frozen=True)
class BridgeSettings:
    """``[bridge]``."""

    interval: float = _top("interval")
    trigger_actions: tuple[Action, ...] = tuple(Action(a) for a in _top("trigger_actions"))
    mapping: str = _top("mapping")
    slinky_namespace: str = _top("slinky_namespace")
    taint_key: str = _top("taint_key")
    condition_type: str = _top("condition_type")
    event_namespace: str = _top("event_namespace")
    opt_out_label: str = _top("opt_out_label")
    drain: bool = _top("drain")
    max_job_wait: float = _top("max_job_wait")
    drain_force: bool = _top("drain_force")
    drain_delete_emptydir_data: bool = _top("drain_delete_emptydir_data")
    drain_timeout: float = _top("drain_timeout")
    drain_pass_budget: float = _top("drain_pass_budget")
    request_timeout: float = _top("request_timeout")
    retries: int = _top("retries")
    state_file: str = _top("state_file")
    leader_election: bool = _top("leader_election")
    lease_namespace: str = _top("lease_namespace")
    lease_name: str = _top("lease_name")
    lease_duration: float = _top("lease_duration")
    kubeconfig: str = _top("kubeconfig")
    context: str = _top("context")
    #: Seconds the bridge may hold a machine before it counts in ``slurm_hooks_bridge_held_too_long_nodes``
    #: and is alerted.
    held_alert_after: float = _top("held_alert_after")
    #: ``[bridge.nodes]``: Slurm node name -> Kubernetes node name, for bare metal where they differ.
    nodes: dict[str, str] = field(default_factory=dict)
    breaker: BreakerSettings = BreakerSettings()
    replace: ReplaceSettings = ReplaceSettings()
    reboot: RebootSettings = RebootSettings()
    capi: CapiSettings = CapiSettings()


def _view(values: dict[str, dict[str, Any]]) -> BridgeSettings:
    top = dict(values["bridge"])
    top["trigger_actions"] = tuple(Action(a) for a in top["trigger_actions"])
    return BridgeSettings(**top, nodes=values["bridge.nodes"], breaker=BreakerSettings(**values["bridge.breaker"]),
                          replace=ReplaceSettings(**values["bridge.replace"]),
                          reboot=RebootSettings(**values["bridge.reboot"]),
                          capi=CapiSettings(**values.get("bridge.capi", {})))


def from_config(cfg: Config) -> BridgeSettings:
    """``cfg``'s ``[bridge]`` section; raise :class:`ConfigError` naming file, line and key."""
    return _view(cfg.bridge_values())


def parse(raw: dict) -> BridgeSettings:
    """A ``[bridge]`` table given as a dict (no file, so errors name no line)."""
    return _view(config.check_bridge(raw))


def with_overrides(settings: BridgeSettings, **changes: Any) -> BridgeSettings:
    """``dataclasses.replace`` that ignores ``None`` (unset command-line options)."""
    return dataclasses.replace(settings, **{k: v for k, v in changes.items() if v is not None})


__all__ = ["BridgeSettings", "BreakerSettings", "ReplaceSettings", "ConfigError", "from_config", "parse"]
