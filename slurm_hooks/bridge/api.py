"""The bridge's one window on Kubernetes: a small protocol over plain dicts.

Objects go in and out as the JSON the API server speaks (``{"metadata": ...}``),
never as client models: the logic stays independent of the client's model
classes (which ``kubernetes`` 37 changed) and is cheap to fake in tests.

Errors follow kopf's split: transient (retry later: 429, 5xx, timeouts,
connection refused), conflict (re-read and try again), permanent (a retry will
not help: 400, 401, 403, 422). A 404 on a patch is not an error: the object is
gone and there is nothing left to patch, so the methods return ``None``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

from slurm_hooks.errors import PermanentError, TransientError

Obj = dict[str, Any]

#: Ownership: a JSON record of what the bridge did to a node, so that it undoes only that.
OWNER_ANNOTATION = "slurm-hooks.io/remediation"
#: Mirrors the annotation so that one LIST with a label selector finds every node we hold.
OWNER_LABEL = "slurm-hooks.io/owned"
OWNER_SELECTOR = f"{OWNER_LABEL}=true"
FIELD_MANAGER = "slurm-hooks-bridge"


class KubeError(Exception):
    """Base of the bridge's Kubernetes errors; ``status`` is the HTTP code when there was one."""

    def __init__(self, message: str, status: int | None = None, causes: tuple[str, ...] = ()):
        super().__init__(message)
        self.status = status
        #: The Status body's ``details.causes[].type`` (``DisruptionBudget``, ``NamespaceTerminating``).
        self.causes = causes


class KubeTransient(KubeError, TransientError):
    """429, 5xx, timeouts, connection refused: the next try or the next pass may work."""


class KubeConflict(KubeError):
    """409, or a JSON Patch ``test`` on resourceVersion that failed: re-read, re-apply."""


class KubePermanent(KubeError, PermanentError):
    """400/401/403/422 and the like: retrying the same request will not help."""


class Eviction(str, Enum):
    EVICTED = "evicted"  # 200/201: the API server accepted it; the pod terminates with its grace period
    GONE = "gone"  # 404: nothing to evict
    BLOCKED = "blocked"  # 429 with the DisruptionBudget cause: a PodDisruptionBudget says not now
    #: 403 with the NamespaceTerminating cause: the namespace's deletion removes the pod; never retried.
    NAMESPACE_TERMINATING = "namespace terminating"


@dataclass(frozen=True)
class Resource:
    """A custom resource's coordinates, e.g. ``Resource("karpenter.sh", "v1", "nodeclaims")``."""

    group: str
    version: str
    plural: str
    namespaced: bool = False

    def __str__(self) -> str:
        return f"{self.plural}.{self.group}/{self.version}"


class KubeApi(Protocol):
    """What the bridge needs from Kubernetes, and nothing more (see the ClusterRole)."""

    def list_nodes(self, label_selector: str = "") -> list[Obj]: ...

    def get_node(self, name: str) -> Obj | None: ...

    def patch_node(self, name: str, patch: Obj, *, dry_run: bool = False) -> Obj | None:
        """Strategic merge patch (``kubectl cordon``). ``None``: no such node."""
        ...

    def json_patch_node(self, name: str, ops: list[Obj], *, dry_run: bool = False) -> Obj | None:
        """JSON Patch; raises :class:`KubeConflict` when a ``test`` op fails or on 409."""
        ...

    def patch_node_status(self, name: str, patch: Obj, *, dry_run: bool = False) -> Obj | None:
        """Strategic merge patch of the status subresource (conditions merge by ``type``)."""
        ...

    def list_pods_on_node(self, node: str, *, consistent: bool = False) -> list[Obj]:
        """Pods with ``spec.nodeName == node`` in every namespace. ``consistent``: a quorum read, paged
        like kubectl (500 a page): what the drain lists after the cordon, so that a pod bound just
        before it is seen; else from the API server's watch cache (``resourceVersion=0``: may lag)."""
        ...

    def list_pods(self, namespace: str, label_selector: str) -> list[Obj]: ...

    def evict(self, namespace: str, name: str, *, dry_run: bool = False) -> Eviction:
        """POST a policy/v1 Eviction; 429 is :attr:`Eviction.BLOCKED`, not an error."""
        ...

    def create_event(self, namespace: str, event: Obj, *, dry_run: bool = False) -> bool:
        """``False`` when an event of that name exists already (names are deterministic)."""
        ...

    def list_objects(self, resource: Resource, namespace: str | None = None, label_selector: str = "") -> list[Obj]:
        """Every page, the first from the API server's cache (``resourceVersion=0``)."""
        ...

    def get_object(self, resource: Resource, name: str, namespace: str | None = None) -> Obj | None: ...

    def create_object(self, resource: Resource, body: Obj, *, dry_run: bool = False) -> bool:
        """``False`` when it exists already (409 AlreadyExists)."""
        ...

    def patch_object(
        self, resource: Resource, name: str, patch: Obj, namespace: str | None = None, *, dry_run: bool = False
    ) -> Obj | None:
        """JSON merge patch (custom resources have no strategic merge). ``None``: not found."""
        ...

    def delete_object(self, resource: Resource, name: str, namespace: str | None = None, *, uid: str = "",
                      resource_version: str = "", dry_run: bool = False) -> bool:
        """``False`` when it was already gone; with ``uid`` / ``resource_version`` (preconditions)
        :class:`KubeConflict` when the object is no longer the one read: not ours to delete."""
        ...

    def get_lease(self, namespace: str, name: str) -> Obj | None: ...

    def create_lease(self, namespace: str, body: Obj) -> Obj | None:
        """``None`` when it exists already (409)."""
        ...

    def replace_lease(self, namespace: str, name: str, body: Obj) -> Obj:
        """PUT guarded by the body's ``metadata.resourceVersion``: :class:`KubeConflict` when it moved."""
        ...


def meta(obj: Obj) -> Obj:
    return obj.get("metadata") or {}


def name_of(obj: Obj) -> str:
    return meta(obj).get("name", "")


def labels_of(obj: Obj) -> dict[str, str]:
    return meta(obj).get("labels") or {}


def annotations_of(obj: Obj) -> dict[str, str]:
    return meta(obj).get("annotations") or {}
