"""Exactly the permissions the bridge uses: one list for ``render`` (the RBAC) and ``validate``.

Every configured backend adds its own rule: the replacement backend and the reboot backend
(a reboot template creates, say, NVSentinel's RebootNode: without its rule every create is a
403 and the node stays cordoned, never rebooted). What is namespaced gets a Role in its own
namespace, not a ClusterRole rule: the leader's Lease in ``lease_namespace`` (the bridge's own
when empty), get/update on that one Lease by name (``resourceNames``; a create cannot be limited
by name in RBAC), and the Events in ``event_namespace``.
"""

from __future__ import annotations

from dataclasses import dataclass

from slurm_hooks.bridge.settings import BridgeSection, RebootSection, ReplaceSection


@dataclass(frozen=True)
class Rule:
    group: str
    resource: str
    verbs: tuple[str, ...]
    why: str
    #: "" for the ClusterRole; a namespace's rules go into a Role there (the leader's Lease).
    namespaced: bool = False
    #: The Role's namespace ("" = the bridge's own namespace, known only where it runs).
    namespace: str = ""
    #: ``resourceNames``: only these objects ("" = any).
    names: tuple[str, ...] = ()


#: What every backend needs (see api.KubeApi): no watch, no get on pods, no delete of anything core.
CORE: tuple[Rule, ...] = (
    Rule("", "nodes", ("get", "list", "patch"), "read nodes, LIST the ones we hold, cordon/taint/annotate"),
    Rule("", "nodes/status", ("patch",), "set the GpuHealthy condition"),
    Rule("", "pods", ("list",), "pods on a node (field selector; again until evicted pods are gone), the Slinky "
         "slurmd pod (label selector)"),
    Rule("", "pods/eviction", ("create",), "drain by eviction, honouring PodDisruptionBudgets"),
)

#: The leader's Lease (and the breaker's state in it), in the bridge's own namespace.
LEASE = Rule("coordination.k8s.io", "leases", ("get", "create", "update"),
             "one leader: the Lease, and the circuit breaker's state in its annotation", namespaced=True)


def _template_rule(plural: str, group: str, cancel_on_recovery: bool, why: str) -> Rule:
    # get: tell our own object (its created-for marker) from one that was there before.
    verbs = ("create", "get", "delete") if cancel_on_recovery else ("create", "get")
    return Rule(group, plural, verbs, why)


def backend_rules(replace: ReplaceSection, template_group: str = "") -> tuple[Rule, ...]:
    if replace.backend == "karpenter":
        return (Rule("karpenter.sh", "nodeclaims", ("get", "list", "delete"),
                     "find the bad node's NodeClaim (its owner reference, else a LIST) and delete it"),)
    if replace.backend == "capi":
        return (Rule("cluster.x-k8s.io", "machines", ("get", "patch"), "annotate the Machine remediate-machine"),
                Rule("cluster.x-k8s.io", "machinehealthchecks", ("list",),
                     "a MachineHealthCheck must select the Machine, or nothing acts on the annotation"))
    if replace.backend == "template":
        return (_template_rule(replace.plural, template_group, replace.cancel_on_recovery,
                               "create the rendered remediation request"),)
    return ()


def reboot_rules(reboot: RebootSection, template_group: str = "") -> tuple[Rule, ...]:
    """``[bridge.reboot]``'s own rule: a template's resource; the annotation backend patches nodes (CORE)."""
    if reboot.backend == "template":
        return (_template_rule(reboot.plural, template_group, reboot.cancel_on_recovery,
                               "create the rendered reboot request"),)
    return ()


def events_rule(settings: BridgeSection) -> Rule:
    return Rule("", "events", ("create",), "an Event on the Node for each step", namespaced=True,
                namespace=settings.event_namespace)


def lease_rules(settings: BridgeSection) -> tuple[Rule, ...]:
    """The leader's Lease, in ``lease_namespace``: get and update that Lease only; create (the first
    bridge makes it) cannot be limited by name."""
    why = "one leader: the Lease, and the circuit breaker's state in its annotation"
    return (Rule(LEASE.group, LEASE.resource, ("get", "update"), why, namespaced=True,
                 namespace=settings.lease_namespace, names=(settings.lease_name,)),
            Rule(LEASE.group, LEASE.resource, ("create",), "the first bridge creates the Lease", namespaced=True,
                 namespace=settings.lease_namespace))


def rules(settings: BridgeSection, groups: dict[str, str] | None = None) -> tuple[Rule, ...]:
    """Every rule the bridge needs with these settings; ``groups``: the API group of each template
    backend's resource (``{"replace": ..., "reboot": ...}``, see ``replace.template_groups``)."""
    groups = groups or {}
    out = CORE + backend_rules(settings.replace, groups.get("replace", "")) \
        + reboot_rules(settings.reboot, groups.get("reboot", ""))
    seen: dict[tuple[str, str], Rule] = {}
    for rule in out:  # a reboot and a replacement template on one resource: one rule, verbs merged
        key = (rule.group, rule.resource)
        if key in seen:
            verbs = tuple(dict.fromkeys(seen[key].verbs + rule.verbs))
            seen[key] = Rule(rule.group, rule.resource, verbs, f"{seen[key].why}; {rule.why}")
        else:
            seen[key] = rule
    return tuple(seen.values()) + (events_rule(settings),) + (lease_rules(settings) if settings.leader_election else ())
