"""Ways to ask for a replacement machine, behind one small interface.

- ``condition``: the ``GpuHealthy=False`` node condition the reconciler sets is
  the request; Cluster API MachineHealthCheck or medik8s NodeHealthCheck act on
  it after their timeout. No extra permission, no extra call.
- ``karpenter``: delete the node's NodeClaim (Karpenter drains, terminates and
  launches a new one).
- ``capi``: annotate the node's Cluster API Machine with
  ``cluster.x-k8s.io/remediate-machine`` (MachineHealthCheck's manual trigger).
- ``template``: create a custom resource rendered from a jinja2 template (a
  medik8s remediation CR named after the node, an NVSentinel-style
  RebootNode/TerminateNode, or one of your own). What it creates carries the
  annotation ``slurm-hooks.io/created-for: <node>/<take>``, and ``cancel``
  deletes only an object carrying the marker of the request it withdraws:
  never one that already existed when the backend was asked.

Each ``request`` is idempotent: run twice, it asks once.

A node drained ``[reboot]`` (the node side's repair ladder asks Slurm for a reboot; on
Kubernetes the reboot is a request too) goes to a reboot backend when one is configured
(``[bridge.reboot]``): ``template`` (an NVSentinel ``RebootNode``, cluster-scoped with
``spec.nodeName``, or a medik8s ``SelfNodeRemediation``) or ``annotation`` (an annotation
on the node, for a reboot daemon that watches for it). Without one, ``[reboot]`` is
handled like ``[replace]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from slurm_hooks.bridge.api import KubeApi, KubeConflict, Obj, Resource, annotations_of, meta, name_of
from slurm_hooks.bridge.settings import RebootSection, ReplaceSection
from slurm_hooks.errors import ConfigError, PermanentError
from slurm_hooks.models import Action

CAPI_MACHINE_ANNOTATION = "cluster.x-k8s.io/machine"
CAPI_NAMESPACE_ANNOTATION = "cluster.x-k8s.io/cluster-namespace"
CAPI_REMEDIATE_ANNOTATION = "cluster.x-k8s.io/remediate-machine"
#: Cluster API's own opt-outs on a Machine: MachineHealthCheck skips it, or its controllers are paused.
CAPI_OPT_OUTS = ("cluster.x-k8s.io/skip-remediation", "cluster.x-k8s.io/paused")
KARPENTER_DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
#: On an object the template backend created: for which node and which take. ``cancel``
#: deletes an object only when it carries the marker of the request it is withdrawing.
CREATED_FOR_ANNOTATION = "slurm-hooks.io/created-for"


class ReplacementError(PermanentError):
    """The backend cannot ask for this node (no NodeClaim, no Machine, a bad template)."""


@dataclass(frozen=True)
class Target:
    node: Obj
    slurm_node: str
    reason: str
    summary: str
    action: Action
    #: Identifies this take of the node (the ownership record's timestamp, in hex milliseconds).
    take: str = ""

    @property
    def name(self) -> str:
        return name_of(self.node)


class Backend(Protocol):
    name: str
    #: The GpuHealthy=False condition is itself the request (so it waits for Slurm's jobs too).
    condition_is_request: bool
    #: The repair keeps the machine (a reboot): the bridge gives it back once it is back, and ends the request.
    keeps_machine: bool

    def request(self, kube: KubeApi, target: Target, *, dry_run: bool = False) -> str:
        """Ask for a replacement; return what was asked for (kept in the ownership record)."""
        ...

    def cancel(self, kube: KubeApi, node: Obj, ref: str, *, dry_run: bool = False) -> str | None:
        """Withdraw an earlier request when the node recovered first; ``None``: nothing to withdraw."""
        ...


class ConditionBackend:
    name = "condition"
    condition_is_request = True
    keeps_machine = False

    def request(self, kube: KubeApi, target: Target, *, dry_run: bool = False) -> str:
        return "node condition"

    def cancel(self, kube: KubeApi, node: Obj, ref: str, *, dry_run: bool = False) -> str | None:
        return None  # the reconciler sets the condition back to True itself


class KarpenterBackend:
    name = "karpenter"
    condition_is_request = False
    keeps_machine = False

    def __init__(self, version: str = "v1"):
        self.resource = Resource("karpenter.sh", version, "nodeclaims")

    def find(self, kube: KubeApi, node: Obj) -> Obj | None:
        """The node's NodeClaim: by the Node's owner reference (Karpenter v1 makes the NodeClaim
        the Node's owner) with one GET, checked by provider ID; else one paginated LIST from the
        API server's cache, matched by provider ID or node name."""
        node_name = name_of(node)
        provider_id = (node.get("spec") or {}).get("providerID") or ""

        def matches(claim: Obj) -> bool:
            status = claim.get("status") or {}
            return status.get("nodeName") == node_name or bool(provider_id and status.get("providerID") == provider_id)

        owner = next((ref for ref in meta(node).get("ownerReferences") or () if ref.get("kind") == "NodeClaim"), None)
        if owner is not None and owner.get("name"):
            claim = kube.get_object(self.resource, owner["name"])
            if claim is not None and (not owner.get("uid") or meta(claim).get("uid") == owner["uid"]):
                return claim
        return next((claim for claim in kube.list_objects(self.resource) if matches(claim)), None)

    def opt_out(self, kube: KubeApi, node: Obj) -> str | None:
        """Karpenter's pin on the node's NodeClaim (the Node's own is read with the pods'): ``"true"``."""
        claim = self.find(kube, node)
        value = annotations_of(claim or {}).get(KARPENTER_DO_NOT_DISRUPT)
        if claim is not None and str(value).strip().lower() == "true":
            return f"nodeclaim {name_of(claim)} annotation {KARPENTER_DO_NOT_DISRUPT}"
        return None

    def request(self, kube: KubeApi, target: Target, *, dry_run: bool = False) -> str:
        claim = self.find(kube, target.node)
        if claim is None:
            raise ReplacementError(f"no Karpenter NodeClaim for node {target.name}")
        claim_name = name_of(claim)
        if meta(claim).get("deletionTimestamp"):
            return f"nodeclaim/{claim_name} (already being deleted)"
        try:
            # UID only: Karpenter rewrites a NodeClaim's status (and so its resourceVersion) all the time.
            kube.delete_object(self.resource, claim_name, uid=str(meta(claim).get("uid") or ""), dry_run=dry_run)
        except KubeConflict:
            raise ReplacementError(f"NodeClaim {claim_name} was replaced while being deleted; next pass") from None
        return f"nodeclaim/{claim_name} deleted"

    def cancel(self, kube: KubeApi, node: Obj, ref: str, *, dry_run: bool = False) -> str | None:
        return None  # a deleted NodeClaim cannot be taken back


class CapiBackend:
    name = "capi"
    condition_is_request = False
    keeps_machine = False

    def __init__(self, version: str = "v1beta1", cancel_on_recovery: bool = True, management: KubeApi | None = None):
        self.resource = Resource("cluster.x-k8s.io", version, "machines", namespaced=True)
        self.cancel_on_recovery = cancel_on_recovery
        #: The management cluster's API, where the Machines live (``[bridge.capi] kubeconfig``);
        #: ``None``: the workload cluster's own (a self-hosted management cluster).
        self.management = management

    def _api(self, kube: KubeApi) -> KubeApi:
        return self.management if self.management is not None else kube

    def opt_out(self, kube: KubeApi, node: Obj) -> str | None:
        """Cluster API's own pins on the Machine: ``skip-remediation`` (MachineHealthCheck leaves it
        alone) and ``paused``; a node without a Machine annotation has none to read."""
        try:
            machine, namespace = self._machine(node)
        except ReplacementError:
            return None
        found = self._api(kube).get_object(self.resource, machine, namespace)
        ann = annotations_of(found or {})
        for key in CAPI_OPT_OUTS:
            if key in ann:
                return f"machine {namespace}/{machine} annotation {key}"
        return None

    def _machine(self, node: Obj) -> tuple[str, str]:
        ann = annotations_of(node)
        machine, namespace = ann.get(CAPI_MACHINE_ANNOTATION), ann.get(CAPI_NAMESPACE_ANNOTATION)
        if not machine or not namespace:
            raise ReplacementError(
                f"node {name_of(node)} has no {CAPI_MACHINE_ANNOTATION} / {CAPI_NAMESPACE_ANNOTATION} annotation"
            )
        return machine, namespace

    def health_check_for(self, api: KubeApi, machine: Obj) -> Obj | None:
        """The MachineHealthCheck that selects ``machine`` (same namespace and cluster, its selector
        matching the Machine's labels): Cluster API remediates an annotated Machine only through one."""
        checks = Resource(self.resource.group, self.resource.version, "machinehealthchecks", namespaced=True)
        m = meta(machine)
        cluster = str((machine.get("spec") or {}).get("clusterName") or "")
        for mhc in api.list_objects(checks, m.get("namespace") or ""):
            spec = mhc.get("spec") or {}
            if cluster and spec.get("clusterName") and spec["clusterName"] != cluster:
                continue
            if selector_matches(spec.get("selector") or {}, m.get("labels") or {}):
                return mhc
        return None

    def request(self, kube: KubeApi, target: Target, *, dry_run: bool = False) -> str:
        machine, namespace = self._machine(target.node)
        api = self._api(kube)
        found = api.get_object(self.resource, machine, namespace)
        if found is None:
            raise ReplacementError(f"Cluster API Machine {namespace}/{machine} not found"
                                   + ("" if self.management is not None else
                                      " (in a separate management cluster? [bridge.capi] kubeconfig)"))
        if self.health_check_for(api, found) is None:
            raise ReplacementError(
                f"no MachineHealthCheck in namespace {namespace} selects Machine {machine}: Cluster API acts on "
                f"{CAPI_REMEDIATE_ANNOTATION} only through one (create one whose selector matches the Machine)")
        patch = {"metadata": {"annotations": {CAPI_REMEDIATE_ANNOTATION: ""}}}
        if self._api(kube).patch_object(self.resource, machine, patch, namespace, dry_run=dry_run) is None:
            raise ReplacementError(f"Cluster API Machine {namespace}/{machine} not found")
        return f"machine/{namespace}/{machine} annotated"

    def cancel(self, kube: KubeApi, node: Obj, ref: str, *, dry_run: bool = False) -> str | None:
        if not self.cancel_on_recovery:
            return None
        try:
            machine, namespace = self._machine(node)
        except ReplacementError:
            return None
        patch = {"metadata": {"annotations": {CAPI_REMEDIATE_ANNOTATION: None}}}
        if self._api(kube).patch_object(self.resource, machine, patch, namespace, dry_run=dry_run) is None:
            return None
        return f"machine/{namespace}/{machine} annotation removed"


class AnnotationRebootBackend:
    """A reboot request as an annotation on the node (value: the take); removed on recovery."""

    name = "reboot-annotation"
    condition_is_request = False
    keeps_machine = True

    def __init__(self, key: str = "slurm-hooks.io/reboot-requested", cancel_on_recovery: bool = True):
        self.key = key
        self.cancel_on_recovery = cancel_on_recovery

    def request(self, kube: KubeApi, target: Target, *, dry_run: bool = False) -> str:
        value = target.take or "1"
        if annotations_of(target.node).get(self.key) == value:
            return f"node/{target.name} annotated {self.key}={value} (already)"
        kube.patch_node(target.name, {"metadata": {"annotations": {self.key: value}}}, dry_run=dry_run)
        return f"node/{target.name} annotated {self.key}={value}"

    def cancel(self, kube: KubeApi, node: Obj, ref: str, *, dry_run: bool = False) -> str | None:
        if not self.cancel_on_recovery or self.key not in annotations_of(node):
            return None
        kube.patch_node(name_of(node), {"metadata": {"annotations": {self.key: None}}}, dry_run=dry_run)
        return f"node/{name_of(node)} annotation {self.key} removed"


class TemplateBackend:
    name = "template"
    condition_is_request = False

    def __init__(self, template_path: str, plural: str, cancel_on_recovery: bool = True, name: str = "template",
                 keeps_machine: bool = False):
        self.name = name
        #: The reboot backend's objects repair the machine in place (NVSentinel RebootNode, medik8s SNR).
        self.keeps_machine = keeps_machine
        import jinja2

        try:
            with open(template_path, encoding="utf-8") as fh:
                source = fh.read()
        except OSError as exc:
            raise ConfigError(f"cannot read {template_path}: {exc.strerror}", None, None, "[bridge.replace] template") from None
        env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
        env.filters["tojson"] = _tojson
        self.template = env.from_string(source)
        self.path = template_path
        self.plural = plural
        self.cancel_on_recovery = cancel_on_recovery

    def render(self, target: Target) -> tuple[Resource, Obj]:
        import jinja2

        node = target.node
        try:
            text = self.template.render(
                node=name_of(node),
                slurm_node=target.slurm_node,
                reason=target.reason,
                summary=target.summary,
                action=target.action.value,
                uid=(node.get("metadata") or {}).get("uid", ""),
                provider_id=(node.get("spec") or {}).get("providerID", ""),
                labels=(node.get("metadata") or {}).get("labels") or {},
            )
        except jinja2.TemplateError as exc:
            raise ReplacementError(f"template {self.path}: {exc}") from None
        body = _load(text, self.path)
        api_version = str(body.get("apiVersion") or "")
        if "/" not in api_version or not name_of(body):
            raise ReplacementError(f"template {self.path}: needs apiVersion group/version and metadata.name")
        group, version = api_version.split("/", 1)
        namespaced = bool((body.get("metadata") or {}).get("namespace"))
        return Resource(group, version, self.plural, namespaced), body

    def request(self, kube: KubeApi, target: Target, *, dry_run: bool = False) -> str:
        """Create the rendered object, marked as ours; ``<ref> created [<marker>]`` or ``<ref> (exists)``.

        An object of that name that is already there is left alone and never deleted later,
        unless it carries this very request's marker (our own create whose answer was lost).
        """
        resource, body = self.render(target)
        marker = f"{target.name}/{target.take}" if target.take else target.name
        body.setdefault("metadata", {})
        body["metadata"]["annotations"] = {**(body["metadata"].get("annotations") or {}),
                                           CREATED_FOR_ANNOTATION: marker}
        ref = _ref(body)
        if kube.create_object(resource, body, dry_run=dry_run):
            return f"{ref} created [{marker}]"
        namespace = (body.get("metadata") or {}).get("namespace") or None
        there = kube.get_object(resource, name_of(body), namespace)
        if there is not None and annotations_of(there).get(CREATED_FOR_ANNOTATION) == marker:
            return f"{ref} created [{marker}]"
        return f"{ref} (exists)"

    def cancel(self, kube: KubeApi, node: Obj, ref: str, *, dry_run: bool = False) -> str | None:
        """Delete the object only if this backend created it for that request (never one that was there)."""
        if not self.cancel_on_recovery:
            return None
        words = ref.split(" ", 2)
        if len(words) != 3 or words[1] != "created" or not words[2].startswith("["):
            return None  # "(exists)": someone else's object, or a record too old to tell
        kind_ns_name, marker = words[0], words[2].strip("[]")
        parts = kind_ns_name.split("/")
        if len(parts) != 4:
            return None
        api_group, api_version, namespace, name = parts
        resource = Resource(api_group, api_version, self.plural, bool(namespace))
        there = kube.get_object(resource, name, namespace or None)
        if there is None or annotations_of(there).get(CREATED_FOR_ANNOTATION) != marker:
            return None  # gone, or deleted and made again by someone else since
        try:
            # UID only: the object read above, not one made again under the same name since
            # (NodeHealthCheck recreates its remediation objects): 409 means it is not ours. No
            # resourceVersion: SNR and RebootNode controllers rewrite their status all the time.
            deleted = kube.delete_object(resource, name, namespace or None, uid=str(meta(there).get("uid") or ""),
                                         dry_run=dry_run)
        except KubeConflict:
            return None
        return f"{kind_ns_name} deleted" if deleted else None


def selector_matches(selector: Obj, labels: dict[str, str]) -> bool:
    """A metav1.LabelSelector against ``labels`` (an empty selector selects everything, as in Kubernetes)."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or ():
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or ()
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def _ref(body: Obj) -> str:
    group, version = str(body["apiVersion"]).split("/", 1)
    namespace = (body.get("metadata") or {}).get("namespace") or ""
    return f"{group}/{version}/{namespace}/{name_of(body)}"


def _tojson(value: Any) -> str:
    import json

    return json.dumps(value)


def _load(text: str, path: str) -> Obj:
    import json

    try:
        data = json.loads(text)
    except ValueError:
        try:
            import yaml  # a dependency of ``kubernetes``, so present wherever the bridge runs
        except ImportError:
            raise ReplacementError(f"template {path}: not JSON, and PyYAML is not installed") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ReplacementError(f"template {path}: rendered text is not YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ReplacementError(f"template {path}: must render one object")
    return data


def template_groups(replace: ReplaceSection, reboot: RebootSection) -> dict[str, str]:
    """The API group of each configured template backend's resource, read from its template rendered
    for a placeholder node: what ``render`` grants and ``validate`` asks about (``{"replace": g, "reboot": g}``)."""
    placeholder = Target(node={"metadata": {"name": "node", "uid": "uid", "labels": {}}, "spec": {"providerID": ""}},
                         slurm_node="node", reason="slurm-hooks: placeholder [replace]", summary="placeholder",
                         action=Action.REPLACE, take="0")
    groups = {}
    for key, chosen in (("replace", replace), ("reboot", reboot)):
        if chosen.backend == "template" and chosen.template:
            resource, _ = TemplateBackend(chosen.template, chosen.plural).render(placeholder)
            groups[key] = resource.group
    return groups


def make_backend(settings: ReplaceSection, management: KubeApi | None = None) -> Backend:
    """``management``: the Cluster API management cluster's API, when it is not this cluster."""
    if settings.backend == "karpenter":
        return KarpenterBackend(settings.karpenter_version)
    if settings.backend == "capi":
        return CapiBackend(settings.capi_version, settings.cancel_on_recovery, management)
    if settings.backend == "template":
        return TemplateBackend(settings.template, settings.plural, settings.cancel_on_recovery)
    return ConditionBackend()


def make_reboot_backend(settings: RebootSection) -> Backend | None:
    """The backend for ``[reboot]`` drains; ``None``: the replacement backend takes them."""
    if settings.backend == "template":
        return TemplateBackend(settings.template, settings.plural, settings.cancel_on_recovery, name="reboot-template",
                               keeps_machine=True)
    if settings.backend == "annotation":
        return AnnotationRebootBackend(settings.annotation, settings.cancel_on_recovery)
    return None
