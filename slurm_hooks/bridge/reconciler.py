"""One level-triggered pass: make Kubernetes match what Slurm says about its nodes.

Slurm is the source of truth. A node drained with our ``slurm-hooks:`` reason
whose action (the ``[replace]`` tag) is one of ``trigger_actions`` (reboot and
replace by default) means "cordon, taint, set GpuHealthy=False, drain, request
a replacement". Drain-only and reset reasons do not: those are fixed on the
node (a GPU reset) or need a person, and a replacement would be too much.
A node we took whose Slurm node is healthy again means "undo what we did".

The bridge follows Slurm's clock. Taking a node (cordon, taint, condition) is
done at once, so nothing new lands on it; evicting its pods and requesting the
replacement wait until Slurm has no job left there (the node drained, not
draining, and no job listing it: the requeued jobs got SIGTERM and their
KillWait to checkpoint, and have left), or until ``max_job_wait`` seconds after
the take (``0``: wait for ever). With the ``condition`` backend the condition
*is* the replacement request (a MachineHealthCheck acts on it), so it is set
at that point too, not at the take.

Each step is idempotent and recorded in the node's ownership annotation, so a
pass that dies half-way is finished by the next one and nothing is done twice.
A node whose work is complete costs no API call at all: one LIST with our
label selector per pass finds every node we hold, so the API calls of a pass
grow with the bad nodes, not with the cluster.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from slurm_hooks.bridge import metrics, nodeops
from slurm_hooks.bridge.api import (
    OWNER_ANNOTATION,
    OWNER_SELECTOR,
    KubeApi,
    KubeConflict,
    KubeError,
    KubePermanent,
    KubeTransient,
    Obj,
    name_of,
)
from slurm_hooks.bridge.breaker import CircuitBreaker
from slurm_hooks.bridge.evict import Evictor, opt_out
from slurm_hooks.bridge.guard import LeaderGuard, LeadershipLost
from slurm_hooks.bridge.mapping import NodeMapper
from slurm_hooks.bridge.ownership import Drained, Ownership, ReleaseReason, VerdictKept
from slurm_hooks.bridge.replace import Backend, ReplacementError, Target, make_backend, make_reboot_backend
from slurm_hooks.bridge.settings import BridgeSection
from slurm_hooks.bridge.state import StateStore
from slurm_hooks.bridge.verdict import NodeVerdict, extra_is_foreign, operator_reason
from slurm_hooks.errors import SlurmHooksError
from slurm_hooks.models import Action
from slurm_hooks.observe.audit import AuditLog
from slurm_hooks.slurm import NodeInfo, Slurm, parse_reason

COMPONENT = nodeops.COMPONENT
#: Consecutive transient errors after which the API server is taken to be down for this pass.
_ABORT_AFTER = 3
_CONFLICT_TRIES = 4
#: Backoff between drain rounds of a pass (PDB 429s, evicted pods still terminating).
_DRAIN_BACKOFF = 0.5
_DRAIN_BACKOFF_MAX = 5.0
#: Audit kinds a notifier hears about (``Reconciler(notify=...)``): what a person wants told.
NOTIFIED = frozenset({"bridge_breaker_tripped", "bridge_replace", "bridge_incident_closed", "bridge_held_too_long",
                      "bridge_permission_missing", "bridge_drain_timeout"})


def slurm_healthy(node: NodeInfo) -> bool:
    """Healthy again as Slurm sees it: in service (:attr:`NodeInfo.serving`)."""
    return node.serving


def readopt(node: NodeInfo, verdict: NodeVerdict, actions: tuple[Action, ...]) -> bool:
    """Take a node again from our verdict alone: its reason is the Slinky operator's now (the
    preStop), our annotation is gone, and its replacement was never asked for (asked once)."""
    return node.out_of_service and operator_reason(node.reason) and not verdict.requested \
        and verdict.action in {a.value for a in actions}


def trigger(node: NodeInfo, actions: tuple[Action, ...]) -> tuple[str, Action] | None:
    """(summary, action) when this Slurm node asks the bridge to act, else ``None``."""
    if not node.out_of_service or not node.ours:
        return None  # a DOWN node counts: our reboot left "reboot timed out" (Slurm's suffixes parsed off)
    parsed = parse_reason(node.reason)
    if parsed is None or parsed[1] not in actions:
        return None
    return parsed[0], parsed[1]


@dataclass
class PassResult:
    started: float
    dry_run: bool = False
    duration: float = 0.0
    slurm_nodes: int = 0
    bad: int = 0
    owned: int = 0
    taken: list[str] = field(default_factory=list)
    opted_out: list[str] = field(default_factory=list)
    drained: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    #: Kubernetes node -> ids of the Slurm jobs still on it: taken, not drained yet.
    waiting: dict[str, list[str]] = field(default_factory=dict)
    replaced: list[str] = field(default_factory=list)
    restored: list[str] = field(default_factory=list)
    #: Slurm nodes whose incident closed this pass: back in service (on this machine or another).
    closed: list[str] = field(default_factory=list)
    blocked: list[str] = field(default_factory=list)
    detached: list[str] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)
    breaker_open: bool = False
    breaker_limit: int = 0
    breaker_in_window: int = 0
    aborted: str = ""
    api_calls: int | None = None
    #: Machines held (cordoned by us) longer than ``held_alert_after``.
    held_too_long: list[str] = field(default_factory=list)
    #: The bridge's problems true at the end of this pass, each as the audit record that told it
    #: (``bridge_breaker_tripped``, ``bridge_permission_missing``, ``bridge_held_too_long``): given to
    #: the notifier every pass, so their alerts keep firing while true and end when not.
    standing: list[dict[str, Any]] = field(default_factory=list)

    @property
    def acted(self) -> bool:
        return bool(self.taken or self.opted_out or self.drained or self.replaced or self.restored or self.closed)

    def summary(self) -> str:
        parts = [f"{self.slurm_nodes} slurm nodes", f"{self.bad} bad", f"{self.owned} held"]
        for label, items in (
            ("taken", self.taken), ("opted out", self.opted_out), ("drained", self.drained),
            ("draining", self.pending), ("replacement requested", self.replaced),
            ("restored", self.restored), ("incident closed", self.closed), ("blocked by breaker", self.blocked),
        ):
            if items:
                parts.append(f"{label}: {','.join(items)}")
        if self.waiting:
            parts.append("waiting for jobs: " + ",".join(
                f"{node} ({' '.join(jobs) or 'draining'})" for node, jobs in sorted(self.waiting.items())))
        if self.errors:
            parts.append(f"{len(self.errors)} error(s)")
        if self.aborted:
            parts.append(f"aborted: {self.aborted}")
        if self.api_calls is not None:
            parts.append(f"{self.api_calls} API calls")
        parts.append(f"{self.duration:.2f} s")
        return ("[dry run] " if self.dry_run else "") + "; ".join(parts)


class _Abort(Exception):
    pass


@dataclass
class _Work:
    """One taken node going through :attr:`Reconciler.STEPS`."""

    node: Obj
    record: Ownership
    ctx: PassContext
    sn: NodeInfo | None
    pods: list[Obj] | None
    summary: str

    @property
    def kname(self) -> str:
        return name_of(self.node)


@dataclass
class PassContext:
    """What one pass carries from node to node."""

    res: PassResult
    breaker: CircuitBreaker
    now: float
    #: ``monotonic()`` by which the drain rounds of this pass stop (``drain_pass_budget``).
    deadline: float
    held: dict[str, Obj] = field(default_factory=dict)
    owned_since: dict[str, float] = field(default_factory=dict)
    #: Consecutive transient errors (three abort the pass: the API server is down).
    transient: int = 0
    #: Nodes whose drain goes on in this pass's next round: (node, record, Slurm node).
    draining: list[tuple[Obj, Ownership, NodeInfo | None]] = field(default_factory=list)
    #: The last drain round's result per node still draining.
    last_drain: dict[str, Any] = field(default_factory=dict)


class _SlurmJobsUnknown(SlurmHooksError):
    """Slurm could not say which jobs are on a node: it is not drained this pass."""


def slurm_busy(node: NodeInfo) -> bool:
    """Draining rather than drained: a job still runs or completes on it."""
    return node.busy


def _take_id(record: Ownership) -> str:
    """One take of a node, for Event names and the template backend's marker."""
    return f"{int(record.since * 1000):x}"


class Reconciler:
    def __init__(
        self,
        slurm: Slurm,
        kube: KubeApi,
        settings: BridgeSection,
        *,
        audit: AuditLog | None = None,
        backend: Backend | None = None,
        reboot_backend: Backend | None = None,
        store: StateStore | None = None,
        dry_run: bool = False,
        metrics_dir: str = "",
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        notify: Callable[[str, dict[str, Any]], None] | None = None,
        leader: Callable[[], bool] | None = None,
    ):
        self.slurm = slurm
        #: Whether this process still holds the leader's Lease: asked before every write of a pass
        #: (the Kubernetes ones through :class:`~.guard.LeaderGuard`, Slurm's in :meth:`_set_extra`).
        self.leader = leader
        self.kube: KubeApi = LeaderGuard(kube, leader) if leader is not None else kube
        for chosen in (backend, reboot_backend):
            if leader is not None and getattr(chosen, "management", None) is not None:
                chosen.management = LeaderGuard(chosen.management, leader)  # another cluster: the same rule
        self.settings = settings
        self.audit = audit
        self.backend = backend or make_backend(settings.replace)
        self.reboot_backend = reboot_backend or make_reboot_backend(settings.reboot)
        self.store = store if store is not None else StateStore(settings.state_file)
        self.dry_run = dry_run
        self.metrics_dir = metrics_dir
        self.clock = clock
        self.monotonic = monotonic
        self.mapper = NodeMapper(settings.mapping, settings.nodes, settings.slinky_namespace)
        self.sleep = sleep
        self.evictor = Evictor(self.kube, force=settings.drain_force,
                               delete_emptydir_data=settings.drain_delete_emptydir_data)
        self.instance = socket.gethostname()
        #: The place for notifications (breaker trips, replacements and reboot requests, incidents
        #: closed, missing permissions): called with the audit kind and its fields, after the audit.
        self.notify = notify
        #: node -> last error text, so a failure repeated every pass is audited once.
        self._last_error: dict[str, str] = {}
        #: node -> a backend's 403: not asked again until the bridge restarts (fix the RBAC first).
        self._denied: dict[str, str] = {}
        #: node -> the audit record that told of its missing permission (a standing problem).
        self._denied_told: dict[str, dict[str, Any]] = {}
        #: Machines told to be held too long: node -> the record that told it (once per take).
        self._held_told: dict[str, dict[str, Any]] = {}

    # -- the pass ----------------------------------------------------------------------

    def run_pass(self) -> PassResult:
        t0 = self.monotonic()
        now = self.clock()
        res = PassResult(started=now, dry_run=self.dry_run)
        calls_before = self._calls()
        state = self.store.load()
        saved = state.to_dict()
        breaker = CircuitBreaker(self.settings.breaker, state)
        breaker.expire(now)
        ctx = PassContext(res=res, breaker=breaker, now=now, deadline=t0 + self.settings.drain_pass_budget)
        lost = False
        try:
            self._pass(ctx)
        except _Abort as exc:
            res.aborted = str(exc)
            self._audit("bridge_pass_aborted", error=res.aborted)
        except LeadershipLost as exc:
            res.aborted, lost = str(exc), True
            self._audit("bridge_pass_aborted", level="warning", error=res.aborted, leadership_lost=True)
        res.breaker_open = breaker.is_open(now)
        res.standing = self._standing_problems(breaker, res, now)
        res.breaker_limit = breaker.limit(max(res.slurm_nodes, 1))
        res.breaker_in_window = len(breaker.in_window(now))
        if not self.dry_run and not lost and state.to_dict() != saved and self._still_leader():
            try:
                self.store.save(state)
            except (OSError, KubeError) as exc:
                why = exc.strerror if isinstance(exc, OSError) else str(exc)
                res.errors.append(("state", f"cannot save the breaker's state ({self.store}): {why}"))
                self._audit("bridge_error", node="", step="state", error=res.errors[-1][1])
        res.duration = self.monotonic() - t0
        calls_after = self._calls()
        if calls_before is not None and calls_after is not None:
            res.api_calls = calls_after - calls_before
        if res.acted or res.errors or res.aborted:
            self._audit(
                "bridge_pass", summary=res.summary(), taken=res.taken, opted_out=res.opted_out,
                drained=res.drained, replaced=res.replaced, restored=res.restored, closed=res.closed,
                blocked=res.blocked, waiting=res.waiting,
                errors=len(res.errors), duration_s=round(res.duration, 3),
            )
        self._write_metrics(res)
        return res

    def _guarded(self, ctx: PassContext, node_name: str, fn: Callable[[], None]) -> None:
        """Run one node's work: its error is recorded (audited once per distinct text) and the pass
        goes on; ``_ABORT_AFTER`` transient errors in a row mean the API server is down."""
        try:
            fn()
            ctx.transient = 0
            self._last_error.pop(node_name, None)
        except (KubeError, SlurmHooksError) as exc:
            if isinstance(exc, KubeError) and not self._still_leader():
                # A call cut at the renew deadline, or any failure once the Lease is gone: stop here.
                raise LeadershipLost(f"lost the leader's Lease ({exc}): this pass stops; the leader finishes it") \
                    from None
            text = str(exc)
            if isinstance(exc, KubePermanent) and exc.status == 403:
                text = f"missing permission: {exc} (grant it in the bridge's ClusterRole: slurm-hooks render)"
            ctx.res.errors.append((node_name, text))
            if self._last_error.get(node_name) != text:
                self._audit(
                    "bridge_error", node=node_name, error=text,
                    transient=isinstance(exc, KubeTransient), retry="next pass",
                )
            self._last_error[node_name] = text
            if isinstance(exc, KubeTransient):
                ctx.transient += 1
                if ctx.transient >= _ABORT_AFTER:
                    raise _Abort(f"Kubernetes API unavailable: {exc}") from None

    def _pass(self, ctx: PassContext) -> None:
        res = ctx.res
        try:
            slurm_nodes = self.slurm.nodes()
        except SlurmHooksError as exc:
            raise _Abort(f"cannot read Slurm node states: {exc}") from None
        res.slurm_nodes = len(slurm_nodes)
        by_name = {n.name: n for n in slurm_nodes}
        try:
            ctx.held = {name_of(n): n for n in self.kube.list_nodes(OWNER_SELECTOR)}
        except KubeError as exc:
            raise _Abort(f"cannot list nodes held by the bridge: {exc}") from None
        res.owned = len(ctx.held)
        records = {k: Ownership.of(n) for k, n in ctx.held.items()}
        self._note_held_too_long(records, res)
        # A closed incident's machine waits for its repair: it no longer holds Slurm capacity.
        ctx.owned_since = {k: r.since for k, r in records.items() if r is not None and r.closed is None}
        #: Slurm nodes an open record on a held Kubernetes node speaks for.
        handled = {r.slurm_node for r in records.values() if r is not None and r.closed is None}

        # 1. Nodes we hold: give back the recovered, close what is back in service, finish the rest.
        for kname in sorted(ctx.held):
            node, record = ctx.held[kname], records[kname]
            if record is None:
                continue  # our label without a readable record: leave it for a person
            sn = by_name.get(record.slurm_node)
            self._guarded(ctx, kname, lambda n=node, r=record, s=sn: self._held(n, r, s, ctx))

        # 2. Bad Slurm nodes we do not hold yet, and verdicts whose node is back in service.
        candidates: list[tuple[NodeInfo, Action, NodeVerdict | None]] = []
        for sn in slurm_nodes:
            if sn.name in handled:
                continue
            hit = trigger(sn, self.settings.trigger_actions)
            verdict = NodeVerdict.of(sn) if sn.extra_text else None
            if hit is not None:
                res.bad += 1
                candidates.append((sn, hit[1], None))
            elif verdict is not None:
                if slurm_healthy(sn):
                    self._guarded(ctx, sn.name, lambda s=sn, v=verdict: self._close(ctx, s, v, None, None))
                elif readopt(sn, verdict, self.settings.trigger_actions):
                    res.bad += 1
                    candidates.append((sn, Action(verdict.action), verdict))
        for sn, action, verdict in sorted(candidates, key=lambda c: c[0].name):
            self._guarded(ctx, sn.name, lambda s=sn, a=action, v=verdict: self._take(s, a, ctx, v))

        # 3. Drains still running: rounds for all of them together, within the pass's budget.
        self._drain_rounds(ctx)
        self._note_blocked(res, ctx.breaker)

    def _held(self, node: Obj, record: Ownership, sn: NodeInfo | None, ctx: PassContext) -> None:
        kname = name_of(node)
        target = self._kube_name(sn) if sn is not None else None
        maps_here = target == kname
        # Only a Slurm node known to run elsewhere detaches this machine: a slurmd pod briefly
        # missing (target unknown) still has its jobs to wait for.
        elsewhere = target is not None and target != kname
        if maps_here and slurm_healthy(sn):
            self._restore(node, record, ctx.res, sn)
        elif elsewhere and record.closed is None and slurm_healthy(sn) and (record.replacement or record.drained):
            self._close(ctx, sn, NodeVerdict.of(sn), node, record, back_on=target)
            self._give_back_repaired(node, record, ctx)
        elif not record.complete and record.closed is None:
            self._progress(node, record, ctx, None if elsewhere else sn)
        elif record.closed is not None and self._give_back_repaired(node, record, ctx):
            pass
        elif elsewhere or record.closed is not None:
            ctx.res.detached.append(kname)

    def _repaired_in_place(self, node: Obj, record: Ownership) -> bool:
        """The machine a repair kept (a reboot) is back: its request was made by a backend that keeps
        the machine, the Node is Ready, and it reports another boot than when the reboot was asked."""
        asked = next((b for b in (self.backend, self.reboot_backend) if b is not None and b.name == record.backend),
                     None)
        if asked is None or not getattr(asked, "keeps_machine", False) or not record.replacement:
            return False
        status = node.get("status") or {}
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ())
        boot = str((status.get("nodeInfo") or {}).get("bootID") or "")
        return ready and (not record.boot_id or boot != record.boot_id)

    def _give_back_repaired(self, node: Obj, record: Ownership, ctx: PassContext) -> bool:
        """Every request the bridge makes is ended by the bridge: once the Slurm node is back in service
        (its incident closed) and the machine its repair kept is back too, the request is withdrawn
        (the CR deleted) and the machine uncordoned and untainted. True when given back."""
        if not self._repaired_in_place(node, record):
            return False
        kname = name_of(node)
        if kname in ctx.res.detached:
            ctx.res.detached.remove(kname)
        self._restore(node, record, ctx.res)
        return True

    # -- the incident: closed when the Slurm node is back in service -------------------------

    def _close(self, ctx: PassContext, sn: NodeInfo, verdict: NodeVerdict | None, node: Obj | None,
               record: Ownership | None, back_on: str | None = None) -> None:
        """The Slurm node is back in service (a new slurmd pod registered and the operator undrained
        it, or a person resumed it): close our incident. The old machine, if we hold it, stays
        cordoned for its repair backend (reported as detached)."""
        if verdict is not None and not self.dry_run:
            self._set_extra(sn.name, "")
        kname = name_of(node) if node is not None else (verdict.kube_node if verdict else "")
        if record is not None:
            record.closed = self.clock()
            self._save(kname, record)
            ctx.res.detached.append(kname)
        ctx.res.closed.append(sn.name)
        reason = record.reason if record is not None else (verdict.reason if verdict else "")
        self._audit("bridge_incident_closed", node=sn.name, kube_node=kname, reason=reason,
                    back_on=back_on or self._kube_name_offline(sn), state=sn.state,
                    message="Slurm node back in service" + (f" on {back_on}" if back_on else ""))

    # -- taking a node -------------------------------------------------------------------

    def _kube_name(self, sn: NodeInfo) -> str | None:
        return self.mapper.kube_name(sn, self.kube)

    def _kube_name_offline(self, sn: NodeInfo) -> str | None:
        return self.mapper.kube_name_offline(sn)

    def _take(self, sn: NodeInfo, action: Action, ctx: PassContext, verdict: NodeVerdict | None = None) -> None:
        """Take the Kubernetes node under a bad Slurm node; ``verdict``: taken again from our verdict
        in the Slurm node's Extra (its reason is the operator's now, our annotation is gone)."""
        res, breaker, now = ctx.res, ctx.breaker, ctx.now
        if breaker.is_open(now):
            # Refused without a single API call, the Slinky pod lookup included.
            kname = self._kube_name_offline(sn) or sn.name
            if kname not in ctx.held:
                res.blocked.append(kname)
            return
        kname = self._kube_name(sn)
        if kname in ctx.held:
            return  # handled with the nodes we hold
        if not kname:
            raise ReplacementError(f"Slurm node {sn.name}: no Kubernetes node found (Slinky pod gone?)")
        if verdict is not None and verdict.kube_node != kname:
            return  # the verdict is about the machine it ran on before; this is another one
        if not self._still_leader():
            return
        node = self.kube.get_node(kname)
        if node is None:
            raise ReplacementError(f"Slurm node {sn.name}: Kubernetes node {kname} not found")
        existing = Ownership.of(node)
        if existing is not None:  # annotated but not labelled: a half-written take; finish it
            self._progress(node, existing, ctx, sn)
            return
        pods = self.kube.list_pods_on_node(kname)
        why = self._opt_out(pods, node, action)
        decision = breaker.admit(kname, res.slurm_nodes, now, ctx.owned_since)
        if not decision.admitted:
            res.blocked.append(kname)
            if decision.tripped:
                self._audit(
                    "bridge_breaker_tripped", level="critical", node=kname, slurm_node=sn.name,
                    reason=decision.reason, message="no new nodes will be taken until "
                    "`slurm-hooks bridge reset-breaker` or the window passes",
                )
            return
        record = Ownership(
            slurm_node=sn.name, reason=verdict.reason if verdict else sn.reason, action=action.value, since=now,
            opt_out=why or "", backend=self.backend.name,
        )
        node = self._patch_guarded(kname, node, lambda n: self._take_ops(n, record, taint=not why))
        if node is None:
            raise ReplacementError(f"Kubernetes node {kname} vanished while being cordoned")
        ctx.owned_since[kname] = now
        res.taken.append(kname)
        self._audit(
            "bridge_cordon", node=kname, slurm_node=sn.name, reason=record.reason, action=action.value,
            cordoned=record.cordoned, tainted=record.tainted, opt_out=record.opt_out or None,
            from_verdict=bool(verdict) or None,
        )
        # An opted-out node reuses the list; otherwise the drain lists again, after the cordon,
        # so that no pod scheduled in between is missed (kubectl cordons before it lists, too).
        self._progress(node, record, ctx, sn, pods=pods if why else None)

    def _take_ops(self, node: Obj, record: Ownership, *, taint: bool) -> list[Obj]:
        done = Ownership.of(node)
        if done is not None and done.since == record.since:
            # Our own write went through although its answer was lost (a timeout, a 500): adopt it.
            record.cordoned, record.tainted = done.cordoned, done.tainted
            return []
        record.cordoned = not (node.get("spec") or {}).get("unschedulable")
        record.tainted = taint
        ops, _ = nodeops.take_ops(node, record.to_json(), taint_key=self.settings.taint_key, action=record.action,
                                  taint=taint)
        return ops

    def _patch_guarded(self, kname: str, node: Obj, build: Callable[[Obj], list[Obj]]) -> Obj | None:
        """JSON Patch guarded by resourceVersion; on conflict re-read and rebuild, a few times."""
        for _ in range(_CONFLICT_TRIES):
            ops = build(node)
            if not [op for op in ops if op["op"] != "test"]:
                return node
            try:
                return self.kube.json_patch_node(kname, ops, dry_run=self.dry_run)
            except KubeConflict:
                fresh = self.kube.get_node(kname)
                if fresh is None:
                    return None
                node = fresh
        raise KubeTransient(f"node {kname} kept changing under us ({_CONFLICT_TRIES} conflicts); next pass")

    # -- finishing what was started --------------------------------------------------------

    def _progress(self, node: Obj, record: Ownership, ctx: PassContext, sn: NodeInfo | None,
                  pods: list[Obj] | None = None) -> None:
        """Carry a taken node forward; ``sn``: its Slurm node, ``None`` when none maps to it any more."""
        kname = name_of(node)
        before = record.to_json()
        try:
            self._steps(node, record, ctx, sn, pods)
        except LeadershipLost:
            raise  # no write at all: the next leader reads the record as it is
        except Exception:
            if record.to_json() != before:
                try:
                    self._save(kname, record)
                except KubeError:
                    pass
            raise
        if record.to_json() != before:
            self._save(kname, record)

    #: A taken node's way to its replacement, in order; each step is done once (the record says so)
    #: and says whether the next one may run in this pass.
    STEPS = ("_step_opt_out", "_step_announce", "_step_verdict", "_step_early_condition", "_step_jobs",
             "_step_condition", "_step_drain", "_step_request")

    def _steps(self, node: Obj, record: Ownership, ctx: PassContext, sn: NodeInfo | None,
               pods: list[Obj] | None) -> None:
        work = _Work(node=node, record=record, ctx=ctx, sn=sn, pods=pods,
                     summary=(parse_reason(record.reason) or (record.reason, None))[0])
        for step in self.STEPS:
            if not getattr(self, step)(work):
                return

    def _step_opt_out(self, w: _Work) -> bool:
        """An opt-out (a pod label, the medik8s node label) holds the node at cordon-and-alert."""
        record, kname = w.record, w.kname
        if not record.opt_out:
            return True
        if w.pods is None:
            w.pods = self.kube.list_pods_on_node(kname, consistent=True)
        why = self._opt_out(w.pods, w.node, Action(record.action))
        if why:
            if "optout" not in record.events:
                self._event(w.node, record, "optout", "GpuUnhealthyOptOut",
                            f"{w.summary} (Slurm node {record.slurm_node}): cordoned only, no drain and no "
                            f"replacement because of {why}")
            if why != record.opt_out or kname in w.ctx.res.taken:
                record.opt_out = why
                self._audit("bridge_opt_out", node=kname, slurm_node=record.slurm_node, opt_out=why,
                            message="cordon and alert only: no drain, no replacement")
            w.ctx.res.opted_out.append(kname)
            return False
        self._audit("bridge_opt_out_lifted", node=kname, slurm_node=record.slurm_node, was=record.opt_out)
        record.opt_out = ""
        if not record.tainted:
            fresh = self._patch_guarded(kname, w.node, lambda n: [
                *nodeops.rv_test(n), nodeops.taint_op(n.get("spec") or {}, self.settings.taint_key, record.action)])
            w.node = fresh or w.node
            record.tainted = True
        return True

    def _opt_out(self, pods: list[Obj], node: Obj, action: Action) -> str | None:
        """The pins of the pods and the Node, then the backend's owner's own (a Machine's, a NodeClaim's)."""
        why = opt_out(pods, node, self.settings.opt_out_label, self.clock())
        if why:
            return why
        backend_pin = getattr(self._backend_for(action), "opt_out", None)
        if backend_pin is None:
            return None
        try:
            return backend_pin(self.kube, node)
        except LeadershipLost:
            raise
        except (KubeError, SlurmHooksError):
            return None  # cannot read the owner's object now: the cordon goes on; the request step reports it

    def _step_announce(self, w: _Work) -> bool:
        if "taken" not in w.record.events:
            self._event(w.node, w.record, "taken", "GpuUnhealthy",
                        f"{w.summary} (Slurm node {w.record.slurm_node}): cordoned, tainted {self.settings.taint_key}; "
                        f"its pods are evicted and a replacement requested ({self.backend.name}) once Slurm has "
                        "no job left on it")
        return True

    def _step_verdict(self, w: _Work) -> bool:
        if w.sn is not None and not w.record.verdict:
            self._keep_verdict(w.sn, w.record, w.kname)
        return True

    def _step_early_condition(self, w: _Work) -> bool:
        # The condition backend's request is the condition itself: it waits for the jobs too.
        if not w.record.condition and not self.backend.condition_is_request:
            self._set_fault_condition(w)
        return True

    def _step_jobs(self, w: _Work) -> bool:
        record = w.record
        if record.released or record.drained or record.replacement:
            return True
        return self._jobs_gone(w.kname, record, w.ctx.res, w.sn)

    def _step_condition(self, w: _Work) -> bool:
        if not w.record.condition:
            self._set_fault_condition(w)
        return True

    def _set_fault_condition(self, w: _Work) -> None:
        self._condition(w.node, "False", "GpuFault", f"{w.record.reason} (Slurm node {w.record.slurm_node})")
        w.record.condition = True

    def _step_drain(self, w: _Work) -> bool:
        if w.record.drained:
            return True
        if not self.settings.drain:
            w.record.drained = Drained.SKIPPED
            return True
        if self._drain(w.node, w.record, w.ctx, w.pods):
            return True
        w.ctx.draining.append((w.node, w.record, w.sn))
        return False

    def _step_request(self, w: _Work) -> bool:
        record, kname, res = w.record, w.kname, w.ctx.res
        if record.replacement:
            return True
        if kname in self._denied:
            res.errors.append((kname, self._denied[kname]))
            return False  # a missing permission: not asked again until the bridge restarts
        if not self._still_leader():
            return False
        target = Target(node=w.node, slurm_node=record.slurm_node, reason=record.reason,
                        summary=w.summary, action=Action(record.action), take=_take_id(record))
        backend = self._backend_for(target.action)
        backend_pin = getattr(backend, "opt_out", None)
        pin = backend_pin(self.kube, w.node) if backend_pin is not None else None  # an error: next pass
        if pin:  # the owner's pin, set since the take (or unreadable then): hold at cordon-and-alert
            record.opt_out = pin
            self._audit("bridge_opt_out", node=kname, slurm_node=record.slurm_node, opt_out=pin,
                        message="cordon and alert only: no replacement")
            res.opted_out.append(kname)
            return False
        try:
            asked = backend.request(self.kube, target, dry_run=self.dry_run)
        except KubePermanent as exc:
            if exc.status != 403:
                raise
            self._denied[kname] = (f"missing permission for the {backend.name} backend: {exc}; grant it "
                                   "(slurm-hooks render, slurm-hooks validate) and restart the bridge")
            res.errors.append((kname, self._denied[kname]))
            told = {"level": "error", "node": kname, "slurm_node": record.slurm_node, "backend": backend.name,
                    "error": str(exc), "message": self._denied[kname]}
            self._denied_told[kname] = {"kind": "bridge_permission_missing", "ts": self.clock(), **told}
            self._audit("bridge_permission_missing", **told)
            return False
        record.replacement = asked or backend.name
        record.backend = backend.name
        if getattr(backend, "keeps_machine", False):
            record.boot_id = str(((w.node.get("status") or {}).get("nodeInfo") or {}).get("bootID") or "")
        res.replaced.append(kname)
        self._audit("bridge_replace", node=kname, slurm_node=record.slurm_node, backend=backend.name,
                    requested=record.replacement, action=target.action.value)
        if record.verdict == VerdictKept.SLURM and w.sn is not None:
            self._keep_verdict(w.sn, record, kname)
        return True

    def _keep_verdict(self, sn: NodeInfo, record: Ownership, kname: str) -> None:
        """Write our verdict into the Slurm node's Extra, where the operator's preStop cannot reach.

        Once at the take and once more with the replacement asked for. An Extra someone else wrote
        is left alone (recorded ``foreign``); a refused write is recorded and not retried: the
        Kubernetes annotation still holds the verdict.
        """
        if self.dry_run:
            return
        if extra_is_foreign(sn):
            record.verdict = VerdictKept.FOREIGN
            self._audit("bridge_verdict_not_kept", level="warning", node=kname, slurm_node=sn.name,
                        extra=sn.extra_text[:200], message="the Slurm node's Extra is someone else's: "
                        "the verdict is kept in the Kubernetes annotation only")
            return
        verdict = NodeVerdict(reason=record.reason, action=record.action, since=record.since, kube_node=kname,
                          requested=record.replacement)
        try:
            self._set_extra(sn.name, verdict.to_text())
        except SlurmHooksError as exc:
            record.verdict = f"failed: {exc}"[:200]
            self._audit("bridge_verdict_not_kept", level="warning", node=kname, slurm_node=sn.name, error=str(exc),
                        message="cannot write the Slurm node's Extra (the bridge needs Slurm operator rights): "
                        "the verdict is kept in the Kubernetes annotation only")
            return
        record.verdict = VerdictKept.SLURM

    def _backend_for(self, action: Action) -> Backend:
        """``[reboot]``: the reboot backend when one is configured; else the replacement backend."""
        if action is Action.REBOOT and self.reboot_backend is not None:
            return self.reboot_backend
        return self.backend

    def _jobs_gone(self, kname: str, record: Ownership, res: PassResult, sn: NodeInfo | None) -> bool:
        """True once the node may be drained: Slurm has no job on it, or ``max_job_wait`` has passed.

        Sticky: the record's ``released`` says why, and Slurm is not asked again for this take.
        """
        now = self.clock()
        if sn is None:
            record.released = ReleaseReason.NO_SLURM_NODE  # none maps here any more: no Slurm job can run here
            return True
        try:
            jobs = [str(j.job_id) for j in self.slurm.jobs_on_node(sn.name)]
        except SlurmHooksError as exc:
            res.waiting[kname] = list(record.waiting_jobs or ())
            raise _SlurmJobsUnknown(f"cannot list the jobs on Slurm node {sn.name}, not draining yet: {exc}") from None
        busy = slurm_busy(sn)
        waited = now - record.since
        if not jobs and not busy:
            record.released = ReleaseReason.NO_JOBS
            if record.waiting_jobs is not None:
                self._audit("bridge_jobs_gone", node=kname, slurm_node=sn.name, waited_s=round(waited, 1),
                            jobs=record.waiting_jobs, message="no Slurm job left: draining")
            return True
        limit = self.settings.max_job_wait
        if limit > 0 and waited >= limit:
            record.released = ReleaseReason.FORCED
            self._audit("bridge_jobs_wait_timeout", level="warning", node=kname, slurm_node=sn.name, jobs=jobs,
                        state=sn.state, waited_s=round(waited, 1), max_job_wait=limit,
                        message="jobs still on the node after max_job_wait: draining anyway")
            return True
        res.waiting[kname] = jobs
        if jobs != record.waiting_jobs:
            record.waiting_jobs = jobs
            self._audit("bridge_waiting_for_jobs", node=kname, slurm_node=sn.name, jobs=jobs, state=sn.state,
                        waited_s=round(waited, 1), max_job_wait=limit or None)
        return False

    def _drain(self, node: Obj, record: Ownership, ctx: PassContext, pods: list[Obj] | None) -> bool:
        """One drain round; True once the drain is over (done, or ``drain_timeout`` passed)."""
        res = ctx.res
        kname = name_of(node)
        now = self.clock()
        if record.drain_started is None:
            record.drain_started = now
        if pods is None:
            # After the cordon: a consistent read, not the watch cache (a pod bound just before the
            # cordon may not be in it yet; the drain would be "done" and the request made without it).
            pods = self.kube.list_pods_on_node(kname, consistent=True)
        result = self.evictor.drain(pods, evicted=record.evicted, node=kname, dry_run=self.dry_run)
        if result.evicted or result.gone:
            self._audit("bridge_drain", node=kname, evicted=result.evicted, gone=result.gone,
                        blocked=result.blocked, last=result.last or None,
                        namespace_terminating=result.namespace_terminating or None,
                        skipped=[f"{p} ({why})" for p, why in result.skipped])
        if result.protected and "protected" not in record.events:
            kept = [f"{p}: {why}" for p, why in result.protected]
            self._audit("bridge_drain_protected", level="warning", node=kname, slurm_node=record.slurm_node,
                        pods=kept, message="not evicted (kubectl drain's protections); going on without them")
            self._event(node, record, "protected", "GpuUnhealthyPodsKept",
                        f"not evicted, and lost when the node is replaced: {'; '.join(kept)}")
        if result.done or (self.dry_run and not result.blocked):
            record.drained = Drained.DONE
            res.drained.append(kname)
            return True
        if self.clock() >= record.drain_started + self.settings.drain_timeout:
            record.drained = Drained.TIMEOUT
            self._audit("bridge_drain_timeout", level="warning", node=kname, blocked=result.blocked,
                        terminating=result.terminating, last=result.last or None,
                        timeout_s=self.settings.drain_timeout,
                        message="pods still there after drain_timeout (PodDisruptionBudgets, or evicted pods "
                        "not deleted yet); requesting the replacement anyway (the backend drains with its own "
                        "PDB-aware logic)")
            return True
        if kname not in res.pending:
            res.pending.append(kname)
        ctx.last_drain[kname] = result
        return False

    def _drain_rounds(self, ctx: PassContext) -> None:
        """Retry every draining node together, with one backoff, until the pass's drain budget is spent.

        Ten nodes blocked by PodDisruptionBudgets cost one ``drain_pass_budget``, not ten; an
        evicted pod still terminating is looked for again (by UID) in the next round.
        """
        delay = _DRAIN_BACKOFF
        while ctx.draining and not self.dry_run:
            left = ctx.deadline - self.monotonic()
            if left <= 0:
                break
            self.sleep(min(delay, left, _DRAIN_BACKOFF_MAX))
            delay *= 2
            batch, ctx.draining = ctx.draining, []
            for node, record, sn in batch:
                kname = name_of(node)
                if kname in ctx.res.pending:
                    ctx.res.pending.remove(kname)
                self._guarded(ctx, kname, lambda n=node, r=record, s=sn: self._progress(n, r, ctx, s))
        for node, _record, _sn in ctx.draining:  # once per pass: what the drain still waits for
            kname = name_of(node)
            result = ctx.last_drain.get(kname)
            if result is not None and (result.blocked or result.terminating or result.last):
                self._audit("bridge_drain", node=kname, evicted=[], gone=[], blocked=result.blocked,
                            terminating=result.terminating or None, last=result.last or None,
                            message="still draining; the next pass goes on")

    def _save(self, kname: str, record: Ownership) -> None:
        patch = {"metadata": {"annotations": {OWNER_ANNOTATION: record.to_json()}}}
        self.kube.patch_node(kname, patch, dry_run=self.dry_run)

    # -- giving a node back ------------------------------------------------------------------

    def _restore(self, node: Obj, record: Ownership, res: PassResult, sn: NodeInfo | None = None) -> None:
        kname = name_of(node)
        undone: list[str] = []
        if sn is not None and NodeVerdict.of(sn) is not None and not self.dry_run:
            self._set_extra(sn.name, "")  # our verdict, never someone else's Extra
            undone.append("verdict cleared from the Slurm node's Extra")
        asked = next((b for b in (self.backend, self.reboot_backend) if b is not None and b.name == record.backend), None)
        if record.replacement and asked is not None:
            withdrawn = asked.cancel(self.kube, node, record.replacement, dry_run=self.dry_run)
            if withdrawn:
                undone.append(withdrawn)
        if record.condition:
            # The answer carries the new resourceVersion the guarded patch below must test.
            node = self._condition(node, "True", "SlurmNodeHealthy",
                                   f"Slurm node {record.slurm_node} is healthy again") or node
            undone.append(f"{self.settings.condition_type}=True")
        self._event(node, record, "restored", "GpuHealthy",
                    f"Slurm node {record.slurm_node} is healthy again: undoing what slurm-hooks did", kind_type="Normal")
        result = self._patch_guarded(kname, node, lambda n: self._restore_ops(n, record))
        if record.cordoned:
            undone.append("uncordoned")
        if record.tainted:
            undone.append(f"taint {self.settings.taint_key} removed")
        res.restored.append(kname)
        self._audit("bridge_restore", node=kname, slurm_node=record.slurm_node, undone=undone,
                    node_gone=result is None, held_s=round(self.clock() - record.since, 1))
        if record.closed is None:
            res.closed.append(record.slurm_node)
            self._audit("bridge_incident_closed", node=record.slurm_node, kube_node=kname, reason=record.reason,
                        back_on=kname, state=sn.state if sn is not None else "",
                        message=f"Slurm node back in service on {kname}: what the bridge did is undone")

    def _restore_ops(self, node: Obj, record: Ownership) -> list[Obj]:
        return nodeops.restore_ops(node, taint_key=self.settings.taint_key, tainted=record.tainted,
                                   cordoned=record.cordoned)

    # -- small writers -----------------------------------------------------------------------

    def _condition(self, node: Obj, status: str, reason: str, message: str) -> Obj | None:
        patch = nodeops.condition_patch(node, self.settings.condition_type, status, reason, message, self.clock())
        return self.kube.patch_node_status(name_of(node), patch, dry_run=self.dry_run)

    def _event(self, node: Obj, record: Ownership, kind: str, reason: str, message: str,
               kind_type: str = "Warning") -> None:
        """Post an Event on the Node; its name is fixed per (node, take, kind), so a retry is a no-op."""
        body = nodeops.event_body(node, namespace=self.settings.event_namespace, kind=kind, take=_take_id(record),
                                  reason=reason, message=message, event_type=kind_type, instance=self.instance,
                                  now=self.clock())
        self.kube.create_event(self.settings.event_namespace, body, dry_run=self.dry_run)
        if kind not in record.events:
            record.events.append(kind)

    def _note_blocked(self, res: PassResult, breaker: CircuitBreaker) -> None:
        blocked = tuple(sorted(res.blocked))
        if blocked != breaker.state.blocked:
            if blocked:
                self._audit("bridge_breaker_blocked", level="critical", nodes=list(blocked),
                            reason=breaker.state.trip_reason)
            breaker.state.blocked = blocked

    def _note_held_too_long(self, records: dict[str, Ownership | None], res: PassResult) -> None:
        """Machines we have held longer than ``held_alert_after``: a gauge, and an alert once per take
        (a standing problem while it lasts)."""
        now = self.clock()
        bound = self.settings.held_alert_after
        for kname, record in sorted(records.items()):
            if record is None or now - record.since < bound:
                continue
            res.held_too_long.append(kname)
            told = self._held_told.get(kname)
            if told is None or told.get("since") != record.since:
                fields = {"level": "warning", "node": kname, "slurm_node": record.slurm_node, "since": record.since,
                          "held_s": round(now - record.since, 1), "backend": record.backend,
                          "requested": record.replacement or None, "closed": record.closed is not None,
                          "message": f"held (cordoned by the bridge) for more than {bound:g} s: "
                                     f"{record.replacement or 'nothing requested yet'}"}
                self._held_told[kname] = {"kind": "bridge_held_too_long", "ts": now, **fields}
                self._audit("bridge_held_too_long", **fields)
        for kname in [k for k in self._held_told if k not in res.held_too_long]:
            del self._held_told[kname]

    def _standing_problems(self, breaker: CircuitBreaker, res: PassResult, now: float) -> list[dict[str, Any]]:
        """The bridge's own problems true now, re-told every pass (an alert that is not re-posted
        resolves in Alertmanager while the breaker is still latched)."""
        out: list[dict[str, Any]] = []
        state = breaker.state
        if breaker.is_open(now) and state.tripped_at is not None:
            out.append({"kind": "bridge_breaker_tripped", "ts": state.tripped_at, "level": "critical",
                        "node": (state.blocked or res.blocked or [""])[0], "slurm_node": "",
                        "reason": state.trip_reason, "message": "no new nodes will be taken until "
                        "`slurm-hooks bridge reset-breaker` or the window passes"})
        out.extend(self._denied_told[k] for k in sorted(self._denied_told) if k in self._denied)
        out.extend(self._held_told[k] for k in sorted(self._held_told))
        return out

    def _still_leader(self) -> bool:
        return self.leader is None or self.leader()

    def _set_extra(self, slurm_node: str, text: str) -> None:
        """Write (or clear) our verdict in the Slurm node's Extra: a write, so only while leading."""
        if not self._still_leader():
            raise LeadershipLost(f"lost the leader's Lease before writing Slurm node {slurm_node}'s Extra")
        self.slurm.set_node_extra(slurm_node, text)

    def _audit(self, kind: str, **fields: Any) -> None:
        if self.dry_run:
            fields["dry_run"] = True
        if self.audit is not None:
            self.audit.write(kind, **fields)
        if self.notify is not None and kind in NOTIFIED and not self.dry_run:
            self.notify(kind, fields)

    def _calls(self) -> int | None:
        calls = getattr(self.kube, "calls", None)
        return sum(calls.values()) if calls is not None else None

    def _write_metrics(self, res: PassResult) -> None:
        try:
            metrics.write(self.metrics_dir, {
                "slurm_hooks_bridge_breaker_open": int(res.breaker_open),
                "slurm_hooks_bridge_breaker_taken_in_window": res.breaker_in_window,
                "slurm_hooks_bridge_breaker_limit": res.breaker_limit,
                "slurm_hooks_bridge_breaker_blocked_nodes": len(res.blocked),
                "slurm_hooks_bridge_owned_nodes": res.owned + len(res.taken) - len(res.restored),
                "slurm_hooks_bridge_detached_nodes": len(res.detached),
                "slurm_hooks_bridge_held_too_long_nodes": len(res.held_too_long),
                "slurm_hooks_bridge_waiting_nodes": len(res.waiting),
                "slurm_hooks_bridge_pass_errors": len(res.errors) + int(bool(res.aborted)),
                "slurm_hooks_bridge_pass_duration_seconds": res.duration,
                "slurm_hooks_bridge_last_pass_timestamp_seconds": self.clock(),
            })
        except OSError as exc:
            res.errors.append(("metrics", f"cannot write metrics: {exc.strerror}"))
