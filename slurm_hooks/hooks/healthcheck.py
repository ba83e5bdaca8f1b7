"""HealthCheckProgram: check every GPU; drain and requeue on a fault; resume when mended.

slurmd ignores this program's exit code, so it acts itself. It runs on every
node every few minutes: the healthy path is one probe, pure checks, and no
Slurm call unless this node is drained by us (or, once an hour, to find a drain
of ours whose record was lost).

One deadline ([check] deadline) bounds the whole run, remediation included: every
Slurm call after the checks gets what is left. A drain or requeue that fails for
a transient reason (slurmctld unreachable, too slow, the deadline spent) is kept
as a pending action (:mod:`slurm_hooks.remedy.pending`) that the next run on this node,
the watcher's retry loop included, finishes or drops as superseded.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence

from slurm_hooks import engine
from slurm_hooks.errors import SlurmHooksError, TransientError
from slurm_hooks.models import Action, Context, NodeSnapshot, Report, Scope, XidEvent
from slurm_hooks.remedy import drain, follower, gpumap, ownership, pending, repairs
from slurm_hooks.remedy.audit import annotate_jobs
from slurm_hooks.remedy.outcome import Outcome, record_alerts, record_metrics
from slurm_hooks.remedy.requeue import in_slurms_numbering, job_summary, requeue_jobs
from slurm_hooks.remedy.wiring import Wiring, xid_history
from slurm_hooks.slurm import quirks
from slurm_hooks.values import asdict, replace
from slurm_hooks.xid.history import XidState

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing (~3 ms of each start)
if TYPE_CHECKING:
    from typing import Any

    from slurm_hooks.slurm.recording import Record
    from slurm_hooks.xid.catalog import XidInfo


def run(w: Wiring, *, dry_run: bool = False, context: Context = Context.CHECK, follow: str = "detached",
        events: Sequence[XidEvent] = (), retry: bool = False, history: XidState | None = None,
        xid_lookup: Callable[[int], XidInfo | None] | None = None, repair: str = "detached") -> tuple[Report, Outcome]:
    """Judge the node and act. ``events``: XIDs a source delivered (the watcher's NVML event)
    that the probe may not see, e.g. when the kernel log is unreadable in a container.
    ``history`` and ``xid_lookup``: see :func:`judge`.

    A pending action left by an earlier run is finished on the way: its events are judged
    with this run's, and acting on the verdict settles it (done, superseded, or retried later).
    ``retry``: this run exists only to finish the pending action (its alerts were recorded).
    ``repair``: how a due repair runs (:data:`slurm_hooks.remedy.repair.MODES`): a detached worker.

    The run talks to Slurm through a record of its own (:meth:`Wiring.recording`): a node or job
    it has read is not read again until a write of its own may have changed it.
    """
    if context is not Context.WATCH:  # the watcher is a daemon: nothing kills it at 60 s
        w.start_deadline(w.config.check.deadline)
    mine = w.record is None
    w = w.recording()
    try:
        return _run(w, dry_run=dry_run, context=context, follow=follow, events=events, retry=retry, history=history,
                    xid_lookup=xid_lookup, repair=repair)
    finally:
        if mine and w.record is not None:
            w.record.end()


def _run(w: Wiring, *, dry_run: bool, context: Context, follow: str, events: Sequence[XidEvent], retry: bool,
         history: XidState | None, xid_lookup: Callable[[int], XidInfo | None] | None,
         repair: str) -> tuple[Report, Outcome]:
    if context is Context.CHECK and not dry_run and repairs.repair_under_way(w):
        # A repair worker has the (drained, idle) node: it judges it itself, and a probe of ours
        # now could hold a GPU open under its nvidia-smi --gpu-reset.
        return Report(w.node, context, (), 0.0), Outcome(repairs=["worker:busy"])
    earlier = None if dry_run else pending.load(w.config.state.dir, w.node)
    if earlier is not None:
        events = (*events, *_events(earlier))
    report = judge(w, context, events=events, acknowledge=not dry_run, history=history, xid_lookup=xid_lookup)
    outcome = Outcome()
    if not dry_run:
        if not retry:
            record_alerts(w, report)
            if context is Context.CHECK:
                _record_slurm_view(w, report)
        act(w, report, outcome, follow=follow, earlier=earlier, repair=repair)
        follower.finish_followed(w)  # jobs a requeue follower left waiting (it died, or could not start)
        if context is Context.CHECK and not retry:
            notify_flush(w)
    return report, outcome


def _record_slurm_view(w: Wiring, report: Report, env: Mapping[str, str] | None = None) -> None:
    """Slurm 26.05.2+ tells the health check its own view (``SLURM_NODE_IS_HEALTHY=yes|no``): kept
    beside ours in the audit log when it says something (an older Slurm says nothing: no record)."""
    said = quirks.node_is_healthy(dict(os.environ if env is None else env))
    if said:
        w.audit.write("slurm-view", node=w.node, context=report.context.value, node_is_healthy=said,
                      ours="healthy" if not report.drain_findings() else "faulty")


#: The health check's flush keeps this much of the run's deadline unspent, and needs at least MIN_FLUSH_S.
FLUSH_MARGIN_S = 1.0
MIN_FLUSH_S = 0.5


def notify_flush(w: Wiring) -> dict[str, int] | None:
    """After remediation, deliver what the audit log has to tell when no watcher does ([notify]):
    only with a receiver configured, no watcher's notifier alive, and something new or open;
    bounded by [notify] flush_timeout and what is left of the run's deadline. Never raises."""
    n = w.config.notify
    if not (n.webhook or n.alertmanager or n.syslog):
        return None  # nothing configured: not even an import
    budget = min(n.flush_timeout, w.time_left(n.flush_timeout) - FLUSH_MARGIN_S)
    if budget < MIN_FLUSH_S:
        return None
    try:
        from slurm_hooks.observe.notify import Notifier, NotifySettings

        notifier = Notifier(NotifySettings.from_config(w.config),
                            log=lambda msg: print(f"slurm-hooks check: notify: {msg}", file=sys.stderr))
        if notifier.delivering() or not notifier.has_work():
            return None
        return notifier.flush(budget, wait_settle=True)
    except Exception as exc:  # noqa: BLE001 - telling must never fail the check
        print(f"slurm-hooks check: notify flush failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return None


#: A pending action is retried only with at least this much of the run's deadline left.
MIN_RETRY_S = 10.0


def finish_pending(w: Wiring, *, follow: str = "detached", respect_backoff: bool = False) -> str | None:
    """Finish this node's pending action, if there is one: re-judge the node, then act or drop it.

    Cheap when there is none (one failed ``open``). Returns None when nothing was pending (or it
    is not due yet with ``respect_backoff``, or another process is finishing it right now), else
    the step it took: "done", "retry", "superseded" or "dropped".
    """
    state = w.config.state.dir
    rec = pending.load(state, w.node)
    if rec is None or (respect_backoff and not rec.due()):
        return None
    if w.time_left(MIN_RETRY_S) < MIN_RETRY_S:
        return None  # a probe cut short by our own deadline must not read as a broken node
    with pending.claimed(state, w.node) as mine:
        if not mine:
            return None
        try:
            context = Context(rec.context)
        except ValueError:
            context = Context.CHECK
        _, outcome = run(w, context=context, follow=follow, retry=True)
    return outcome.pending or None


def _events(rec: pending.Pending) -> list[XidEvent]:
    out = []
    for e in rec.events:
        try:
            out.append(XidEvent(**e))
        except TypeError:
            continue
    return out


def judge(w: Wiring, context: Context, *, acknowledge: bool = True, events: Sequence[XidEvent] = (),
          gpus: list[str] | None = None, baseline: NodeSnapshot | None = None, job_failed: bool = False,
          history: XidState | None = None, xid_lookup: Callable[[int], XidInfo | None] | None = None,
          dcgm_level: int = 0, dcgm_timeout: float | None = None, node_wide: bool = True) -> Report:
    """Take one snapshot (with ``events`` a source delivered) and judge it; then, if we drained this
    node before and an admin has resumed it since, acknowledge the XIDs we drained for and judge
    the same snapshot again: in every context, so that the first job after the resume is not
    refused for what the admin has mended.

    ``history``: this node's XID history as the caller loaded it (the watcher, which also marks
    its event seen), saved by the caller; without one it is loaded here and saved once.
    ``xid_lookup``: where the XID check looks codes up (the watcher's, which has looked one up).
    ``dcgm_level``: at least this deep a DCGM diag (the validation after a repair), bounded by
    ``dcgm_timeout`` instead of ``[dcgm] timeout`` when given.
    ``node_wide`` False: without the readings that count across runs (links, hysteresis), for a
    judgement that acts on nothing (the watcher's answer to NVRx) and must not count as a reading.
    """
    started = time.monotonic()
    state = xid_history(w).load() if history is None else history
    request = _request(w, context, state, started=started, gpus=gpus, baseline=baseline, job_failed=job_failed,
                       xid_lookup=xid_lookup, node_wide=node_wide)
    if dcgm_level > request.expect.dcgm_level_check and context is Context.CHECK:
        expect = replace(request.expect, dcgm_level_check=dcgm_level)
        request = replace(request, expect=expect,
                          dcgm=_dcgm_runner(w, context, expect, job_failed, dcgm_timeout))
    snap = engine.take_snapshot(w.probe(), w.node, min(w.config.gpu.probe_timeout, request.deadline_s))
    if snap.error is None:
        # Slurm's GPU numbers to NVML's (a cached map: one small read), for the job's GPUs here and
        # for the requeue scope later in this run.
        gmap = gpumap.current(w, snap)
        if gpus is not None:
            gpus, missing = gpumap.job_tokens(gmap, snap, gpus)
            request = replace(request, gpus=None if gpus is None else tuple(gpus), missing=tuple(missing))
    report = engine.judge(_with_events(snap, events), request)
    if report.snapshot is not None and report.snapshot.error is None:
        state.record(engine.snapshot_xids(report.snapshot))
    if acknowledge and report.drain_findings() and _admin_resumed(w, report, state):
        report = engine.judge(report.snapshot, _request(w, context, state, gpus=request.gpus, baseline=baseline,
                                                        job_failed=job_failed, xid_lookup=xid_lookup,
                                                        missing=request.missing, node_wide=node_wide))
    if history is None:
        _save(state)
    return report


def _request(w: Wiring, context: Context, state: XidState, node_wide: bool = True, **kw: Any) -> engine.JudgeRequest:
    cfg = w.config
    expect = cfg.expectations_for(w.node)
    return engine.JudgeRequest(
        expect, context,
        deadline_s=_check_budget(w),
        probe_timeout_s=cfg.gpu.probe_timeout,
        xid_history=state.recorded(),
        severities=cfg.severities,
        acked_xids=state.acked(),
        ecc_acked=state.ecc_acked(_boot()) if state.has_ecc_acks else {},
        dcgm=_dcgm_runner(w, context, expect, kw.get("job_failed", False)),
        on_check_error=Action(cfg.check.on_check_error),
        if_idle=context is Context.CHECK,  # what resume_if_ours looks at on an idle node
        **(_node_wide(w) if node_wide and context in (Context.CHECK, Context.WATCH) else {}),
        **kw,
    )


def _boot() -> str:
    from slurm_hooks.probes.kmsg import boot_id

    return boot_id()


def _node_wide(w: Wiring) -> dict[str, Any]:
    """The node's links to gather and the hysteresis of the threshold checks (not on the job path)."""
    from slurm_hooks.checks import hysteresis
    from slurm_hooks.probes import ib

    return {"links": ib.from_config(w.config, w.node), "hysteresis": hysteresis.from_config(w.config, w.node)}


def _save(state: XidState) -> None:
    try:
        state.save()
    except SlurmHooksError as exc:
        print(f"slurm-hooks: {exc}", file=sys.stderr)


def _with_events(snap: NodeSnapshot, events: Sequence[XidEvent]) -> NodeSnapshot:
    """Add delivered XIDs the snapshot lacks: not the same event (key), nor, from another source
    (NVML's event for a line the kernel log holds), the same code on the same GPU."""
    if snap.error is not None or not events:
        return snap
    present = engine.snapshot_xids(snap)
    keys = {x.key for x in present}
    seen = {(x.gpu, x.code, x.rule) for x in present}
    extra = [e for e in events if e.key not in keys and (e.gpu, e.code, e.rule) not in seen]
    if not extra:
        return snap
    by_gpu: dict[int, list[XidEvent]] = {}
    node_level: list[XidEvent] = []
    for e in extra:
        gpu = snap.gpu(e.gpu) if e.gpu is not None else None
        if gpu is not None:
            by_gpu.setdefault(gpu.index, []).append(replace(e, uuid=e.uuid or gpu.uuid))
        else:
            node_level.append(e)
    gpus = tuple(replace(g, xids=g.xids + tuple(by_gpu[g.index])) if g.index in by_gpu else g
                 for g in snap.gpus)
    return replace(snap, gpus=gpus, node_xids=snap.node_xids + tuple(node_level))


def _admin_resumed(w: Wiring, report: Report, state: XidState) -> bool:
    """We drained this node for some XIDs and an admin has resumed it: those XIDs are dealt with.

    They stay in the kernel log until the next reboot; acknowledging exactly the
    events we drained for keeps a mended node from being drained again for them,
    while any newer XID still drains. Faults that are state (ECC counts, a lost
    GPU, remapping) are judged afresh as always. The acknowledgement is written at
    once: a node whose history cannot be written stays drained rather than forget it.
    """
    drained_for = ownership.drained_for(w)
    if drained_for is None or report.snapshot is None:
        return False
    try:
        info = w.slurm.node(w.node)
        if info.drained or info.reboot_pending:
            return False  # our reboot under way shows no DRAIN flag at times: not an admin's resume
        from slurm_hooks.remedy import repair

        repair.note_person_resume(w, info)  # closes the incident as resumed by a person
        keys = sorted(set(drained_for) & set(_keys(report.snapshot)))
        if keys:
            state.ack(keys)
            state.save()
            w.audit.write("action", node=w.node, action="ack-xids", target=w.node, result="ok", duration_s=0.0,
                          detail=f"a person returned the node to service after our drain: the {len(keys)} GPU driver "
                                 "event(s) we drained for are taken as dealt with (a new one drains again); "
                                 "a GPU marked for replacement stays marked")
    except SlurmHooksError as exc:
        print(f"slurm-hooks: {exc}", file=sys.stderr)
        return False
    try:
        marker = ownership.load_marker(w)
    except SlurmHooksError:
        marker = None
    ownership.let_go(w, marker, info)  # the reason Slurm >= 23.11 may keep is never ours again
    return True


def _check_budget(w: Wiring) -> float:
    """What probe and checks may take of the run's deadline: the rest (a Slurm call, at most a
    quarter of what is left: a short run, such as one inside NHC, still probes) is kept for the drain."""
    left = w.time_left(w.config.check.deadline)
    return max(left - min(w.config.slurm.timeout, left / 4), 0.5)


def _keys(snap: NodeSnapshot) -> list[str]:
    return [x.key for x in engine.snapshot_xids(snap)]


def act(w: Wiring, report: Report, outcome: Outcome, follow: str = "detached",
        earlier: pending.Pending | None = None, repair: str = "detached") -> None:
    if earlier is not None and not _still_to_do(w, earlier, report, outcome):
        record_metrics(w, report, outcome)
        return
    if report.context is Context.CHECK and repairs.take_turn(w, report, outcome, rejudge(w), mode=repair):
        # A repair holds the node: it neither drains nor resumes it here. But an urgent new fault
        # (our reboot is pending while jobs finish) still requeues the jobs it touches.
        from slurm_hooks.remedy import repair

        fresh = repair.new_urgent(w, report)
        if fresh and w.policy.may_requeue:
            gpus = None if any(f.scope is Scope.NODE or f.gpu is None for f in fresh) \
                else frozenset(f.gpu for f in fresh if f.gpu is not None and f.instance is None)
            instances = frozenset((f.gpu, f.instance) for f in fresh if f.gpu is not None and f.instance is not None)
            outcome.node_out = True
            requeue_jobs(w, outcome, follow=follow, gpus=gpus, instances=instances)
        record_metrics(w, report, outcome)
        return
    if report.drain_findings():
        # Only a fault to act on now requeues, and only the jobs it touches (those on its GPU or
        # MIG instance, or every job for a node-wide one); the rest run to their end on the drained node.
        gpus, instances = report.requeue_gpus(), report.requeue_instances()
        multi_node = report.requeue_multi_node()  # a fabric fault: the jobs that span nodes
        requeue = (w.policy.may_requeue and (gpus is None or bool(gpus) or bool(instances) or multi_node)
                   and report.context in (Context.CHECK, Context.WATCH))
        take_out(w, report, outcome, follow=follow, requeue=requeue, earlier=earlier, gpus=gpus,
                 instances=instances, multi_node=multi_node)
        if outcome.drained and report.context is Context.CHECK:
            repairs.take_turn(w, report, outcome, rejudge(w), mode=repair)  # an idle node climbs at once
    elif report.healthy and report.context is Context.CHECK:
        held = os.path.exists(w.drained_marker())
        drain.resume_if_ours(w, outcome, report)
        if held and not outcome.resumed and not os.path.exists(w.drained_marker()):
            from slurm_hooks.remedy import repair

            repair.note_person_resume(w)  # our drain let go of, the node in service: a person resumed it
    record_metrics(w, report, outcome)


def rejudge(w: Wiring) -> Callable[[int, float | None], Report]:
    """How the repair ladder judges the whole node again (:data:`slurm_hooks.remedy.repair.Rejudge`):
    with a DCGM diag of at least ``dcgm_level``, bounded by ``dcgm_timeout``; 0 and None: as a check.
    A validation's (``dcgm_level`` > 0) runs the per-node fabric tests too where ``[repair] fabric_tests``."""
    def judged(dcgm_level: int, dcgm_timeout: float | None = None) -> Report:
        t0 = time.monotonic()
        report = judge(w, Context.CHECK, acknowledge=False, dcgm_level=dcgm_level, dcgm_timeout=dcgm_timeout)
        if dcgm_level > 0 and w.config.repair.fabric_tests and not report.drain_findings():
            from slurm_hooks.hooks import nodefabric

            left = (dcgm_timeout or w.config.repair.validate_timeout) - (time.monotonic() - t0)
            report = nodefabric.validate(w, report, w.time_left(left) - 5.0)
        return report

    return judged


def take_out(w: Wiring, report: Report, outcome: Outcome, *, follow: str, requeue: bool,
             earlier: pending.Pending | None = None, gpus: frozenset[int] | None = None,
             instances: frozenset[tuple[int, int]] = frozenset(), multi_node: bool = False, **extra: Any) -> None:
    """Drain, then requeue the node's jobs (``gpus``: only those on these GPUs, ``multi_node``: and
    those that span nodes): most urgent first,
    each Slurm call bounded by what is left of the run's deadline. What fails for a transient
    reason stays pending. Monitor-only (``[check] drain = false``, for every caller: check, watcher,
    prolog, epilog): audited as not acted on, and nothing done. Through the run's record
    (:meth:`Wiring.recording`; its own when the caller keeps none): the drain's first look at
    the node is the one this run took already, if it took one."""
    if not w.policy.may_drain:
        drain.not_acted(w, report, outcome, **extra)
        if earlier is not None:
            _close(w, earlier, "superseded", "monitor-only: [check] drain = false")
            outcome.pending = "superseded"
        return
    mine = w.record is None
    w = w.recording()
    try:
        _take_out(w, w.record, report, outcome, follow=follow, requeue=requeue, earlier=earlier, gpus=gpus,
                  instances=instances, multi_node=multi_node, **extra)
    finally:
        if mine and w.record is not None:
            w.record.end()


def _take_out(w: Wiring, record: Record, report: Report, outcome: Outcome, *, follow: str, requeue: bool,
              earlier: pending.Pending | None, gpus: frozenset[int] | None, instances: frozenset[tuple[int, int]],
              multi_node: bool, **extra: Any) -> None:
    first = len(record.errors)  # this drain's and requeue's errors count, not the run's earlier reads'
    drain.drain(w, report, outcome, **extra)
    left: list[str] = []
    requeued = False
    if record.transient(since=first):
        left = ["drain", "requeue"] if requeue else ["drain"]
    elif requeue and outcome.node_out:
        before = len(record.errors)
        snap = report.snapshot
        requeue_jobs(w, outcome, follow=follow, gpus=gpus, instances=instances, multi_node=multi_node,
                     fault_at=snap.taken_at if snap is not None and snap.taken_at > 0 else None)
        if record.transient(since=before):
            left = ["requeue"]
        requeued = True
    error = record.last_error(since=first)  # taken before the AdminComments: theirs is never a pending requeue
    # Why, in each requeued job's AdminComment: after the requeue (its failure is a warning), joined to
    # the AdminComment the job showed when its GPUs were read (the record's: no second read).
    # Each names only what touched its own GPUs (and node-wide faults).
    for ref in outcome.requeued if requeued else ():
        held = outcome.job_gpus.get(ref, ())
        annotate_jobs(w, [ref], f"requeued from {w.node}, {job_summary(w, report, held)}"
                      + in_slurms_numbering(w, held))
    if earlier is not None and not requeue and "requeue" in earlier.steps:
        left.append("requeue")  # this run (a prolog, an epilog) does not requeue: the next one will
    _settle(w, report, outcome, earlier, left, error)


def _still_to_do(w: Wiring, earlier: pending.Pending, report: Report, outcome: Outcome) -> bool:
    """Whether a pending action is still ours to finish; settles it when it is not.

    Never replayed over a person: a node someone else drained, or resumed after our drain,
    is theirs. A fault the re-judged node no longer shows needs nothing more.
    """
    if not report.drain_findings():
        _close(w, earlier, "superseded", "the fault is gone: the node was re-judged without it")
        outcome.pending = "superseded"
        return False
    try:
        info = w.slurm.node(w.node)
    except SlurmHooksError as exc:
        if isinstance(exc, TransientError):
            _settle(w, report, outcome, earlier, list(earlier.steps), str(exc))
            outcome.failed.append(f"{'+'.join(earlier.steps)} (pending): {exc}")
        else:
            _close(w, earlier, "dropped", f"cannot read the node: {exc}")
            outcome.pending = "dropped"
        return False
    if info.drained and not info.ours:
        detail = f"drained by someone else meanwhile: {info.reason!r}"
    elif "drain" not in earlier.steps and not info.drained:
        detail = "resumed by someone else after our drain"
    else:
        return True
    _close(w, earlier, "superseded", detail)
    outcome.pending = "superseded"
    return False


def _settle(w: Wiring, report: Report, outcome: Outcome, earlier: pending.Pending | None,
            left: list[str], error: str) -> None:
    """Keep what is left pending (with backoff), or close the earlier record now that it is done."""
    state = w.config.state.dir
    if left:
        snap = report.snapshot
        events = [asdict(x) for x in engine.snapshot_xids(snap)] if snap is not None else []
        reason = drain.drain_reason(report)
        try:
            rec = pending.record_failure(state, w.node, steps=left, context=report.context.value, reason=reason,
                                         events=events, error=error, earlier=earlier)
        except OSError as exc:
            print(f"slurm-hooks: cannot keep the pending action: {exc.strerror}", file=sys.stderr)
            return
        outcome.pending = "retry"
        w.audit.write("action", node=w.node, action="pending", target=w.node,
                      result="queued" if earlier is None else "retry", steps=list(rec.steps),
                      attempt=rec.attempts, error=error, reason=rec.reason, pending=rec.id, duration_s=0.0,
                      detail=f"next try in {pending.backoff(rec.attempts, error):g}s")
    elif earlier is not None and outcome.guarded:
        _close(w, earlier, "superseded", "held back by the drain guard: the config is suspected, not the node")
        outcome.pending = "superseded"
    elif earlier is not None:
        failed = list(outcome.failed)
        _close(w, earlier, "dropped" if failed else "done",
               "; ".join(failed) if failed else f"{'+'.join(earlier.steps)} finished")
        outcome.pending = "dropped" if failed else "done"


def _close(w: Wiring, earlier: pending.Pending, result: str, detail: str) -> None:
    pending.clear(w.config.state.dir, w.node)
    w.audit.write("action", node=w.node, action="pending", target=w.node, result=result,
                  steps=list(earlier.steps), attempt=earlier.attempts + 1, pending=earlier.id,
                  duration_s=round(time.time() - earlier.created, 4), detail=detail)


def _dcgm_runner(w: Wiring, context: Context, expect, job_failed: bool = False,
                 timeout: float | None = None) -> Callable | None:
    if engine.dcgm_level(context, expect, job_failed) <= 0:
        return None
    from slurm_hooks.probes import diag_runner

    return diag_runner(w.config, max_timeout=w.config.dcgm.timeout if timeout is None else timeout, node=w.node)
