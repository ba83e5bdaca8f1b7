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
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Callable, Optional

from slurm_hooks import fsutil
from slurm_hooks.engine import drain_summary
from slurm_hooks.errors import PermanentError, SlurmHooksError
from slurm_hooks.hooks import remediate
from slurm_hooks.models import Action, Finding, Report, Urgency, gpu_identity
from slurm_hooks.remedy.repair import ladder
from slurm_hooks.remedy.repair import state as repair_state
from slurm_hooks.remedy.repair.state import RepairState, RepairStateUnreadable
from slurm_hooks.slurm import format_reason, format_status_reason, parse_reason, reason_attempt, reboot_pending
from slurm_hooks.slurm.errors import ReasonNotOurs
from slurm_hooks.values import dataclass, field
from slurm_hooks.xid.history import repeat_offender

if TYPE_CHECKING:
    from slurm_hooks.hooks.remediate import Outcome
    from slurm_hooks.hooks.wiring import Wiring
    from slurm_hooks.probes.gpureset import GpuResetter, NvidiaSmiReset

RUNGS = ladder.RUNGS
VERSION = repair_state.VERSION
#: Attempts older than this are dropped from the state file whatever the window.
KEEP_S = 30 * 86400

#: ``judge(dcgm_level, dcgm_timeout)``: the node judged afresh after a repair (a new snapshot),
#: with a DCGM diag of at least that level bounded by that timeout (None: ``[dcgm] timeout``).
Rejudge = Callable[[int, Optional[float]], Report]
#: How a due rung runs: handed to a detached worker (the hooks); here, taking the repair lock
#: (tests, a person's command); or here under the lock the caller holds (the worker itself).
MODES = tuple(m.value for m in ladder.Mode)
#: Reason tags of a node proving itself (``[validating]``) or left for a person because its
#: diagnostic did not run in full (``[unverified]``).
VALIDATING, UNVERIFIED = "validating", repair_state.UNVERIFIED
#: How long a worker has to say it runs (and holds the lock).
WORKER_READY_S = 5.0
#: A validation interrupted this often (its worker died) is given up: ``[unverified]``.
VALIDATE_TRIES = 2
#: The evidence kept before a reboot or a [replace]: at most this long (never past the rung's
#: budget), this many bytes per file, this many bundles per node (the oldest go).
EVIDENCE_S = 10.0
EVIDENCE_FILE_MAX = 256 * 1024
EVIDENCE_KEEP = 10


def start_rung(finding: Finding) -> str | None:
    """The rung a finding starts at; ``None`` for one no repair mends (a person must look)."""
    rung = ladder.start_rung(finding)
    return None if rung is None else rung.value


@dataclass
class Plan:
    rung: str
    #: (index, identity) of the GPUs the findings name; identity "node" for node-wide findings.
    gpus: list[tuple[int | None, str]]
    why: str
    summary: str
    skipped: list[str] = field(default_factory=list)

    def text(self, node: str) -> str:
        what = {"reset": "reset GPU(s) " + ", ".join(str(i) for i, _ in self.gpus if i is not None),
                "reboot": "reboot the node through Slurm", "replace": "leave it drained for replacement [replace]"}
        return f"{node}: repair would {what[self.rung]} ({self.why})"


def plan(w: Wiring, report: Report, state: dict[str, Any] | None = None, now: float | None = None) -> Plan | None:
    """What the ladder would do for this report; ``None`` when nothing is to repair."""
    now = time.time() if now is None else now
    findings = report.drain_findings()
    if not findings:
        return None
    if state is None:
        try:
            state = load(w)
        except RepairStateUnreadable as exc:
            print(f"slurm-hooks: repair: {exc}: the ladder does nothing until it is mended or removed",
                  file=sys.stderr)
            return None
    gpus = _gpus(report, findings)
    choice = ladder.choose(findings, gpus, state["attempts"], ladder.Policy.from_config(w.config.repair), now,
                           drain_summary(report), offender=repeat_offender)
    if choice is None:
        return None
    return Plan(choice.rung.value, gpus, choice.why, drain_summary(report), list(choice.skipped))


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
    active = state.get("active")
    busy = active is not None or bool(state.get("stopped")) or bool(state.get("validating"))
    if not busy and not report.drain_findings() and not state.get("replaced"):
        return False
    try:
        info = w.slurm.node(w.node)
        # A person's resume (or new hardware) ends our [replace] whatever reason Slurm kept after it.
        ended = bool(state.get("replaced")) and active is None and _replace_ended(w, report, state, info)
        if info.reason and remediate.holds(w, info, our_reboot=active is not None):
            if state.get("validating"):
                _forget_validation(w, state)  # someone else took the node over meanwhile
            return bool(state.get("stopped")) and _restore_now(w, mode)
        if state.get("replaced") and active is None and (info.drained or _down(info)):
            return True  # waiting for a person (or new hardware): no reboot loop, no resume
        if ended and not report.drain_findings():
            if not ((info.drained or _down(info)) and _begin_validation(w, state, info, "replacement")):
                return False  # healthy (or a person's resume): the caller resumes it
        if active is None and not (info.drained or _down(info)) and not state.get("stopped"):
            if state.get("validating"):
                _forget_validation(w, state)  # resumed by a person: their call
            return False  # not drained (yet): the caller drains first
        jobs = [j for j in w.slurm.jobs_on_node(w.node) if j.active and j.ref != own_job and str(j.job_id) != own_job]
    except SlurmHooksError as exc:
        print(f"slurm-hooks: repair: {exc}", file=sys.stderr)
        return busy
    if ladder.waits_for_jobs(RepairState.from_json(state), jobs):
        return False  # repaired once the last job has left (its epilog, or the next check)
    try:
        if mode == ladder.Mode.HELD:
            return _work(w, report, outcome, rejudge, info, resetter)
        with _locked(w) as mine:
            if not mine:
                return True  # a worker (or a person's repair) has the node right now
            if mode == ladder.Mode.INLINE:
                return _work(w, report, outcome, rejudge, info, resetter)
            state = load(w)  # as the lock holder sees it
            restore_services(w, state)  # a worker died with them stopped
            due = _due(w, report, state, info, resetter)
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
        restore_services(w, load(w))
        return False
    with _locked(w) as mine:
        if mine:
            restore_services(w, load(w))
    return False


def _due(w: Wiring, report: Report, state: dict[str, Any], info: Any,
         resetter: GpuResetter | None) -> ladder.Decision:
    """What the hook does with the lock free (:func:`ladder.decide`), after the ladder's memory
    is taken from Slurm's reason where the state dir was lost."""
    boot = ""
    if state.get("active") is not None:
        boot = (resetter or _resetter(w, state)).boot_id()
    elif not state.get("validating") and _recall(w, report, state, info):
        return ladder.Decision.WAIT  # the state dir was lost, and Slurm's reason says a person must act
    findings = report.drain_findings()
    # The jobs were weighed before the lock was taken (and services a dead worker stopped restored since).
    return ladder.decide(RepairState.from_json(state), info, (), boot, report, now=time.time(),
                         policy=ladder.Policy.from_config(w.config.repair), gpus=_gpus(report, findings),
                         summary=drain_summary(report) if findings else "")


def _work(w: Wiring, report: Report, outcome: Outcome, rejudge: Rejudge, info: Any,
          resetter: GpuResetter | None) -> bool:
    """The ladder's due rung, run by the lock holder."""
    state = load(w)
    restore_services(w, state)
    active = state.get("active")
    if active is not None:
        return _after_reboot(w, report, outcome, rejudge, state, active, info, resetter)
    if state.get("validating"):
        return _revalidate(w, report, outcome, rejudge, state, info, resetter)
    if _recall(w, report, state, info):
        return True  # the state dir was lost, and Slurm's reason says a person must act
    return _climb(w, report, outcome, rejudge, state, resetter)


def _climb(w: Wiring, report: Report, outcome: Outcome, rejudge: Rejudge, state: dict[str, Any],
           resetter: GpuResetter | None) -> bool:
    p = plan(w, report, state)
    if p is None:
        return False
    if p.rung == "reset":
        if _reset(w, p, outcome, rejudge, state, resetter) != "failed":
            return True
        p = plan(w, report, state)  # the reset is now an attempt: the next rung
        if p is None:
            return True
    if p.rung == "reboot":
        _reboot(w, p, outcome, state, resetter, report)
    else:
        _replace(w, p, report, outcome, state)
    return True


def _reset(w: Wiring, p: Plan, outcome: Outcome, rejudge: Rejudge, state: dict[str, Any],
           resetter: GpuResetter | None) -> str:
    """Rung 1: "ok" when the node is healthy again and resumed, "unverified" when it checked
    healthy but its diagnostic did not run in full, else "failed"."""
    from slurm_hooks.hooks.wiring import xid_history

    backend = resetter or _resetter(w, state)
    indexes = sorted(i for i, _ in p.gpus if i is not None)
    started, t0 = time.time(), time.monotonic()
    attempt = _attempt(state, "reset", p, started, "started")
    save(w, state)  # counted before it acts: a worker killed mid-reset still used this attempt
    _audit(w, "reset", "start", 0.0, p, gpus=indexes, backend=backend.name)
    result, detail = "failed", ""
    try:
        backend.reset(indexes)
    except SlurmHooksError as exc:
        detail = str(exc)
    else:
        # The reset cleared what the XIDs we drained for reported; they stay in the kernel log.
        history = xid_history(w).load()
        history.ack(remediate.drained_for(w) or [])
        with contextlib.suppress(SlurmHooksError):
            history.save()
        after = rejudge(0, None)
        if after.drain_findings():
            detail = f"still {drain_summary(after)} after the reset"
        else:
            result, detail, _ = _validate_and_resume(w, p.summary, "reset", outcome, rejudge, state)
    attempt["result"] = result
    save(w, state)
    outcome.repairs.append(f"reset:{result}")
    _audit(w, "reset", result, time.monotonic() - t0, p, gpus=indexes, detail=detail)
    return result


# -- validation before return to service ----------------------------------------


def _validate_and_resume(w: Wiring, summary: str, after: str, outcome: Outcome, rejudge: Rejudge,
                         state: dict[str, Any], info: Any = None) -> tuple[str, str, Report | None]:
    """The node checked healthy on NVML after ``after`` (reset, reboot, request): hold it drained
    ``[validating]`` while the configured diagnostic runs, then resume it only on a full pass.
    Returns (result, detail, the report judged): "ok", "failed" (the diagnostic found a fault: the
    caller climbs on that report), or "unverified" (the node stays drained for a person)."""

    level = int(w.config.repair.dcgm_level)
    if level <= 0:
        report = rejudge(0, None)
        if report.drain_findings():
            return "failed", f"still {drain_summary(report)}", report
        return (*_resume_validated(w, outcome, report, info, "no diagnostic configured ([repair] dcgm_level = 0)"),
                report)
    reason = format_status_reason(summary, VALIDATING)
    validating = state.setdefault("validating", {"t": time.time(), "after": after, "tries": 0})
    validating.update(summary=summary, reason=reason, result="running", tries=int(validating.get("tries", 0)) + 1)
    save(w, state)
    t0 = time.monotonic()
    try:
        w.slurm.drain(w.node, reason)
    except SlurmHooksError as exc:
        outcome.failed.append(f"drain: {exc}")
        _forget_validation(w, state)
        return "failed", f"could not mark the node {reason!r}: {exc}", None
    remediate.write_marker(w, reason, None)
    budget = min(float(w.config.repair.validate_timeout), w.time_left(float(w.config.repair.validate_timeout)))
    w.audit.write("action", node=w.node, action="repair-validate", target=w.node, result="start", duration_s=0.0,
                  reason=reason, level=level, after=after, timeout_s=round(budget, 1),
                  detail=f"dcgmi diag -r {level} before the node returns to service")
    report = rejudge(level, budget)
    found, detail = verdict(report, level)
    w.audit.write("action", node=w.node, action="repair-validate", target=w.node, result=found,
                  duration_s=round(time.monotonic() - t0, 4), reason=reason, level=level, after=after, detail=detail,
                  **({"gpus": sorted({f.gpu for f in report.drain_findings() if f.gpu is not None})}
                     if found == "failed" else {}))
    if found == "ok":
        _forget_validation(w, state)
        return (*_resume_validated(w, outcome, report, info, detail), report)
    if found == "failed":
        _forget_validation(w, state)
        return "failed", detail, report
    _unverified(w, state, summary, detail)
    return UNVERIFIED, detail, report


def verdict(report: Report, level: int) -> tuple[str, str]:
    """Passed only when the diagnostic ran and every test passed; one that could not run (not
    installed, host engine down, timed out, cut by the deadline) is "unverified", never a pass."""
    if report.drain_findings():
        return "failed", f"{drain_summary(report)}: " + "; ".join(f.message for f in report.drain_findings()[:3])
    dcgm = [f for f in report.findings if f.check == "dcgm"]
    if dcgm:
        return UNVERIFIED, dcgm[0].message
    if "dcgm" not in report.checks_run:
        return UNVERIFIED, f"DCGM diag L{level} did not run"
    return "ok", f"DCGM diag L{level} passed"


def _resume_validated(w: Wiring, outcome: Outcome, report: Report, info: Any, detail: str) -> tuple[str, str]:
    """Back into service after a validation (or none configured): a node that came back DOWN from
    our reboot is drained with our reason first, which resume accepts."""

    try:
        node = w.slurm.node(w.node)
        if not node.drained and node.base_state == "DOWN" and node.ours:
            w.slurm.drain(w.node, node.reason)
    except SlurmHooksError as exc:
        outcome.failed.append(f"resume: {exc}")
        return "failed", f"{detail}, but not resumed: {exc}"
    remediate.resume_if_ours(w, outcome, report)
    if outcome.resumed:
        return "ok", f"{detail}, resumed"
    return "failed", f"{detail}, but not resumed: " + "; ".join(outcome.failed or ["see the resume record"])


def _unverified(w: Wiring, state: dict[str, Any], summary: str, detail: str) -> None:
    """The diagnostic did not run in full: the node stays drained, tagged for a person."""

    reason = format_status_reason(summary, UNVERIFIED)
    state.setdefault("validating", {})
    state["validating"].update(result=UNVERIFIED, reason=reason, detail=detail)
    save(w, state)
    with contextlib.suppress(SlurmHooksError):
        w.slurm.drain(w.node, reason)
        remediate.write_marker(w, reason, None)


def _begin_validation(w: Wiring, state: dict[str, Any], info: Any, after: str) -> bool:
    """Hold a node that is still out (new hardware after ``[replace]``) for its validation,
    which a worker then runs; False when none is configured ([repair] dcgm_level = 0)."""
    if int(w.config.repair.dcgm_level) <= 0:
        return False
    parsed = parse_reason(info.reason)
    summary = parsed[0] if parsed else "hardware replaced"
    state["validating"] = {"t": time.time(), "after": after, "tries": 0, "summary": summary, "result": "running"}
    save(w, state)
    return True


def _forget_validation(w: Wiring, state: dict[str, Any]) -> None:
    if state.pop("validating", None) is not None:
        save(w, state)


def _revalidate(w: Wiring, report: Report, outcome: Outcome, rejudge: Rejudge, state: dict[str, Any], info: Any,
                resetter: GpuResetter | None) -> bool:
    """A validation that its worker did not finish (it died): run it again, at most VALIDATE_TRIES
    times; a fault the node shows meanwhile climbs the ladder instead."""
    validating = state["validating"]
    if validating.get("result") == UNVERIFIED:
        return True
    summary = str(validating.get("summary", ""))
    if report.drain_findings():
        _forget_validation(w, state)
        return _climb(w, report, outcome, rejudge, state, resetter)
    if int(validating.get("tries", 0)) >= VALIDATE_TRIES:
        _unverified(w, state, summary, f"validation interrupted {validating.get('tries')} time(s)")
        outcome.repairs.append(f"validate:{UNVERIFIED}")
        return True
    result, _detail, judged = _validate_and_resume(w, summary, str(validating.get("after", "")), outcome, rejudge,
                                                   state, info)
    outcome.repairs.append(f"validate:{result}")
    if result == "failed" and judged is not None and judged.drain_findings():
        _climb(w, judged, outcome, rejudge, state, resetter)
    return True


def validate_on_request(w: Wiring, outcome: Outcome, rejudge: Rejudge, who: str) -> str:
    """A person's ``slurm-hooks repair --validate``: drain ``[validating]``, run the configured
    diagnostic, resume on a full pass. The caller holds the repair lock. Returns the verdict
    ("failed", the node left as it is, when the ladder's memory cannot be read)."""
    try:
        state = load(w)
    except RepairStateUnreadable as exc:
        print(f"slurm-hooks: repair: {exc}: mend or remove it first", file=sys.stderr)
        return "failed"
    state.pop("validating", None)
    report = rejudge(0, None)
    if report.drain_findings():
        return "failed"
    result, _, judged = _validate_and_resume(w, f"validation asked by {who}", "request", outcome, rejudge, state)
    if result == "failed" and judged is not None and judged.drain_findings():
        remediate.drain(w, judged, outcome)  # what failed, as the reason: the ladder takes it from there
    return result


# -- the worker -------------------------------------------------------------------


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
    return _locked(w)


# -- services stopped around a reset ------------------------------------------------


def restore_services(w: Wiring, state: dict[str, Any]) -> list[str]:
    """Start the services the record says are stopped (a worker died between its stop and its
    start); returns those still not running. Call with the repair lock held."""
    stopped = state.get("stopped") or {}
    names = [str(n) for n in stopped.get("services", ())]
    if not names:
        return []
    t0 = time.monotonic()
    backend = _resetter(w, state)
    errors: list[str] = []
    left = backend.start_services(names, errors)
    _journal(w, state, left)
    w.audit.write("action", node=w.node, action="repair-services", target=w.node,
                  result="failed" if left else "ok", duration_s=round(time.monotonic() - t0, 4),
                  services=names, **({"error": "; ".join(errors)} if errors else {}),
                  detail=f"left stopped by a repair worker that did not finish (pid {stopped.get('pid')})")
    return left


def _journal(w: Wiring, state: dict[str, Any], services: list[str]) -> None:
    if services:
        state["stopped"] = {"services": list(services), "t": time.time(), "pid": os.getpid()}
    else:
        state.pop("stopped", None)
    save(w, state)


def _reboot(w: Wiring, p: Plan, outcome: Outcome, state: dict[str, Any], resetter: GpuResetter | None,
            report: Report | None = None) -> None:
    since = time.time() - float(w.config.repair.window)
    tried = sum(1 for a in state["attempts"] if a["rung"] == "reboot" and a["t"] >= since
                and set(a["gpus"]) & {g for _, g in p.gpus})
    # The count rides in Slurm's reason ([reboot 1/2]): a lost state dir does not reset it.
    reason = format_reason(p.summary, Action.REBOOT, attempt=(tried + 1, int(w.config.repair.attempts)))
    evidence = keep_evidence(w, report, "reboot")  # a reboot wipes the kernel log and the GPU's state
    t0, started = time.monotonic(), time.time()
    boot = (resetter or _resetter(w, state)).boot_id()
    try:
        w.slurm.reboot(w.node, reason, "DOWN")
    except ReasonNotOurs as exc:
        _audit(w, "reboot", "skipped", time.monotonic() - t0, p, reason=reason, detail=str(exc))
        return
    except PermanentError as exc:
        # Refused (no RebootProgram: "Unspecified error"): that was the attempt. Counted once,
        # and the ladder moves on now instead of asking again at every check.
        _attempt(state, "reboot", p, started, "refused")
        save(w, state)
        outcome.repairs.append("reboot:refused")
        _audit(w, "reboot", "refused", time.monotonic() - t0, p, reason=reason, error=str(exc),
               detail="Slurm refused the reboot (is RebootProgram set in slurm.conf?): the ladder moves on")
        if report is not None:
            _replace(w, plan(w, report, state) or p, report, outcome, state)
        return
    except SlurmHooksError as exc:
        outcome.failed.append(f"reboot: {exc}")
        _audit(w, "reboot", "failed", time.monotonic() - t0, p, reason=reason, error=str(exc))
        return
    remediate.write_marker(w, reason, None)
    state["active"] = {"rung": "reboot", "t": time.time(), "boot": boot, "reason": reason, "why": p.why,
                       "summary": p.summary, "gpus": [list(g) for g in p.gpus],
                       "findings": [[f.check, f.gpu] for f in report.drain_findings()] if report else []}
    save(w, state)
    outcome.repairs.append("reboot:start")
    _audit(w, "reboot", "start", time.monotonic() - t0, p, reason=reason, gpu_ids=gpu_ids(report, p),
           evidence=evidence,
           detail="scontrol reboot ASAP nextstate=DOWN: back in service only after a passing check on the new boot")


def _after_reboot(w: Wiring, report: Report, outcome: Outcome, rejudge: Rejudge, state: dict[str, Any],
                  active: dict[str, Any], info: Any, resetter: GpuResetter | None) -> bool:
    p = Plan("reboot", [tuple(g) for g in active.get("gpus", [])], active.get("why", ""),  # type: ignore[misc]
             active.get("summary", ""))
    elapsed = time.time() - float(active.get("t", 0))
    booted = (resetter or _resetter(w, state)).boot_id() != active.get("boot")
    if not booted and not reboot_pending(info) and not _down(info):
        # No reboot happened and none is pending: a person cancelled it (cancel_reboot) or resumed
        # the node. Their decision: our tracking ends, no [replace] over it.
        state.pop("active", None)
        _attempt(state, "reboot", p, float(active.get("t", time.time())), "cancelled")
        save(w, state)
        outcome.repairs.append("reboot:cancelled")
        _audit(w, "reboot", "cancelled", elapsed, p, reason=active.get("reason"),
               detail=f"the reboot was cancelled or the node resumed by someone else (node {info.state}, "
                      f"reason {info.reason!r}): tracking ends")
        return False
    if reboot_pending(info) or not booted:
        if elapsed < float(w.config.repair.reboot_timeout):
            return True  # the reboot is still to come, or under way: leave the node to Slurm
        result, detail = "failed", f"no reboot within {elapsed:.0f}s"
    elif info.reason and remediate.holds(w, info, our_reboot=True):
        state.pop("active", None)
        save(w, state)
        return False  # an admin took the node over meanwhile
    elif report.drain_findings():
        result, detail = "failed", f"still {drain_summary(report)} after the reboot"
    else:
        result, detail, judged = _validate_and_resume(w, str(active.get("summary", "")), "reboot", outcome,
                                                      rejudge, state, info)
        if result == "ok":
            detail = f"checked healthy on the new boot; {detail}"
        if judged is not None and judged.drain_findings():
            report = judged  # the diagnostic's finding is what the ladder climbs on
    state.pop("active", None)
    _attempt(state, "reboot", p, float(active.get("t", time.time())), result)
    save(w, state)
    outcome.repairs.append(f"reboot:{result}")
    _audit(w, "reboot", result, elapsed, p, detail=detail, reason=active.get("reason"))
    if result == UNVERIFIED:
        return True
    if result != "ok" and report.drain_findings():
        _climb(w, report, outcome, rejudge, state, resetter)
    elif result != "ok":
        _replace(w, p, report, outcome, state)
    return True


def _replace(w: Wiring, p: Plan, report: Report, outcome: Outcome, state: dict[str, Any]) -> None:
    summary = drain_summary(report) if report.drain_findings() else p.summary
    reason = format_reason(summary, Action.REPLACE)
    t0 = time.monotonic()
    try:
        w.slurm.drain(w.node, reason)
    except SlurmHooksError as exc:
        outcome.failed.append(f"drain: {exc}")
        _audit(w, "replace", "failed", time.monotonic() - t0, p, reason=reason, error=str(exc))
        return
    remediate.write_marker(w, reason, report)
    outcome.drained = outcome.node_out = True
    _attempt(state, "replace", p, time.time(), "ok")
    state["replaced"] = {"t": time.time(), "reason": reason, "gpus": [g for _, g in p.gpus]}
    save(w, state)
    evidence = keep_evidence(w, report, "replace")
    rma = add_to_rma(w, p, report, state, evidence)
    outcome.repairs.append("replace:ok")
    _audit(w, "replace", "ok", time.monotonic() - t0, p, reason=reason, rma=rma, gpu_ids=gpu_ids(report, p),
           evidence=evidence, detail=f"{p.why}; drain stays for a person or the bridge; GPU(s) on the RMA list")


def new_urgent(w: Wiring, report: Report) -> list[Finding]:
    """Urgent findings that our pending reboot was not for (a new fault while the node waits for
    its jobs to end): their jobs are requeued even though the repair holds the node."""
    try:
        active = load(w).get("active")
    except RepairStateUnreadable:
        return []  # said by the step that held the node
    if not active:
        return []
    known = {(c, g) for c, g in active.get("findings", [])}
    return [f for f in report.drain_findings() if f.urgency is Urgency.NOW and (f.check, f.gpu) not in known]


def _down(info: Any) -> bool:
    """DOWN with our reason: how our ``nextstate=DOWN`` reboot brings a node back."""
    return info.base_state == "DOWN" and info.ours


def _replace_ended(w: Wiring, report: Report, state: dict[str, Any], info: Any) -> bool:
    """Whether our ``[replace]`` is over: a person resumed the node, or every GPU it named is
    gone from the node (new hardware: new UUIDs). The same GPU passing a check is not enough
    (flaky hardware passes now and then). The RMA entry stays. True when it ended now."""
    replaced = state["replaced"]
    gpus = [g for g in replaced.get("gpus", []) if _is_uuid(g)]
    snap = report.snapshot
    if not (info.drained or _down(info)):
        detail = "the node was resumed by a person"
    elif gpus and snap is not None and snap.error is None and snap.gpus \
            and not set(gpus) & {g.uuid for g in snap.gpus}:
        detail = f"GPU(s) {', '.join(gpus)} no longer in the node: the hardware was replaced"
    else:
        return False
    state.pop("replaced", None)
    state["attempts"] = [a for a in state["attempts"] if not set(a["gpus"]) & set(replaced.get("gpus", []))]
    save(w, state)
    w.audit.write("action", node=w.node, action="repair-replace", target=w.node, result="ended", duration_s=0.0,
                  reason=replaced.get("reason", ""), detail=f"{detail}; the ladder starts afresh on this node")
    return True


def _has_marker(w: Wiring) -> bool:
    try:
        return remediate.load_marker(w) is not None
    except SlurmHooksError:
        return True  # there, though unreadable: the state dir was not lost


def _is_uuid(ident: str) -> bool:
    return ident.startswith(("GPU-", "MIG-"))


def _recall(w: Wiring, report: Report, state: dict[str, Any], info: Any) -> bool:
    """With no attempt on record (the state dir was lost: a diskless node, a reimage), take the
    ladder's memory from Slurm's reason: ``[replace]`` waits for a person, ``[reboot 1/1]``
    counts as that many reboots of the GPUs now at fault. True when the node waits for a person."""
    if state["attempts"] or _has_marker(w):
        return False  # the state dir is there: what it holds is the ladder's memory
    parsed = parse_reason(info.reason)
    if parsed is None:
        return False
    if parsed[1] is Action.REPLACE and (info.drained or _down(info)):
        state["replaced"] = {"t": time.time(), "reason": info.reason, "gpus": [], "recalled": True}
        save(w, state)
        return True
    counted = reason_attempt(info.reason)
    if counted is None or counted[0] is not Action.REBOOT:
        return False
    p = plan(w, report, state)
    if p is None:
        return False
    for _ in range(counted[1]):
        _attempt(state, "reboot", p, time.time(), "recalled")
    save(w, state)
    w.audit.write("action", node=w.node, action="repair-reboot", target=w.node, result="recalled", duration_s=0.0,
                  reason=info.reason, detail=f"no repair state on this node (state dir lost?): {counted[1]} reboot(s) "
                                             "taken from Slurm's reason")
    return False


# -- a person's resume -------------------------------------------------------


def note_person_resume(w: Wiring, info: Any = None) -> bool:
    """We drained this node (our marker was there) and it is back in service, not by our resume:
    a person resumed it. Closes its incident as "resumed by <user>" (Slurm's ``ReasonUser`` only
    when it is not the drain's own, else "a person"). One Slurm read, once per incident. True
    when it wrote the closing record."""
    from slurm_hooks.observe import incidents
    from slurm_hooks.slurm import out_of_service

    try:
        info = w.slurm.node(w.node) if info is None else info
    except SlurmHooksError:
        return False
    try:
        rebooting = load(w).get("active") is not None
    except RepairStateUnreadable as exc:
        print(f"slurm-hooks: repair: {exc}", file=sys.stderr)
        return False
    if out_of_service(info) or reboot_pending(info) or rebooting:
        return False  # still out, or our reboot under way (Slurm shows it neither drained nor DOWN at times)
    incidents.record_person_resume(w.audit, w.node, reason=info.reason, state=info.state)
    return True


# -- the RMA list -------------------------------------------------------------


def rma_path(w: Wiring) -> str:
    return w.state_path("rma.json")


def read_rma(path: str) -> list[dict[str, Any]]:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        return []
    except (OSError, ValueError):
        return []
    return [e for e in data.get("gpus", []) if isinstance(e, dict)] if isinstance(data, dict) else []


def add_to_rma(w: Wiring, p: Plan, report: Report, state: dict[str, Any], evidence: str = "") -> list[str]:
    """Put the plan's GPUs on the RMA list (UUID, serial, PCI bus id, history, the evidence kept);
    returns their UUIDs."""
    snap = report.snapshot
    path = rma_path(w)
    added = []
    with fsutil.locked(path):
        entries = read_rma(path)
        for index, ident in p.gpus:
            gpu = snap.gpu(index) if snap is not None and index is not None else None
            entry = {"uuid": gpu.uuid if gpu else ident, "serial": gpu.serial if gpu else "",
                     "pci_bus_id": gpu.pci_bus_id if gpu else "", "node": w.node, "gpu": index,
                     "reason": p.why, "added": time.time(), **({"evidence": evidence} if evidence else {}),
                     "history": [a for a in state["attempts"] if ident in a["gpus"]]}
            entries = [e for e in entries if e.get("uuid") != entry["uuid"]] + [entry]
            added.append(entry["uuid"])
        fsutil.atomic_write(path, json.dumps({"version": VERSION, "gpus": entries}, indent=1), mode=0o600)
    return added


def gpu_ids(report: Report | None, p: Plan) -> list[dict[str, Any]]:
    """The plan's GPUs as the audit record and the RMA list name them: index, UUID, serial, PCI bus id."""
    from slurm_hooks.hooks.actions import gpu_fields

    return [{"index": index, "uuid": ident if _is_uuid(ident) else "", "serial": "", "pci_bus_id": "",
             **gpu_fields(report, index)} for index, ident in p.gpus if index is not None]


# -- evidence before a repair that wipes it -------------------------------------


def evidence_dir(w: Wiring) -> str:
    return w.state_path("evidence", w.node)


def keep_evidence(w: Wiring, report: Report | None, rung: str) -> str:
    """Before a reboot or a [replace]: keep the NVML snapshot, the kernel log's tail and
    ``nvidia-smi -q`` (where present) in ``<state dir>/evidence/<node>/<time>-<rung>/``, each file at
    most EVIDENCE_FILE_MAX bytes, the whole at most EVIDENCE_S (and never past what is left of the
    rung's budget), the oldest bundles beyond EVIDENCE_KEEP removed. Returns the directory ("" when
    nothing could be kept); never raises."""
    t0 = time.monotonic()
    budget = min(EVIDENCE_S, w.time_left(EVIDENCE_S) / 4)
    now = time.time()
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + f".{int(now * 1000) % 1000:03d}Z"
    manifest: dict[str, Any] = {"node": w.node, "rung": rung, "at": stamp, "files": {}, "skipped": {}}
    path = os.path.join(evidence_dir(w), f"{stamp}-{rung}")
    try:
        os.makedirs(evidence_dir(w), mode=0o700, exist_ok=True)
        for n in range(2, 100):
            try:
                os.mkdir(path, 0o700)
                break
            except FileExistsError:
                path = os.path.join(evidence_dir(w), f"{stamp}-{rung}-{n}")
    except OSError as exc:
        print(f"slurm-hooks: repair: cannot keep evidence in {path}: {exc.strerror}", file=sys.stderr)
        return ""
    parts: list[tuple[str, Callable[[float], str]]] = [
        ("snapshot.json", lambda _left: _snapshot_text(report)),
        ("kernel-log.txt", lambda left: _kernel_tail(w, left)),
        ("nvidia-smi-q.txt", lambda left: _nvidia_smi_q(left)),
    ]
    for name, gather in parts:
        left = budget - (time.monotonic() - t0)
        if left <= 0.1:
            manifest["skipped"][name] = "out of time"
            continue
        try:
            text = gather(left)
        except (SlurmHooksError, OSError, ValueError) as exc:
            manifest["skipped"][name] = str(exc)[:200]
            continue
        if not text:
            manifest["skipped"][name] = "nothing to keep"
            continue
        data = text.encode("utf-8", "replace")[-EVIDENCE_FILE_MAX:]
        with contextlib.suppress(OSError):
            fsutil.atomic_write(os.path.join(path, name), data, mode=0o600, durable=False)
            manifest["files"][name] = len(data)
    manifest["seconds"] = round(time.monotonic() - t0, 3)
    with contextlib.suppress(OSError):
        fsutil.atomic_write(os.path.join(path, "manifest.json"), json.dumps(manifest, indent=1), mode=0o600,
                            durable=False)
    _prune_evidence(evidence_dir(w))
    return path


def _snapshot_text(report: Report | None) -> str:
    snap = report.snapshot if report is not None else None
    return "" if snap is None else json.dumps(dataclasses.asdict(snap), indent=1, default=str)


def _kernel_tail(w: Wiring, left: float) -> str:
    """The kernel log's tail: the configured file where it is one (a container's copy, a test's), else ``dmesg``."""
    from slurm_hooks.runner import run_command

    path = w.config.watch.kmsg
    if path and os.path.isfile(path):
        with open(path, "rb") as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - EVIDENCE_FILE_MAX))
            return fh.read().decode("utf-8", "replace")
    return run_command(["dmesg", "--time-format", "iso"], timeout=left).stdout


def _nvidia_smi_q(left: float) -> str:
    import shutil

    from slurm_hooks.runner import run_command

    if shutil.which("nvidia-smi") is None:
        return ""
    return run_command(["nvidia-smi", "-q"], timeout=left, check=False).stdout


def _prune_evidence(root: str) -> None:
    import shutil

    try:
        bundles = sorted(os.listdir(root))
    except OSError:
        return
    for old in bundles[:-EVIDENCE_KEEP]:
        shutil.rmtree(os.path.join(root, old), ignore_errors=True)


# -- state ---------------------------------------------------------------------


def state_path(w: Wiring) -> str:
    return w.repair_state()


def load(w: Wiring) -> dict[str, Any]:
    """The ladder's memory as today's JSON object. Raises :class:`RepairStateUnreadable` when the
    file is there but unreadable: starting afresh would forget the attempts."""
    return repair_state.load(state_path(w)).to_json()


def save(w: Wiring, state: dict[str, Any]) -> None:
    oldest = time.time() - max(KEEP_S, float(w.config.repair.window))
    state["attempts"] = [a for a in state["attempts"] if a.get("t", 0) >= oldest]
    try:
        os.makedirs(w.config.state.dir, mode=0o700, exist_ok=True)
        fsutil.atomic_write(state_path(w), json.dumps(state), mode=0o600)
    except OSError as exc:
        print(f"slurm-hooks: cannot write {state_path(w)}: {exc.strerror}", file=sys.stderr)


def _attempt(state: dict[str, Any], rung: str, p: Plan, started: float, result: str) -> dict[str, Any]:
    record = {"rung": rung, "t": started, "result": result, "gpus": [g for _, g in p.gpus], "summary": p.summary}
    state["attempts"].append(record)
    return record


def _locked(w: Wiring) -> contextlib.AbstractContextManager[bool]:
    """One repair per node at a time: an flock, which the kernel drops when its holder dies."""
    return fsutil.try_locked(w.state_path(f"repair-{w.node}.lock"), dir_mode=0o700)


# -- helpers -------------------------------------------------------------------


def _gpus(report: Report, findings: Sequence[Finding]) -> list[tuple[int | None, str]]:
    snap = report.snapshot
    out: dict[str, int | None] = {}
    for f in findings:
        gpu = snap.gpu(f.gpu) if snap is not None and f.gpu is not None else None
        ident = gpu_identity(gpu.uuid, gpu.index, gpu.pci_bus_id) if gpu else (f"gpu{f.gpu}" if f.gpu is not None
                                                                              else "node")
        out.setdefault(ident, f.gpu)
    return [(i, g) for g, i in out.items()]


def _resetter(w: Wiring, state: dict[str, Any]) -> NvidiaSmiReset:
    """The node's reset backend, bounded by this run's budget, journaling the services it stops."""
    from slurm_hooks.probes.gpureset import from_config

    return from_config(w.config, w.node, time_left=lambda: w.time_left(float(w.config.repair.reset_timeout)),
                       journal=lambda services: _journal(w, state, services))


def _audit(w: Wiring, rung: str, result: str, duration: float, p: Plan, **fields: Any) -> None:
    w.audit.write("action", node=w.node, action=f"repair-{rung}", target=w.node, result=result,
                  duration_s=round(duration, 4), why=p.why, **{k: v for k, v in fields.items() if v not in (None, "")})


_span = ladder.span

