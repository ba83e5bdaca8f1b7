"""Slurm node -> Kubernetes node.

- Slinky: the operator writes the Slurm node ``Comment`` as JSON
  ``{"namespace", "podName", "node", ...}``; ``node`` is the Kubernetes node the
  slurmd pod runs on. We only ever read Comment, never write it. When Comment
  says nothing, the slurmd pod is found by its label
  ``nodeset.slinky.slurm.net/pod-hostname=<slurm name>`` (one API call).
- Bare metal: ``[bridge.nodes]`` maps names that differ; otherwise the same name.

``auto`` tries Comment first, then the table, then the same name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from slurm_hooks.bridge.api import KubeApi
from slurm_hooks.slurm import NodeInfo

SLINKY_HOSTNAME_LABEL = "nodeset.slinky.slurm.net/pod-hostname"


@dataclass(frozen=True)
class SlinkyComment:
    node: str
    namespace: str = ""
    pod: str = ""


def json_object(text: str) -> dict | None:
    """A node text field (Comment, Extra) read as a JSON object, or ``None`` for anything else:
    admins write free text in these fields too."""
    text = (text or "").strip()
    if not text.startswith("{"):
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def parse_comment(comment: str) -> SlinkyComment | None:
    """The operator's JSON Comment, or ``None`` for anything else (admins write comments too)."""
    data = json_object(comment)
    if data is None or not isinstance(data.get("node"), str) or not data["node"]:
        return None
    return SlinkyComment(node=data["node"], namespace=str(data.get("namespace") or ""), pod=str(data.get("podName") or ""))


class NodeMapper:
    def __init__(self, mode: str = "auto", table: dict[str, str] | None = None, slinky_namespace: str = "slurm"):
        self.mode = mode
        self.table = dict(table or {})
        self.slinky_namespace = slinky_namespace

    def kube_name(self, node: NodeInfo, kube: KubeApi | None = None) -> str | None:
        """The Kubernetes node under ``node``; ``None`` when it cannot be told (Slinky, pod gone)."""
        if self.mode in ("auto", "slinky"):
            parsed = parse_comment(node.comment)
            if parsed:
                return parsed.node
        if self.mode == "slinky":
            return self._from_pod(node.name, kube)
        return self.table.get(node.name, node.name)

    def kube_name_offline(self, node: NodeInfo) -> str | None:
        """Like :meth:`kube_name` without any API call (Slinky pod lookup skipped)."""
        if self.mode in ("auto", "slinky"):
            parsed = parse_comment(node.comment)
            if parsed:
                return parsed.node
        if self.mode == "slinky":
            return None
        return self.table.get(node.name, node.name)

    def _from_pod(self, slurm_name: str, kube: KubeApi | None) -> str | None:
        if kube is None:
            return None
        pods = kube.list_pods(self.slinky_namespace, f"{SLINKY_HOSTNAME_LABEL}={slurm_name}")
        # The pod that serves the name now: a terminating one (evicted, its preStop running) only
        # when there is no other.
        pods.sort(key=lambda p: bool((p.get("metadata") or {}).get("deletionTimestamp")))
        for pod in pods:
            node = (pod.get("spec") or {}).get("nodeName")
            if node:
                return node
        return None
