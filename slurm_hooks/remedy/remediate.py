"""Remediation shared by every hook: drain with an owned reason, requeue, resume.

Every step writes one audit record with its result and duration. Nothing here
raises for a Slurm failure: an unreachable slurmctld is recorded and reported
so the caller can pick an exit code, and the next run tries again.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable

from slurm_hooks.engine import snapshot_xids
from slurm_hooks.errors import SlurmHooksError
from slurm_hooks.models import Context, Finding, Report, Scope, Severity, Urgency
from slurm_hooks.remedy import gpumap
from slurm_hooks.remedy.audit import annotate_jobs, gpu_fields, step
from slurm_hooks.remedy.follower import Follow, Followed, Phase, follow_jobs, in_grace, record_requeue_seconds
from slurm_hooks.remedy.ownership import DrainMarker, MarkerUnreadable, ReleasedReasons, foreign
from slurm_hooks.remedy.wiring import Wiring
from slurm_hooks.slurm import (
    JobInfo,
    NodeInfo,
    format_reason,
    hostlist,
    may_drain,
    out_of_service,
    parse_reason,
    reboot_pending,
    split_reason,
    status_tag,
    waits_for_job_end,
)
from slurm_hooks.slurm.errors import AlreadyRequeued
from slurm_hooks.values import dataclass, field, replace

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing (~3 ms of each start)
if TYPE_CHECKING:
    from typing import Any

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
    #: Repair rungs taken in this run, as "<rung>:<result>" (remedy.repair).
    repairs: list[str] = field(default_factory=list)
    #: ``[check] drain = false``: a fault was found and audited, and not acted on.
    monitor_only: bool = False
    #: The GPUs each touched job holds here as Slurm numbers them (its owner's SLURM_JOB_GPUS), by ref.
    job_gpus: dict[str, tuple[int, ...]] = field(default_factory=dict)
    #: Slurm showed the node drained by us and IDLE (no job, none completing): it can get none, so
    #: there is nothing to requeue and no job list to read (a storm's later rounds ask Slurm less).
    node_empty: bool = False

    @property
    def ok(self) -> bool:
        return not self.failed


def record_alerts(w: Wiring, report: Report, **extra: Any) -> None:
    if w.policy.monitor_only:
        extra["monitor_only"] = True  # [check] drain = false: found, told, not acted on
    for f in report.findings:
        if f.severity is Severity.OK:
            continue
        w.audit.write("alert", node=w.node, context=report.context.value, gpu=f.gpu, check=f.check,
                      severity=f.severity.value, action=f.action.value, message=f.message,
                      **gpu_fields(report, f.gpu), **extra)


def record_metrics(w: Wiring, report: Report, outcome: Outcome) -> None:
    """This run's verdict and what it did, in the node's metrics textfile ([metrics] textfile_dir)."""
    if not w.config.metrics.textfile_dir:
        return
    from slurm_hooks.observe import metrics
    from slurm_hooks.remedy import pending

    done = ["drain"] * int(outcome.drained) + ["requeue"] * len(outcome.requeued) + ["resume"] * int(outcome.resumed)
    done += [f"repair-{r.split(':')[0]}" for r in outcome.repairs if not r.endswith(":start")]
    done += ["drain-monitor-only"] * int(outcome.monitor_only)  # found, and not acted on: [check] drain = false
    waiting = pending.load(w.config.state.dir, w.node)
    metrics.record(w.config, w.node, report, remediations=done, pending=len(waiting.steps) if waiting else 0)


def not_acted(w: Wiring, report: Report, outcome: Outcome, **extra: Any) -> None:
    """Monitor-only (``[check] drain = false``): audit the drain we would have made, and make none."""
    outcome.monitor_only = True
    extra.setdefault("context", report.context.value)
    _step(w, "drain", w.node, "monitor-only", time.monotonic(), reason=drain_reason(report),
          detail="not acted on: [check] drain = false", **extra)


def drain(w: Wiring, report: Report, outcome: Outcome, **extra: Any) -> None:
    """Drain this node with ``slurm-hooks: <what broke> [<action>]`` unless someone else owns it."""
    started = time.monotonic()
    reason = drain_reason(report)
    try:
        info = w.slurm.node(w.node)
        if info.drained and info.ours and split_reason(info.reason)[0] == reason and _still_ours(w, info):
            outcome.drained = outcome.node_out = True
            outcome.node_empty = _empty(info)
            write_marker(w, reason, report, info)  # an earlier drain may have landed after its scontrol timed out
            _step(w, "drain", w.node, "already", started, reason=reason, **extra)
            return
        if (report.context is not Context.CHECK and info.drained and info.ours
                and covers(split_reason(info.reason)[0], reason) and _still_ours(w, info)):
            # a hook that judges fewer GPUs (prolog, epilog: the job's; the watcher: one event) keeps our
            # wider reason; the check judges every GPU: what it no longer finds leaves the reason
            outcome.drained = outcome.node_out = True
            outcome.node_empty = _empty(info)
            _step(w, "drain", w.node, "already", started, reason=split_reason(info.reason)[0], found=reason, **extra)
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
    write_marker(w, reason, report, _after_drain(w, reason))
    _step(w, "drain", w.node, "ok", started, reason=reason, **extra)


def _empty(info: NodeInfo) -> bool:
    """A drained node Slurm shows IDLE (not ALLOCATED, MIXED or COMPLETING) runs no job and gets none."""
    return info.drained and info.idle and not info.completing


def _after_drain(w: Wiring, reason: str) -> NodeInfo | None:
    """The node as Slurm shows it right after our drain: its ReasonTime/ReasonUser are what tell
    our drain from a later party's with the same text. ``None`` when it cannot be read now."""
    try:
        info = w.slurm.node(w.node)
    except SlurmHooksError:
        return None
    return info if split_reason(info.reason)[0] == reason else None


def _still_ours(w: Wiring, info: NodeInfo) -> bool:
    """Our text on a drained node: is it our drain (not one that outlived our resume)?"""
    try:
        marker = load_marker(w)
    except MarkerUnreadable:
        marker = None
    if marker is not None:
        return marker.owns(info, our_reboot=True)
    return not _released(w).covers(info)


def drain_reason(report: Report) -> str:
    """``slurm-hooks: <what broke> [<action>]``, with ``, at job end`` when no finding is urgent."""
    return format_reason(findings_summary(report.drain_findings()), report.worst_action,
                         at_job_end=not report.urgent())


def findings_summary(findings: Iterable[Finding]) -> str:
    """``XID 79 on GPU 3; row remap pending on GPU 6``: one text for one set of findings, whichever
    hook found them in whichever order: worst action first, then node-wide before each GPU in
    order, then the text; each text once."""
    def order(f: Finding) -> tuple[int, int, str]:
        return -f.action.rank, -1 if f.gpu is None else f.gpu, f.summary or f.message

    parts: list[str] = []
    for f in sorted(findings, key=order):
        text = f.summary or f.message
        if text not in parts:
            parts.append(text)
    return "; ".join(parts)


def findings_on(report: Report, nvml: Iterable[int] | None) -> tuple[Finding, ...]:
    """The drain-worthy findings that touch a job on the GPUs ``nvml`` (NVML indexes): node-wide
    ones and those on its GPUs; all of them when ``nvml`` is ``None`` (its GPUs are not known)."""
    if nvml is None:
        return report.drain_findings()
    mine = set(nvml)
    return tuple(f for f in report.drain_findings() if f.scope is Scope.NODE or f.gpu is None or f.gpu in mine)


def job_summary(w: Wiring, report: Report, held: Iterable[int] | None) -> str:
    """What touched a job holding GRES ``held`` here (Slurm's numbering), for its AdminComment: only
    the findings on its GPUs (and node-wide ones); all of them when the map or its GPUs are unknown."""
    held = tuple(held or ())
    gmap = gpumap.cached(w) if held else None
    nvml = gpumap.nvml_of(gmap, held) if gmap is not None and gmap.known else None
    return findings_summary(findings_on(report, nvml) or report.drain_findings())


def covers(current: str, reason: str) -> bool:
    """Whether our drain reason ``current`` already says everything ``reason`` says: each of its
    findings, an action at least as strong, and no later remedy. A hook that judges fewer GPUs
    (the prolog and epilog judge the job's) then keeps the wider reason the check wrote instead of
    narrowing it, and the next check widening it again: the reason does not flap."""
    now, new = parse_reason(current), parse_reason(reason)
    if now is None or new is None or now[1] is None or new[1] is None:
        return False
    if now[1].rank < new[1].rank or (waits_for_job_end(current) and not waits_for_job_end(reason)):
        return False
    have = set(now[0].split("; "))
    return all(part in have for part in new[0].split("; "))


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
                 fault_at: float | None = None, multi_node: bool = False) -> None:
    """Requeue exactly the jobs on this node, each once, then make them eligible at once elsewhere.
    ``multi_node``: a fabric fault (a network link) touches every job that spans nodes as well.

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
        jobs = [] if outcome.node_empty else w.slurm.jobs_on_node(w.node)
    except SlurmHooksError as exc:
        outcome.failed.append(f"list jobs: {exc}")
        _step(w, "requeue", w.node, "failed", started, error=f"cannot list jobs: {exc}")
        return
    graced: list[Followed] = []
    requeued: list[Followed] = []
    gmap = gpumap.cached(w) if gpus is not None else None
    faulty = _fmt(gpus or ()) + "".join(f", GPU {g} instance {i}" for g, i in sorted(instances))
    for job, held, touched in touched_jobs(w, jobs, gpus, instances, gmap, multi_node):
        ref = job.ref
        t0 = time.monotonic()
        scope = _scope_note(gmap, held)
        if not touched:
            ended = _ended(job)
            if ended is not None:  # a requeue under way shows no GPUs: not "left to run"
                _step(w, "requeue", ref, ended[0], t0, jobs=[ref], detail=ended[2])
                continue
            where = "no GPU on this node" if held == () else f"GPU {_fmt(gpumap.nvml_of(gmap, held or ()))}"
            _step(w, "requeue", ref, "spared", t0, jobs=[ref], gpus=list(held or ()),
                  detail="runs on this node alone: the network fault does not touch it" if multi_node and not gpus
                  else f"runs on {where}, not on the faulty GPU {faulty}: left to run")
            continue
        if held:
            outcome.job_gpus[ref] = held
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
        requeued.append(Followed(ref, w.node, Phase.REQUEUED, fault_at=fault_at, ts=time.time(),
                                 nodes=node_count(job)))
        seconds = round(time.time() - fault_at, 3)
        _step(w, "requeue", ref, "ok", t0, jobs=[ref], requeued_by="ours", seconds_from_fault=seconds,
              **({"gpus": list(held)} if held else {}), **scope)
        record_requeue_seconds(w, "ours", seconds)
    if outcome.requeued or graced:
        follow_jobs(w, [*outcome.requeued, *outcome.signalled], follow, records=[*requeued, *graced])


def _signal_first(w: Wiring, job: JobInfo, fault_at: float) -> Followed | None:
    """Send the job its checkpoint signal and open its grace; ``None`` for a job to requeue now
    (no signal, no grace left, or the signal could not be sent)."""
    from slurm_hooks.remedy import checkpoint  # a job being requeued only (with jobsignal, shlex)

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
                    signalled_at=now, grace_until=now + grace, restarts=job.restarts, nodes=node_count(job))


def node_count(job: JobInfo) -> int:
    """How many nodes the job runs on (1 when its node list does not parse)."""
    try:
        return max(1, len(hostlist.expand(job.nodes))) if job.nodes else 1
    except ValueError:
        return 1


def in_slurms_numbering(w: Wiring, gres: Iterable[int]) -> str:
    """`` (the job's GPU 0,1 as Slurm numbers them)``: what its owner knows a GPU by (SLURM_JOB_GPUS,
    CUDA_VISIBLE_DEVICES), next to a finding that names NVML's index; "" when the job holds none
    here, or when Slurm and NVML number its GPUs alike."""
    held = sorted(set(gres))
    if not held:
        return ""
    gmap = gpumap.cached(w)
    if gmap.known and gpumap.nvml_of(gmap, held) == held:
        return ""
    return f" (the job's GPU {','.join(str(g) for g in held)} as Slurm numbers them)"


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
                 instances: frozenset[tuple[int, int]] = frozenset(), gmap: gpumap.GpuMap | None = None,
                 multi_node: bool = False) -> list[tuple[JobInfo, tuple[int, ...] | None, bool]]:
    """Which jobs a fault touches: each job once (a het job's components are one job), with the
    GRES indexes Slurm says it holds on this node (``()``: none, a CPU-only job; ``None``: not
    asked, or Slurm did not say) and whether the fault touches it.

    ``gpus`` ``None``: a node-wide fault, every job. Otherwise the fault's GPUs (NVML indexes)
    and MIG instances, mapped to Slurm's numbering by :mod:`slurm_hooks.remedy.gpumap`
    (``gmap``: the map to use; default the one this boot's runs cached). A job with no GPU here
    is never touched; one whose GPUs Slurm does not say, and every GPU job when the map is
    unknown, is (requeue too much, never the wrong job)."""
    if gpus is not None and gmap is None:
        gmap = gpumap.cached(w)
    fabric_only = multi_node and gpus is not None and not gpus and not instances  # no GPU fault to map
    out: list[tuple[JobInfo, tuple[int, ...] | None, bool]] = []
    done: set[str] = set()
    for job in jobs:
        if job.ref in done:
            continue
        done.add(job.ref)
        held: tuple[int, ...] | None = None
        if gpus is not None and not fabric_only:
            try:
                held = w.slurm.job_gpus(job.ref, w.node)
            except SlurmHooksError:
                held = None  # cannot tell: count it as touched rather than leave it on a bad GPU
        touched = gpus is None or (not fabric_only and gpumap.touches(gmap or gpumap.unknown("not asked"), held,
                                                                      gpus, instances))
        out.append((job, held, touched or (multi_node and len(hostlist.expand(job.nodes or "")) > 1)))
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


def _ended(job: JobInfo) -> tuple[str, str, str] | None:
    """(result, level, detail) for a job that ended or is being requeued; ``None`` for a live one."""
    if job.completing or job.finished or not job.active:
        return ("skipped", "", f"job is {job.base_state} (it ended, or a requeue is already under way): "
                               "requeuing it now would run it again")
    return None


def _not_requeued(job: JobInfo) -> tuple[str, str, str] | None:
    """(result, level, detail) for a job that is not to be requeued; ``None`` for one that is."""
    ended = _ended(job)
    if ended is not None:
        return ended
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
    drain it judged: the node's drain must be the one our marker records
    (:meth:`DrainMarker.owns`: our text with at most Slurm's owner-keeping suffixes,
    ReasonTime/ReasonUser unchanged, no reboot pending that we did not ask for). A newer
    drain (a DCGM failure after a thermal drain, a drain whose record could not be
    written) is not covered by this verdict, nor is a drain whose record is unreadable
    (then Slurm is asked, as when the record is lost). A drain for a check the periodic
    run does not do (the epilog's DCGM diagnostic) waits for a person. A drain written
    after this check took its snapshot (the watcher, an epilog) is newer than our verdict
    and is left alone.
    """
    try:
        marker = load_marker(w)
    except MarkerUnreadable:
        marker = None  # what we drained for is unknown: as when the record is lost
    if marker is None:
        marker = _recover_marker(w)
        if marker is None:
            return
    snap = report.snapshot
    if snap is not None and marker.ts >= snap.taken_at:
        return
    started = time.monotonic()
    try:
        info = w.slurm.node(w.node)
        if not out_of_service(info):
            let_go(w, marker, info)
            return
        theirs = foreign(info)
        if theirs:
            let_go(w, marker, info)
            _step(w, "resume", w.node, "skipped", started, detail=f"drained by someone else: {theirs}")
            return
        why_not = _not_rejudged(w, marker, report, info)
        if why_not:
            _step(w, "resume", w.node, "skipped", started, reason=info.reason, detail=why_not)
            return
        w.slurm.resume(w.node)
    except SlurmHooksError as exc:
        outcome.failed.append(f"resume: {exc}")
        _step(w, "resume", w.node, "failed", started, error=str(exc))
        return
    let_go(w, marker, info)
    outcome.resumed = True
    _step(w, "resume", w.node, "ok", started, reason=info.reason)


def _not_rejudged(w: Wiring, marker: DrainMarker, report: Report, info: NodeInfo) -> str:
    """Why this healthy verdict does not cover what the node was drained for ("" when it does)."""
    why = marker.why_not_ours(info)
    if why:
        if split_reason(info.reason)[0] != marker.reason:
            return (f"{why}: this check did not judge the newer drain; resume by hand "
                    "(scontrol update State=RESUME) once mended")
        return f"{why}: not ours to resume"
    leftovers = {"leftover", "busy"} & set(marker.checks)
    ran = set(report.checks_run)
    if any(f.check == "dcgm" for f in report.findings):
        ran.discard("dcgm")  # a diag that could not run or did not pass in full vouches for nothing
    missing = sorted(set(marker.checks) - ran - leftovers)
    if missing:
        return (f"drained for {', '.join(missing)}, which the periodic check does not run: "
                "resume by hand (scontrol update State=RESUME) once mended")
    if report.snapshot is not None and info.empty:
        # An idle node's GPUs should be empty: what is on them now is left over.
        left = report.if_idle
        if left:
            return "still " + "; ".join(f.message for f in left[:3]) + " on an idle node"
    return ""


def _recover_marker(w: Wiring) -> DrainMarker | None:
    """No marker: now and then, ask Slurm whether this node carries our drain anyway.

    Adopted only when nothing says it is not ours: our text with at most Slurm's
    owner-keeping suffixes, no reboot pending that our repair state does not name, and
    not a reason we let go of (Slurm >= 23.11 without accounting keeps it after a resume)."""
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
    if not (out_of_service(info) and info.ours) or reboot_pending(info) or _released(w).covers(info):
        return None
    text = split_reason(info.reason)[0]
    # What it was drained for is lost with the marker; the reason still says whether it was DCGM.
    # A node drained [validating]/[unverified] waits for its diagnostic, which the periodic check does not run.
    dcgm = "DCGM" in text or bool(status_tag(text))
    return DrainMarker(reason=text, checks=("dcgm",) if dcgm else (), recovered=True).seen(info)


def holds(w: Wiring, info: NodeInfo, *, our_reboot: bool = False) -> str:
    """"" when the drain on this node is ours to act on (repair, reboot); else why not.

    By our marker when there is one (any of our texts: a newer drain of ours counts); with
    the marker lost, by Slurm's view: our text, not one we let go of, no reboot pending that
    ``our_reboot`` does not cover."""
    theirs = foreign(info)
    if theirs:
        return theirs
    try:
        marker = load_marker(w)
    except MarkerUnreadable:
        marker = None
    if marker is not None:
        return marker.why_not_ours(info, our_reboot=our_reboot, same_text=False)
    if _released(w).covers(info):
        return "a reason we let go of (Slurm kept it on the node after a resume)"
    if reboot_pending(info) and not our_reboot:
        return "a reboot we did not ask for is pending on the node (someone else's scontrol reboot)"
    return ""


def let_go(w: Wiring, marker: DrainMarker | None, info: NodeInfo | None) -> None:
    """We no longer hold this node's drain: forget the marker, and remember the reason that
    Slurm may keep on the node (>= 23.11 without accounting) so it is never adopted again."""
    if marker is not None and info is not None and info.reason and split_reason(info.reason)[0] == marker.reason:
        _released(w).add(marker.reason, info.reason_time)
    forget_drain(w)


def _released(w: Wiring) -> ReleasedReasons:
    return ReleasedReasons(w.state_path(f"released-{w.node}.json"))


def forget_drain(w: Wiring) -> None:
    _remove(w.drained_marker())


def write_marker(w: Wiring, reason: str, report: Report | None, node: NodeInfo | None = None) -> None:
    """Remember that we drained this node: when, why, for which XID events and checks, and the
    node's ReasonTime/ReasonUser right after (``node``, as read then; ``None``: unknown).
    ``report`` None: a new reason for the same drain, as the repair's reboot gives it."""
    if report is None:
        try:
            before = load_marker(w)
        except MarkerUnreadable:
            before = None
        marker = replace(before, ts=time.time(), reason=reason, reason_time="", reason_user="") if before \
            else DrainMarker(reason=reason, ts=time.time())
    else:
        snap = report.snapshot
        keys = sorted({x.key for x in snapshot_xids(snap)}) if snap else []
        marker = DrainMarker(reason=reason, ts=time.time(), xids=tuple(keys), context=report.context.value,
                             checks=tuple(sorted({f.check for f in report.drain_findings()})))
    if node is not None and split_reason(node.reason)[0] == reason:
        marker = marker.seen(node)
    try:
        marker.save(w.drained_marker())
    except OSError as exc:
        print(f"slurm-hooks: cannot write {w.drained_marker()}: {exc.strerror}", file=sys.stderr)


def load_marker(w: Wiring) -> DrainMarker | None:
    """Our record of draining this node; ``None`` when we have not drained it.
    Raises :class:`MarkerUnreadable` when it exists but cannot be read."""
    return DrainMarker.load(w.drained_marker())


def drained_for(w: Wiring) -> list[str] | None:
    """XID event keys our drain of this node was for; ``None`` when we have not drained it
    (an unreadable marker: ``[]``, a drain for unknown events)."""
    try:
        marker = load_marker(w)
    except MarkerUnreadable:
        return []
    return None if marker is None else list(marker.xids)


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
