"""Kubernetes credentials: the one loader, for the bridge and for ``validate``'s RBAC review.

``kubernetes`` is imported inside :func:`load` (about 0.35 s, and installed only where the
bridge runs): importing this module costs nothing and the node side never calls it.
"""

from __future__ import annotations

import os
from typing import Any

from slurm_hooks.bridge.api import KubePermanent
from slurm_hooks.errors import PermanentError


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


def load(kubeconfig: str | None = None, context: str | None = None, *, url: str | None = None,
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
