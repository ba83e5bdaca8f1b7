"""One bridge acts at a time: a ``coordination.k8s.io/v1`` Lease, and the breaker's state in it.

The loop is client-go's ``leaderelection`` (``tools/leaderelection/leaderelection.go``) over the
bridge's own :class:`~.api.KubeApi` (the Python client ships a ConfigMap lock only):

- a candidate reads the Lease; if there is none it creates it (a 409 means another made it
  first); if another holds it, it waits until the record has not changed for
  ``leaseDurationSeconds`` **by its own clock** (the holder's ``renewTime`` is never compared
  with the local time: clocks differ), then takes it with a PUT carrying the
  ``resourceVersion`` it read, so of two candidates exactly one wins (the other gets 409);
- the holder renews with the same guarded PUT every ``retry_period``; it counts as leader only
  while its last successful renewal is younger than ``renew_deadline`` (< the lease duration),
  so it stops acting before anyone else may take over;
- on a clean stop it releases the Lease (empty holder, 1 s duration) so the standby takes
  over at its next try instead of a whole lease duration later.

The circuit breaker's window and latch (:class:`~.state.BreakerState`) live in the Lease's
annotation ``slurm-hooks.io/breaker``: whoever leads sees what the previous leader admitted,
so two replicas, or two pods overlapping in a rollout, never double the blast-radius cap.
"""

from __future__ import annotations

import datetime
import json
import time
from typing import Callable

from slurm_hooks.bridge.api import KubeApi, KubeConflict, KubeError, Obj, annotations_of, meta
from slurm_hooks.bridge.state import BreakerState, rebase

BREAKER_ANNOTATION = "slurm-hooks.io/breaker"
#: Where a pod finds its own namespace (the Lease's, unless ``lease_namespace`` names one).
SA_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
_MICRO = "%Y-%m-%dT%H:%M:%S.%fZ"


def _micro_time(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, tz=datetime.timezone.utc).strftime(_MICRO)


def lease_namespace(configured: str) -> str:
    """``[bridge] lease_namespace``, else the pod's own namespace, else ``default``."""
    if configured:
        return configured
    try:
        with open(SA_NAMESPACE_FILE, encoding="utf-8") as fh:
            return fh.read().strip() or "default"
    except OSError:
        return "default"


class LeaderElector:
    def __init__(self, kube: KubeApi, namespace: str, name: str, identity: str, *, lease_duration: float = 60.0,
                 renew_deadline: float | None = None, retry_period: float | None = None,
                 clock: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic):
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration = float(lease_duration)
        # client-go's defaults keep the same proportions: 15 s lease, 10 s renew deadline, 2 s retry.
        self.renew_deadline = renew_deadline if renew_deadline is not None else self.lease_duration * 2 / 3
        self.retry_period = retry_period if retry_period is not None else self.lease_duration / 7.5
        self.clock = clock
        self.monotonic = monotonic
        self._lease: Obj | None = None
        self._renewed_at: float | None = None
        self._observed: tuple[str, str] | None = None
        self._observed_at = 0.0
        #: Why the last attempt could not reach the Lease ("" when it could).
        self.last_error = ""

    # -- the election ---------------------------------------------------------------------------

    def try_acquire_or_renew(self) -> bool:
        """One attempt (one GET and at most one write); True while this process leads."""
        self.last_error = ""
        # Counted from before the request: the standby starts its own count when it sees this
        # renewal, which is after it was sent, so this leader's deadline always ends first.
        sent = self.monotonic()
        try:
            lease = self.kube.get_lease(self.namespace, self.name)
            if lease is None:
                created = self.kube.create_lease(self.namespace, self._body(None, transitions=0))
                return self._won(created, sent)
            spec = lease.get("spec") or {}
            holder = str(spec.get("holderIdentity") or "")
            record = (holder, str(spec.get("renewTime") or ""))
            if record != self._observed:
                self._observed, self._observed_at = record, self.monotonic()
            duration = float(spec.get("leaseDurationSeconds") or self.lease_duration)
            if holder and holder != self.identity and self.monotonic() < self._observed_at + duration:
                self._lost(lease)
                return False
            transitions = int(spec.get("leaseTransitions") or 0) + (0 if holder == self.identity else 1)
            return self._won(self.kube.replace_lease(self.namespace, self.name, self._body(lease, transitions)), sent)
        except KubeConflict:
            self._lost(None)
            return False
        except KubeError as exc:
            # The API server cannot be reached: keep leading only until the renew deadline.
            self.last_error = str(exc)
            return self.is_leader()

    def is_leader(self) -> bool:
        return self._renewed_at is not None and self.monotonic() - self._renewed_at < self.renew_deadline

    def acting_deadline(self) -> float:
        """``monotonic()`` by which this leader stops acting unless it renews (in the past when it does
        not lead): what bounds each API call of a pass (:attr:`~.kubeclient.KubeClient.deadline`)."""
        if self._renewed_at is None:
            return self.monotonic()
        return self._renewed_at + self.renew_deadline

    def check(self) -> bool:
        """Leader now? Renews first when the last renewal is ``retry_period`` old, so a long pass
        (500 nodes to take, drains within their budget) keeps the Lease instead of running out of it.
        What the reconciler asks before each new take and request."""
        if self._renewed_at is not None and self.monotonic() - self._renewed_at >= self.retry_period:
            return self.try_acquire_or_renew()
        return self.is_leader()

    @property
    def holder(self) -> str:
        return str(((self._lease or {}).get("spec") or {}).get("holderIdentity") or "")

    def release(self) -> None:
        """Give the Lease up on a clean stop (client-go's ReleaseOnCancel)."""
        if not self.is_leader() or self._lease is None:
            return
        body = self._body(self._lease, int((self._lease.get("spec") or {}).get("leaseTransitions") or 0))
        body["spec"]["holderIdentity"] = ""
        body["spec"]["leaseDurationSeconds"] = 1
        try:
            self.kube.replace_lease(self.namespace, self.name, body)
        except KubeError:
            pass
        self._renewed_at = None

    # -- the breaker's state, in the Lease ----------------------------------------------------------

    def load_state(self) -> BreakerState:
        return _state_of(self._lease)

    def save_state(self, state: BreakerState, base: BreakerState | None = None) -> None:
        """Write the state into the Lease (a guarded PUT that renews it too); only the leader writes.

        A compare-and-swap against ``base`` (what the pass loaded): when the Lease's state changed
        since (an admin's ``reset-breaker``), the pass's changes are laid over it (:func:`~.state.rebase`);
        a 409 re-reads the Lease and tries again, so the reset is never written over.
        """
        for _ in range(4):
            if self._lease is None or not self.is_leader():
                raise KubeConflict(f"lease {self.namespace}/{self.name}: not the leader, the breaker's state is not "
                                   "written")
            current = _state_of(self._lease)
            merged = state if base is None or current.to_dict() == base.to_dict() else rebase(state, base, current)
            body = self._body(self._lease, int((self._lease.get("spec") or {}).get("leaseTransitions") or 0))
            body["metadata"].setdefault("annotations", {})[BREAKER_ANNOTATION] = json.dumps(
                merged.to_dict(), separators=(",", ":"))
            sent = self.monotonic()
            try:
                self._won(self.kube.replace_lease(self.namespace, self.name, body), sent)
                return
            except KubeConflict:
                fresh = self.kube.get_lease(self.namespace, self.name)  # someone wrote it: read again
                if fresh is None or (fresh.get("spec") or {}).get("holderIdentity") != self.identity:
                    self._lost(fresh)
                    raise
                self._lease = fresh
        raise KubeConflict(f"lease {self.namespace}/{self.name}: kept changing under us; the breaker's state is "
                           "written next pass")

    # -- plumbing -------------------------------------------------------------------------------------

    def _body(self, lease: Obj | None, transitions: int) -> Obj:
        now = _micro_time(self.clock())
        old = (lease or {}).get("spec") or {}
        mine = old.get("holderIdentity") == self.identity
        m: Obj = {"name": self.name, "namespace": self.namespace}
        if lease is not None:
            m["resourceVersion"] = meta(lease).get("resourceVersion")
            if annotations_of(lease):
                m["annotations"] = dict(annotations_of(lease))
            if meta(lease).get("uid"):
                m["uid"] = meta(lease)["uid"]
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": m,
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": int(round(self.lease_duration)),
                "acquireTime": old.get("acquireTime") if mine and old.get("acquireTime") else now,
                "renewTime": now,
                "leaseTransitions": transitions,
            },
        }

    def _won(self, lease: Obj | None, sent: float) -> bool:
        if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
            self._lost(lease)
            return False
        self._lease = lease
        self._renewed_at = sent
        spec = lease.get("spec") or {}
        self._observed, self._observed_at = (self.identity, str(spec.get("renewTime") or "")), self._renewed_at
        return True

    def _lost(self, lease: Obj | None) -> None:
        if lease is not None:
            self._lease = lease
        self._renewed_at = None


def _state_of(lease: Obj | None) -> BreakerState:
    text = annotations_of(lease or {}).get(BREAKER_ANNOTATION)
    try:
        data = json.loads(text) if text else {}
    except ValueError:
        data = {}  # unreadable: the nodes' ownership annotations still bound the window
    return BreakerState.from_dict(data if isinstance(data, dict) else {})


class LeaseStateStore:
    """The breaker's state in the leader's Lease: the :class:`~.state.StateStore` interface."""

    def __init__(self, elector: LeaderElector):
        self.elector = elector
        self._base: BreakerState | None = None

    def __str__(self) -> str:
        return f"lease {self.elector.namespace}/{self.elector.name}"

    @property
    def path(self) -> str:
        return str(self)

    def load(self) -> BreakerState:
        state = self.elector.load_state()
        self._base = BreakerState.from_dict(state.to_dict())
        return state

    def save(self, state: BreakerState) -> None:
        self.elector.save_state(state, self._base)
        self._base = self.elector.load_state()

    def exists(self) -> bool:
        return BREAKER_ANNOTATION in annotations_of(self.elector._lease or {})


class LeaseAdminStore:
    """The breaker's state in the Lease, for ``bridge status`` and ``reset-breaker`` (not the leader):
    read with one GET; written by a guarded PUT of the annotation alone, re-read on a conflict."""

    def __init__(self, kube: KubeApi, namespace: str, name: str):
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.lease: Obj | None = None
        self._base: BreakerState | None = None

    def __str__(self) -> str:
        return f"lease {self.namespace}/{self.name}"

    def load(self) -> BreakerState:
        self.lease = self.kube.get_lease(self.namespace, self.name)
        state = _state_of(self.lease)
        self._base = BreakerState.from_dict(state.to_dict())
        return state

    def save(self, state: BreakerState) -> None:
        for _ in range(4):
            lease = self.kube.get_lease(self.namespace, self.name)
            if lease is None:
                raise KubeError(f"{self}: no such Lease (no bridge has run against this cluster yet)")
            current = _state_of(lease)
            base = self._base
            merged = state if base is None or current.to_dict() == base.to_dict() else rebase(state, base, current)
            lease.setdefault("metadata", {}).setdefault("annotations", {})[BREAKER_ANNOTATION] = json.dumps(
                merged.to_dict(), separators=(",", ":"))
            try:
                self.lease = self.kube.replace_lease(self.namespace, self.name, lease)
                return
            except KubeConflict:
                continue  # the leader renewed in between: read again
        raise KubeConflict(f"{self}: kept changing under us; try again")
