"""Evicting a Kubernetes node's pods as kubectl drain does, and the opt-out rule (a Slurm node is drained;
a Kubernetes node's pods are evicted: one word per meaning).

kubectl drain (k8s.io/kubectl/pkg/drain) looks at every pod on the node and

- skips pods already terminating, mirror pods (static pods the kubelet owns;
  evicting them does nothing) and DaemonSet pods (the DaemonSet would put them
  straight back; ``--ignore-daemonsets``);
- refuses pods with an ``emptyDir`` volume (their data would be lost) unless
  ``--delete-emptydir-data``, and pods that no controller owns (a bare pod
  evicted is gone for good) unless ``--force``. A finished pod (Succeeded,
  Failed) passes both: nothing is lost;
- evicts the rest through policy/v1 Eviction so that PodDisruptionBudgets are
  honoured, retries a 429 (a PDB says not now), takes 404 as done, retries a pod
  whose namespace is being deleted (403 ``NamespaceTerminating``) until the namespace's
  deletion marks it terminating, **waits for each evicted pod's deletion** (by UID: a
  new pod of the same name is not the one it evicted), waits for pods already
  terminating too (evicted by someone else, or their namespace going), and gives up
  after one overall timeout.

We apply the same filters, in that order, with two differences. Finished pods
are left alone (they hold nothing), and a refused pod does not fail the whole
drain: it is reported (:attr:`DrainResult.protected`, an audit record and an
Event on the node) and the rest of the node is drained; ``drain_force`` and
``drain_delete_emptydir_data`` are the two kubectl flags. On Slinky the slurmd
pod goes last: it is evicted only once every other evictable pod has left the
node (so Slurm keeps the node until nothing else runs there). And we never
block a whole pass on one node: a round never sleeps, the reconciler retries the
rounds of all draining nodes together within one pass budget, and the overall
timeout is counted from the first eviction, which the ownership record keeps
across passes and restarts (with the UIDs of the pods evicted).
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass, field

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


_GO_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|\u00b5s|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "\u00b5s": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def go_duration(text: str) -> float | None:
    """Seconds in a Go ``time.ParseDuration`` string (``30m``, ``1h30m``, ``90s``); ``None`` if it is not one."""
    text = text.strip()
    if not text or text in ("0",):
        return 0.0 if text == "0" else None
    pos, total = 0, 0.0
    for m in _GO_DURATION.finditer(text):
        if m.start() != pos:
            return None
        total += float(m.group(1)) * _UNIT_S[m.group(2)]
        pos = m.end()
    return total if pos == len(text) else None


def _timestamp(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return datetime.datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(
            tzinfo=datetime.timezone.utc).timestamp()
    except ValueError:
        return None


def karpenter_pod_protected(pod: Obj, now: float | None) -> bool:
    """Karpenter's pod ``do-not-disrupt``: ``"true"``, or a duration after the pod's start during which
    the pod is protected (``"30m"``). A value that is neither protects nothing (Karpenter ignores it)."""
    value = annotations_of(pod).get(KARPENTER_DO_NOT_DISRUPT)
    if value is None:
        value = labels_of(pod).get(KARPENTER_DO_NOT_DISRUPT)
    if value is None:
        return False
    if _is_true(value):
        return True
    seconds = go_duration(str(value))
    if seconds is None:
        return False
    started = _timestamp((pod.get("status") or {}).get("startTime")) or _timestamp(meta(pod).get("creationTimestamp"))
    if started is None or now is None:
        return True  # no start to count from: protected, as while the pod is starting
    return now < started + seconds


def opt_out(pods: list[Obj], node: Obj, label: str, now: float | None = None) -> str | None:
    """The first opt-out found, as ``"pod ns/name: label"``; ``None`` when remediation may proceed.

    The owners' own pins: medik8s' node label, Karpenter's ``do-not-disrupt`` on the Node (``"true"``)
    and on pods (``"true"`` or a duration from the pod's start, ``now`` being the wall clock), and
    our own ``label`` on pods.
    """
    if _is_true(labels_of(node).get(MEDIK8S_EXCLUDE)):
        return f"node label {MEDIK8S_EXCLUDE}"
    if _is_true(annotations_of(node).get(KARPENTER_DO_NOT_DISRUPT)):
        return f"node annotation {KARPENTER_DO_NOT_DISRUPT}"
    for pod in pods:
        if skip_reason(pod) in ("finished", "already terminating"):
            continue
        if _is_true(labels_of(pod).get(label)) or _is_true(annotations_of(pod).get(label)):
            return f"pod {pod_ref(pod)}: {label}"
        if karpenter_pod_protected(pod, now):
            value = annotations_of(pod).get(KARPENTER_DO_NOT_DISRUPT) or labels_of(pod).get(KARPENTER_DO_NOT_DISRUPT)
            return f"pod {pod_ref(pod)}: {KARPENTER_DO_NOT_DISRUPT}" + ("" if _is_true(value) else f"={value}")
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
    #: Pods still on the node that are going (kubectl waits for them): ones we evicted (same UID),
    #: ones already terminating when we came, ones whose namespace is being deleted.
    terminating: list[str] = field(default_factory=list)
    #: Pods whose eviction the API server refused because their namespace is being deleted: asked
    #: again next round (kubectl retries) and waited for once the namespace's deletion marks them.
    namespace_terminating: list[str] = field(default_factory=list)

    @property
    def done(self) -> bool:
        """Nothing blocked, the slurmd pod evicted, and every pod we evicted deleted (kubectl's wait)."""
        return not self.blocked and not self.last and not self.terminating


class Evictor:
    """One drain round per call: evict what kubectl would, the slurmd pod last; the caller waits.

    A round never sleeps. The reconciler runs rounds for every draining node of a pass
    together, with one backoff and one pass deadline, so ten PDB-blocked nodes cost one
    budget, not ten (kubectl drains one node; the bridge drains many at once).
    """

    def __init__(self, kube: KubeApi, *, force: bool = False, delete_emptydir_data: bool = False):
        self.kube = kube
        self.force = force
        self.delete_emptydir_data = delete_emptydir_data

    def _sort(self, pods: list[Obj], result: DrainResult,
              evicted: dict[str, str]) -> tuple[list[Obj], list[Obj], list[Obj]]:
        """(evict now, slurmd pods for last, other pods still on the node) after the filters.

        A pod we evicted (its UID in ``evicted``) that is still listed is terminating: waited for.
        """
        first: list[Obj] = []
        last: list[Obj] = []
        staying: list[Obj] = []
        for pod in pods:
            ref = pod_ref(pod)
            if evicted.get(ref) and evicted[ref] == meta(pod).get("uid"):
                result.terminating.append(ref)
                if not is_slurmd_pod(pod):
                    staying.append(pod)
                continue
            why = skip_reason(pod)
            if why:
                result.skipped.append((ref, why))
                if why == "already terminating":
                    result.terminating.append(ref)  # not ours, but kubectl waits for it too
                    if not is_slurmd_pod(pod):
                        staying.append(pod)
                continue
            kept = protection(pod, force=self.force, delete_emptydir_data=self.delete_emptydir_data)
            if kept:
                result.protected.append((ref, kept))
            elif is_slurmd_pod(pod):
                last.append(pod)
            else:
                first.append(pod)
        return first, last, staying

    def drain(self, pods: list[Obj], *, evicted: dict[str, str], node: str = "", dry_run: bool = False) -> DrainResult:
        """One round over the node's current ``pods``: no sleeping, a few API calls.

        ``evicted`` (pod ref -> UID, kept by the caller across rounds and passes) is updated
        with what this round evicted: the drain is done only once none of them is listed any
        more (deleted, or replaced by a new pod of the same name: another UID). When this round
        evicted something, the node's pods are listed again (``node``) to see whether they have
        gone, and the slurmd pod is evicted only once no other evictable pod is left on the
        node, terminating ones included (Slurm keeps the node until nothing else runs there).
        A PDB-blocked pod is not asked again within the round: the caller backs off first.
        """
        result = DrainResult()
        for _ in range(3):  # evict the others; the slurmd pod once they have left; see it gone
            view = DrainResult()
            first, last, staying = self._sort(pods, view, evicted)
            result.skipped = view.skipped
            result.protected = view.protected
            result.terminating, result.last = view.terminating, []
            first = [p for p in first if pod_ref(p) not in result.blocked]
            acted = self._evict(first, result, evicted, dry_run)
            if last and not first and not staying and not result.blocked:
                acted = self._evict(last, result, evicted, dry_run) or acted
            elif last:
                result.last = [pod_ref(p) for p in last]
            if not acted or dry_run or not node:
                break
            pods = self.kube.list_pods_on_node(node, consistent=True)
        return result

    def _evict(self, pods: list[Obj], result: DrainResult, evicted: dict[str, str], dry_run: bool) -> bool:
        """Evict ``pods``; True when any was evicted or found gone (the node's pods changed)."""
        acted = False
        for pod in pods:
            m = meta(pod)
            ref = pod_ref(pod)
            outcome = self.kube.evict(m.get("namespace", ""), m.get("name", ""), dry_run=dry_run)
            if outcome is Eviction.EVICTED:
                acted = True
                result.evicted.append(ref)
                if not dry_run:
                    evicted[ref] = str(m.get("uid") or "")
                    result.terminating.append(ref)  # until a listing shows it gone
            elif outcome is Eviction.GONE:
                acted = True
                result.gone.append(ref)
            elif outcome is Eviction.NAMESPACE_TERMINATING:
                # kubectl: an eviction in a namespace being deleted is refused until the namespace's
                # deletion marks the pod terminating; it is asked again (next round), then waited for.
                result.namespace_terminating.append(ref)
                if ref not in result.terminating:
                    result.terminating.append(ref)
            else:
                result.blocked.append(ref)
        return acted
