"""``[bridge]`` settings: validated here (config.py keeps the section raw), with defaults.

Every error names the file, the line and the key, like the rest of the config:
a typo in the bridge's settings must stop the bridge before it touches a node.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from slurm_hooks.config import Config, _Locator
from slurm_hooks.errors import ConfigError
from slurm_hooks.models import Action

_Num = (int, float)

MAPPINGS = ("auto", "slinky", "name")
BACKENDS = ("condition", "karpenter", "capi", "template")


@dataclass(frozen=True)
class BreakerSettings:
    #: At most this share of all nodes may be taken by the bridge in one window...
    max_percent: float = 20.0
    #: ...and at most this many, whichever is smaller (never below one node).
    max_nodes: int = 10
    #: Sliding window, seconds; a tripped breaker also stays open this long.
    window: float = 600.0


@dataclass(frozen=True)
class ReplaceSettings:
    backend: str = "condition"
    karpenter_version: str = "v1"
    capi_version: str = "v1beta1"
    #: backend = "template": a jinja2 template rendering one object (YAML or JSON).
    template: str = ""
    #: backend = "template": the resource's plural name, needed for its URL.
    plural: str = ""
    #: backend = "template" / "capi": withdraw the request when the node recovers first.
    cancel_on_recovery: bool = True


@dataclass(frozen=True)
class RebootSettings:
    """How a node drained ``[reboot]`` is asked to reboot. ``none``: like ``[replace]`` (the
    replacement backend); ``template``: a custom resource rendered from a jinja2 template (an
    NVSentinel RebootNode, a medik8s SelfNodeRemediation); ``annotation``: an annotation on the node."""

    backend: str = "none"
    template: str = ""
    plural: str = ""
    annotation: str = "slurm-hooks.io/reboot-requested"
    cancel_on_recovery: bool = True


@dataclass(frozen=True)
class BridgeSettings:
    interval: float = 30.0
    #: Actions in our drain reason (``[replace]``) that mean "cordon, drain, replace".
    trigger_actions: tuple[Action, ...] = (Action.REBOOT, Action.REPLACE)
    mapping: str = "auto"
    slinky_namespace: str = "slurm"
    taint_key: str = "slurm-hooks.io/gpu-unhealthy"
    condition_type: str = "GpuHealthy"
    event_namespace: str = "default"
    #: A pod carrying this label (or annotation) = "true" opts its node out of drain and replacement.
    opt_out_label: str = "slurm-hooks.io/do-not-remediate"
    drain: bool = True
    #: Longest wait, from the take, for Slurm's jobs to leave the node before its pods are
    #: evicted and the replacement is requested anyway; 0 = wait for ever. The default is
    #: KillWait (120 s recommended) + [remediation] requeue_grace (120 s) + a minute.
    max_job_wait: float = 300.0
    #: kubectl drain --force: also evict pods that no controller would recreate.
    drain_force: bool = False
    #: kubectl drain --delete-emptydir-data: also evict pods with emptyDir volumes (their data is lost).
    drain_delete_emptydir_data: bool = False
    drain_timeout: float = 600.0
    #: Seconds one pass may spend retrying blocked evictions on one node before moving on.
    drain_pass_budget: float = 30.0
    request_timeout: float = 10.0
    retries: int = 3
    state_file: str = "/var/lib/slurm-hooks/bridge-state.json"
    kubeconfig: str = ""
    context: str = ""
    #: Slurm node name -> Kubernetes node name, for bare metal where they differ.
    nodes: dict[str, str] = field(default_factory=dict)
    breaker: BreakerSettings = BreakerSettings()
    replace: ReplaceSettings = ReplaceSettings()
    reboot: RebootSettings = RebootSettings()


_TOP: dict[str, tuple[Any, Any]] = {
    "interval": (_Num, 30.0),
    "trigger_actions": (list, ["reboot", "replace"]),
    "mapping": (str, "auto"),
    "slinky_namespace": (str, "slurm"),
    "taint_key": (str, "slurm-hooks.io/gpu-unhealthy"),
    "condition_type": (str, "GpuHealthy"),
    "event_namespace": (str, "default"),
    "opt_out_label": (str, "slurm-hooks.io/do-not-remediate"),
    "drain": (bool, True),
    "max_job_wait": (_Num, 300.0),
    "drain_force": (bool, False),
    "drain_delete_emptydir_data": (bool, False),
    "drain_timeout": (_Num, 600.0),
    "drain_pass_budget": (_Num, 30.0),
    "request_timeout": (_Num, 10.0),
    "retries": (int, 3),
    "state_file": (str, "/var/lib/slurm-hooks/bridge-state.json"),
    "kubeconfig": (str, ""),
    "context": (str, ""),
}
_BREAKER: dict[str, tuple[Any, Any]] = {
    "max_percent": (_Num, 20.0),
    "max_nodes": (int, 10),
    "window": (_Num, 600.0),
}
_REPLACE: dict[str, tuple[Any, Any]] = {
    "backend": (str, "condition"),
    "karpenter_version": (str, "v1"),
    "capi_version": (str, "v1beta1"),
    "template": (str, ""),
    "plural": (str, ""),
    "cancel_on_recovery": (bool, True),
}
_REBOOT: dict[str, tuple[Any, Any]] = {
    "backend": (str, "none"),
    "template": (str, ""),
    "plural": (str, ""),
    "annotation": (str, "slurm-hooks.io/reboot-requested"),
    "cancel_on_recovery": (bool, True),
}
REBOOT_BACKENDS = ("none", "template", "annotation")
_SUBTABLES = ("breaker", "replace", "reboot", "nodes")


def _type_name(accepted: Any) -> str:
    if accepted is _Num:
        return "a number"
    return {str: "a string", int: "an integer", bool: "true or false", list: "a list"}[accepted]


def _check(table: dict, schema: dict, section: str, where: _Locator, skip: tuple[str, ...] = ()) -> dict:
    values: dict[str, Any] = {}
    for key, value in table.items():
        if key in skip:
            continue
        if key not in schema:
            where.fail(section, key, f"unknown key (known: {', '.join(sorted([*schema, *skip]))})")
        accepted, _ = schema[key]
        ok = not (isinstance(value, bool) and accepted is not bool) and isinstance(value, accepted)
        if not ok:
            where.fail(section, key, f"expected {_type_name(accepted)}, got {type(value).__name__} {value!r}")
        if isinstance(value, _Num) and not isinstance(value, bool) and value < 0:
            where.fail(section, key, f"must not be negative, got {value!r}")
    for key, (_, default) in schema.items():
        values[key] = table.get(key, default)
    return values


class _Where(_Locator):
    """config's locator, falling back to the section's header for a key that is missing."""

    def fail(self, section: str, key: str | None, message: str) -> None:
        line = self.line_of(section, key) if key else None
        if line is None:
            line = self.line_of(section, None)
        label = f"[{section}] {key}" if key else f"[{section}]"
        raise ConfigError(message, self.path, line, label)


def _locator(cfg: Config) -> _Locator:
    text = ""
    if cfg.path and os.path.exists(cfg.path):
        with open(cfg.path, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    return _Where(text, cfg.path)


def from_config(cfg: Config) -> BridgeSettings:
    """Validate ``cfg.raw["bridge"]``; raise :class:`ConfigError` naming file, line and key."""
    raw = cfg.raw.get("bridge", {}) or {}
    return parse(raw, _locator(cfg))


def parse(raw: dict, where: _Locator | None = None) -> BridgeSettings:
    where = where or _Where("", None)
    for name in _SUBTABLES:
        if name in raw and not isinstance(raw[name], dict):
            where.fail(f"bridge.{name}", None, "must be a table")
    top = _check(raw, _TOP, "bridge", where, skip=_SUBTABLES)
    breaker = _check(raw.get("breaker", {}), _BREAKER, "bridge.breaker", where)
    replace = _check(raw.get("replace", {}), _REPLACE, "bridge.replace", where)
    reboot = _check(raw.get("reboot", {}), _REBOOT, "bridge.reboot", where)

    actions = []
    known = [a.value for a in Action]
    for item in top["trigger_actions"]:
        if item not in known:
            where.fail("bridge", "trigger_actions", f"unknown action {item!r} (known: {', '.join(known)})")
        actions.append(Action(item))
    if not actions:
        where.fail("bridge", "trigger_actions", "must name at least one action (e.g. [\"replace\"])")
    top["trigger_actions"] = tuple(actions)
    if top["mapping"] not in MAPPINGS:
        where.fail("bridge", "mapping", f"must be one of {', '.join(MAPPINGS)}, not {top['mapping']!r}")
    for key in ("interval", "request_timeout", "drain_timeout"):
        if top[key] <= 0:
            where.fail("bridge", key, f"must be greater than 0, got {top[key]!r}")
    for key in ("taint_key", "condition_type", "opt_out_label", "event_namespace"):
        if not top[key]:
            where.fail("bridge", key, "must not be empty")

    if not 0 < breaker["max_percent"] <= 100:
        where.fail("bridge.breaker", "max_percent", f"must be in (0, 100], got {breaker['max_percent']!r}")
    if breaker["max_nodes"] < 1:
        where.fail("bridge.breaker", "max_nodes", "must be at least 1 (the breaker cannot be switched off)")
    if breaker["window"] <= 0:
        where.fail("bridge.breaker", "window", f"must be greater than 0, got {breaker['window']!r}")

    if replace["backend"] not in BACKENDS:
        where.fail("bridge.replace", "backend", f"must be one of {', '.join(BACKENDS)}, not {replace['backend']!r}")
    if replace["backend"] == "template":
        if not replace["template"]:
            where.fail("bridge.replace", "template", "backend = \"template\" needs a template path")
        if not replace["plural"]:
            where.fail("bridge.replace", "plural", "backend = \"template\" needs the resource's plural name")
        _check_template(replace["template"], where)

    if reboot["backend"] not in REBOOT_BACKENDS:
        where.fail("bridge.reboot", "backend", f"must be one of {', '.join(REBOOT_BACKENDS)}, not {reboot['backend']!r}")
    if reboot["backend"] == "template":
        if not reboot["template"]:
            where.fail("bridge.reboot", "template", "backend = \"template\" needs a template path")
        if not reboot["plural"]:
            where.fail("bridge.reboot", "plural", "backend = \"template\" needs the resource's plural name")
        _check_template(reboot["template"], where, "bridge.reboot")
    if reboot["backend"] == "annotation" and "/" not in reboot["annotation"]:
        where.fail("bridge.reboot", "annotation", f"must be a prefixed key (example.org/name), not {reboot['annotation']!r}")

    nodes = raw.get("nodes", {})
    for key, value in nodes.items():
        if not isinstance(value, str) or not value:
            where.fail("bridge.nodes", key, f"expected a Kubernetes node name, got {value!r}")

    return BridgeSettings(
        **top,
        nodes=dict(nodes),
        breaker=BreakerSettings(**breaker),
        replace=ReplaceSettings(**replace),
        reboot=RebootSettings(**reboot),
    )


def _check_template(path: str, where: _Locator, section: str = "bridge.replace") -> None:
    import jinja2

    try:
        with open(path, encoding="utf-8") as fh:
            source = fh.read()
    except OSError as exc:
        where.fail(section, "template", f"cannot read {path}: {exc.strerror}")
        return
    try:
        jinja2.Environment(undefined=jinja2.StrictUndefined).parse(source)
    except jinja2.TemplateSyntaxError as exc:
        where.fail(section, "template", f"{path}:{exc.lineno}: {exc.message}")


def with_overrides(settings: BridgeSettings, **changes: Any) -> BridgeSettings:
    """``dataclasses.replace`` that ignores ``None`` (unset command-line options)."""
    return dataclasses.replace(settings, **{k: v for k, v in changes.items() if v is not None})


__all__ = ["BridgeSettings", "BreakerSettings", "ReplaceSettings", "ConfigError", "from_config", "parse"]
