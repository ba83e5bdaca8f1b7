"""``[bridge]`` and its tables: one class per table, one field per key, as the rest of the config.

Declared here, with the bridge, and read from the loaded :class:`~slurm_hooks.config.Config`'s raw
table on demand (:func:`from_config`), never on the node side's path: a typo in ``[bridge]`` stops the
bridge, not the health check of every node that shares the file. Errors name the file, the line and
the key, as every config error does.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from slurm_hooks.config import Config, Locator, check_table, choices, spec
from slurm_hooks.errors import ConfigError
from slurm_hooks.models import Action
from slurm_hooks.values import dataclass, field, setting

_WAIT = ("The node is cordoned and tainted at once; its pods are evicted and the replacement requested only once "
         "Slurm has no job left on it (drained, not draining, and no job listing it), or this many seconds after it "
         "was taken, whichever comes first. Longer than the checkpoint grace: KillWait (120 s) + [remediation] "
         "requeue_grace (120 s) + a margin. 0 = never force: wait for the jobs however long they run.")
_LEASE = ("One bridge acts at a time: replicas hold a coordination.k8s.io Lease (the breaker's state lives in it; "
          "false: one process only, the state in state_file). lease_namespace \"\" = the pod's own namespace (else "
          "\"default\"); lease_duration: seconds without a renewal before a standby takes over.")


@dataclass(frozen=True)
class BreakerSection:
    """``[bridge.breaker]``."""

    max_percent: float = setting(20.0, doc="At most max_percent of all Slurm nodes, and at most max_nodes, taken in "
                                           "`window` seconds. The first node over the cap trips it: no new node is "
                                           "taken until `slurm-hooks bridge reset-breaker` or the window passes.")
    max_nodes: int = setting(10, doc="see `max_percent`")
    window: float = setting(600.0, doc="see `max_percent`")


@dataclass(frozen=True)
class ReplaceSection:
    """``[bridge.replace]``: how a replacement is requested."""

    backend: str = setting("condition", choices=("condition", "karpenter", "capi", "template"),
                           doc='"condition": the GpuHealthy=False condition is the request (MachineHealthCheck, '
                               'medik8s). "karpenter": delete the node\'s NodeClaim. "capi": annotate its Cluster API '
                               'Machine cluster.x-k8s.io/remediate-machine. "template": create a custom resource '
                               'rendered from `template` (jinja2; YAML or JSON).')
    karpenter_version: str = setting("v1", doc="see `backend`")
    capi_version: str = setting("v1beta1", doc="see `backend`")
    template: str = setting("", doc="see `backend`")
    plural: str = setting("", doc="see `backend`")
    cancel_on_recovery: bool = setting(True, doc="Withdraw the request (CAPI annotation, templated resource) if the "
                                                 "node recovers first.")


@dataclass(frozen=True)
class RebootSection:
    """``[bridge.reboot]``: how a node drained ``[reboot]`` is asked to reboot."""

    backend: str = setting("none", choices=("none", "template", "annotation"),
                           doc='How a node drained [reboot] is asked to reboot: "none": like [replace], through the '
                               'replacement backend above. "template": create a custom resource rendered from '
                               '`template` (NVSentinel RebootNode, medik8s SelfNodeRemediation); `plural` is its '
                               'resource name. "annotation": set `annotation` on the Kubernetes node (a prefixed '
                               'key) for a reboot controller.')
    template: str = setting("", doc="see `backend`")
    plural: str = setting("", doc="see `backend`")
    annotation: str = setting("slurm-hooks.io/reboot-requested", doc="see `backend`")
    cancel_on_recovery: bool = setting(True, doc="Withdraw the request if the node recovers first.")


@dataclass(frozen=True)
class CapiSection:
    """``[bridge.capi]``: where Cluster API's Machines live when the management cluster is not this one."""

    kubeconfig: str = setting("", doc='backend = "capi" where Cluster API\'s Machines live in a separate management '
                                      'cluster: its kubeconfig and context ("" = this cluster, a self-hosted '
                                      'management cluster). A MachineHealthCheck there must select the Machine, or '
                                      'nothing acts on the request.')
    context: str = setting("", doc="see `kubeconfig`")


@dataclass(frozen=True)
class BridgeSection:
    """``[bridge]``; its tables are fields too (``breaker``, ``replace``, ``reboot``, ``capi``, ``nodes``)."""

    interval: float = setting(30.0, doc="Seconds between passes.")
    trigger_actions: tuple[str, ...] = setting(  # kept as Action values (a str each)
        (Action.REBOOT, Action.REPLACE), doc='Actions in our drain reason ("slurm-hooks: XID 79 on GPU 3 [replace]") that mean '
                                   '"cordon, drain, request a replacement". drain and reset are fixed on the node or '
                                   'by a person, so they are not here by default.')
    mapping: str = setting("auto", choices=("auto", "slinky", "name"),
                           doc='Slurm node -> Kubernetes node: "auto" (Slinky Comment JSON, then [bridge.nodes], then '
                               'the same name), "slinky" (Comment JSON, then the slurmd pod\'s label), or "name" '
                               '([bridge.nodes], then the same name).')
    slinky_namespace: str = setting("slurm", doc='Namespace of the Slinky slurmd pods (mapping = "slinky" pod lookup).')
    taint_key: str = setting("slurm-hooks.io/gpu-unhealthy",
                             doc='Our NoSchedule taint; its value is the action ("replace", "reboot").')
    condition_type: str = setting("GpuHealthy", doc="The node condition repair controllers watch (Cluster API "
                                                    "MachineHealthCheck, medik8s NodeHealthCheck): GpuHealthy=False "
                                                    "while the node is bad.")
    event_namespace: str = setting("default", doc='Where Events about Nodes go (kubectl shows node events from '
                                                  '"default").')
    opt_out_label: str = setting("slurm-hooks.io/do-not-remediate",
                                 doc='A pod with this label (or annotation) = "true" keeps its node from being drained '
                                     'or replaced: cordon and alert only. karpenter.sh/do-not-disrupt is always '
                                     'honoured too, and the node label remediation.medik8s.io/exclude-from-remediation.')
    drain: bool = setting(True, doc="Evict the node's pods (kubectl drain's filters: DaemonSet and mirror pods stay).")
    max_job_wait: float = setting(300.0, doc=_WAIT)
    drain_force: bool = setting(False, doc="kubectl drain --force: also evict pods that no controller owns (they are "
                                           "gone for good). false: such pods are left, named in an audit record and "
                                           "an Event on the node.")
    drain_delete_emptydir_data: bool = setting(False, doc="kubectl drain --delete-emptydir-data: also evict pods with "
                                                          "emptyDir volumes (their data is lost). false: left and "
                                                          "reported, like the above.")
    drain_timeout: float = setting(600.0, doc="Give up waiting for PodDisruptionBudgets after this many seconds "
                                              "(counted from the first eviction, across passes); the replacement is "
                                              "then requested anyway.")
    drain_pass_budget: float = setting(30.0, doc="At most this many seconds of one pass are spent retrying blocked "
                                                 "evictions and waiting for evicted pods to be deleted: one budget "
                                                 "for all the nodes draining in the pass.")
    request_timeout: float = setting(10.0, doc="Per-request timeout and retries (429, 5xx, timeouts, connection "
                                               "refused).")
    retries: int = setting(3, doc="see `request_timeout`")
    state_file: str = setting("/var/lib/slurm-hooks/bridge-state.json",
                              doc="The circuit breaker's state with leader_election = false; see docs/bridge.md.")
    leader_election: bool = setting(True, doc=_LEASE)
    lease_namespace: str = setting("", doc="see `leader_election`")
    lease_name: str = setting("slurm-hooks-bridge", doc="see `leader_election`")
    lease_duration: float = setting(60.0, doc="see `leader_election`")
    kubeconfig: str = setting("", doc='Credentials: "" = in-cluster service account, else $KUBECONFIG / '
                                      '~/.kube/config.')
    context: str = setting("", doc="see `kubeconfig`")
    held_alert_after: float = setting(86400.0, doc="Seconds the bridge may hold a machine (cordoned, a request open) "
                                                   "before it counts in slurm_hooks_bridge_held_too_long_nodes and "
                                                   "raises SlurmHooksBridgeHeldTooLong.")
    #: ``[bridge.nodes]``: Slurm node name -> Kubernetes node name, for bare metal where they differ.
    nodes: dict[str, str] = field(default_factory=dict)
    breaker: BreakerSection = BreakerSection()
    replace: ReplaceSection = ReplaceSection()
    reboot: RebootSection = RebootSection()
    capi: CapiSection = CapiSection()


#: Table -> its class; ``[bridge]``'s own keys are the fields of :class:`BridgeSection` that are not tables.
TABLES: dict[str, type] = {"bridge": BridgeSection, "bridge.breaker": BreakerSection,
                           "bridge.replace": ReplaceSection, "bridge.reboot": RebootSection, "bridge.capi": CapiSection}
SUBTABLES = ("breaker", "replace", "reboot", "capi", "nodes")
MAPPINGS = choices(BridgeSection)["mapping"]
BACKENDS = choices(ReplaceSection)["backend"]
#: The actions ``trigger_actions`` may name (:class:`slurm_hooks.models.Action` values).
_ACTIONS = tuple(a.value for a in Action)


def keys(table: str) -> dict[str, tuple[Any, Any, Any, Any]]:
    """A table's keys (:func:`slurm_hooks.config.spec`), without ``[bridge]``'s own tables."""
    return spec(TABLES[table], SUBTABLES)


def check_bridge(raw: dict, where: Locator | None = None) -> BridgeSection:
    """``[bridge]`` and its tables with defaults filled in; a bad value raises :class:`ConfigError`
    naming file, line and key."""
    where = copy.copy(where or Locator("", None))
    where.header_fallback = True  # a key left at its default is blamed on its table's header
    fail = where.fail

    for name in SUBTABLES:
        if name in raw and not isinstance(raw[name], dict):
            fail(f"bridge.{name}", None, "must be a table")
    tables = {"bridge": raw}
    tables.update({f"bridge.{n}": raw.get(n, {}) for n in ("breaker", "replace", "reboot", "capi")})
    values = {}
    for table in TABLES:
        values[table] = check_table(tables[table], keys(table), table, where, SUBTABLES if table == "bridge" else ())
    for table, cls in TABLES.items():
        for key, allowed in choices(cls).items():
            if values[table][key] not in allowed:
                fail(table, key, f"must be one of {', '.join(allowed)}, not {values[table][key]!r}")

    top = values["bridge"]
    for item in top["trigger_actions"]:
        if item not in _ACTIONS:
            fail("bridge", "trigger_actions", f"unknown action {item!r} (known: {', '.join(_ACTIONS)})")
    if not top["trigger_actions"]:
        fail("bridge", "trigger_actions", "must name at least one action (e.g. [\"replace\"])")
    top["trigger_actions"] = tuple(Action(a) for a in top["trigger_actions"])
    for key in ("interval", "request_timeout", "drain_timeout", "lease_duration"):
        if top[key] <= 0:
            fail("bridge", key, f"must be greater than 0, got {top[key]!r}")
    for key in ("taint_key", "condition_type", "opt_out_label", "event_namespace"):
        if not top[key]:
            fail("bridge", key, "must not be empty")

    breaker = values["bridge.breaker"]
    if not 0 < breaker["max_percent"] <= 100:
        fail("bridge.breaker", "max_percent", f"must be in (0, 100], got {breaker['max_percent']!r}")
    if breaker["max_nodes"] < 1:
        fail("bridge.breaker", "max_nodes", "must be at least 1 (the breaker cannot be switched off)")
    if breaker["window"] <= 0:
        fail("bridge.breaker", "window", f"must be greater than 0, got {breaker['window']!r}")

    for table in ("bridge.replace", "bridge.reboot"):
        chosen = values[table]
        if chosen["backend"] == "template":
            if not chosen["template"]:
                fail(table, "template", "backend = \"template\" needs a template path")
            if not chosen["plural"]:
                fail(table, "plural", "backend = \"template\" needs the resource's plural name")
            _check_template(chosen["template"], fail, table)
    if values["bridge.reboot"]["backend"] == "annotation" and "/" not in values["bridge.reboot"]["annotation"]:
        fail("bridge.reboot", "annotation", "must be a prefixed key (example.org/name), not "
                                            f"{values['bridge.reboot']['annotation']!r}")

    nodes = raw.get("nodes", {})
    for key, value in nodes.items():
        if not isinstance(value, str) or not value:
            fail("bridge.nodes", key, f"expected a Kubernetes node name, got {value!r}")
    return BridgeSection(**top, nodes=dict(nodes), breaker=BreakerSection(**breaker),
                         replace=ReplaceSection(**values["bridge.replace"]),
                         reboot=RebootSection(**values["bridge.reboot"]), capi=CapiSection(**values["bridge.capi"]))


def _check_template(path: str, fail: Any, table: str = "bridge.replace") -> None:
    import jinja2  # the bridge's dependency; never imported on the node side's path

    try:
        with open(path, encoding="utf-8") as fh:
            source = fh.read()
    except OSError as exc:
        fail(table, "template", f"cannot read {path}: {exc.strerror}")
        return
    try:
        jinja2.Environment(undefined=jinja2.StrictUndefined).parse(source)
    except jinja2.TemplateSyntaxError as exc:
        fail(table, "template", f"{path}:{exc.lineno}: {exc.message}")


def from_config(cfg: Config) -> BridgeSection:
    """``cfg``'s ``[bridge]`` section; raise :class:`ConfigError` naming file, line and key."""
    return check_bridge(cfg.raw.get("bridge", {}) or {}, cfg.where or Locator("", cfg.path))


def parse(raw: dict) -> BridgeSection:
    """A ``[bridge]`` table given as a dict (no file, so errors name no line)."""
    return check_bridge(raw)


def with_overrides(settings: BridgeSection, **changes: Any) -> BridgeSection:
    """``dataclasses.replace`` that ignores ``None`` (unset command-line options)."""
    return dataclasses.replace(settings, **{k: v for k, v in changes.items() if v is not None})


__all__ = ["BreakerSection", "BridgeSection", "CapiSection", "ConfigError", "RebootSection", "ReplaceSection",
           "from_config", "parse"]
