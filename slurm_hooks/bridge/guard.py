"""Act only while leading: every write of a pass asks the leader's Lease first.

The reconciler's :class:`~.api.KubeApi` is wrapped in :class:`LeaderGuard` when a Lease elects
the bridge: each mutating call (cordon, taint, condition, Event, eviction, a backend's request or
cancel, uncordon, the ownership record) first asks ``still_leading`` (the elector's ``check``:
renews when due, and answers False once the last renewal is ``renew_deadline`` old), and raises
:class:`LeadershipLost` instead of sending the write. The pass stops there; what it did is in the
nodes' ownership records, and the next leader finishes it.

Reads pass through. The time a single call may take is bounded separately, in
:class:`~.kubeclient.KubeClient` (``deadline``): no request and no retry outlives the renew deadline.
What this does not give: a write already on the wire when the deadline passes is not taken back
(client-go's leader election says the same: it bounds, it does not guarantee one actor).
"""

from __future__ import annotations

from typing import Any, Callable

from slurm_hooks.bridge.api import Eviction, KubeApi, Obj, Resource


class LeadershipLost(Exception):
    """This process no longer holds the Lease: the pass stops before its next write."""


#: The writes of :class:`~.api.KubeApi` (the Lease's own calls are the elector's, not guarded).
MUTATING = frozenset({"patch_node", "json_patch_node", "patch_node_status", "evict", "create_event",
                      "create_object", "patch_object", "delete_object"})


class LeaderGuard:
    """A :class:`~.api.KubeApi` whose writes are sent only while ``still_leading()`` says so."""

    def __init__(self, kube: KubeApi, still_leading: Callable[[], bool]):
        self._kube = kube
        self._still_leading = still_leading

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kube, name)  # reads, ``calls``, ``close``

    def ensure(self, what: str) -> None:
        if not self._still_leading():
            raise LeadershipLost(f"lost the leader's Lease before {what}: this pass stops; the leader finishes it")

    def patch_node(self, name: str, patch: Obj, *, dry_run: bool = False) -> Obj | None:
        self.ensure(f"patching node {name}")
        return self._kube.patch_node(name, patch, dry_run=dry_run)

    def json_patch_node(self, name: str, ops: list[Obj], *, dry_run: bool = False) -> Obj | None:
        self.ensure(f"patching node {name}")
        return self._kube.json_patch_node(name, ops, dry_run=dry_run)

    def patch_node_status(self, name: str, patch: Obj, *, dry_run: bool = False) -> Obj | None:
        self.ensure(f"setting a condition on node {name}")
        return self._kube.patch_node_status(name, patch, dry_run=dry_run)

    def evict(self, namespace: str, name: str, *, dry_run: bool = False) -> Eviction:
        self.ensure(f"evicting pod {namespace}/{name}")
        return self._kube.evict(namespace, name, dry_run=dry_run)

    def create_event(self, namespace: str, event: Obj, *, dry_run: bool = False) -> bool:
        self.ensure("posting an Event")
        return self._kube.create_event(namespace, event, dry_run=dry_run)

    def create_object(self, resource: Resource, body: Obj, *, dry_run: bool = False) -> bool:
        self.ensure(f"creating a {resource.plural}")
        return self._kube.create_object(resource, body, dry_run=dry_run)

    def patch_object(self, resource: Resource, name: str, patch: Obj, namespace: str | None = None, *,
                     dry_run: bool = False) -> Obj | None:
        self.ensure(f"patching {resource.plural} {name}")
        return self._kube.patch_object(resource, name, patch, namespace, dry_run=dry_run)

    def delete_object(self, resource: Resource, name: str, namespace: str | None = None, *, uid: str = "",
                      resource_version: str = "", dry_run: bool = False) -> bool:
        self.ensure(f"deleting {resource.plural} {name}")
        return self._kube.delete_object(resource, name, namespace, uid=uid, resource_version=resource_version,
                                        dry_run=dry_run)
