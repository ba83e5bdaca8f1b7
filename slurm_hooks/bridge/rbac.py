"""Exactly the permissions the bridge uses: one list for ``render`` (the ClusterRole) and ``validate``."""

from __future__ import annotations

from dataclasses import dataclass

from slurm_hooks.bridge.settings import ReplaceSettings


@dataclass(frozen=True)
class Rule:
    group: str
    resource: str
    verbs: tuple[str, ...]
    why: str


#: What every backend needs (see api.KubeApi): no watch, no get on pods, no delete of anything core.
CORE: tuple[Rule, ...] = (
    Rule("", "nodes", ("get", "list", "patch"), "read nodes, LIST the ones we hold, cordon/taint/annotate"),
    Rule("", "nodes/status", ("patch",), "set the GpuHealthy condition"),
    Rule("", "pods", ("list",), "pods on a node (field selector), the Slinky slurmd pod (label selector)"),
    Rule("", "pods/eviction", ("create",), "drain by eviction, honouring PodDisruptionBudgets"),
    Rule("", "events", ("create",), "an Event on the Node for each step"),
)


def backend_rules(replace: ReplaceSettings, template_group: str = "") -> tuple[Rule, ...]:
    if replace.backend == "karpenter":
        return (Rule("karpenter.sh", "nodeclaims", ("list", "delete"), "delete the bad node's NodeClaim"),)
    if replace.backend == "capi":
        return (Rule("cluster.x-k8s.io", "machines", ("get", "patch"), "annotate the Machine remediate-machine"),)
    if replace.backend == "template":
        # get: tell our own object (its created-for marker) from one that was there before.
        verbs = ("create", "get", "delete") if replace.cancel_on_recovery else ("create", "get")
        return (Rule(template_group, replace.plural, verbs, "create the rendered remediation request"),)
    return ()


def rules(replace: ReplaceSettings, template_group: str = "") -> tuple[Rule, ...]:
    return CORE + backend_rules(replace, template_group)
