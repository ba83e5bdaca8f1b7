"""The :class:`~.api.KubeApi` of the official ``kubernetes`` client: the only module importing it.

``kubernetes`` 37 (pinned to the major: it moved to pydantic models and changed
exceptions and return types) is imported lazily, inside :func:`load_credentials`
and :class:`KubeClient`, so ``import slurm_hooks.bridge.kubeclient`` costs nothing.
:func:`load_credentials` is the one credential loader: the bridge's and ``validate``'s.

Every call goes through :meth:`KubeClient._request`: one timeout per request
(``_request_timeout``), bounded retries with exponential backoff for transient
failures (429 honouring ``Retry-After``, 5xx, timeouts, connection refused), and
errors turned into the bridge's own hierarchy. Responses are read raw
(``_preload_content=False``) and parsed as JSON: plain dicts, no model classes,
and no cost for deserialising a thousand Nodes into pydantic objects.
"""

from __future__ import annotations

import collections
import json
import os
import time
from typing import Any, Callable

from slurm_hooks.bridge.api import (
    FIELD_MANAGER,
    Eviction,
    KubeConflict,
    KubeError,
    KubePermanent,
    KubeTransient,
    Obj,
    Resource,
)
from slurm_hooks.errors import PermanentError

STRATEGIC = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
PAGE_SIZE = 500  # kubectl drain's page size

_TRANSIENT_STATUS = {429, 500, 502, 503, 504}


def classify(status: int | None, message: str) -> KubeError:
    """One place where HTTP statuses become the bridge's errors."""
    if status is None or status == 0 or status in _TRANSIENT_STATUS or status >= 500:
        return KubeTransient(message, status)
    if status == 409:
        return KubeConflict(message, status)
    return KubePermanent(message, status)


def _status_message(exc: Any) -> str:
    """``reason: message`` from a Kubernetes Status body, or the HTTP reason."""
    body = getattr(exc, "body", None)
    try:
        status = json.loads(body) if body else {}
    except ValueError:
        status = {}
    if isinstance(status, dict) and status.get("message"):
        text = f"{status.get('reason') or exc.reason}: {status['message']}"
    else:
        text = str(getattr(exc, "reason", "") or exc)
    return f"HTTP {exc.status}: {text.splitlines()[0] if text else ''}"[:300]


def _retry_after(exc: Any) -> float | None:
    headers = getattr(exc, "headers", None) or {}
    value = headers.get("Retry-After") if hasattr(headers, "get") else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


# -- credentials: the one loader -----------------------------------------------------------


class KubeClientMissing(PermanentError):
    """The ``kubernetes`` package is not installed here (node-side environments)."""


class CredentialsError(KubePermanent):
    """No usable credentials, or the API server rejected them (401/403)."""


MISSING = ("the bridge needs the kubernetes client, which is not installed here: "
           "pip install 'slurm-hooks[k8s]' (Python 3.10+), in the bridge's own environment")


def _kubeconfig_paths(kubeconfig: str | None) -> list[str]:
    if kubeconfig:
        return [kubeconfig]
    env = os.environ.get("KUBECONFIG", "")
    paths = [os.path.expanduser(p) for p in env.split(os.pathsep) if p]
    return paths or [os.path.expanduser("~/.kube/config")]


def load_credentials(kubeconfig: str | None = None, context: str | None = None, *, url: str | None = None,
                     in_cluster: bool | None = None) -> tuple[Any, str]:
    """(``kubernetes.client.ApiClient``, where the credentials came from).

    An explicit ``url`` (tests: no credentials), else in-cluster (``in_cluster``, or ``None`` and the
    pod's service-account environment is there and no kubeconfig is named), else the kubeconfig
    named, else $KUBECONFIG / ~/.kube/config. urllib3 does not retry: the caller's own loop decides
    (the bridge's :class:`~slurm_hooks.bridge.kubeclient.KubeClient`), so retries never multiply.
    """
    try:
        from kubernetes import client as k8s_client
        from kubernetes import config as k8s_config
    except ImportError:
        raise KubeClientMissing(MISSING) from None
    configuration = k8s_client.Configuration()
    try:
        if url:
            configuration.host = url.rstrip("/")
            source = f"API server {configuration.host}"
        elif in_cluster or (in_cluster is None and not kubeconfig and os.environ.get("KUBERNETES_SERVICE_HOST")):
            k8s_config.load_incluster_config(client_configuration=configuration)
            source = "in-cluster service account"
        else:
            paths = _kubeconfig_paths(kubeconfig)
            if not any(os.path.exists(p) for p in paths):
                raise CredentialsError(f"cannot load Kubernetes credentials: kubeconfig {paths[0]} not found "
                                       "and not running in a pod")
            k8s_config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=configuration,
                                        persist_config=False)
            source = f"kubeconfig {kubeconfig or os.pathsep.join(paths)}" + (f" (context {context})" if context else "")
    except k8s_config.ConfigException as exc:
        raise CredentialsError(f"cannot load Kubernetes credentials: {exc}") from None
    except OSError as exc:
        raise CredentialsError(f"cannot read kubeconfig: {exc}") from None
    configuration.retries = False
    return k8s_client.ApiClient(configuration), source


class KubeClient:
    """:class:`~.api.KubeApi` over ``kubernetes.client``; counts calls per verb for the bench."""

    def __init__(
        self,
        api_client: Any,
        *,
        timeout: float = 10.0,
        retries: int = 3,
        backoff: float = 0.5,
        backoff_max: float = 8.0,
        sleep: Callable[[float], None] = time.sleep,
    ):
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        self._api_client = api_client
        self._core = client.CoreV1Api(api_client)
        self._custom = client.CustomObjectsApi(api_client)
        self._api_exception = ApiException
        self._network_errors = (HTTPError, OSError)
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.backoff_max = backoff_max
        self.sleep = sleep
        #: verb -> number of HTTP requests sent (retries included).
        self.calls: collections.Counter[str] = collections.Counter()

    def close(self) -> None:
        self._api_client.close()

    # -- the one retrying request function -------------------------------------------

    def _request(self, verb: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call ``fn`` and return the parsed JSON body; raise :class:`KubeError` subclasses.

        Transient failures are retried ``retries`` times with exponential backoff
        (Retry-After wins for 429, capped at ``backoff_max``); the last one is raised.
        ``no_retry`` names statuses the caller handles itself (eviction's 429).
        """
        no_retry: frozenset[int] = kwargs.pop("no_retry", frozenset())
        attempt = 0
        while True:
            attempt += 1
            self.calls[verb] += 1
            delay: float | None = None
            try:
                resp = fn(*args, _preload_content=False, _request_timeout=self.timeout, **kwargs)
            except self._api_exception as exc:
                error = classify(exc.status, _status_message(exc))
                if exc.status in no_retry:
                    raise error from None
                delay = _retry_after(exc) if exc.status == 429 else None
            except self._network_errors as exc:
                error = KubeTransient(f"{type(exc).__name__}: {exc}"[:300])
            except (TypeError, ValueError) as exc:  # the client's own validation of our arguments
                raise KubePermanent(f"{verb}: invalid request: {exc}"[:300]) from None
            else:
                try:
                    return json.loads(resp.data) if resp.data else None
                except ValueError as exc:  # a body that is not JSON: a proxy's error page
                    error = KubeTransient(f"{verb}: unparseable response: {exc}"[:300])
            if not isinstance(error, KubeTransient) or attempt > self.retries:
                raise error from None
            if delay is None:
                delay = self.backoff * (2 ** (attempt - 1))
            self.sleep(min(delay, self.backoff_max))

    def _maybe(self, verb: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Like :meth:`_request`, but a 404 is ``None`` (patching a gone object is a no-op)."""
        try:
            return self._request(verb, fn, *args, **kwargs)
        except KubePermanent as exc:
            if exc.status == 404:
                return None
            raise

    @staticmethod
    def _dry(dry_run: bool) -> dict[str, Any]:
        return {"dry_run": "All"} if dry_run else {}

    # -- nodes -----------------------------------------------------------------------

    def list_nodes(self, label_selector: str = "") -> list[Obj]:
        items: list[Obj] = []
        token = None
        while True:
            kw: dict[str, Any] = {"limit": PAGE_SIZE}
            if label_selector:
                kw["label_selector"] = label_selector
            if token:
                kw["_continue"] = token
            page = self._request("list_nodes", self._core.list_node, **kw) or {}
            items.extend(page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items

    def get_node(self, name: str) -> Obj | None:
        return self._maybe("get_node", self._core.read_node, name)

    def patch_node(self, name: str, patch: Obj, *, dry_run: bool = False) -> Obj | None:
        return self._maybe(
            "patch_node", self._core.patch_node, name, patch,
            _content_type=STRATEGIC, field_manager=FIELD_MANAGER, **self._dry(dry_run),
        )

    def json_patch_node(self, name: str, ops: list[Obj], *, dry_run: bool = False) -> Obj | None:
        try:
            return self._maybe(
                "json_patch_node", self._core.patch_node, name, ops,
                _content_type=JSON_PATCH, field_manager=FIELD_MANAGER, **self._dry(dry_run),
            )
        except KubePermanent as exc:
            # A failed ``test`` op: the API server answers 422 (kube-apiserver's patch handler).
            if exc.status == 422 and "test" in str(exc).lower():
                raise KubeConflict(str(exc), exc.status) from None
            raise

    def patch_node_status(self, name: str, patch: Obj, *, dry_run: bool = False) -> Obj | None:
        return self._maybe(
            "patch_node_status", self._core.patch_node_status, name, patch,
            _content_type=STRATEGIC, field_manager=FIELD_MANAGER, **self._dry(dry_run),
        )

    # -- pods ------------------------------------------------------------------------

    def list_pods_on_node(self, node: str) -> list[Obj]:
        items: list[Obj] = []
        token = None
        while True:
            kw: dict[str, Any] = {"field_selector": f"spec.nodeName={node}", "limit": PAGE_SIZE}
            if token:
                kw["_continue"] = token
            page = self._request("list_pods", self._core.list_pod_for_all_namespaces, **kw) or {}
            items.extend(page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                # Belt and braces: a server (or an emulator) that ignores the field selector.
                return [p for p in items if (p.get("spec") or {}).get("nodeName") == node]

    def list_pods(self, namespace: str, label_selector: str) -> list[Obj]:
        page = self._request(
            "list_pods", self._core.list_namespaced_pod, namespace, label_selector=label_selector
        ) or {}
        return page.get("items") or []

    def evict(self, namespace: str, name: str, *, dry_run: bool = False) -> Eviction:
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        try:
            self._request(
                "evict", self._core.create_namespaced_pod_eviction, name, namespace, body,
                no_retry=frozenset({429}), **self._dry(dry_run),
            )
        except KubeTransient as exc:
            if exc.status == 429:
                return Eviction.BLOCKED
            raise
        except KubePermanent as exc:
            if exc.status == 404:
                return Eviction.GONE
            raise
        return Eviction.EVICTED

    # -- events ----------------------------------------------------------------------

    def create_event(self, namespace: str, event: Obj, *, dry_run: bool = False) -> bool:
        try:
            self._request("create_event", self._core.create_namespaced_event, namespace, event, **self._dry(dry_run))
        except KubeConflict:
            return False
        return True

    # -- custom resources (replacement backends) -------------------------------------

    def list_objects(self, resource: Resource, namespace: str | None = None) -> list[Obj]:
        r = resource
        if namespace:
            page = self._request(
                "list_objects", self._custom.list_namespaced_custom_object, r.group, r.version, namespace, r.plural
            )
        else:
            page = self._request(
                "list_objects", self._custom.list_cluster_custom_object, r.group, r.version, r.plural
            )
        return (page or {}).get("items") or []

    def get_object(self, resource: Resource, name: str, namespace: str | None = None) -> Obj | None:
        r = resource
        if namespace:
            return self._maybe(
                "get_object", self._custom.get_namespaced_custom_object, r.group, r.version, namespace, r.plural, name
            )
        return self._maybe("get_object", self._custom.get_cluster_custom_object, r.group, r.version, r.plural, name)

    def create_object(self, resource: Resource, body: Obj, *, dry_run: bool = False) -> bool:
        r = resource
        namespace = (body.get("metadata") or {}).get("namespace")
        try:
            if namespace:
                self._request(
                    "create_object", self._custom.create_namespaced_custom_object,
                    r.group, r.version, namespace, r.plural, body, **self._dry(dry_run),
                )
            else:
                self._request(
                    "create_object", self._custom.create_cluster_custom_object,
                    r.group, r.version, r.plural, body, **self._dry(dry_run),
                )
        except KubeConflict:
            return False
        return True

    def patch_object(
        self, resource: Resource, name: str, patch: Obj, namespace: str | None = None, *, dry_run: bool = False
    ) -> Obj | None:
        r = resource
        if namespace:
            return self._maybe(
                "patch_object", self._custom.patch_namespaced_custom_object,
                r.group, r.version, namespace, r.plural, name, patch, _content_type=MERGE, **self._dry(dry_run),
            )
        return self._maybe(
            "patch_object", self._custom.patch_cluster_custom_object,
            r.group, r.version, r.plural, name, patch, _content_type=MERGE, **self._dry(dry_run),
        )

    def delete_object(self, resource: Resource, name: str, namespace: str | None = None, *, dry_run: bool = False) -> bool:
        r = resource
        if namespace:
            result = self._maybe(
                "delete_object", self._custom.delete_namespaced_custom_object,
                r.group, r.version, namespace, r.plural, name, **self._dry(dry_run),
            )
        else:
            result = self._maybe(
                "delete_object", self._custom.delete_cluster_custom_object,
                r.group, r.version, r.plural, name, **self._dry(dry_run),
            )
        return result is not None


def connect(
    *,
    url: str | None = None,
    kubeconfig: str | None = None,
    context: str | None = None,
    in_cluster: bool | None = None,
    **options: Any,
) -> KubeClient:
    """Build a :class:`KubeClient`: an explicit URL (tests), in-cluster, or a kubeconfig.

    ``in_cluster=None`` means: in-cluster when the service-account environment
    is there (``KUBERNETES_SERVICE_HOST``), the kubeconfig otherwise.
    """
    api_client, _ = load_credentials(kubeconfig, context, url=url, in_cluster=in_cluster)
    return KubeClient(api_client, **options)
