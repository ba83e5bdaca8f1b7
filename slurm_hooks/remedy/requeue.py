"""Requeue the jobs a fault touches, each once (its checkpoint signal first where it has one), and
say which jobs those are (:func:`touched_jobs`, :func:`explain`).

Every step writes one audit record with its result and duration. Nothing here raises for a Slurm
failure: it is recorded in the :class:`.outcome.Outcome`, and the next run tries again.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from slurm_hooks.errors import SlurmHooksError
from slurm_hooks.models import Context, Finding, Report, Scope, Urgency
from slurm_hooks.remedy import gpumap
from slurm_hooks.remedy.audit import step
from slurm_hooks.remedy.drain import findings_summary
from slurm_hooks.remedy.follower import (
    WINDOWS,
    Follow,
    Followed,
    Phase,
    follow_jobs,
    forget_record,
    read_record,
    record_requeue_seconds,
    write_record,
)
from slurm_hooks.remedy.wiring import Wiring
from slurm_hooks.slurm import JobInfo, hostlist
from slurm_hooks.slurm.errors import AlreadyRequeued
from slurm_hooks.values import replace

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing (~3 ms of each start)
if TYPE_CHECKING:
    from typing import Any

    from slurm_hooks.remedy.outcome import Outcome

__all__ = ["explain", "in_slurms_numbering", "job_summary", "requeue_jobs", "touched_jobs"]


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


def _refused_here(w: Wiring, rec: Followed) -> bool:
    """Our prolog on this node refused the job and Slurm has not requeued it yet: it still shows on
    the node (in its prolog, not ended), and Slurm requeues it when the prolog exits. A periodic
    check that ran meanwhile would requeue it a second time (and say "requeued from" over the
    prolog's "refused by the prolog")."""
    return rec.refused and not rec.pending_at and rec.node == w.node


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
    under way) is left alone: Slurm would run a completed job again. A fault's
    requeue is recorded once per job: a later run (slurmd's periodic check, the
    watcher) that finds a job this node already sees to (its following record:
    in its grace, or requeued and completing) records nothing for it. A job
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
        step(w, "requeue", w.node, "failed", started, error=f"cannot list jobs: {exc}")
        return
    graced: list[Followed] = []
    requeued: list[Followed] = []
    gmap = gpumap.cached(w) if gpus is not None else None
    faulty = _fmt(gpus or ()) + "".join(f", GPU {g} instance {i}" for g, i in sorted(instances))
    for job, held, touched in touched_jobs(w, jobs, gpus, instances, gmap, multi_node):
        ref = job.ref
        t0 = time.monotonic()
        whose = _whose(job)
        scope = _scope_note(gmap, held)
        seen_to = read_record(w, ref)
        if seen_to is not None and (seen_to.phase in WINDOWS or _ended(job) is not None or _refused_here(w, seen_to)):
            continue  # this node already sees to it (in its grace, requeued, refused): its first record says so
        if seen_to is not None and seen_to.phase is Phase.HEALED and _still_away(w, seen_to, job):
            write_record(w, replace(seen_to, ts=time.time()))  # kept while the job holds the drained node
            continue
        if not touched:
            ended = _ended(job)
            if ended is not None:  # a requeue under way shows no GPUs: not "left to run"
                step(w, "requeue", ref, ended[0], t0, jobs=[ref], **whose, detail=ended[2])
                continue
            where = "no GPU on this node" if held == () else f"GPU {_fmt(gpumap.nvml_of(gmap, held or ()))}"
            step(w, "requeue", ref, "spared", t0, jobs=[ref], **whose, gpus=list(held or ()),
                  detail="runs on this node alone: the network fault does not touch it" if multi_node and not gpus
                  else f"runs on {where}, not on the faulty GPU {faulty}: left to run")
            continue
        if held:
            outcome.job_gpus[ref] = held
        why_not = _not_requeued(job)
        if why_not:
            result, level, detail = why_not
            step(w, "requeue", ref, result, t0, jobs=[ref], **whose, detail=detail, **({"level": level} if level else {}),
                  **scope)
            continue
        rec, found = _in_place(w, job, fault_at, t0, whose)
        if rec is None:
            rec = _signal_first(w, job, fault_at, found)
        if rec is not None:
            graced.append(rec)
            outcome.signalled.append(ref)
            continue
        # Written before the requeue: a run that looks while the job completes (slurmd's periodic check,
        # the watcher) finds it being seen to and adds no record of its own.
        mine = Followed(ref, w.node, Phase.REQUEUED, fault_at=fault_at, ts=time.time(), nodes=node_count(job))
        write_record(w, mine)
        try:
            w.slurm.requeue(ref)
        except AlreadyRequeued as exc:
            # Another run (the check on the job's other node) requeued it a moment ago.
            forget_record(w, ref)
            step(w, "requeue", ref, "already", t0, jobs=[ref], **whose, detail=str(exc))
            continue
        except SlurmHooksError as exc:
            forget_record(w, ref)
            outcome.failed.append(f"requeue {ref}: {exc}")
            step(w, "requeue", ref, "failed", t0, jobs=[ref], **whose, error=str(exc))
            continue
        outcome.requeued.append(ref)
        requeued.append(replace(mine, ts=time.time()))
        seconds = round(time.time() - fault_at, 3)
        step(w, "requeue", ref, "ok", t0, jobs=[ref], **whose, requeued_by="ours", seconds_from_fault=seconds,
              **({"gpus": list(held)} if held else {}), **scope)
        record_requeue_seconds(w, "ours", seconds)
    if outcome.requeued or graced:
        follow_jobs(w, [*outcome.requeued, *outcome.signalled], follow, records=[*requeued, *graced])


def _whose(job: JobInfo) -> dict[str, dict[str, str]]:
    """Whose job it is, for its audit record: its owner and its name (bounded, printable)."""
    from slurm_hooks.observe.records import job_name

    return {k: v for k, v in (("users", {job.ref: job_name(job.user)} if job.user else {}),
                              ("names", {job.ref: job_name(job.name)} if job.name else {})) if v}


def _in_place(w: Wiring, job: JobInfo, fault_at: float, t0: float, whose: dict) -> tuple[Followed | None, Any]:
    """A job that heals in place (:mod:`.selfheal`): its ranks here told to leave, its in-job window
    open; ``None`` for any other job, and for one that cannot leave this node (requeued now, as any).
    With what the job says of itself (its :class:`~slurm_hooks.slurm.jobheal.Marks`; ``None``: not read)."""
    if w.config.interop.in_job_grace <= 0:
        return None, None
    from slurm_hooks.remedy import selfheal  # a touched job only (reads /proc, its record, its script)

    record = selfheal.read_record(w, job)
    procs = selfheal.job_processes(job.job_id, w.node)
    found = selfheal.marks(w, job, record, procs)
    if not found.in_place:
        return None, found
    grace, why = selfheal.tell_ranks(w, job, found, record, procs)
    if not grace:
        step(w, "signal", job.ref, "skipped", t0, jobs=[job.ref], **whose, heals=found.spec, source=found.source,
             detail=f"heals in place ({found.spec}), but {why}: requeued now")
        return None, found
    now = time.time()
    return Followed(job.ref, w.node, Phase.IN_JOB, fault_at=fault_at, signal="TERM", source=found.source,
                    signalled_at=now, grace_until=now + grace, restarts=job.restarts, nodes=node_count(job),
                    heals=found.spec), found


def _still_away(w: Wiring, rec: Followed, job: JobInfo) -> bool:
    from slurm_hooks.remedy import selfheal

    return selfheal.still_away(w, job, rec.restarts)


def _signal_first(w: Wiring, job: JobInfo, fault_at: float, found: Any = None) -> Followed | None:
    """Send the job its checkpoint signal and open its grace; ``None`` for a job to requeue now
    (no signal, no grace left, or the signal could not be sent)."""
    from slurm_hooks.remedy import checkpoint  # a job being requeued only (with jobsignal, shlex)

    t0 = time.monotonic()
    sig = checkpoint.read_signal(w, job, found)
    if sig is None:
        return None
    grace = checkpoint.grace_seconds(w, sig)
    if grace <= 0:
        return None
    try:
        how = checkpoint.deliver(w, job, sig)
    except SlurmHooksError as exc:
        step(w, "signal", job.ref, "failed", t0, jobs=[job.ref], signal=sig.spec, source=sig.source.value,
              level="warning", error=str(exc), detail="could not send the job its checkpoint signal: requeued now")
        return None
    now = time.time()
    step(w, "signal", job.ref, "ok", t0, jobs=[job.ref], **_whose(job), signal=sig.spec, source=sig.source.value, via=how,
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
