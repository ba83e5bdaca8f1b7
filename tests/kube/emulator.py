"""kmock's Kubernetes emulator on a real HTTP port, in a thread, for the sync ``kubernetes`` client.

kmock stores objects and speaks real HTTP, but it treats every patch as a merge
patch, ignores selectors and dryRun, never bumps resourceVersion and knows no
evictions. :class:`KubeEmulator` teaches it exactly the API-server rules the
bridge depends on (see ``merge.py``) and answers a pod's ``eviction``
subresource by deleting the pod. Everything else a test wants (a PDB's 429, a
500, a slow answer) is scripted with kmock's own per-URL rules, e.g.::

    server.kmock["post /api/v1/namespaces/default/pods/p1/eviction"][:2] << 429 << status(429)

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
    return status(429, "TooManyRequests",
                  f"Cannot evict pod {pod} as it would violate the pod's disruption budget.")


@attrs.define(kw_only=True)
class KubeEmulator(kmock.KubernetesEmulator):
    _rv: Any = attrs.field(factory=lambda: itertools.count(1000), init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for resource in ("v1/nodes", "v1/pods", "v1/events", "karpenter.sh/v1/nodeclaims",
                         "cluster.x-k8s.io/v1beta1/machines"):
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
        action = request.action
        if action in (enums.action.CREATE, enums.action.UPDATE, enums.action.DELETE):
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
            return body, 201
        key = (request.resource, request.namespace, request.name)
        if key not in objects or objects[key].deleted:
            raise kmock.KubernetesObjectNotFoundError()
        current = _plain(objects[key].raw)
        if request.action == enums.action.DELETE:
            if not dry_run:
                objects[key].delete()
            return current, 200
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

    # -- reads: selectors and paging ----------------------------------------------------------

    def _list(self, request: Any) -> dict:
        labels = request.params.get("labelSelector", "")
        fields = request.params.get("fieldSelector", "")
        items = [
            obj.raw for (resource, namespace, _), obj in self.objects.items()
            if resource == request.resource and not obj.deleted
            and (request.namespace is None or namespace == request.namespace)
        ]
        items = [i for i in items if matches_labels(i, labels) and matches_fields(i, fields)]
        start = int(base64.b64decode(request.params["continue"]).decode()) if request.params.get("continue") else 0
        limit = int(request.params.get("limit") or 0)
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
            self.objects[key].delete()
        return {**status(201, "Success", "evicted"), "status": "Success"}

    async def _serve_eviction(self, request: Any) -> Any:
        async with self._lock:
            answer = self._evict(request)
        return kmock.Response(status=201, payload=answer)


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
        return obj

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
