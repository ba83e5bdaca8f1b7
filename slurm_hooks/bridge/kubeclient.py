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


def classify(status: int | None, message: str, causes: tuple[str, ...] = ()) -> KubeError:
    """One place where HTTP statuses become the bridge's errors."""
    if status is None or status == 0 or status in _TRANSIENT_STATUS or status >= 500:
        return KubeTransient(message, status, causes)
    if status == 409:
        return KubeConflict(message, status, causes)
    return KubePermanent(message, status, causes)


def _status_body(exc: Any) -> dict[str, Any]:
    body = getattr(exc, "body", None)
    try:
        status = json.loads(body) if body else {}
    except ValueError:
        status = {}
    return status if isinstance(status, dict) else {}


def _causes(exc: Any) -> tuple[str, ...]:
    """``details.causes[].type`` of the Status body: how kube-apiserver tells a PDB's 429
    (``DisruptionBudget``) from API throttling (none), and a terminating namespace's 403."""
    details = _status_body(exc).get("details") or {}
    causes = details.get("causes") if isinstance(details, dict) else None
    return tuple(str(c.get("type") or c.get("reason") or "") for c in causes or () if isinstance(c, dict))


def is_pdb_refusal(exc: Any) -> bool:
    """An eviction's 429 from a PodDisruptionBudget, not from API Priority and Fairness throttling.

    kube-apiserver's eviction handler sets the cause ``DisruptionBudget`` (and says "disruption
    budget" in the message); a throttled request carries no cause, and a ``Retry-After`` header.
    """
    return "DisruptionBudget" in _causes(exc) or "disruption budget" in str(_status_body(exc).get("message", "")).lower()


def _status_message(exc: Any) -> str:
    """``reason: message`` from a Kubernetes Status body, or the HTTP reason."""
    status = _status_body(exc)
    if status.get("message"):
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


def client_module() -> tuple[Any, type[Exception]]:
    """(``kubernetes.client``, its ``ApiException``), imported now: for :mod:`slurm_hooks.bridge.access`,
    whose access reviews are the one API call outside :class:`KubeClient`."""
    try:
        from kubernetes import client as k8s_client
        from kubernetes.client.exceptions import ApiException
    except ImportError:
        raise KubeClientMissing(MISSING) from None
    return k8s_client, ApiException


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
        monotonic: Callable[[], float] = time.monotonic,
    ):
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        self._api_client = api_client
        self._core = client.CoreV1Api(api_client)
        self._custom = client.CustomObjectsApi(api_client)
        self._coordination = client.CoordinationV1Api(api_client)
        self._models = client
        self._api_exception = ApiException
        self._network_errors = (HTTPError, OSError)
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.backoff_max = backoff_max
        self.sleep = sleep
        self.monotonic = monotonic
        #: ``monotonic()`` by which every call but the Lease's must be over (the leader's renew
        #: deadline: a pass never acts past it), or ``None``; the bridge sets it to its elector's.
        self.deadline: Callable[[], float | None] | None = None
        #: Items per page of a consistent LIST (kubectl drain's 500).
        self.page_size = PAGE_SIZE
        #: verb -> number of HTTP requests sent (retries included).
        self.calls: collections.Counter[str] = collections.Counter()

    def close(self) -> None:
        self._api_client.close()

    # -- the one retrying request function -------------------------------------------

    def _request(self, verb: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call ``fn`` and return the parsed JSON body; raise :class:`KubeError` subclasses.

        Transient failures are retried ``retries`` times with exponential backoff
        (Retry-After wins for 429, capped at ``backoff_max``); the last one is raised.
        ``give_up`` picks the errors the caller handles itself (an eviction's PDB 429: a
        throttling 429 is retried here like any other).
        """
        give_up: Callable[[Any], bool] = kwargs.pop("give_up", lambda exc: False)
        until = self.deadline() if self.deadline is not None and not verb.endswith("_lease") else None
        attempt = 0
        while True:
            attempt += 1
            timeout = self.timeout
            if until is not None:
                left = until - self.monotonic()
                if left <= 0.05:
                    raise KubeTransient(f"{verb}: not sent: past the leader's renew deadline")
                timeout = min(timeout, left)
            self.calls[verb] += 1
            delay: float | None = None
            try:
                resp = fn(*args, _preload_content=False, _request_timeout=timeout, **kwargs)
            except self._api_exception as exc:
                error = classify(exc.status, _status_message(exc), _causes(exc))
                if give_up(exc):
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
            delay = min(delay, self.backoff_max)
            if until is not None and self.monotonic() + delay >= until:
                raise error from None  # no retry past the renew deadline
            self.sleep(delay)

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

    def _list_all(self, verb: str, fn: Callable[..., Any], *args: Any, consistent: bool = False,
                  **kw: Any) -> list[Obj]:
        """Every page of a LIST: from the API server's watch cache, or ``consistent``.

        ``resourceVersion=0`` lets kube-apiserver answer from its cache instead of a quorum read
        of etcd (a full scan of 300,000 pods for each field-selected LIST), but the cache may be
        behind (a pod bound a moment ago is not in it) and it ignores ``limit``: one page. A
        consistent LIST names no version: the latest state, truly paged by ``limit``/``continue``
        (served from the cache too where the API server can prove it current, Kubernetes 1.31+).
        """
        items: list[Obj] = []
        token = None
        while True:
            page_kw = dict(kw, limit=self.page_size if consistent else PAGE_SIZE)
            if token:
                page_kw["_continue"] = token
            elif not consistent:
                page_kw["resource_version"] = "0"
            page = self._request(verb, fn, *args, **page_kw) or {}
            items.extend(page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items

    def list_nodes(self, label_selector: str = "") -> list[Obj]:
        kw = {"label_selector": label_selector} if label_selector else {}
        return self._list_all("list_nodes", self._core.list_node, **kw)

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

    def list_pods_on_node(self, node: str, *, consistent: bool = False) -> list[Obj]:
        items = self._list_all("list_pods", self._core.list_pod_for_all_namespaces, consistent=consistent,
                               field_selector=f"spec.nodeName={node}")
        # Belt and braces: a server (or an emulator) that ignores the field selector.
        return [p for p in items if (p.get("spec") or {}).get("nodeName") == node]

    def list_pods(self, namespace: str, label_selector: str) -> list[Obj]:
        return self._list_all("list_pods", self._core.list_namespaced_pod, namespace, label_selector=label_selector)

    def evict(self, namespace: str, name: str, *, dry_run: bool = False) -> Eviction:
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        try:
            self._request(
                "evict", self._core.create_namespaced_pod_eviction, name, namespace, body,
                give_up=lambda exc: exc.status == 429 and is_pdb_refusal(exc), **self._dry(dry_run),
            )
        except KubeTransient as exc:
            if exc.status == 429 and ("DisruptionBudget" in exc.causes or "disruption budget" in str(exc).lower()):
                return Eviction.BLOCKED
            raise  # throttled (or 5xx) after every retry: transient, the pass goes on with the next node
        except KubePermanent as exc:
            if exc.status == 404:
                return Eviction.GONE
            if exc.status == 403 and "NamespaceTerminating" in exc.causes:
                return Eviction.NAMESPACE_TERMINATING
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

    def list_objects(self, resource: Resource, namespace: str | None = None, label_selector: str = "") -> list[Obj]:
        r = resource
        kw = {"label_selector": label_selector} if label_selector else {}
        if namespace:
            return self._list_all("list_objects", self._custom.list_namespaced_custom_object,
                                  r.group, r.version, namespace, r.plural, **kw)
        return self._list_all("list_objects", self._custom.list_cluster_custom_object, r.group, r.version, r.plural, **kw)

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

    def delete_object(self, resource: Resource, name: str, namespace: str | None = None, *, uid: str = "",
                      resource_version: str = "", dry_run: bool = False) -> bool:
        """DELETE, with preconditions when given: the object must still be the one read (same UID,
        same resourceVersion), else the API server answers 409 (:class:`KubeConflict`)."""
        r = resource
        body = None
        if uid or resource_version:
            body = self._models.V1DeleteOptions(preconditions=self._models.V1Preconditions(
                uid=uid or None, resource_version=resource_version or None))
        if namespace:
            result = self._maybe(
                "delete_object", self._custom.delete_namespaced_custom_object,
                r.group, r.version, namespace, r.plural, name, body=body, **self._dry(dry_run),
            )
        else:
            result = self._maybe(
                "delete_object", self._custom.delete_cluster_custom_object,
                r.group, r.version, r.plural, name, body=body, **self._dry(dry_run),
            )
        return result is not None

    # -- the leader's Lease (coordination.k8s.io/v1) ------------------------------------

    def get_lease(self, namespace: str, name: str) -> Obj | None:
        return self._maybe("get_lease", self._coordination.read_namespaced_lease, name, namespace)

    def create_lease(self, namespace: str, body: Obj) -> Obj | None:
        """``None`` when a Lease of that name exists already (409): someone else made it first."""
        try:
            return self._request("create_lease", self._coordination.create_namespaced_lease, namespace, body)
        except KubeConflict:
            return None

    def replace_lease(self, namespace: str, name: str, body: Obj) -> Obj:
        """PUT with the ``resourceVersion`` read: 409 (:class:`KubeConflict`) when it changed since."""
        return self._request("replace_lease", self._coordination.replace_namespaced_lease, name, namespace, body)


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
