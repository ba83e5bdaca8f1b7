"""An in-memory :class:`~slurm_hooks.bridge.api.KubeApi` for unit tests of the bridge's logic.

It keeps the API server's rules that matter to the bridge (resourceVersion
bumps and ``test`` ops, strategic merge of conditions, dry run, 404 on patch
as ``None``, 409 on create as ``False``), counts calls per verb like the real
client does, and lets a test script failures per verb and PDB answers per pod.
"""

from __future__ import annotations

import collections
import copy
import itertools
from typing import Any

from slurm_hooks.bridge.api import Eviction, KubeConflict, KubeError, KubePermanent, Obj, Resource

from .merge import PatchTestFailed, json_patch, matches_fields, matches_labels, merge_patch, strategic_merge


class InMemoryKube:
    def __init__(self) -> None:
        self.nodes: dict[str, Obj] = {}
        self.pods: dict[tuple[str, str], Obj] = {}
        self.events: list[Obj] = []
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
        self.pods[(namespace, name)] = pod
        return pod

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

    def list_pods_on_node(self, node: str) -> list[Obj]:
        self._call("list_pods")
        return [copy.deepcopy(p) for p in self.pods.values() if matches_fields(p, f"spec.nodeName={node}")]

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
        else:
            del self.pods[(namespace, name)]
            self.evicted.append(ref)
        return Eviction.EVICTED

    def create_event(self, namespace: str, event: Obj, *, dry_run: bool = False) -> bool:
        self._call("create_event")
        if any(e["metadata"]["name"] == event["metadata"]["name"] for e in self.events):
            return False
        if dry_run:
            self.dry_runs.append(f"create_event {event['metadata']['name']}")
        else:
            self.events.append(copy.deepcopy(event))
        return True

    def list_objects(self, resource: Resource, namespace: str | None = None) -> list[Obj]:
        self._call("list_objects")
        return [copy.deepcopy(o) for (r, ns, _), o in self.objects.items()
                if r.plural == resource.plural and r.group == resource.group and (namespace is None or ns == namespace)]

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

    def delete_object(self, resource: Resource, name: str, namespace: str | None = None, *,
                      dry_run: bool = False) -> bool:
        self._call("delete_object")
        key = self._key(resource, name, namespace)
        if key is None:
            return False
        if not dry_run:
            del self.objects[key]
        return True
