"""Drain by eviction with kubectl's filters, and the opt-out rule.

kubectl drain (k8s.io/kubectl/pkg/drain) skips mirror pods (static pods the
kubelet owns; evicting them does nothing) and DaemonSet pods (the DaemonSet
would put them straight back), evicts the rest through policy/v1 Eviction so
that PodDisruptionBudgets are honoured, retries a 429 (a PDB says not now),
takes 404 as done, and gives up after one overall timeout. We do the same,
except that we never block a whole pass on one node: each pass spends at most
``pass_budget`` seconds on a node, and the overall timeout is counted from the
first eviction, which the ownership record keeps across passes and restarts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from slurm_hooks.bridge.api import Eviction, KubeApi, Obj, annotations_of, labels_of, meta

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
KARPENTER_DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
#: medik8s' node-level opt-out; honoured like a pod opt-out.
MEDIK8S_EXCLUDE = "remediation.medik8s.io/exclude-from-remediation"


def pod_ref(pod: Obj) -> str:
    m = meta(pod)
    return f"{m.get('namespace', '')}/{m.get('name', '')}"


def skip_reason(pod: Obj) -> str | None:
    """Why kubectl drain would leave this pod alone, or ``None`` to evict it."""
    m = meta(pod)
    if MIRROR_ANNOTATION in (m.get("annotations") or {}):
        return "mirror pod"
    if any(ref.get("kind") == "DaemonSet" for ref in m.get("ownerReferences") or ()):
        return "DaemonSet pod"
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return "finished"
    if m.get("deletionTimestamp"):
        return "already terminating"
    return None


def _is_true(value: str | None) -> bool:
    return str(value).strip().lower() == "true"


def opt_out(pods: list[Obj], node: Obj, label: str) -> str | None:
    """The first opt-out found, as ``"pod ns/name: label"``; ``None`` when remediation may proceed."""
    if _is_true(labels_of(node).get(MEDIK8S_EXCLUDE)):
        return f"node label {MEDIK8S_EXCLUDE}"
    for pod in pods:
        if skip_reason(pod) in ("finished", "already terminating"):
            continue
        for key in (label, KARPENTER_DO_NOT_DISRUPT):
            if _is_true(labels_of(pod).get(key)) or _is_true(annotations_of(pod).get(key)):
                return f"pod {pod_ref(pod)}: {key}"
    return None


@dataclass
class DrainResult:
    evicted: list[str] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)
    blocked: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return not self.blocked


class Drainer:
    def __init__(
        self,
        kube: KubeApi,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        backoff: float = 0.5,
        backoff_max: float = 5.0,
    ):
        self.kube = kube
        self.clock = clock
        self.sleep = sleep
        self.backoff = backoff
        self.backoff_max = backoff_max

    def drain(self, pods: list[Obj], budget: float, *, dry_run: bool = False) -> DrainResult:
        """Evict what kubectl would; retry PDB-blocked pods with backoff for ``budget`` seconds."""
        result = DrainResult()
        pending: list[Obj] = []
        for pod in pods:
            why = skip_reason(pod)
            if why:
                result.skipped.append((pod_ref(pod), why))
            else:
                pending.append(pod)
        deadline = self.clock() + max(0.0, budget)
        delay = self.backoff
        while pending:
            blocked = []
            for pod in pending:
                m = meta(pod)
                outcome = self.kube.evict(m.get("namespace", ""), m.get("name", ""), dry_run=dry_run)
                if outcome is Eviction.EVICTED:
                    result.evicted.append(pod_ref(pod))
                elif outcome is Eviction.GONE:
                    result.gone.append(pod_ref(pod))
                else:
                    blocked.append(pod)
            pending = blocked
            left = deadline - self.clock()
            if not pending or left <= 0:
                break
            self.sleep(min(delay, left, self.backoff_max))
            delay *= 2
        result.blocked = [pod_ref(p) for p in pending]
        return result
