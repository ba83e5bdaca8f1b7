"""Drain by eviction with kubectl's filters, and the opt-out rule.

kubectl drain (k8s.io/kubectl/pkg/drain) looks at every pod on the node and

- skips pods already terminating, mirror pods (static pods the kubelet owns;
  evicting them does nothing) and DaemonSet pods (the DaemonSet would put them
  straight back; ``--ignore-daemonsets``);
- refuses pods with an ``emptyDir`` volume (their data would be lost) unless
  ``--delete-emptydir-data``, and pods that no controller owns (a bare pod
  evicted is gone for good) unless ``--force``. A finished pod (Succeeded,
  Failed) passes both: nothing is lost;
- evicts the rest through policy/v1 Eviction so that PodDisruptionBudgets are
  honoured, retries a 429 (a PDB says not now), takes 404 as done, and gives up
  after one overall timeout.

We apply the same filters, in that order, with two differences. Finished pods
are left alone (they hold nothing), and a refused pod does not fail the whole
drain: it is reported (:attr:`DrainResult.protected`, an audit record and an
Event on the node) and the rest of the node is drained; ``drain_force`` and
``drain_delete_emptydir_data`` are the two kubectl flags. On Slinky the slurmd
pod goes last: it is evicted only once every other evictable pod has left the
node (so Slurm keeps the node until nothing else runs there). And we never
block a whole pass on one node: each pass spends at most ``pass_budget`` seconds
on a node, and the overall timeout is counted from the first eviction, which
the ownership record keeps across passes and restarts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from slurm_hooks.bridge.api import Eviction, KubeApi, Obj, annotations_of, labels_of, meta
from slurm_hooks.bridge.mapping import SLINKY_HOSTNAME_LABEL

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
KARPENTER_DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
#: medik8s' node-level opt-out; honoured like a pod opt-out.
MEDIK8S_EXCLUDE = "remediation.medik8s.io/exclude-from-remediation"
#: Slinky's slurmd pods are owned by a NodeSet (not a DaemonSet): they are evicted, last.
SLINKY_NODESET_KIND = "NodeSet"


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


def controller_of(pod: Obj) -> Obj | None:
    """The owner reference marked ``controller: true`` (metav1.GetControllerOf), or ``None``."""
    return next((ref for ref in meta(pod).get("ownerReferences") or () if ref.get("controller") is True), None)


def protection(pod: Obj, *, force: bool = False, delete_emptydir_data: bool = False) -> str | None:
    """Why kubectl drain would refuse to evict this pod without a flag, or ``None``.

    Only for pods :func:`skip_reason` lets through. kubectl's order: local storage, then no controller.
    """
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return None
    reasons = []
    if not delete_emptydir_data:
        volumes = [v.get("name", "?") for v in (pod.get("spec") or {}).get("volumes") or () if "emptyDir" in v]
        if volumes:
            reasons.append(f"emptyDir volume {', '.join(volumes)} (drain_delete_emptydir_data = true evicts it)")
    if not force and controller_of(pod) is None:
        reasons.append("no controller: evicted, it would be gone for good (drain_force = true evicts it)")
    return "; ".join(reasons) or None


def is_slurmd_pod(pod: Obj) -> bool:
    """A Slinky slurmd pod: owned by a NodeSet, or labelled with the Slurm hostname it serves."""
    ref = controller_of(pod)
    return (ref is not None and ref.get("kind") == SLINKY_NODESET_KIND) or SLINKY_HOSTNAME_LABEL in labels_of(pod)


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
    #: Pods kubectl drain would refuse without --force / --delete-emptydir-data: left on the node.
    protected: list[tuple[str, str]] = field(default_factory=list)
    #: slurmd pods not evicted yet because other pods have not left the node.
    last: list[str] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return not self.blocked and not self.last


class Drainer:
    def __init__(
        self,
        kube: KubeApi,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        backoff: float = 0.5,
        backoff_max: float = 5.0,
        force: bool = False,
        delete_emptydir_data: bool = False,
    ):
        self.kube = kube
        self.clock = clock
        self.sleep = sleep
        self.backoff = backoff
        self.backoff_max = backoff_max
        self.force = force
        self.delete_emptydir_data = delete_emptydir_data

    def _sort(self, pods: list[Obj], result: DrainResult) -> tuple[list[Obj], list[Obj], list[Obj]]:
        """(evict now, slurmd pods for last, other pods still on the node) after the filters."""
        first: list[Obj] = []
        last: list[Obj] = []
        staying: list[Obj] = []
        for pod in pods:
            why = skip_reason(pod)
            if why:
                result.skipped.append((pod_ref(pod), why))
                if why == "already terminating" and not is_slurmd_pod(pod):
                    staying.append(pod)
                continue
            kept = protection(pod, force=self.force, delete_emptydir_data=self.delete_emptydir_data)
            if kept:
                result.protected.append((pod_ref(pod), kept))
            elif is_slurmd_pod(pod):
                last.append(pod)
            else:
                first.append(pod)
        return first, last, staying

    def drain(self, pods: list[Obj], budget: float, *, node: str = "", dry_run: bool = False) -> DrainResult:
        """Evict what kubectl would; retry PDB-blocked pods with backoff for ``budget`` seconds.

        The slurmd pod is evicted only once no other evictable pod is left on the node,
        terminating ones included: the other pods are evicted first and, if any were,
        the node's pods are listed again (``node``) to see whether they have gone.
        """
        result = DrainResult()
        first, last, staying = self._sort(pods, result)
        deadline = self.clock() + max(0.0, budget)
        self._evict(first, deadline, result, dry_run)
        if last and not result.blocked and (first or staying) and node and not dry_run:
            again = DrainResult()
            first, _, staying = self._sort(self.kube.list_pods_on_node(node), again)
        if last and not result.blocked and not first and not staying:
            self._evict(last, deadline, result, dry_run)
        elif last:
            result.last = [pod_ref(p) for p in last]
        return result

    def _evict(self, pods: list[Obj], deadline: float, result: DrainResult, dry_run: bool) -> None:
        pending = list(pods)
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
        result.blocked.extend(pod_ref(p) for p in pending)
