"""kmock's Kubernetes emulator on a real HTTP port, in a thread, for the sync ``kubernetes`` client.

kmock stores objects and speaks real HTTP, but it treats every patch as a merge
patch, ignores selectors and dryRun, never bumps resourceVersion and knows no
evictions. :class:`KubeEmulator` teaches it exactly the API-server rules the
bridge depends on (see ``merge.py``): a PUT must carry the current
``resourceVersion`` (409 otherwise: how a Lease is taken), a DELETE's
preconditions (UID, resourceVersion) are checked (409), field-selected pod LISTs
use a ``spec.nodeName`` index, and a pod's ``eviction`` subresource deletes the
pod -- or, with ``graceful = True``, marks it terminating (``deletionTimestamp``)
until :meth:`KubeServer.finish` deletes it, as the kubelet does after the grace
period. ``on_evict`` hooks see each accepted eviction (the Slinky double runs the
slurmd pod's preStop there). Everything else a test wants (a PDB's 429, a
throttled request, a 500, a slow answer) is scripted with kmock's own per-URL
rules, e.g.::

    server.kmock["post /api/v1/namespaces/default/pods/p1/eviction"][:2] << 429 << pdb_429()

A scripted answer is served *instead of* the emulator: it does not change state.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import itertools
import json
import math
import threading
from typing import Any

import aiohttp.web
import attrs
import kmock
from kmock._internal import apps, enums

from .merge import PatchTestFailed, json_patch, matches_fields, matches_labels, merge_patch, strategic_merge


def status(code: int, reason: str = "", message: str = "") -> dict:
    """A Kubernetes ``Status`` body, as the API server sends with an error."""
    default = {404: "NotFound", 409: "AlreadyExists", 422: "Invalid", 429: "TooManyRequests",
               500: "InternalError", 503: "ServiceUnavailable"}
    return {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure", "code": code,
            "reason": reason or default.get(code, "Unknown"), "message": message or f"scripted {code}"}


def pdb_429(pod: str = "") -> dict:
    """kube-apiserver's eviction refusal (``pkg/registry/core/pod/storage/eviction.go``)."""
    body = status(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget.")
    body["details"] = {"causes": [{"type": "DisruptionBudget",
                                   "message": f"The disruption budget {pod or 'pdb'} needs 1 healthy pods and has 1 currently"}]}
    return body


def throttled_429() -> dict:
    """API Priority and Fairness turning a request away: no cause; the answer carries ``Retry-After``."""
    return status(429, "TooManyRequests", "Too many requests, please try again later.")


def namespace_terminating_403(namespace: str) -> dict:
    """The NamespaceLifecycle admission plugin refusing new content (an Eviction) in a namespace being deleted."""
    body = status(403, "Forbidden", f"pods \"x\" is forbidden: unable to create new content in namespace {namespace} "
                                    "because it is being terminated")
    body["details"] = {"causes": [{"type": "NamespaceTerminating", "field": "metadata.namespace",
                                   "message": f"namespace {namespace} is being terminated"}]}
    return body


@attrs.define(kw_only=True)
class KubeEmulator(kmock.KubernetesEmulator):
    _rv: Any = attrs.field(factory=lambda: itertools.count(1000), init=False)
    #: An eviction marks the pod terminating; ``KubeServer.finish`` deletes it (the kubelet's part).
    graceful: bool = attrs.field(default=False, init=False)
    #: Called (in the server's thread) with (namespace, name, pod) after each accepted eviction.
    on_evict: list = attrs.field(factory=list, init=False)
    #: (namespace, name) of the ServiceAccount a SelfSubjectAccessReview is answered for, from the
    #: RBAC objects stored here (RoleBindings, ClusterRoleBindings); ``None``: everything is allowed.
    rbac_subject: Any = attrs.field(default=None, init=False)
    #: With ``rbac_subject``: every request is authorized as that ServiceAccount (403 otherwise),
    #: by the stored Roles and ClusterRoles, ``resourceNames`` included (the RBAC objects themselves
    #: stay writable: the test applies them).
    rbac_enforced: bool = attrs.field(default=False, init=False)
    #: spec.nodeName -> keys of the pods on that node (kube-apiserver's cache index).
    pod_index: dict = attrs.field(factory=dict, init=False)
    #: The watch cache behind etcd (:meth:`KubeServer.freeze_cache`): pods as they were, served to
    #: ``resourceVersion=0`` LISTs until thawed; ``None``: the cache is current.
    pod_cache: Any = attrs.field(default=None, init=False)

    def index_pod(self, namespace: str | None, body: dict) -> None:
        node_name = (body.get("spec") or {}).get("nodeName")
        if node_name:
            key = (kmock.resource("v1/pods"), namespace, body["metadata"]["name"])
            self.pod_index.setdefault(node_name, {})[key] = None

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for resource in ("v1/nodes", "v1/pods", "v1/events", "karpenter.sh/v1/nodeclaims",
                         "cluster.x-k8s.io/v1beta1/machines", "cluster.x-k8s.io/v1beta1/machinehealthchecks",
                         "coordination.k8s.io/v1/leases",
                         "self-node-remediation.medik8s.io/v1alpha1/selfnoderemediations",
                         "janitor.dgxc.nvidia.com/v1alpha1/rebootnodes",
                         "rbac.authorization.k8s.io/v1/clusterroles", "rbac.authorization.k8s.io/v1/clusterrolebindings",
                         "rbac.authorization.k8s.io/v1/roles", "rbac.authorization.k8s.io/v1/rolebindings"):
            self.resources[resource] = {}
        self.fallback["post", kmock.resource("v1/pods"), kmock.subresource("eviction")] << self._serve_eviction

    # -- state changes, done here instead of in kmock so that they follow the API server --

    def _user_reaction_for(self, request: Any) -> bool:
        for payload in self._payloads:
            if any(p == -math.inf for p in payload.priorities):
                continue
            if not payload._disabled.is_set() and request in payload._source:
                return True
        return False

    async def _handle(self, request: Any) -> aiohttp.web.StreamResponse:
        """Serve Kubernetes requests directly unless a test scripted this URL.

        kmock's own dispatch matches every reaction against the whole request
        history, which is quadratic; serving the emulator's answers here keeps a
        1,000-node cluster at milliseconds per request.
        """
        if request.resource is None or self._user_reaction_for(request):
            return await apps.RawHandler._handle(self, request)
        if request.resource.plural == "selfsubjectaccessreviews" and request.method == enums.method.POST:
            return aiohttp.web.json_response(self._access_review(request.data or {}), status=201)
        if self.rbac_enforced and self.rbac_subject is not None and request.resource.group != "rbac.authorization.k8s.io":
            verb = self._verb(request)
            resource = request.resource.plural + (f"/{request.subresource}" if request.subresource else "")
            if not self.rbac_allows(verb, request.resource.group or "", resource, request.namespace,
                                    request.name if verb != "create" else None):
                body = status(403, "Forbidden", f"{resource} {request.name or ''!r} is forbidden: User "
                              f"\"system:serviceaccount:{':'.join(self.rbac_subject)}\" cannot {verb} resource "
                              f"{resource!r} in namespace {request.namespace!r}")
                return aiohttp.web.json_response(body, status=403)
        action = request.action
        put = request.method == enums.method.PUT and request.name is not None and not request.subresource
        if action in (enums.action.CREATE, enums.action.UPDATE, enums.action.DELETE) or put:
            async with self._lock:
                result, code = self._mutate(request, request.params.get("dryRun") == "All")
            return aiohttp.web.json_response(result, status=code)
        if action == enums.action.FETCH:
            key = (request.resource, request.namespace, request.name)
            if key not in self.objects or self.objects[key].deleted:
                raise kmock.KubernetesObjectNotFoundError()
            return aiohttp.web.json_response(_plain(self.objects[key].raw))
        if action == enums.action.LIST:
            return aiohttp.web.json_response(self._list(request))
        if request.method == enums.method.POST and request.subresource == "eviction":
            async with self._lock:
                answer = self._evict(request)
            return aiohttp.web.json_response(answer, status=201)
        return await apps.RawHandler._handle(self, request)

    def _mutate(self, request: Any, dry_run: bool) -> tuple[dict, int]:
        objects = self.objects
        if request.action == enums.action.CREATE:
            body = copy.deepcopy(request.data or {})
            m = body.setdefault("metadata", {})
            namespace = request.namespace or m.get("namespace")
            key = (request.resource, namespace, m.get("name"))
            if key in objects and not objects[key].deleted:
                raise kmock.KubernetesError(status=409, reason="AlreadyExists",
                                            message=f"{request.resource.plural} {m.get('name')!r} already exists")
            m["resourceVersion"] = str(next(self._rv))
            if not dry_run:
                objects[key] = body
                if request.resource == kmock.resource("v1/pods"):
                    self.index_pod(namespace, body)
            return body, 201
        key = (request.resource, request.namespace, request.name)
        if key not in objects or objects[key].deleted:
            raise kmock.KubernetesObjectNotFoundError()
        current = _plain(objects[key].raw)
        if request.action == enums.action.DELETE and request.method == enums.method.DELETE:
            wanted = (request.data or {}).get("preconditions") or {} if isinstance(request.data, dict) else {}
            m = current.get("metadata") or {}
            for field_name in ("uid", "resourceVersion"):
                if wanted.get(field_name) and wanted[field_name] != m.get(field_name):
                    raise kmock.KubernetesError(
                        status=409, reason="Conflict",
                        message=f"Precondition failed: {field_name} in precondition: {wanted[field_name]}, "
                                f"{field_name} in object meta: {m.get(field_name)}")
            if not dry_run:
                objects[key].delete()
            return current, 200
        if request.method == enums.method.PUT:
            body = copy.deepcopy(request.data or {})
            sent = (body.get("metadata") or {}).get("resourceVersion")
            if sent != (current.get("metadata") or {}).get("resourceVersion"):
                raise kmock.KubernetesError(
                    status=409, reason="Conflict", message=f"Operation cannot be fulfilled on {request.resource.plural} "
                    f"{request.name!r}: the object has been modified; please apply your changes to the latest version "
                    "and try again")
            body.setdefault("metadata", {})["resourceVersion"] = str(next(self._rv))
            if not dry_run:
                objects[key].history.append(body)
            return body, 200
        content_type = request.headers.get("Content-Type", "")
        data = request.data
        if request.subresource == "status" and isinstance(data, dict):
            data = {"status": data.get("status", {})}
        try:
            if "json-patch" in content_type:
                patched = json_patch(current, data)
            elif "strategic-merge" in content_type:
                patched = strategic_merge(current, data)
            else:
                patched = merge_patch(current, data)
        except PatchTestFailed as exc:
            raise kmock.KubernetesError(status=422, reason="Invalid", message=f"the server rejected our request: {exc}") from None
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            raise kmock.KubernetesError(status=422, reason="Invalid", message=f"cannot apply patch: {exc!r}") from None
        patched.setdefault("metadata", {})["resourceVersion"] = str(next(self._rv))
        if not dry_run:
            objects[key].history.append(patched)
        return patched, 200

    # -- RBAC, as kube-apiserver's authorizer answers SelfSubjectAccessReview --------------------------

    def _stored(self, resource: str, namespace: str | None = None) -> list[dict]:
        wanted = kmock.resource(resource)
        return [_plain(obj.raw) for (res, ns, _), obj in self.objects.items()
                if res == wanted and not obj.deleted and (namespace is None or ns == namespace)]

    def _access_review(self, body: dict) -> dict:
        attrs_ = (body.get("spec") or {}).get("resourceAttributes") or {}
        resource = attrs_.get("resource", "") + (f"/{attrs_['subresource']}" if attrs_.get("subresource") else "")
        allowed = self.rbac_allows(attrs_.get("verb", ""), attrs_.get("group", ""), resource, attrs_.get("namespace"),
                                   attrs_.get("name"))
        return {**body, "status": {"allowed": allowed, "reason": "" if allowed else "no RBAC rule allows it"}}

    @staticmethod
    def _verb(request: Any) -> str:
        method = str(request.method.value).upper()
        if method == "GET":
            return "get" if request.name else "list"
        return {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(method, method.lower())

    def rbac_allows(self, verb: str, group: str, resource: str, namespace: str | None, name: str | None = None) -> bool:
        if self.rbac_subject is None:
            return True
        sa_namespace, sa_name = self.rbac_subject

        def bound(binding: dict) -> bool:
            return any(s.get("kind") == "ServiceAccount" and s.get("name") == sa_name
                       and s.get("namespace") == sa_namespace for s in binding.get("subjects") or ())

        def role(ref: dict, ns: str | None) -> dict | None:
            kind = "clusterroles" if ref.get("kind") == "ClusterRole" else "roles"
            found = [r for r in self._stored(f"rbac.authorization.k8s.io/v1/{kind}", None if kind == "clusterroles" else ns)
                     if r["metadata"]["name"] == ref.get("name")]
            return found[0] if found else None

        roles = [role(b["roleRef"], None) for b in self._stored("rbac.authorization.k8s.io/v1/clusterrolebindings")
                 if bound(b)]
        if namespace:
            roles += [role(b["roleRef"], namespace)
                      for b in self._stored("rbac.authorization.k8s.io/v1/rolebindings", namespace) if bound(b)]
        for r in roles:
            for rule in (r or {}).get("rules") or ():
                names = rule.get("resourceNames") or ()
                if (group in rule.get("apiGroups", ()) or "*" in rule.get("apiGroups", ())) \
                        and (resource in rule.get("resources", ()) or "*" in rule.get("resources", ())) \
                        and (verb in rule.get("verbs", ()) or "*" in rule.get("verbs", ())) \
                        and (not names or (name is not None and name in names)):
                    return True
        return False

    # -- reads: selectors and paging ----------------------------------------------------------

    def _list(self, request: Any) -> dict:
        labels = request.params.get("labelSelector", "")
        fields = request.params.get("fieldSelector", "")
        cached = request.params.get("resourceVersion") == "0"
        if cached and self.pod_cache is not None and request.resource == kmock.resource("v1/pods"):
            items = [p for p in self.pod_cache if (request.namespace is None or p["metadata"].get("namespace")
                                                   == request.namespace)]
            return self._page(request, [i for i in items if matches_labels(i, labels) and matches_fields(i, fields)])
        if fields.startswith("spec.nodeName=") and "," not in fields and request.resource == kmock.resource("v1/pods"):
            # kube-apiserver's cache indexes pods by spec.nodeName: the node's pods, not the cluster's.
            keys = self.pod_index.get(fields.split("=", 1)[1], {})
            found = [self.objects[k] for k in keys if k in self.objects]
            items = [obj.raw for obj in found if not obj.deleted]
            return self._page(request, [i for i in items if matches_labels(i, labels)])
        items = [
            obj.raw for (resource, namespace, _), obj in self.objects.items()
            if resource == request.resource and not obj.deleted
            and (request.namespace is None or namespace == request.namespace)
        ]
        items = [i for i in items if matches_labels(i, labels) and matches_fields(i, fields)]
        return self._page(request, items)

    def _page(self, request: Any, items: list) -> dict:
        start = int(base64.b64decode(request.params["continue"]).decode()) if request.params.get("continue") else 0
        # kube-apiserver serves resourceVersion=0 from its watch cache in one page: limit is ignored.
        limit = 0 if request.params.get("resourceVersion") == "0" else int(request.params.get("limit") or 0)
        meta: dict[str, Any] = {"resourceVersion": str(next(self._rv))}
        if limit and start + limit < len(items):
            meta["continue"] = base64.b64encode(str(start + limit).encode()).decode()
        page = items[start:start + limit] if limit else items[start:]
        return {"apiVersion": "v1", "kind": "List", "metadata": meta, "items": _plain(page)}

    async def _serve_list(self, request: Any) -> Any:
        return self._list(request)

    # -- evictions ----------------------------------------------------------------------------

    def _evict(self, request: Any) -> dict:
        key = (kmock.resource("v1/pods"), request.namespace, request.name)
        if key not in self.objects or self.objects[key].deleted:
            raise kmock.KubernetesObjectNotFoundError()
        if request.params.get("dryRun") != "All":
            pod = _plain(self.objects[key].raw)
            if self.graceful:
                if not pod["metadata"].get("deletionTimestamp"):
                    pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
                    pod["metadata"]["deletionGracePeriodSeconds"] = 30
                    pod["metadata"]["resourceVersion"] = str(next(self._rv))
                    self.objects[key].history.append(pod)
            else:
                self.objects[key].delete()
            for hook in self.on_evict:
                hook(request.namespace, request.name, pod)
        return {**status(201, "Success", "evicted"), "status": "Success"}

    async def _serve_eviction(self, request: Any) -> Any:
        async with self._lock:
            answer = self._evict(request)
        return kmock.Response(status=201, payload=answer)


async def _call(fn: Any) -> Any:
    return fn()


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(value, default=dict))


class KubeServer:
    """A :class:`KubeEmulator` with its HTTP server on an event loop in a daemon thread."""

    def __init__(self) -> None:
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="kmock", daemon=True)
        self._thread.start()
        if not self._ready.wait(15):
            raise RuntimeError("kmock did not start in 15 s")
        if self._error:
            raise self._error

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # surfaced to the test through __init__
            self._error = exc
            self._ready.set()

    async def _main(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with KubeEmulator() as handler, kmock.Server(handler) as server:
            self.kmock = handler
            self.url = str(server.url).rstrip("/")
            self._ready.set()
            await self._stop.wait()

    def close(self) -> None:
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(10)

    # -- helpers for tests -------------------------------------------------------------------

    def put(self, resource: str, obj: dict, namespace: str | None = None) -> dict:
        obj = copy.deepcopy(obj)
        obj.setdefault("metadata", {}).setdefault("resourceVersion", "1")
        self.kmock.objects[resource, namespace, obj["metadata"]["name"]] = obj
        if resource == "v1/pods":
            self.kmock.index_pod(namespace, obj)
        return obj

    def freeze_cache(self) -> None:
        """The watch cache stops following etcd: ``resourceVersion=0`` pod LISTs see the pods as of now."""
        self.kmock.pod_cache = self.list("v1/pods")

    def finish(self, name: str, namespace: str) -> bool:
        """The kubelet is done with a terminating pod (its grace period and preStop over): delete it."""
        key = (kmock.resource("v1/pods"), namespace, name)

        def delete() -> bool:
            if key in self.kmock.objects and not self.kmock.objects[key].deleted:
                self.kmock.objects[key].delete()
                return True
            return False

        return asyncio.run_coroutine_threadsafe(_call(delete), self.loop).result(10)

    def get(self, resource: str, name: str, namespace: str | None = None) -> dict | None:
        key = (kmock.resource(resource), namespace, name)
        if key not in self.kmock.objects or self.kmock.objects[key].deleted:
            return None
        return _plain(self.kmock.objects[key].raw)

    def list(self, resource: str, namespace: str | None = None) -> list[dict]:
        """Every stored object of ``resource`` (in ``namespace``, if given), as the server holds it."""
        wanted = kmock.resource(resource)
        return [_plain(obj.raw) for (res, ns, _), obj in list(self.kmock.objects.items())
                if res == wanted and not obj.deleted and (namespace is None or ns == namespace)]

    def requests(self, method: str | None = None) -> list[Any]:
        return [r for r in self.kmock if method is None or str(r.method.value).upper() == method.upper()]


def node(name: str, **extra: Any) -> dict:
    return strategic_merge({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "uid": f"uid-{name}", "labels": {"kubernetes.io/hostname": name}},
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }, extra)


def pod(name: str, node_name: str, namespace: str = "default", **extra: Any) -> dict:
    return strategic_merge({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}"},
        "spec": {"nodeName": node_name},
        "status": {"phase": "Running"},
    }, extra)
