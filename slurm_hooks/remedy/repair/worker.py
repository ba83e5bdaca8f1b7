"""The repair ladder: GPU reset -> reboot -> replace, climbed only as far as the fault needs.

Taken only on a node that we drained, with no job on it (the health check on the idle
drained node, or the epilog of its last job), one repair at a time per node (an flock
that a crash lets go of), never on a node someone else drained.

1. **reset** the faulty GPUs (:mod:`slurm_hooks.probes.gpureset`), acknowledge the XIDs
   the reset cleared, judge the node again (with a DCGM diag when configured): healthy
   -> resume.
2. **reboot** through Slurm: ``scontrol reboot ASAP nextstate=DOWN reason="... [reboot]"``.
   The node comes back DOWN, whatever the start-up health check found (verified on 22.05:
   with ``nextstate=RESUME`` the registration clears a drain the start-up check set); the
   first health check on the new boot resumes it when healthy, else climbs on.
3. **replace**: the fault survived the reboot (or came back on the same GPU within the
   window after one): the drain stays, tagged ``[replace]`` (the bridge acts on it), the
   GPUs go on the RMA list, and nothing is tried again until a person resumes the node.

The hooks only decide; a rung that is due runs in a **repair worker** (``slurm-hooks
repair-worker``), started detached in its own session through :mod:`slurm_hooks.runner`, so
that slurmd's kill of the health check (60 s) or the epilog (PrologEpilogTimeout) cannot cut a
reset short. The worker holds the node's repair lock for as long as it runs (one worker per
node), bounds every call by its own budget (``[repair] worker_timeout``), records each attempt
before it acts (``result: started``: a worker that dies is counted) and the services it stops
before it stops them, so that the next hook run restarts services a dead worker left stopped.

**Validation before return to service**: after a reset or a reboot (and on a person's
``slurm-hooks repair --validate``) the node stays drained with the tag ``[validating]`` while
the worker runs ``dcgmi diag -r <[repair] dcgm_level>``; only a diagnostic that ran and passed
in full resumes it. One that failed climbs the ladder; one that timed out, could not reach its
host engine or is not installed leaves the node drained ``[unverified]`` for a person.

Where to start is the finding's action (reset-class faults at reset; XID 79, a lost GPU,
a missing GPU at reboot). A fault back on the same GPU (UUID) within ``[repair] window``
after a repair starts one rung above it; a rung is tried at most ``attempts`` times per GPU
in the window. Everything is kept in ``<state dir>/repair-<node>.json``, so it counts
across reboots. Every rung is an audit record (start, result, duration) and a metric.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time

from slurm_hooks.engine import drain_summary
from slurm_hooks.errors import SlurmHooksError
from slurm_hooks.models import Action, Finding, Report, Urgency
from slurm_hooks.remedy import ownership
from slurm_hooks.remedy.repair import ladder
from slurm_hooks.remedy.repair.planner import Plan, attempt, gpus_of, plan
from slurm_hooks.remedy.repair.rma import is_uuid
from slurm_hooks.remedy.repair.rungs import CLIMBS_ON, audit, replace, resetter_for, restore_services, run
from slurm_hooks.remedy.repair.state import RepairStateUnreadable, Replaced
from slurm_hooks.remedy.repair.store import Ledger, load, locked
from slurm_hooks.remedy.repair.validation import (
    UNVERIFIED,
    VALIDATE_TRIES,
    Rejudge,
    begin,
    forget,
    unverified,
    validate_and_resume,
)
from slurm_hooks.slurm import is_held, parse_reason, reason_attempt

TYPE_CHECKING = False
if TYPE_CHECKING:

    from slurm_hooks.probes.gpureset import GpuResetter
    from slurm_hooks.remedy.outcome import Outcome
    from slurm_hooks.remedy.repair.state import Active
    from slurm_hooks.remedy.wiring import Wiring
    from slurm_hooks.slurm import NodeInfo

#: How a due rung runs: handed to a detached worker (the hooks); here, taking the repair lock
#: (tests, a person's command); or here under the lock the caller holds (the worker itself).
MODES = tuple(m.value for m in ladder.Mode)
#: How long a worker has to say it runs (and holds the lock).
WORKER_READY_S = 5.0


def step(w: Wiring, report: Report, outcome: Outcome, rejudge: Rejudge, *, own_job: str = "",
         resetter: GpuResetter | None = None, mode: str = "detached") -> bool:
    """One look at the ladder for this run; True when the repair holds the node (the caller
    then neither drains nor resumes it). Cheap on a healthy node with no repair under way
    (one failed ``open``); never raises. ``mode``: see :data:`MODES`."""
    cfg = w.config.repair
    if not cfg.enabled:
        return False
    try:
        state = load(w)
    except RepairStateUnreadable as exc:
        return _unreadable(report, outcome, exc)
    busy, rebooting = state.busy, state.active is not None
    if not busy and not report.drain_findings() and state.replaced is None:
        return False
    ledger = Ledger(w, state)
    try:
        info = w.node_now()  # the ladder decides on Slurm's answer now (a person may have taken the node)
        # A person's resume (or new hardware) ends our [replace] whatever reason Slurm kept after it.
        ended = state.replaced is not None and not rebooting and _replace_ended(w, report, ledger, info)
        if info.reason and ownership.holds(w, info, our_reboot=rebooting):
            forget(ledger)  # someone else took the node over meanwhile
            return ledger.state.stopped is not None and _restore_now(w, mode)
        if (info.drained or _down(info)) and is_held(info.reason):
            return True  # held for a person (too many remediations on this node): no rung runs, no resume
        replaced = ledger.state.replaced
        if replaced is not None and not replaced.resumed and not rebooting and (info.drained or _down(info)):
            return True  # waiting for a person (or new hardware): no reboot loop, no resume
        # A person returned it to service with the GPU still marked, and a new fault drained it since:
        # the ladder weighs the new fault on its attempts (a [replace] again, within the window).
        if ended and not report.drain_findings():
            if not ((info.drained or _down(info)) and begin(w, ledger, info, "replacement")):
                return False  # healthy (or a person's resume): the caller resumes it
        if not rebooting and not (info.drained or _down(info)) and ledger.state.stopped is None:
            forget(ledger)  # resumed by a person: their call
            return False  # not drained (yet): the caller drains first
        jobs = [j for j in w.slurm.jobs_on_node(w.node) if j.active and j.ref != own_job and str(j.job_id) != own_job]
    except SlurmHooksError as exc:
        print(f"slurm-hooks: repair: {exc}", file=sys.stderr)
        return busy
    if ladder.waits_for_jobs(ledger.state, jobs):
        return False  # repaired once the last job has left (its epilog, or the next check)
    try:
        if mode == ladder.Mode.HELD:
            return _work(w, report, outcome, rejudge, info, resetter)
        with locked(w) as mine:
            if not mine:
                return True  # a worker (or a person's repair) has the node right now
            if mode == ladder.Mode.INLINE:
                return _work(w, report, outcome, rejudge, info, resetter)
            ledger = Ledger(w)  # as the lock holder sees it
            restore_services(w, ledger)  # a worker died with them stopped
            due = _due(w, report, ledger, info, resetter)
    except RepairStateUnreadable as exc:
        return _unreadable(report, outcome, exc)
    if due is not ladder.Decision.WORK:
        return due is ladder.Decision.WAIT
    hand_off(w, outcome, own_job)
    return True


def _unreadable(report: Report, outcome: Outcome, exc: RepairStateUnreadable) -> bool:
    """The ladder's memory cannot be read: say so (once a run) and repair nothing. A node with a
    fault is still drained by the caller (False); one without is neither resumed nor drained."""
    line = f"repair: {exc}: no repair until it is mended or removed"
    if line not in outcome.failed:
        outcome.failed.append(line)
        print(f"slurm-hooks: {line}", file=sys.stderr)
    return not report.drain_findings()


def _restore_now(w: Wiring, mode: str) -> bool:
    """Services a dead worker left stopped come back whoever holds the node now."""
    if mode == "held":
        restore_services(w, Ledger(w))
        return False
    with locked(w) as mine:
        if mine:
            restore_services(w, Ledger(w))
    return False


def _due(w: Wiring, report: Report, ledger: Ledger, info: NodeInfo, resetter: GpuResetter | None) -> ladder.Decision:
    """What the hook does with the lock free (:func:`ladder.decide`), after the ladder's memory
    is taken from Slurm's reason where the state dir was lost."""
    boot = ""
    if ledger.state.active is not None:
        boot = (resetter or resetter_for(w, ledger)).boot_id()
    elif ledger.state.validating is None and _recall(w, report, ledger, info):
        return ladder.Decision.WAIT  # the state dir was lost, and Slurm's reason says a person must act
    findings = report.drain_findings()
    # The jobs were weighed before the lock was taken (and services a dead worker stopped restored since).
    return ladder.decide(ledger.state, info, (), boot, report, now=time.time(),
                         policy=ladder.Policy.from_config(w.config.repair), gpus=gpus_of(report, findings),
                         summary=drain_summary(report) if findings else "")


def _work(w: Wiring, report: Report, outcome: Outcome, rejudge: Rejudge, info: NodeInfo,
          resetter: GpuResetter | None) -> bool:
    """The ladder's due rung, run by the lock holder."""
    ledger = Ledger(w)
    restore_services(w, ledger)
    if ledger.state.active is not None:
        return _after_reboot(w, report, outcome, rejudge, ledger, ledger.state.active, info, resetter)
    if ledger.state.validating is not None:
        return _revalidate(w, report, outcome, rejudge, ledger, info, resetter)
    if _recall(w, report, ledger, info):
        return True  # the state dir was lost, and Slurm's reason says a person must act
    return _climb(w, report, outcome, rejudge, ledger, resetter)


def _climb(w: Wiring, report: Report, outcome: Outcome, rejudge: Rejudge, ledger: Ledger,
           resetter: GpuResetter | None) -> bool:
    """Run the due rung, and on a result in :data:`.rungs.CLIMBS_ON` the rung the ladder gives
    next, in the same run (a failed reset, a reboot Slurm refused): the rungs never climb."""
    p = plan(w, report, ledger.state)
    if p is None:
        return False
    while True:
        rung = ladder.Rung(p.rung)
        if run(rung, w, p, report, outcome, rejudge, ledger, resetter) not in CLIMBS_ON[rung]:
            return True
        p = plan(w, report, ledger.state)  # the attempt is on record: the next rung
        if p is None or ladder.Rung(p.rung).index <= rung.index:
            return True


def _after_reboot(w: Wiring, report: Report, outcome: Outcome, rejudge: Rejudge, ledger: Ledger,
                  active: Active, info: NodeInfo, resetter: GpuResetter | None) -> bool:
    p = Plan("reboot", list(active.gpus), active.why, active.summary)
    elapsed = time.time() - active.t
    booted = (resetter or resetter_for(w, ledger)).boot_id() != active.boot
    if not booted and not info.reboot_pending and not _down(info):
        # No reboot happened and none is pending: a person cancelled it (cancel_reboot) or resumed
        # the node. Their decision: our tracking ends, no [replace] over it.
        ledger.record(attempt("reboot", p, active.t, "cancelled"), active=None)
        outcome.repairs.append("reboot:cancelled")
        audit(w, "reboot", "cancelled", elapsed, p, reason=active.reason,
               detail=f"the reboot was cancelled or the node resumed by someone else (node {info.state}, "
                      f"reason {info.reason!r}): tracking ends")
        return False
    if info.reboot_pending or not booted:
        if elapsed < w.config.repair.reboot_timeout:
            return True  # the reboot is still to come, or under way: leave the node to Slurm
        result, detail = "failed", f"no reboot within {elapsed:.0f}s"
    elif info.reason and ownership.holds(w, info, our_reboot=True):
        ledger.update(active=None)
        return False  # an admin took the node over meanwhile
    elif report.drain_findings():
        result, detail = "failed", f"still {drain_summary(report)} after the reboot"
    else:
        result, detail, judged = validate_and_resume(w, active.summary, "reboot", outcome, rejudge, ledger, info)
        if result == "ok":
            detail = f"checked healthy on the new boot; {detail}"
        if judged is not None and judged.drain_findings():
            report = judged  # the diagnostic's finding is what the ladder climbs on
    ledger.record(attempt("reboot", p, active.t, result), active=None)
    outcome.repairs.append(f"reboot:{result}")
    audit(w, "reboot", result, elapsed, p, detail=detail, reason=active.reason)
    if result == UNVERIFIED:
        return True
    if result != "ok" and report.drain_findings():
        _climb(w, report, outcome, rejudge, ledger, resetter)
    elif result != "ok":
        replace(w, p, report, outcome, ledger)
    return True


def _revalidate(w: Wiring, report: Report, outcome: Outcome, rejudge: Rejudge, ledger: Ledger, info: NodeInfo,
                resetter: GpuResetter | None) -> bool:
    """A validation that its worker did not finish (it died): run it again, at most VALIDATE_TRIES
    times; a fault the node shows meanwhile climbs the ladder instead."""
    validating = ledger.state.validating
    if validating is None or validating.unverified:
        return True
    if report.drain_findings():
        forget(ledger)
        return _climb(w, report, outcome, rejudge, ledger, resetter)
    if validating.tries >= VALIDATE_TRIES:
        unverified(w, ledger, validating.summary, f"validation interrupted {validating.tries} time(s)")
        outcome.repairs.append(f"validate:{UNVERIFIED}")
        return True
    result, _detail, judged = validate_and_resume(w, validating.summary, validating.after, outcome, rejudge,
                                                   ledger, info)
    outcome.repairs.append(f"validate:{result}")
    if result == "failed" and judged is not None and judged.drain_findings():
        _climb(w, judged, outcome, rejudge, ledger, resetter)
    return True


def new_urgent(w: Wiring, report: Report) -> list[Finding]:
    """Urgent findings that our pending reboot was not for (a new fault while the node waits for
    its jobs to end): their jobs are requeued even though the repair holds the node."""
    try:
        active = load(w).active
    except RepairStateUnreadable:
        return []  # said by the step that held the node
    if active is None:
        return []
    known = set(active.findings)
    return [f for f in report.drain_findings() if f.urgency is Urgency.NOW and (f.check, f.gpu) not in known]


def _down(info: NodeInfo) -> bool:
    """DOWN with our reason: how our ``nextstate=DOWN`` reboot brings a node back."""
    return info.down and info.ours


def _replace_ended(w: Wiring, report: Report, ledger: Ledger, info: NodeInfo) -> bool:
    """Whether our ``[replace]`` is over: every GPU it named is gone from the node (new hardware:
    new UUIDs). The same GPU passing a check is not enough (flaky hardware passes now and then), and
    neither is a person's resume: the node then runs jobs with its GPUs still marked for
    replacement (said once, in the audit log and so in the page, ``status`` and the report) until
    new hardware or ``slurm-hooks rma clear``. A ``[replace]`` taken from Slurm's reason (no GPU
    known) ends with the resume. The RMA entry stays. True when it ended now."""
    replaced = ledger.state.replaced
    if replaced is None:
        return False
    gpus = [g for g in replaced.gpus if is_uuid(g)]
    snap = report.snapshot
    in_service = not (info.drained or _down(info))
    if gpus and snap is not None and snap.error is None and snap.gpus \
            and not set(gpus) & {g.uuid for g in snap.gpus}:
        detail = f"GPU(s) {', '.join(gpus)} no longer in the node: the hardware was replaced"
    elif in_service and gpus:
        if not replaced.resumed:
            from slurm_hooks.remedy.repair.rma import marked_on

            ledger.update(replaced=dataclasses.replace(replaced, resumed=time.time()))
            marked = marked_on(w, gpus)
            w.audit.write("action", node=w.node, action="repair-replace", target=w.node, result="resumed",
                          duration_s=0.0, reason=replaced.reason, gpu_ids=marked,
                          detail=f"returned to service by a person with {_named(marked)} still marked for "
                                 "replacement: jobs run on it; the mark stays until new hardware or "
                                 + "; ".join(f"`slurm-hooks rma clear --node {w.node} --gpu {g['index']}`"
                                             for g in marked if g.get("index") is not None))
        return False
    elif in_service:
        detail = "the node was resumed by a person"
    else:
        return False
    ledger.update(replaced=None, attempts=tuple(a for a in ledger.state.attempts if not set(a.gpus) & set(replaced.gpus)))
    w.audit.write("action", node=w.node, action="repair-replace", target=w.node, result="ended", duration_s=0.0,
                  reason=replaced.reason, detail=f"{detail}; the ladder starts afresh on this node")
    return True


def _named(gpus: list[dict]) -> str:
    words = [f"GPU {g.get('index', '?')}" + (f" (serial {g['serial']})" if g.get("serial") else "") for g in gpus]
    return ", ".join(words) or "its GPU"


def _has_marker(w: Wiring) -> bool:
    try:
        return ownership.load_marker(w) is not None
    except SlurmHooksError:
        return True  # there, though unreadable: the state dir was not lost


def _recall(w: Wiring, report: Report, ledger: Ledger, info: NodeInfo) -> bool:
    """With no attempt on record (the state dir was lost: a diskless node, a reimage), take the
    ladder's memory from Slurm's reason: ``[replace]`` waits for a person, ``[reboot 1/1]``
    counts as that many reboots of the GPUs now at fault. True when the node waits for a person."""
    if ledger.state.attempts or _has_marker(w):
        return False  # the state dir is there: what it holds is the ladder's memory
    parsed = parse_reason(info.reason)
    if parsed is None:
        return False
    if parsed[1] is Action.REPLACE and (info.drained or _down(info)):
        ledger.update(replaced=Replaced(time.time(), info.reason, (), recalled=True))
        return True
    counted = reason_attempt(info.reason)
    if counted is None or counted[0] is not Action.REBOOT:
        return False
    p = plan(w, report, ledger.state)
    if p is None:
        return False
    now = time.time()
    ledger.update(attempts=(*ledger.state.attempts, *(attempt("reboot", p, now, "recalled") for _ in range(counted[1]))))
    w.audit.write("action", node=w.node, action="repair-reboot", target=w.node, result="recalled", duration_s=0.0,
                  reason=info.reason, detail=f"no repair state on this node (state dir lost?): {counted[1]} reboot(s) "
                                             "taken from Slurm's reason")
    return False


def note_person_resume(w: Wiring, info: NodeInfo | None = None) -> bool:
    """We drained this node (our marker was there) and it is back in service, not by our resume:
    a person resumed it. Closes its incident as "resumed by <user>" (Slurm's ``ReasonUser`` only
    when it is not the drain's own, else "a person"). One Slurm read, once per incident. True
    when it wrote the closing record."""
    from slurm_hooks.observe import incidents

    try:
        info = w.slurm.node(w.node) if info is None else info
    except SlurmHooksError:
        return False
    try:
        rebooting = load(w).active is not None
    except RepairStateUnreadable as exc:
        print(f"slurm-hooks: repair: {exc}", file=sys.stderr)
        return False
    if info.out_of_service or info.reboot_pending or rebooting:
        return False  # still out, or our reboot under way (Slurm shows it neither drained nor DOWN at times)
    incidents.record_person_resume(w.audit, w.node, reason=info.reason, state=info.state)
    return True


def hand_off(w: Wiring, outcome: Outcome, own_job: str = "", python: str | None = None) -> bool:
    """Start the node's repair worker, detached in its own session; True once it runs."""
    from slurm_hooks.runner import python_argv, spawn_detached

    args = ["repair-worker", "--node", w.node] + (["--config", w.config.path] if w.config.path else [])
    if own_job:
        args += ["--job", own_job]
    env = dict(os.environ)
    if w.config.path:
        env["SLURM_HOOKS_CONFIG"] = w.config.path
    t0 = time.monotonic()
    spawned = spawn_detached(python_argv("slurm_hooks.entry", *args, python=python), env=env, cwd="/",
                             ready_timeout=WORKER_READY_S)
    if spawned.started and spawned.proc is not None:
        outcome.repairs.append("worker:start")
        return True
    outcome.failed.append(f"repair worker: {spawned.error}")
    w.audit.write("action", node=w.node, action="repair-worker", target=w.node, result="failed",
                  duration_s=round(time.monotonic() - t0, 4), level="error", error=spawned.error,
                  detail="the repair worker did not start; the next health check tries again")
    return False


def worker_lock(w: Wiring) -> contextlib.AbstractContextManager[bool]:
    """The node's repair lock, as the worker (or a person's repair command) holds it."""
    return locked(w)
