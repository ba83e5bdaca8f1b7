"""Remediation shared by every hook: drain with an owned reason, requeue, resume.

Every step writes one audit record with its result and duration. Nothing here
raises for a Slurm failure: an unreachable slurmctld is recorded and reported
so the caller can pick an exit code, and the next run tries again.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from slurm_hooks import fsutil
from slurm_hooks.engine import drain_summary, snapshot_xids
from slurm_hooks.errors import SlurmHooksError
from slurm_hooks.hooks import checkpoint, gpumap
from slurm_hooks.hooks.actions import annotate_jobs, step
from slurm_hooks.hooks.follower import Follow, Followed, Phase, follow_jobs, in_grace, record_requeue_seconds
from slurm_hooks.hooks.wiring import Wiring
from slurm_hooks.models import Context, Report, Scope, Severity, Urgency
from slurm_hooks.slurm import JobInfo, format_reason, may_drain, may_resume
from slurm_hooks.slurm.errors import AlreadyRequeued

_step = step
__all__ = ["Outcome", "annotate_jobs", "drain", "requeue_jobs", "resume_if_ours", "touched_jobs"]


@dataclass
class Outcome:
    drained: bool = False
    #: Not drained because the drain guard suspects the config, not the node.
    guarded: bool = False
    #: The node takes no new jobs (drained by us now or before, or by someone else).
    node_out: bool = False
    failed: list[str] = field(default_factory=list)
    #: Refs of the jobs requeued (``123``, ``100_7`` for an array task; see JobInfo.ref).
    requeued: list[str] = field(default_factory=list)
    #: Refs of the jobs sent their checkpoint signal and left their grace to requeue themselves.
    signalled: list[str] = field(default_factory=list)
    resumed: bool = False
    #: What became of a pending action in this run: "retry", "done", "superseded", "dropped" or "".
    pending: str = ""
    #: Repair rungs taken in this run, as "<rung>:<result>" (hooks.repair).
    repairs: list[str] = field(default_factory=list)
    #: ``[check] drain = false``: a fault was found and audited, and not acted on.
    monitor_only: bool = False

    @property
    def ok(self) -> bool:
        return not self.failed


def record_alerts(w: Wiring, report: Report, **extra: Any) -> None:
    if not w.config.check.drain:
        extra["monitor_only"] = True  # [check] drain = false: found, told, not acted on
    for f in report.findings:
        if f.severity is Severity.OK:
            continue
        w.audit.write("alert", node=w.node, context=report.context.value, gpu=f.gpu, check=f.check,
                      severity=f.severity.value, action=f.action.value, message=f.message, **extra)


def not_acted(w: Wiring, report: Report, outcome: Outcome, **extra: Any) -> None:
    """Monitor-only (``[check] drain = false``): audit the drain we would have made, and make none."""
    outcome.monitor_only = True
    _step(w, "drain", w.node, "monitor-only", time.monotonic(), reason=drain_reason(report),
          detail="not acted on: [check] drain = false", **extra)


def drain(w: Wiring, report: Report, outcome: Outcome, **extra: Any) -> None:
    """Drain this node with ``slurm-hooks: <what broke> [<action>]`` unless someone else owns it."""
    started = time.monotonic()
    reason = drain_reason(report)
    try:
        info = w.slurm.node(w.node)
        if info.drained and info.reason == reason:
            outcome.drained = outcome.node_out = True
            write_marker(w, reason, report)  # an earlier drain may have landed after its scontrol timed out
            _step(w, "drain", w.node, "already", started, reason=reason, **extra)
            return
        if _config_suspected(w, report, reason, started, extra):
            outcome.guarded = True
            return
        if not may_drain(info):
            outcome.node_out = True
            _step(w, "drain", w.node, "skipped", started, reason=reason,
                  detail=f"already drained by someone else: {info.reason!r}", **extra)
            return
        w.slurm.drain(w.node, reason, current=info)
    except SlurmHooksError as exc:
        outcome.failed.append(f"drain: {exc}")
        _step(w, "drain", w.node, "failed", started, reason=reason, error=str(exc), **extra)
        return
    outcome.drained = outcome.node_out = True
    write_marker(w, reason, report)
    _step(w, "drain", w.node, "ok", started, reason=reason, **extra)


def drain_reason(report: Report) -> str:
    """``slurm-hooks: <what broke> [<action>]``, with ``, at job end`` when no finding is urgent."""
    return format_reason(drain_summary(report), report.worst_action, at_job_end=not report.urgent())


def _config_suspected(w: Wiring, report: Report, reason: str, started: float, extra: dict) -> bool:
    """Every drain-worthy finding is judged against a configured value, and that many nodes
    are already drained for exactly it: a wrong value in [expect]/[groups] fails every node
    alike, and must not take the whole fleet out one health check at a time."""
    limit = int(w.config.check.drain_guard)
    if limit <= 0 or not all(f.config_based for f in report.drain_findings()):
        return False
    already = w.slurm.drained_count(reason)
    if already < limit:
        return False
    _step(w, "drain", w.node, "guarded", started, reason=reason, level="critical", **extra,
          detail=f"{already} nodes are already drained for {reason!r}: that looks like a wrong value in the "
                 f"config ([expect]/[groups] for this node's group), not {already + 1} broken nodes; not draining. "
                 "Fix the config, or raise [check] drain_guard if the fault is real")
    return True


def requeue_jobs(w: Wiring, outcome: Outcome, follow: Follow | str = Follow.DETACHED,
                 gpus: frozenset[int] | None = None, instances: frozenset[tuple[int, int]] = frozenset(),
                 fault_at: float | None = None) -> None:
    """Requeue exactly the jobs on this node, each once, then make them eligible at once elsewhere.

    ``gpus``: only the jobs a fault on these GPUs (NVML indexes) touches, and ``instances`` (NVML
    index, MIG GPU instance id): only the jobs on those MIG instances; which jobs that is,
    :func:`touched_jobs` says. ``None``: all.

    Each job is addressed by :attr:`JobInfo.ref`: one task of an array as
    ``<array id>_<task id>`` (the array's id alone would requeue every task), a
    heterogeneous job through its leader, once however many of its components
    run here. A job that is completing (it exited, or another run's requeue is
    under way) is left alone: Slurm would run a completed job again. A job
    submitted with ``--no-requeue`` is left running on the drained node (a
    warning, not a failure).

    A job with a checkpoint signal (its ``--signal``, or the site's ``[requeue]`` policy)
    gets it first (:mod:`.checkpoint`) and is left its grace to requeue itself: the
    follower requeues it only if it has not when the grace is over. Any other job is
    requeued now: ``scontrol requeue`` sends SIGTERM and gives it KillWait seconds to
    checkpoint. Requeued jobs wait out a ~121 s delay unless told ``StartTime=now`` once
    PENDING: the follower does that, ``follow`` says where (:class:`.follower.Follow`).
    ``fault_at``: when the fault was seen (wall clock; the requeue metric's start).
    """
    started = time.monotonic()
    fault_at = time.time() if fault_at is None else fault_at
    try:
        jobs = w.slurm.jobs_on_node(w.node)
    except SlurmHooksError as exc:
        outcome.failed.append(f"list jobs: {exc}")
        _step(w, "requeue", w.node, "failed", started, error=f"cannot list jobs: {exc}")
        return
    graced: list[Followed] = []
    gmap = gpumap.cached(w) if gpus is not None else None
    faulty = _fmt(gpus or ()) + "".join(f", GPU {g} instance {i}" for g, i in sorted(instances))
    for job, held, touched in touched_jobs(w, jobs, gpus, instances, gmap):
        ref = job.ref
        t0 = time.monotonic()
        scope = _scope_note(gmap, held)
        if not touched:
            where = "no GPU on this node" if held == () else f"GPU {_fmt(gpumap.nvml_of(gmap, held or ()))}"
            _step(w, "requeue", ref, "spared", t0, jobs=[ref], gpus=list(held or ()),
                  detail=f"runs on {where}, not on the faulty GPU {faulty}: left to run")
            continue
        why_not = _not_requeued(job)
        if why_not:
            result, level, detail = why_not
            _step(w, "requeue", ref, result, t0, jobs=[ref], detail=detail, **({"level": level} if level else {}),
                  **scope)
            continue
        earlier = in_grace(w, ref)
        if earlier is not None:
            _step(w, "requeue", ref, "already", t0, jobs=[ref], signal=earlier.signal,
                  detail=f"in its checkpoint grace (got {earlier.signal} "
                         f"{time.time() - earlier.signalled_at:.1f}s ago): its follower requeues it if it does not")
            continue
        rec = _signal_first(w, job, fault_at)
        if rec is not None:
            graced.append(rec)
            outcome.signalled.append(ref)
            continue
        try:
            w.slurm.requeue(ref)
        except AlreadyRequeued as exc:
            # Another run (the watcher, the check on the job's other node) requeued it a moment ago.
            _step(w, "requeue", ref, "already", t0, jobs=[ref], detail=str(exc))
            continue
        except SlurmHooksError as exc:
            outcome.failed.append(f"requeue {ref}: {exc}")
            _step(w, "requeue", ref, "failed", t0, jobs=[ref], error=str(exc))
            continue
        outcome.requeued.append(ref)
        seconds = round(time.time() - fault_at, 3)
        _step(w, "requeue", ref, "ok", t0, jobs=[ref], requeued_by="ours", seconds_from_fault=seconds, **scope)
        record_requeue_seconds(w, "ours", seconds)
    if outcome.requeued or graced:
        follow_jobs(w, [*outcome.requeued, *outcome.signalled], follow, records=graced)


def _signal_first(w: Wiring, job: JobInfo, fault_at: float) -> Followed | None:
    """Send the job its checkpoint signal and open its grace; ``None`` for a job to requeue now
    (no signal, no grace left, or the signal could not be sent)."""
    t0 = time.monotonic()
    sig = checkpoint.read_signal(w, job)
    if sig is None:
        return None
    grace = checkpoint.grace_seconds(w, sig)
    if grace <= 0:
        return None
    try:
        how = checkpoint.deliver(w, job, sig)
    except SlurmHooksError as exc:
        _step(w, "signal", job.ref, "failed", t0, jobs=[job.ref], signal=sig.spec, source=sig.source.value,
              level="warning", error=str(exc), detail="could not send the job its checkpoint signal: requeued now")
        return None
    now = time.time()
    _step(w, "signal", job.ref, "ok", t0, jobs=[job.ref], signal=sig.spec, source=sig.source.value, via=how,
          grace_s=round(grace, 3), detail=f"sent {sig.name} ({how}); up to {grace:g}s to checkpoint and requeue itself")
    return Followed(job.ref, w.node, Phase.GRACE, fault_at=fault_at, signal=sig.spec, source=sig.source.value,
                    signalled_at=now, grace_until=now + grace, restarts=job.restarts)


def _scope_note(gmap: gpumap.GpuMap | None, held: tuple[int, ...] | None) -> dict[str, str]:
    """What the audit record says when a GPU-scoped fault fell back to node scope for this job."""
    if gmap is None or not held and held is not None:
        return {}
    if not gmap.known:
        return {"scope": "node", "fallback": f"GPU map unknown ({gmap.problem}): every GPU job on the node is touched"}
    if held is None:
        return {"scope": "node", "fallback": "Slurm does not say which GPU the job holds here: counted as touched"}
    return {}


def touched_jobs(w: Wiring, jobs: Iterable[JobInfo], gpus: frozenset[int] | None,
                 instances: frozenset[tuple[int, int]] = frozenset(), gmap: gpumap.GpuMap | None = None
                 ) -> list[tuple[JobInfo, tuple[int, ...] | None, bool]]:
    """Which jobs a fault touches: each job once (a het job's components are one job), with the
    GRES indexes Slurm says it holds on this node (``()``: none, a CPU-only job; ``None``: not
    asked, or Slurm did not say) and whether the fault touches it.

    ``gpus`` ``None``: a node-wide fault, every job. Otherwise the fault's GPUs (NVML indexes)
    and MIG instances, mapped to Slurm's numbering by :mod:`slurm_hooks.hooks.gpumap`
    (``gmap``: the map to use; default the one this boot's runs cached). A job with no GPU here
    is never touched; one whose GPUs Slurm does not say, and every GPU job when the map is
    unknown, is (requeue too much, never the wrong job)."""
    if gpus is not None and gmap is None:
        gmap = gpumap.cached(w)
    out: list[tuple[JobInfo, tuple[int, ...] | None, bool]] = []
    done: set[str] = set()
    for job in jobs:
        if job.ref in done:
            continue
        done.add(job.ref)
        held: tuple[int, ...] | None = None
        if gpus is not None:
            try:
                held = w.slurm.job_gpus(job.ref, w.node)
            except SlurmHooksError:
                held = None  # cannot tell: count it as touched rather than leave it on a bad GPU
        touched = gpus is None or gpumap.touches(gmap or gpumap.unknown("not asked"), held, gpus, instances)
        out.append((job, held, touched))
    return out


def explain(w: Wiring, report: Report) -> list[dict[str, Any]]:
    """Per finding: its scope, urgency, action and the jobs acting on it would requeue, without
    acting (one squeue, and one ``scontrol -d show job`` per job for a GPU-scope fault)."""
    jobs: list[JobInfo] | None = None
    error = ""
    out = []
    gmap = None
    for f in report.findings:
        entry = {**f.to_dict(), "acts": f.acts, "requeues": []}
        if f.acts and f.urgency is Urgency.NOW and report.context in (Context.CHECK, Context.WATCH):
            if jobs is None:
                try:
                    jobs = w.slurm.jobs_on_node(w.node)
                except SlurmHooksError as exc:
                    jobs, error = [], str(exc)
            node_wide = f.scope is Scope.NODE or f.gpu is None
            gpus = None if node_wide else frozenset() if f.instance is not None else frozenset({f.gpu})
            instances = frozenset({(f.gpu, f.instance)}) if not node_wide and f.instance is not None else frozenset()
            if gpus is not None and gmap is None:
                gmap = gpumap.cached(w)
                entry["gpu_map"] = gmap.problem or "known"
            entry["requeues"] = [job.ref for job, _, touched in touched_jobs(w, jobs, gpus, instances, gmap)
                                 if touched and _not_requeued(job) is None]
            if error:
                entry["error"] = f"cannot list jobs: {error}"
        out.append(entry)
    return out


def _fmt(gpus: Iterable[int]) -> str:
    return ",".join(str(g) for g in sorted(gpus)) or "-"


def _not_requeued(job: JobInfo) -> tuple[str, str, str] | None:
    """(result, level, detail) for a job that is not to be requeued; ``None`` for one that is."""
    if job.completing or job.finished or not job.active:
        return ("skipped", "", f"job is {job.base_state} (it ended, or a requeue is already under way): "
                               "requeuing it now would run it again")
    if not job.batch:
        return ("skipped", "", "interactive job (srun/salloc) cannot be requeued; it will fail with the node")
    if not job.requeue:
        return ("not requeued", "warning",
                "not requeued: --no-requeue (or JobRequeue=0): left running on the drained node, not killed; "
                "it ends on its own (or fails with the GPU)")
    return None


#: How often a node with no drain marker asks Slurm whether it carries our drain anyway
#: (the state dir was lost: a slurmd pod restarted, a node reimaged).
#: Once an hour: 10,000 nodes cost slurmctld under 3 light RPCs a second.
RECOVER_LOOK_S = 3600.0


def resume_if_ours(w: Wiring, outcome: Outcome, report: Report) -> None:
    """A healthy node that we drained goes back into service; anyone else's drain stays.

    Only what this check could judge again is taken as mended, and only the exact
    drain it judged: the node's reason must be the one our record names. A newer
    drain (a DCGM failure after a thermal drain, a drain whose record could not be
    written) is not covered by this verdict, nor is a drain whose record is
    unreadable (then Slurm is asked, as when the record is lost). A drain for a
    check the periodic run does not do (the epilog's DCGM diagnostic) waits for a
    person. A drain written after this check took its snapshot (the watcher, an
    epilog) is newer than our verdict and is left alone.
    """
    record = read_marker(w)
    if not record:  # none, or unreadable: what we drained for is unknown
        record = _recover_marker(w)
        if record is None:
            return
    snap = report.snapshot
    if snap is not None and float(record.get("ts", 0)) >= snap.taken_at:
        return
    started = time.monotonic()
    try:
        info = w.slurm.node(w.node)
        if not info.drained:
            forget_drain(w)
            return
        if not may_resume(info):
            forget_drain(w)
            _step(w, "resume", w.node, "skipped", started, detail=f"drained by someone else: {info.reason!r}")
            return
        why_not = _not_rejudged(w, record, report, info)
        if why_not:
            _step(w, "resume", w.node, "skipped", started, reason=info.reason, detail=why_not)
            return
        w.slurm.resume(w.node)
    except SlurmHooksError as exc:
        outcome.failed.append(f"resume: {exc}")
        _step(w, "resume", w.node, "failed", started, error=str(exc))
        return
    forget_drain(w)
    outcome.resumed = True
    _step(w, "resume", w.node, "ok", started, reason=info.reason)


def _not_rejudged(w: Wiring, record: dict, report: Report, info) -> str:
    """Why this healthy verdict does not cover what the node was drained for ("" when it does)."""
    judged = str(record.get("reason", ""))
    if judged != info.reason:
        return (f"drained for {info.reason!r}, but our record is of a drain for {judged!r}: this check did "
                "not judge the newer drain; resume by hand (scontrol update State=RESUME) once mended")
    leftovers = {"leftover", "busy"} & set(record.get("checks", ()))
    missing = sorted(set(record.get("checks", ())) - set(report.checks_run) - leftovers)
    if missing:
        return (f"drained for {', '.join(missing)}, which the periodic check does not run: "
                "resume by hand (scontrol update State=RESUME) once mended")
    if report.snapshot is not None and info.base_state in ("IDLE", "DRAINED", "DOWN"):
        # An idle node's GPUs should be empty: what is on them now is left over.
        left = report.if_idle
        if left:
            return "still " + "; ".join(f.message for f in left[:3]) + " on an idle node"
    return ""


def _recover_marker(w: Wiring) -> dict | None:
    """No marker: now and then, ask Slurm whether this node carries our drain anyway."""
    stamp = w.state_path(f"slurm-look-{w.node}")
    try:
        if time.time() - os.stat(stamp).st_mtime < RECOVER_LOOK_S:
            return None
    except FileNotFoundError:
        pass
    _touch(stamp)
    try:
        info = w.slurm.node(w.node)
    except SlurmHooksError:
        return None
    if not (info.drained and info.ours):
        return None
    # What it was drained for is lost with the marker; the reason still says whether it was DCGM.
    return {"ts": 0.0, "reason": info.reason, "xids": [], "checks": ["dcgm"] if "DCGM" in info.reason else [],
            "recovered": True}


def forget_drain(w: Wiring) -> None:
    _remove(w.drained_marker())


def write_marker(w: Wiring, reason: str, report: Report | None) -> None:
    """Remember that we drained this node: when, why, and for which XID events and checks
    (``report`` None: a new reason for the same drain, as the repair's reboot gives it)."""
    if report is None:
        record = {**(read_marker(w) or {}), "ts": time.time(), "reason": reason}
    else:
        snap = report.snapshot
        keys = sorted({x.key for x in snapshot_xids(snap)}) if snap else []
        record = {"ts": time.time(), "reason": reason, "xids": keys, "context": report.context.value,
                  "checks": sorted({f.check for f in report.drain_findings()})}
    try:
        fsutil.atomic_write(w.drained_marker(), json.dumps(record), mode=0o600)
    except OSError as exc:
        print(f"slurm-hooks: cannot write {w.drained_marker()}: {exc.strerror}", file=sys.stderr)


def read_marker(w: Wiring) -> dict | None:
    """Our record of draining this node; ``None`` when we have not drained it."""
    try:
        with open(w.drained_marker(), encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def drained_for(w: Wiring) -> list[str] | None:
    """XID event keys our drain of this node was for; ``None`` when we have not drained it."""
    record = read_marker(w)
    return None if record is None else [str(k) for k in record.get("xids", [])]


def _touch(path: str) -> None:
    try:
        os.makedirs(os.path.dirname(path), mode=0o750, exist_ok=True)
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
        os.utime(path)
    except OSError:
        pass


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
