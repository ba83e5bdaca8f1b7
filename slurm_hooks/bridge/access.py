"""Can the bridge's credentials do what the bridge does? Asked with SelfSubjectAccessReview.

What ``slurm-hooks validate`` asks Kubernetes. The client comes from
:mod:`slurm_hooks.bridge.kubeclient` (the only module importing ``kubernetes``, lazily:
the import costs ~0.35 s and the client is installed only where the bridge runs), as do the
credentials (:func:`~slurm_hooks.bridge.kubeclient.load_credentials`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from slurm_hooks.errors import TransientError


@dataclass(frozen=True)
class Permission:
    verb: str
    resource: str
    subresource: str = ""
    group: str = ""
    #: Asked in this namespace ("" = cluster-wide / every namespace).
    namespace: str = ""
    #: One object by name (a rule with ``resourceNames``), "" = any.
    name: str = ""

    def __str__(self) -> str:
        res = f"{self.resource}/{self.subresource}" if self.subresource else self.resource
        return f"{self.verb} {res}" + (f" {self.name}" if self.name else "") + \
            (f" ({self.group})" if self.group else "") + (f" in namespace {self.namespace}" if self.namespace else "")

    def rule(self) -> str:
        res = f"{self.resource}/{self.subresource}" if self.subresource else self.resource
        names = f', resourceNames: ["{self.name}"]' if self.name else ""
        return f'{{apiGroups: ["{self.group}"], resources: ["{res}"]{names}, verbs: ["{self.verb}"]}}'


#: What the bridge does: cordon/taint/condition nodes, drain them, record events.
def permissions_for(rules: Sequence[Any], namespace: str = "") -> tuple[Permission, ...]:
    """RBAC rules (``bridge.rbac.Rule``: group, "resource[/sub]", verbs) as single permissions; a
    namespaced rule (the Lease's Role) is asked in ``namespace``."""
    out = []
    for rule in rules:
        resource, _, sub = rule.resource.partition("/")
        where = (getattr(rule, "namespace", "") or namespace) if getattr(rule, "namespaced", False) else ""
        for name in getattr(rule, "names", ()) or ("",):
            out.extend(Permission(verb, resource, sub, rule.group, where, name) for verb in rule.verbs)
    return tuple(out)


def _core_rules() -> tuple[Any, ...]:
    from slurm_hooks.bridge.rbac import CORE

    return CORE


#: What every bridge needs, whatever its replacement backend: the ClusterRole that `render` writes.
REQUIRED: tuple[Permission, ...] = permissions_for(_core_rules())


@dataclass(frozen=True)
class AccessVerdict:
    permission: Permission
    allowed: bool
    reason: str = ""


def review(api_client: Any, permissions: Sequence[Permission] = REQUIRED, namespace: str = "",
           timeout: float = 10.0) -> list[AccessVerdict]:
    """One SelfSubjectAccessReview per permission; namespace "" asks for all namespaces."""
    from slurm_hooks.bridge.kubeclient import CredentialsError, client_module

    k8s_client, ApiException = client_module()
    api = k8s_client.AuthorizationV1Api(api_client)
    verdicts = []
    for perm in permissions:
        body = k8s_client.V1SelfSubjectAccessReview(
            spec=k8s_client.V1SelfSubjectAccessReviewSpec(
                resource_attributes=k8s_client.V1ResourceAttributes(
                    verb=perm.verb, resource=perm.resource, subresource=perm.subresource or None,
                    group=perm.group, namespace=perm.namespace or namespace or None, name=perm.name or None,
                )
            )
        )
        try:
            answer = api.create_self_subject_access_review(body, _request_timeout=timeout)
        except ApiException as exc:
            if exc.status in (401, 403):
                raise CredentialsError(f"API server refused the access review: HTTP {exc.status} {exc.reason}") from None
            raise TransientError(f"access review failed: HTTP {exc.status} {exc.reason}") from None
        except Exception as exc:  # urllib3 connection errors and the like
            raise TransientError(f"cannot reach the API server: {type(exc).__name__}: {exc}") from None
        status = answer.status
        allowed = bool(status is not None and status.allowed)
        reason = (status.reason or status.evaluation_error or "") if status is not None else ""
        verdicts.append(AccessVerdict(perm, allowed, reason))
    return verdicts


def close(api_client: Any) -> None:
    closer = getattr(api_client, "close", None)
    if callable(closer):
        try:
            closer()
        except Exception:  # closing a pool must not turn a verdict into a crash
            pass
