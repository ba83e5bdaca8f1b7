"""Remediation shared by every hook: drain with an owned reason, requeue, resume.

Every step writes one audit record with its result and duration. Nothing here
raises for a Slurm failure: an unreachable slurmctld is recorded and reported
so the caller can pick an exit code, and the next run tries again.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from slurm_hooks import REASON_PREFIX, fsutil
from slurm_hooks.engine import drain_summary, snapshot_xids
from slurm_hooks.errors import SlurmHooksError
from slurm_hooks.hooks import gpumap
from slurm_hooks.hooks.marker import DrainMarker, MarkerUnreadable, Released, foreign
from slurm_hooks.hooks.wiring import Wiring
from slurm_hooks.models import Context, Report, Scope, Severity, Urgency
from slurm_hooks.slurm import (
    ADMIN_COMMENT_MAX,
    JobInfo,
    NodeInfo,
    format_reason,
    hostlist,
    job_ref,
    join_admin_comment,
    may_drain,
    out_of_service,
    reboot_pending,
    split_reason,
    status_tag,
)

if TYPE_CHECKING:
    from slurm_hooks.runner import Spawned


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


def _step(w: Wiring, action: str, target: str, result: str, started: float, **fields: Any) -> None:
    w.audit.write("action", node=w.node, action=action, target=target, result=result,
                  duration_s=round(time.monotonic() - started, 4), **fields)


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
        if info.drained and info.ours and split_reason(info.reason)[0] == reason and _still_ours(w, info):
            outcome.drained = outcome.node_out = True
            write_marker(w, reason, report, info)  # an earlier drain may have landed after its scontrol timed out
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
    write_marker(w, reason, report, _after_drain(w, reason))
    _step(w, "drain", w.node, "ok", started, reason=reason, **extra)


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


def requeue_jobs(w: Wiring, outcome: Outcome, follow: str = "detached", gpus: frozenset[int] | None = None,
                 instances: frozenset[tuple[int, int]] = frozenset()) -> None:
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
    warning, not a failure). ``scontrol requeue`` sends SIGTERM and gives the
    job KillWait seconds to checkpoint; requeued jobs wait out a ~121 s delay
    unless told ``StartTime=now`` once PENDING: :func:`follow_jobs` does that,
    ``follow`` says where: "detached", "thread" (the watcher), "inline", or "none".
    """
    started = time.monotonic()
    try:
        jobs = w.slurm.jobs_on_node(w.node)
    except SlurmHooksError as exc:
        outcome.failed.append(f"list jobs: {exc}")
        _step(w, "requeue", w.node, "failed", started, error=f"cannot list jobs: {exc}")
        return
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
        try:
            w.slurm.requeue(ref)
        except SlurmHooksError as exc:
            if "pending" in str(exc).lower():
                # Another run (the watcher, the check on the job's other node) requeued it a moment ago.
                _step(w, "requeue", ref, "already", t0, jobs=[ref], detail=str(exc))
                continue
            outcome.failed.append(f"requeue {ref}: {exc}")
            _step(w, "requeue", ref, "failed", t0, jobs=[ref], error=str(exc))
            continue
        outcome.requeued.append(ref)
        _step(w, "requeue", ref, "ok", t0, jobs=[ref], **scope)
    if outcome.requeued:
        follow_jobs(w, outcome.requeued, follow)


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


#: An AdminComment is written only with at least this much of the run's deadline left.
ANNOTATE_MIN_S = 1.0
#: What one line says at most (many findings make a long summary).
ANNOTATE_WHAT_MAX = 200


def annotate_jobs(w: Wiring, refs: Iterable[str], what: str) -> None:
    """Tell each job's owner why: append ``slurm-hooks: <what>, <UTC minute>`` to its AdminComment
    (``scontrol show job``, ``sacct -o AdminComment``), keeping what is there.

    Called once the requeue (or the prolog's refusal) is done, and never in its way: each call is
    bounded by what is left of the run's deadline, and a failure is a warning in the audit log.
    Pass an adapter that does not count failures toward a pending requeue.
    """
    what = what if len(what) <= ANNOTATE_WHAT_MAX else what[: ANNOTATE_WHAT_MAX - 3].rstrip() + "..."
    line = f"{REASON_PREFIX} {what}, {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}"
    for ref in refs:
        t0 = time.monotonic()
        if w.time_left(ANNOTATE_MIN_S) < ANNOTATE_MIN_S:
            _step(w, "annotate", ref, "skipped", t0, jobs=[ref], level="warning", comment=line,
                  detail="too little of the run's deadline left to write the job's AdminComment")
            continue
        try:
            joined = join_admin_comment(w.slurm.admin_comment(ref), line)
            if joined is None:
                _step(w, "annotate", ref, "skipped", t0, jobs=[ref], level="warning", comment=line,
                      detail=f"no room in the job's AdminComment (at most {ADMIN_COMMENT_MAX} characters) "
                             "without cutting what others wrote")
                continue
            w.slurm.set_admin_comment(ref, joined)
        except SlurmHooksError as exc:
            _step(w, "annotate", ref, "failed", t0, jobs=[ref], level="warning", comment=line, error=str(exc))
            continue
        _step(w, "annotate", ref, "ok", t0, jobs=[ref], comment=line)


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


#: How long a hook whose follower could not start follows the jobs itself before it goes on
#: (the next hook run on the node finishes what is left, from the records under following/).
FOLLOW_FALLBACK_S = 10.0
#: How long a follower has to say it runs.
FOLLOWER_READY_S = 3.0
#: A following record older than this is dropped: the job has long been dealt with or forgotten.
FOLLOW_RECORD_TTL_S = 3600.0


def follow_jobs(w: Wiring, refs: Iterable[int | str], how: str, *, python: str | None = None,
                fallback: bool = True) -> Spawned | None:
    """Follow requeued jobs until each is PENDING, then release (our hold only) and start it now.

    Before anything else each job gets a small record under ``following/`` in the
    state dir, so that when no follower finishes (it could not start, it was
    killed) the next hook run on this node does (:func:`finish_followed`).
    "detached" starts ``slurm-hooks follow-jobs`` and checks that it runs; a
    follower that cannot start is recorded, and the hook follows the jobs
    itself for up to FOLLOW_FALLBACK_S, unless ``fallback`` is false (the prolog:
    its job cannot be requeued before the prolog exits). ``python`` replaces the
    interpreter (a test seam).
    """
    refs = [str(r) for r in refs]
    if how == "none" or not refs:
        return None
    in_process = how in ("inline", "thread")
    for ref in refs:
        _write_following(w, ref, os.getpid() if in_process else None)
    timeout = float(w.config.remediation.requeue_grace) + 60.0
    if how == "inline":
        follow_requeued(w, refs, timeout)
    elif how == "thread":
        threading.Thread(target=follow_requeued, args=(w, refs, timeout), name="follow-jobs", daemon=True).start()
    elif how == "detached":
        from slurm_hooks.runner import python_argv, spawn_detached

        argv = python_argv("slurm_hooks.entry", "follow-jobs", "--node", w.node, "--timeout", str(timeout), *refs,
                           python=python)
        env = dict(os.environ)
        if w.config.path:
            env["SLURM_HOOKS_CONFIG"] = w.config.path
        t0 = time.monotonic()
        spawned = spawn_detached(argv, env=env, cwd="/", ready_timeout=FOLLOWER_READY_S)
        if spawned.started and spawned.proc is not None:
            for ref in refs:
                _write_following(w, ref, spawned.proc.pid)
            return spawned
        wait = FOLLOW_FALLBACK_S if fallback else None
        _step(w, "follow", ",".join(refs), "failed", t0, jobs=refs, level="error", error=spawned.error,
              detail="requeue follower did not start; " + (f"following here for up to {wait:g}s, " if wait is not None
                                                            else "") + "the next hook run on this node finishes it")
        if wait is not None:
            follow_requeued(w, refs, wait, final=False)
        return spawned
    return None


def follow_requeued(w: Wiring, refs: list[int | str], timeout: float, poll: float = 1.0,
                    final: bool = True) -> dict[str, str]:
    """Wait for each job to be PENDING again, release it if our prolog's refusal held it, start it now.

    One ``squeue`` for all the jobs per poll, at most one poll a ``poll`` seconds,
    and back as soon as every job is settled. ``final``: jobs still unsettled at
    ``timeout`` are recorded as failures (else they are left to the next hook run).
    """
    pending = {str(r): time.monotonic() for r in refs}
    results: dict[str, str] = {}
    deadline = time.monotonic() + timeout
    last_error: SlurmHooksError | None = None
    while True:
        polled = time.monotonic()
        try:
            found = w.slurm.jobs(list(pending))
            last_error = None
        except SlurmHooksError as exc:
            found, last_error = None, exc
        if found is not None:
            for ref in list(pending):
                job = _pick(found, ref)
                result = _settle(w, ref, job, pending[ref])
                if result is not None:
                    pending.pop(ref)
                    results[ref] = result
        if not pending or polled + poll >= deadline:
            break
        time.sleep(max(0.0, poll - (time.monotonic() - polled)))
    for ref, t0 in pending.items():
        if last_error is not None:
            results[ref] = f"failed: {last_error}"
        else:
            results[ref] = "timed out"
        if final:
            error = str(last_error) if last_error else f"job not PENDING again within {timeout:g}s"
            _step(w, "start_now", ref, "failed", t0, jobs=[ref], error=error)
    return results


def _pick(found: list[JobInfo], ref: str) -> JobInfo | None:
    """The record for ``ref``: a het job's leader over its other components."""
    mine = [j for j in found if j.answers_to(ref)]
    return next((j for j in mine if not j.het_job_id or j.het_job_id == j.job_id), mine[0] if mine else None)


def _settle(w: Wiring, ref: str, job: JobInfo | None, t0: float) -> str | None:
    """One look at a followed job: its final result, or ``None`` while it is still on its way."""
    if job is None:
        _forget_following(w, ref)
        _step(w, "start_now", ref, "skipped", t0, jobs=[ref], detail="Slurm no longer knows the job")
        return "gone"
    if job.pending:
        target = job.ref  # the given id may be an array's base id: act on exactly this task
        if job.held_by_admin or job.held_by_user or (job.priority == "0" and not job.held_by_launch_failure):
            _forget_following(w, ref)
            _step(w, "start_now", ref, "skipped", t0, jobs=[ref],
                  detail=f"job is held by someone else ({job.reason}, priority {job.priority or '?'}): left held")
            return f"held: {job.reason}"
        try:
            if job.held_by_launch_failure:
                w.slurm.release(target)
                _step(w, "release", ref, "ok", t0, jobs=[ref], detail=job.reason)
            w.slurm.start_now(target)
        except SlurmHooksError as exc:
            _step(w, "start_now", ref, "failed", t0, jobs=[ref], error=str(exc))
            return f"failed: {exc}"  # the record stays: the next hook run tries again
        _forget_following(w, ref)
        _step(w, "start_now", ref, "ok", t0, jobs=[ref])
        return "ok"
    if job.base_state in ("RUNNING", "CONFIGURING") and job.restarts > 0 and job.nodes \
            and not hostlist.matches(job.nodes, w.node):
        _forget_following(w, ref)
        return "already running"
    if job.finished:
        _forget_following(w, ref)
        _step(w, "start_now", ref, "skipped", t0, jobs=[ref], detail=f"job ended {job.state}")
        return f"ended {job.state}"
    return None


def finish_followed(w: Wiring) -> dict[str, str]:
    """Finish what a follower left: jobs requeued from this node that are still waiting out the delay.

    A listing of one directory when there is nothing to do (the prolog's healthy
    path stays off slurmctld); jobs whose follower still runs are its business;
    for the others one squeue, and each PENDING job is released (our hold only)
    and made eligible now.
    """
    refs = []
    for name, path in _following_records(w):
        try:
            age = time.time() - os.stat(path).st_mtime
            with open(path, encoding="utf-8") as fh:
                pid = json.load(fh).get("pid")
        except (OSError, ValueError, AttributeError):
            continue
        if age > FOLLOW_RECORD_TTL_S:
            _remove(path)
        elif not _follower_alive(pid):
            refs.append(name)
    if not refs:
        return {}
    return follow_requeued(w, refs, 0.0, final=False)


def _following_dir(w: Wiring) -> str:
    return w.state_path("following")


def _following_path(w: Wiring, ref: str) -> str:
    return os.path.join(_following_dir(w), f"{w.node}@{ref}")


def _following_records(w: Wiring) -> list[tuple[str, str]]:
    try:
        names = os.listdir(_following_dir(w))
    except OSError:
        return []
    prefix = f"{w.node}@"
    return [(n[len(prefix):], os.path.join(_following_dir(w), n)) for n in names
            if n.startswith(prefix) and _valid_ref(n[len(prefix):])]


def _valid_ref(text: str) -> bool:
    try:
        return job_ref(text) == text
    except ValueError:
        return False


def _follower_alive(pid: object) -> bool:
    """Whether the follower that owns a record still runs: this process (the watcher's thread),
    or a ``follow-jobs`` process (a pid reused by anything else does not count)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    if pid == os.getpid():
        return True
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return b"follow-jobs" in fh.read()
    except OSError:
        return False


def _write_following(w: Wiring, ref: str, pid: int | None) -> None:
    record = {"ref": ref, "node": w.node, "ts": time.time(), "pid": pid}
    try:
        os.makedirs(_following_dir(w), mode=0o700, exist_ok=True)
        fsutil.atomic_write(_following_path(w, ref), json.dumps(record), mode=0o600, durable=False)
    except OSError as exc:
        print(f"slurm-hooks: cannot write {_following_path(w, ref)}: {exc.strerror}", file=sys.stderr)


def _forget_following(w: Wiring, ref: str) -> None:
    _remove(_following_path(w, ref))


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
    missing = sorted(set(marker.checks) - set(report.checks_run) - leftovers)
    if missing:
        return (f"drained for {', '.join(missing)}, which the periodic check does not run: "
                "resume by hand (scontrol update State=RESUME) once mended")
    if report.snapshot is not None and info.base_state in ("IDLE", "DRAINED", "DOWN"):
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


def _released(w: Wiring) -> Released:
    return Released(w.state_path(f"released-{w.node}.json"))


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
