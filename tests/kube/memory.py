"""An in-memory :class:`~slurm_hooks.bridge.api.KubeApi` for unit tests of the bridge's logic.

It keeps the API server's rules that matter to the bridge (resourceVersion
bumps and ``test`` ops, strategic merge of conditions, dry run, 404 on patch
as ``None``, 409 on create as ``False``, delete preconditions, a Lease's
optimistic concurrency), counts calls per verb like the real client does, and
lets a test script failures per verb and PDB answers per pod.

Pods are indexed by node name, as kube-apiserver's cache indexes them by
``spec.nodeName``: a field-selected LIST costs the node's pods, not the cluster's.
With ``graceful = True`` an eviction only marks the pod terminating (as the kubelet
does during the grace period); :meth:`finish` deletes it.
"""

from __future__ import annotations

import collections
import copy
import itertools
from typing import Any

from slurm_hooks.bridge.api import Eviction, KubeConflict, KubeError, KubePermanent, Obj, Resource

from .merge import PatchTestFailed, json_patch, matches_labels, merge_patch, strategic_merge


class InMemoryKube:
    def __init__(self) -> None:
        self.nodes: dict[str, Obj] = {}
        self.pods: dict[tuple[str, str], Obj] = {}
        #: node name -> keys of its pods (kube-apiserver's spec.nodeName index).
        self._by_node: dict[str, set[tuple[str, str]]] = collections.defaultdict(set)
        #: Evictions mark pods terminating instead of deleting them; :meth:`finish` deletes.
        self.graceful = False
        #: Called with (namespace, name, pod) after each accepted eviction (the Slinky double's preStop).
        self.on_evict: list[Any] = []
        self.leases: dict[tuple[str, str], Obj] = {}
        self.events: list[Obj] = []
        self._event_names: set[str] = set()
        self.objects: dict[tuple[Resource, str, str], Obj] = {}
        self.calls: collections.Counter[str] = collections.Counter()
        #: verb -> errors to raise on its next calls, in order.
        self.failures: dict[str, list[KubeError]] = collections.defaultdict(list)
        #: "ns/name" -> eviction answers to give first (Eviction.BLOCKED for a PDB 429).
        self.eviction_script: dict[str, list[Eviction]] = collections.defaultdict(list)
        self.evicted: list[str] = []
        self.dry_runs: list[str] = []
        self._rv = itertools.count(100)

    # -- test helpers ------------------------------------------------------------------------

    def add_node(self, name: str, **extra: Any) -> Obj:
        node = {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "uid": f"uid-{name}", "labels": {"kubernetes.io/hostname": name}},
            "spec": {},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        }
        node = strategic_merge(node, extra)
        node["metadata"]["resourceVersion"] = str(next(self._rv))
        self.nodes[name] = node
        return node

    def add_pod(self, name: str, node: str, namespace: str = "default", **extra: Any) -> Obj:
        pod = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}"},
            "spec": {"nodeName": node},
            "status": {"phase": "Running"},
        }
        pod = strategic_merge(pod, extra)
        self._drop_pod(namespace, name)
        self.pods[(namespace, name)] = pod
        self._by_node[pod["spec"].get("nodeName", "")].add((namespace, name))
        return pod

    def load_pod(self, pod: Obj) -> None:
        """Store a complete pod as given (benchmarks loading 300,000 of them: no merge, no copy)."""
        m = pod["metadata"]
        self._drop_pod(m["namespace"], m["name"])
        self.pods[(m["namespace"], m["name"])] = pod
        self._by_node[pod["spec"].get("nodeName", "")].add((m["namespace"], m["name"]))

    def _drop_pod(self, namespace: str, name: str) -> None:
        old = self.pods.pop((namespace, name), None)
        if old is not None:
            self._by_node[old["spec"].get("nodeName", "")].discard((namespace, name))

    def finish(self, namespace: str, name: str) -> None:
        """The kubelet is done with a terminating pod: it is deleted."""
        self._drop_pod(namespace, name)

    def add_object(self, resource: Resource, body: Obj) -> Obj:
        m = body["metadata"]
        self.objects[(resource, m.get("namespace", ""), m["name"])] = copy.deepcopy(body)
        return body

    def fail(self, verb: str, *errors: KubeError) -> None:
        self.failures[verb].extend(errors)

    def condition(self, node: str, ctype: str = "GpuHealthy") -> Obj | None:
        for c in self.nodes[node].get("status", {}).get("conditions", []):
            if c.get("type") == ctype:
                return c
        return None

    def mutations(self) -> int:
        return sum(n for verb, n in self.calls.items() if not verb.startswith(("get", "list")))

    # -- plumbing ------------------------------------------------------------------------------

    def _call(self, verb: str) -> None:
        self.calls[verb] += 1
        if self.failures.get(verb):
            raise self.failures[verb].pop(0)

    def _store_node(self, name: str, node: Obj, dry_run: bool, verb: str) -> Obj:
        node = copy.deepcopy(node)
        node["metadata"]["resourceVersion"] = str(next(self._rv))
        if dry_run:
            self.dry_runs.append(f"{verb} {name}")
        else:
            self.nodes[name] = node
        return copy.deepcopy(node)

    # -- KubeApi ---------------------------------------------------------------------------------

    def list_nodes(self, label_selector: str = "") -> list[Obj]:
        self._call("list_nodes")
        return [copy.deepcopy(n) for n in self.nodes.values() if matches_labels(n, label_selector)]

    def get_node(self, name: str) -> Obj | None:
        self._call("get_node")
        node = self.nodes.get(name)
        return copy.deepcopy(node) if node else None

    def patch_node(self, name: str, patch: Obj, *, dry_run: bool = False) -> Obj | None:
        self._call("patch_node")
        if name not in self.nodes:
            return None
        return self._store_node(name, strategic_merge(self.nodes[name], patch), dry_run, "patch_node")

    def json_patch_node(self, name: str, ops: list[Obj], *, dry_run: bool = False) -> Obj | None:
        self._call("json_patch_node")
        if name not in self.nodes:
            return None
        try:
            patched = json_patch(self.nodes[name], ops)
        except PatchTestFailed as exc:
            raise KubeConflict(f"HTTP 422: {exc}", 422) from None
        except (KeyError, IndexError, ValueError) as exc:
            raise KubePermanent(f"HTTP 422: cannot apply patch: {exc!r}", 422) from None
        return self._store_node(name, patched, dry_run, "json_patch_node")

    def patch_node_status(self, name: str, patch: Obj, *, dry_run: bool = False) -> Obj | None:
        self._call("patch_node_status")
        if name not in self.nodes:
            return None
        return self._store_node(name, strategic_merge(self.nodes[name], patch), dry_run, "patch_node_status")

    def list_pods_on_node(self, node: str, *, consistent: bool = False) -> list[Obj]:
        self._call("list_pods")
        return [copy.deepcopy(self.pods[key]) for key in sorted(self._by_node.get(node, ())) if key in self.pods]

    def list_pods(self, namespace: str, label_selector: str) -> list[Obj]:
        self._call("list_pods")
        return [copy.deepcopy(p) for (ns, _), p in self.pods.items() if ns == namespace and matches_labels(p, label_selector)]

    def evict(self, namespace: str, name: str, *, dry_run: bool = False) -> Eviction:
        self._call("evict")
        ref = f"{namespace}/{name}"
        if self.eviction_script.get(ref):
            answer = self.eviction_script[ref].pop(0)
            if answer is not Eviction.EVICTED:
                return answer
        if (namespace, name) not in self.pods:
            return Eviction.GONE
        if dry_run:
            self.dry_runs.append(f"evict {ref}")
            return Eviction.EVICTED
        pod = self.pods[(namespace, name)]
        self.evicted.append(ref)
        if self.graceful:
            pod["metadata"].setdefault("deletionTimestamp", "2026-01-01T00:00:00Z")
        else:
            self._drop_pod(namespace, name)
        for hook in self.on_evict:
            hook(namespace, name, copy.deepcopy(pod))
        return Eviction.EVICTED

    def create_event(self, namespace: str, event: Obj, *, dry_run: bool = False) -> bool:
        self._call("create_event")
        if event["metadata"]["name"] in self._event_names:
            return False
        if dry_run:
            self.dry_runs.append(f"create_event {event['metadata']['name']}")
        else:
            self.events.append(copy.deepcopy(event))
            self._event_names.add(event["metadata"]["name"])
        return True

    def list_objects(self, resource: Resource, namespace: str | None = None, label_selector: str = "") -> list[Obj]:
        self._call("list_objects")
        return [copy.deepcopy(o) for (r, ns, _), o in self.objects.items()
                if r.plural == resource.plural and r.group == resource.group and (namespace is None or ns == namespace)
                and matches_labels(o, label_selector)]

    def _key(self, resource: Resource, name: str, namespace: str | None) -> tuple[Resource, str, str] | None:
        for key in self.objects:
            r, ns, n = key
            if r.group == resource.group and r.plural == resource.plural and n == name and ns == (namespace or ""):
                return key
        return None

    def get_object(self, resource: Resource, name: str, namespace: str | None = None) -> Obj | None:
        self._call("get_object")
        key = self._key(resource, name, namespace)
        return copy.deepcopy(self.objects[key]) if key else None

    def create_object(self, resource: Resource, body: Obj, *, dry_run: bool = False) -> bool:
        self._call("create_object")
        m = body.get("metadata") or {}
        if self._key(resource, m["name"], m.get("namespace")):
            return False
        if not dry_run:
            self.objects[(resource, m.get("namespace", ""), m["name"])] = copy.deepcopy(body)
        return True

    def patch_object(self, resource: Resource, name: str, patch: Obj, namespace: str | None = None, *,
                     dry_run: bool = False) -> Obj | None:
        self._call("patch_object")
        key = self._key(resource, name, namespace)
        if key is None:
            return None
        patched = merge_patch(self.objects[key], patch)
        if not dry_run:
            self.objects[key] = patched
        return copy.deepcopy(patched)

    def delete_object(self, resource: Resource, name: str, namespace: str | None = None, *, uid: str = "",
                      resource_version: str = "", dry_run: bool = False) -> bool:
        self._call("delete_object")
        key = self._key(resource, name, namespace)
        if key is None:
            return False
        m = self.objects[key].get("metadata") or {}
        if (uid and m.get("uid") != uid) or (resource_version and m.get("resourceVersion") != resource_version):
            raise KubeConflict(f"HTTP 409: Precondition failed: UID in precondition: {uid}, UID in object meta: "
                               f"{m.get('uid')}", 409)
        if not dry_run:
            del self.objects[key]
        return True

    # -- the leader's Lease -----------------------------------------------------------------------

    def get_lease(self, namespace: str, name: str) -> Obj | None:
        self._call("get_lease")
        lease = self.leases.get((namespace, name))
        return copy.deepcopy(lease) if lease else None

    def create_lease(self, namespace: str, body: Obj) -> Obj | None:
        self._call("create_lease")
        key = (namespace, body["metadata"]["name"])
        if key in self.leases:
            return None
        lease = copy.deepcopy(body)
        lease["metadata"]["resourceVersion"] = str(next(self._rv))
        self.leases[key] = lease
        return copy.deepcopy(lease)

    def replace_lease(self, namespace: str, name: str, body: Obj) -> Obj:
        self._call("replace_lease")
        current = self.leases.get((namespace, name))
        if current is None:
            raise KubePermanent("HTTP 404: lease not found", 404)
        if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise KubeConflict("HTTP 409: the object has been modified; please apply your changes to the latest "
                               "version and try again", 409)
        lease = copy.deepcopy(body)
        lease["metadata"]["resourceVersion"] = str(next(self._rv))
        self.leases[(namespace, name)] = lease
        return copy.deepcopy(lease)
