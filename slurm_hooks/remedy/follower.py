"""The job follower: see each touched job through to running elsewhere, exactly once.

A job touched by a fault is in one of two phases, written down per job under
``following/`` in the state dir before anything else happens to it:

- :attr:`Phase.GRACE`: it got its own checkpoint signal (:mod:`.checkpoint`) and has
  until ``grace_until`` to requeue itself or end. A job that requeues itself is not
  requeued again; one still running when the grace is over is requeued by us, and so is one
  that ended FAILED in it (submitit late in its time limit cannot checkpoint and fails: never
  lose a job the fault touched).
- :attr:`Phase.IN_JOB`: it heals in place (:mod:`.selfheal`); its ranks on this node were told
  to leave, and it has until ``grace_until`` to; one that left is :attr:`Phase.HEALED`, never
  requeued; one still here is requeued by us as a job whose grace is over.
- :attr:`Phase.REQUEUED`: requeued (by us, by itself, or refused by our prolog):
  once PENDING again it is released (our prolog's hold only) and made eligible now
  (``StartTime=now``), saving Slurm's ~121 s requeue delay.

The record is the job's state on this node: when no follower finishes (it could not
start, it was killed, the watcher restarted) the next hook run on the node does
(:func:`finish_followed`), the grace's end included.
"""

from __future__ import annotations

import enum
import json
import os
import sys
import threading
import time
from collections.abc import Iterable

from slurm_hooks import fsutil
from slurm_hooks.errors import SlurmHooksError
from slurm_hooks.remedy.audit import annotate_jobs, step
from slurm_hooks.remedy.wiring import Wiring
from slurm_hooks.slurm import JobInfo, JobState, hostlist, job_ref
from slurm_hooks.slurm.errors import AlreadyRequeued, SlurmCommandFailed
from slurm_hooks.values import asdict, dataclass, fields, replace

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing (~3 ms of each start)
if TYPE_CHECKING:
    from slurm_hooks.runner import Spawned


class Follow(str, enum.Enum):
    """Where the follower runs: a detached ``follow-jobs`` process (the health check: slurmd kills
    it at 60 s), a thread of the watcher, this very call (tests, bench), or nowhere."""

    DETACHED = "detached"
    THREAD = "thread"
    INLINE = "inline"
    NONE = "none"


class Phase(str, enum.Enum):
    GRACE = "grace"
    REQUEUED = "requeued"
    #: A job that heals in place was told to leave the node (:mod:`.selfheal`): until ``grace_until``.
    IN_JOB = "in-job"
    #: It left and runs on: not followed, kept so that later runs leave it be.
    HEALED = "healed"


#: Phases with a window (``grace_until``) the follower waits out.
WINDOWS = (Phase.GRACE, Phase.IN_JOB)


@dataclass(frozen=True)
class Followed:
    """One job's record under ``following/`` (JSON; times are wall-clock)."""

    ref: str
    node: str
    phase: Phase = Phase.REQUEUED
    #: When the fault was seen (the requeue's clock starts here).
    fault_at: float = 0.0
    #: The job's checkpoint signal (:attr:`.jobsignal.JobSignal.spec`) and where it was read.
    signal: str = ""
    source: str = ""
    signalled_at: float = 0.0
    grace_until: float = 0.0
    #: The job's restart count when it was signalled: a higher one means it requeued itself.
    restarts: int = 0
    #: The follower that owns the record (None: none yet, the next hook run finishes it).
    pid: int | None = None
    #: When the record was written; for a requeued job, when it was requeued.
    ts: float = 0.0
    #: How many nodes the job ran on (1 when not known): a multi-node job is not started again
    #: until CRED_REVOKE_DELAY_S after its requeue.
    nodes: int = 1
    #: Refused by our prolog: Slurm requeues it only once the prolog has exited, so its requeue (and
    #: its credential's revocation) lies after ``ts``, before ``pending_at``: the first look that found
    #: it PENDING again (0: none yet).
    refused: bool = False
    pending_at: float = 0.0
    #: The job's frameworks that heal it (:class:`slurm_hooks.slurm.jobheal.Marks` ``spec``; "" for none).
    heals: str = ""
    #: Nodes to add to its ExcNodeList once PENDING again (a job that named this node: Megatron-LM's exit 16).
    exclude: str = ""

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "phase": self.phase.value})

    @classmethod
    def from_dict(cls, data: object) -> Followed:
        if not isinstance(data, dict):
            raise ValueError("not a record")
        known = {f.name for f in fields(cls)}
        rec = cls(**{k: v for k, v in data.items() if k in known})
        return replace(rec, phase=Phase(rec.phase), ref=job_ref(rec.ref))


#: How long a hook whose follower could not start follows the jobs itself before it goes on
#: (the next hook run on the node finishes what is left, from the records under following/).
FOLLOW_FALLBACK_S = 10.0
#: How long a follower has to say it runs.
FOLLOWER_READY_S = 3.0
#: A following record older than this is dropped: the job has long been dealt with or forgotten.
FOLLOW_RECORD_TTL_S = 3600.0
#: The follower's first wait; each next one is POLL_GROWTH times longer, up to its ``poll``. A
#: job requeued by SIGTERM is PENDING again once its epilog is done, about a second later
#: (bench/bench_checkpoint.py), and each tenth spent waiting here is a tenth before it runs
#: elsewhere: a flat 1 s poll cost 0.5-0.8 s there. Growing waits keep a storm's squeue count
#: close to the flat poll's (bench/bench_storm.py): 7 looks in the first 3 s, then one a second.
#: So a wait is about half the time since the requeue: a follower that starts late (a process
#: started on a loaded node, a job that joins a follower already running) waits as one that had
#: looked since the requeue would (:func:`_first_wait`), not from FIRST_POLL_S again.
FIRST_POLL_S = 0.1
POLL_GROWTH = 1.5
#: A requeue revokes the job's credential on each of its nodes, and slurmd refuses a launch whose
#: credential is not newer than the revocation (second resolution; Slurm's own requeue delay is what
#: keeps that apart). ``StartTime=now`` skips that delay: a multi-node job sent back within the same
#: second to a node it ran on is refused there and killed. So one is made eligible only this long
#: after its requeue; a single-node job at once (its own node is drained).
CRED_REVOKE_DELAY_S = 2.0


def follow_jobs(w: Wiring, refs: Iterable[int | str], how: Follow | str, *, python: str | None = None,
                fallback: bool = True, records: Iterable[Followed] = ()) -> Spawned | None:
    """Follow touched jobs until each runs elsewhere (or ends), exactly once each.

    Before anything else each job gets its record under ``following/`` (``records``:
    those of jobs in their grace, the others are written as requeued), so that when no
    follower finishes the next hook run on this node does (:func:`finish_followed`).
    "detached" starts ``slurm-hooks follow-jobs`` and checks that it runs; a follower
    that cannot start is recorded, and the hook follows the jobs itself for up to
    FOLLOW_FALLBACK_S, unless ``fallback`` is false (the prolog: its job cannot be
    requeued before the prolog exits). ``python`` replaces the interpreter (a test seam).
    """
    how = Follow(how)
    refs = [str(r) for r in refs]
    given = {r.ref: r for r in records}
    if how is Follow.NONE:
        for rec in given.values():
            write_record(w, rec)  # a job in its grace is finished by the next hook run
        return None
    if not refs:
        return None
    in_process = how in (Follow.INLINE, Follow.THREAD)
    now = time.time()
    mine = [replace(given.get(ref) or Followed(ref, w.node, fault_at=now), pid=os.getpid() if in_process else None)
            for ref in refs]
    for rec in mine:
        write_record(w, rec)
    timeout = follow_timeout(w, mine)
    if how is Follow.INLINE:
        follow_requeued(w, refs, timeout)
    elif how is Follow.THREAD:
        _follow_in_thread(w, refs, timeout)
    elif how is Follow.DETACHED:
        from slurm_hooks.runner import python_argv, spawn_detached

        argv = python_argv("slurm_hooks.entry", "follow-jobs", "--node", w.node, "--timeout", f"{timeout:.1f}", *refs,
                           python=python)
        env = dict(os.environ)
        if w.config.path:
            env["SLURM_HOOKS_CONFIG"] = w.config.path
        t0 = time.monotonic()
        spawned = spawn_detached(argv, env=env, cwd="/", ready_timeout=FOLLOWER_READY_S)
        if spawned.started and spawned.proc is not None:
            for rec in mine:
                _claim(w, rec.ref, spawned.proc.pid)
            return spawned
        wait = FOLLOW_FALLBACK_S if fallback else None
        step(w, "follow", ",".join(refs), "failed", t0, jobs=refs, level="error", error=spawned.error,
             detail="requeue follower did not start; " + (f"following here for up to {wait:g}s, " if wait is not None
                                                           else "") + "the next hook run on this node finishes it")
        if wait is not None:
            follow_requeued(w, refs, wait, final=False)
        return spawned
    return None


class Joining:
    """Jobs handed to a follower thread that already follows this node's jobs (the watcher's), so that
    one squeue per look asks for all of them; closed once that follower is done."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._refs: dict[str, float] = {}
        self._open = True

    def add(self, refs: list[str], timeout: float) -> bool:
        """Hand ``refs`` over (followed for ``timeout`` from now); False once the follower is done."""
        with self._lock:
            if self._open:
                for ref in refs:
                    self._refs[ref] = max(timeout, self._refs.get(ref, 0.0))
            return self._open

    def take(self) -> dict[str, float]:
        with self._lock:
            refs, self._refs = self._refs, {}
            return refs

    def close(self) -> bool:
        """Done, unless jobs were handed over meanwhile (False: follow them too)."""
        with self._lock:
            self._open = bool(self._refs)
            return not self._open


def _follow_in_thread(w: Wiring, refs: list[str], timeout: float) -> None:
    """Follow ``refs`` in a thread: the one already following this node's jobs, if one runs, else a new one."""
    with _THREADS_LOCK:
        running = w._following[0] if w._following else None
        if running is not None and running.add(refs, timeout):
            return
        joining = Joining()
        w._following[:] = [joining]
    threading.Thread(target=follow_requeued, args=(w, refs, timeout), kwargs={"joining": joining},
                     name="follow-jobs", daemon=True).start()


_THREADS_LOCK = threading.Lock()


def follow_timeout(w: Wiring, records: Iterable[Followed]) -> float:
    """Long enough for the longest grace still to run, then a requeue's KillWait and its settling."""
    grace_left = max((r.grace_until - time.time() for r in records if r.phase in WINDOWS), default=0.0)
    return max(0.0, grace_left) + w.config.remediation.requeue_grace + 60.0


def follow_requeued(w: Wiring, refs: list[int | str], timeout: float, poll: float = 1.0,
                    final: bool = True, joining: Joining | None = None) -> dict[str, str]:
    """Follow each job through its grace (if it has one) until it is PENDING again, then release it
    if our prolog's refusal held it and start it now.

    One ``squeue`` for all the jobs per look, those that ``joining`` hands over on the way
    included; the first look at once, then waits growing by POLL_GROWTH up to ``poll``, from
    about half the time since the newest requeue (:func:`_first_wait`); back as soon as every
    job is settled. ``final``: jobs still unsettled at ``timeout`` are recorded as failures
    (else they are left to the next hook run).
    """
    pending = {str(r): time.monotonic() for r in refs}
    #: Jobs made eligible on an earlier look: asked about in the looks the others still need (no call of
    #: their own), so that one seen running elsewhere is recorded as running (the incident's time to it).
    eligible: dict[str, float] = {}
    results: dict[str, str] = {}
    deadline = time.monotonic() + timeout
    last_error: SlurmHooksError | None = None
    wait = _first_wait(w, pending, poll)
    while True:
        if joining is not None:
            joined = {ref: t for ref, t in joining.take().items() if ref not in pending}
            if joined:
                now = time.monotonic()
                pending.update((ref, now) for ref in joined)
                deadline = max(deadline, now + max(joined.values()))
                wait = min(wait, _first_wait(w, joined, poll))
        polled = time.monotonic()
        try:
            found = w.slurm.jobs([*pending, *eligible])
            last_error = None
        except SlurmHooksError as exc:
            found, last_error = None, exc
        if found is not None:
            for ref in list(eligible):
                if _seen_running(w, ref, _pick(found, ref), eligible[ref]):
                    eligible.pop(ref)
            for ref in list(pending):
                result = _settle(w, ref, _pick(found, ref), pending[ref])
                if result is not None:
                    t0 = pending.pop(ref)
                    results[ref] = result
                    if result == "ok":
                        eligible[ref] = t0
        if not pending or polled + wait >= deadline:
            if joining is None or joining.close():
                break
            continue  # jobs joined while this look went on
        time.sleep(max(0.0, wait - (time.monotonic() - polled)))
        wait = min(poll, wait * POLL_GROWTH)
    for ref, t0 in pending.items():
        if last_error is not None:
            results[ref] = f"failed: {last_error}"
        else:
            results[ref] = "timed out"
        if final:
            error = str(last_error) if last_error else f"job not PENDING again within {timeout:g}s"
            step(w, "start_now", ref, "failed", t0, jobs=[ref], error=error)
    return results


def _seen_running(w: Wiring, ref: str, job: JobInfo | None, t0: float) -> bool:
    """A job made eligible, seen again: running on another node (recorded), or no longer waiting."""
    if job is None or job.finished:
        return True
    if job.started and job.nodes and not hostlist.matches(job.nodes, w.node):
        step(w, "running", ref, "ok", t0, jobs=[ref], nodes=job.nodes)
        return True
    return False


def _first_wait(w: Wiring, refs: Iterable[str], poll: float) -> float:
    """The wait after a first look at ``refs``: FIRST_POLL_S for jobs requeued just now, about half the
    time since the newest requeue for older ones (the wait a follower that had looked since then would
    have reached), at most ``poll``. A job in its grace, or one without a record, counts as just now."""
    now = time.time()
    since = min((now - rec.ts if rec is not None and rec.phase is Phase.REQUEUED and rec.ts else 0.0
                 for rec in map(lambda ref: read_record(w, ref), refs)), default=0.0)
    return min(poll, FIRST_POLL_S + (POLL_GROWTH - 1.0) * max(0.0, since))


def _pick(found: list[JobInfo], ref: str) -> JobInfo | None:
    """The record for ``ref``: a het job's leader over its other components."""
    mine = [j for j in found if j.answers_to(ref)]
    return next((j for j in mine if not j.het_job_id or j.het_job_id == j.job_id), mine[0] if mine else None)


def _settle(w: Wiring, ref: str, job: JobInfo | None, t0: float) -> str | None:
    """One look at a followed job: its final result, or ``None`` while it is still on its way."""
    rec = read_record(w, ref)
    if rec is not None and rec.phase is Phase.HEALED:
        return "healed in place"
    if rec is not None and rec.phase in WINDOWS and job is not None:
        from slurm_hooks.remedy import checkpoint  # a job in its grace only (with jobsignal, shlex)

        if rec.phase is Phase.GRACE:
            verdict = checkpoint.judge_grace(job, time.time(), rec.grace_until, rec.restarts)
        else:
            from slurm_hooks.remedy import selfheal

            verdict = selfheal.judge_window(w, job, time.time(), restarts=rec.restarts, until=rec.grace_until,
                                            heals=rec.heals)
        if verdict is checkpoint.Grace.WAITING:
            return None
        if verdict is checkpoint.Grace.LEFT:
            return _healed(w, rec, job, t0)
        if verdict is checkpoint.Grace.SELF_REQUEUED:
            _requeued(w, rec, "self", t0)
        elif verdict is checkpoint.Grace.ENDED:
            forget_record(w, ref)
            after = f"its {rec.signal}" if rec.phase is Phase.GRACE else f"its ranks on {w.node} were told to leave"
            why = ("NVRx's exit 93: its launcher decided not to restart it" if rec.phase is Phase.IN_JOB and job.failed
                   else "it checkpointed and stopped, or failed")
            step(w, "requeue", ref, "ended", t0, jobs=[ref], signal=rec.signal,
                 seconds_from_fault=round(time.time() - rec.fault_at, 3),
                 detail=f"the job ended {job.state} after {after} ({why}): not requeued")
            return f"ended {job.state}"
        elif verdict in (checkpoint.Grace.OVER, checkpoint.Grace.FAILED):
            kind = "ours" if verdict is checkpoint.Grace.OVER else "failed"
            try:
                w.slurm.requeue(ref)
            except AlreadyRequeued:
                _requeued(w, rec, "self", t0)  # it did, a moment before us
                return None
            except SlurmCommandFailed as exc:
                if kind == "ours":
                    step(w, "requeue", ref, "failed", t0, jobs=[ref], error=str(exc), signal=rec.signal)
                    return None  # the record stays: the next look (or hook run) tries again
                forget_record(w, ref)  # Slurm refuses to requeue the ended job (--no-requeue, purged): final
                step(w, "requeue", ref, "failed", t0, jobs=[ref], error=str(exc), signal=rec.signal, level="error",
                     detail=f"the job ended {job.state} in its grace after its {rec.signal}, and Slurm refused "
                            "to requeue it")
                return f"ended {job.state}, requeue refused"
            except SlurmHooksError as exc:
                step(w, "requeue", ref, "failed", t0, jobs=[ref], error=str(exc), signal=rec.signal)
                return None  # transient: the record stays, the next look (or hook run) tries again
            _requeued(w, rec, kind, t0, state=job.state)
            return None
    if job is None:
        forget_record(w, ref)
        step(w, "start_now", ref, "skipped", t0, jobs=[ref], detail="Slurm no longer knows the job")
        return "gone"
    if job.pending:
        target = job.ref  # the given id may be an array's base id: act on exactly this task
        if rec is not None and rec.nodes > 1 and not _revocation_behind(w, rec):
            return None  # a multi-node job: not within a second of its credential's revocation
        if job.held_by_admin or job.held_by_user or (job.priority == "0" and not job.held_by_launch_failure):
            forget_record(w, ref)
            step(w, "start_now", ref, "skipped", t0, jobs=[ref],
                 detail=f"job is held by someone else ({job.reason}, priority {job.priority or '?'}): left held")
            return f"held: {job.reason}"
        try:
            if rec is not None and rec.exclude:
                _exclude(w, target, rec.exclude)
            if job.held_by_launch_failure:
                w.slurm.release(target)
                step(w, "release", ref, "ok", t0, jobs=[ref], detail=job.reason)
            w.slurm.start_now(target)
        except SlurmHooksError as exc:
            step(w, "start_now", ref, "failed", t0, jobs=[ref], error=str(exc))
            return f"failed: {exc}"  # the record stays: the next hook run tries again
        forget_record(w, ref)
        step(w, "start_now", ref, "ok", t0, jobs=[ref])
        return "ok"
    if job.started and job.restarts > 0 and job.nodes \
            and not hostlist.matches(job.nodes, w.node):
        forget_record(w, ref)
        step(w, "running", ref, "ok", t0, jobs=[ref], nodes=job.nodes)
        return "already running"
    if job.finished:
        forget_record(w, ref)
        step(w, "start_now", ref, "skipped", t0, jobs=[ref], detail=f"job ended {job.state}")
        return f"ended {job.state}"
    return None


def _healed(w: Wiring, rec: Followed, job: JobInfo, t0: float) -> str:
    """A job that heals in place left this node and runs on: say so once (audit, AdminComment), and
    keep its record (later checks of the drained node leave it be)."""
    now = time.time()
    seconds = round(now - rec.fault_at, 3)
    write_record(w, replace(rec, phase=Phase.HEALED, ts=now))
    detail = (f"healed in place ({rec.heals}): its ranks left {w.node} {seconds:g}s after the fault and it runs on "
              f"({job.nodes}): not requeued")
    step(w, "requeue", rec.ref, "healed", t0, jobs=[rec.ref], heals=rec.heals, seconds_from_fault=seconds,
         nodes=job.nodes, detail=detail)
    annotate_jobs(w, [rec.ref], detail)
    return "healed in place"


def _exclude(w: Wiring, ref: str, nodes: str) -> None:
    """Add ``nodes`` to the PENDING job's ExcNodeList (what it had is kept)."""
    have = w.slurm.job_record(ref).excluded
    try:
        merged = ",".join(dict.fromkeys([*(hostlist.expand(have) if have else []), *hostlist.expand(nodes)]))
    except ValueError:
        merged = nodes
    w.slurm.exclude_nodes(ref, merged)
    step(w, "exclude", ref, "ok", time.monotonic(), jobs=[ref], nodes=merged,
         detail=f"{nodes} excluded: the job named it (it runs elsewhere)")


def _revocation_behind(w: Wiring, rec: Followed) -> bool:
    """Whether a PENDING multi-node job's credential revocation is CRED_REVOKE_DELAY_S behind: counted
    from its requeue (``ts``); for one our prolog refused, from the first look that found it PENDING
    (Slurm requeued it after the prolog exited, however long that took), which this look records."""
    now = time.time()
    if not rec.refused:
        return now >= rec.ts + CRED_REVOKE_DELAY_S
    if not rec.pending_at:
        write_record(w, replace(rec, pending_at=now))
        return False
    return now >= rec.pending_at + CRED_REVOKE_DELAY_S


def _requeued(w: Wiring, rec: Followed, kind: str, t0: float, state: str = "") -> None:
    """A job in its grace is requeued, by itself (``kind`` "self"), by us after the grace ("ours"),
    or by us once it ended FAILED in it ("failed", ``state`` its end state): say so once (audit,
    AdminComment, metric) and follow it on as any requeued job."""
    now = time.time()
    seconds = round(now - rec.fault_at, 3)
    write_record(w, replace(rec, phase=Phase.REQUEUED, ts=now))
    if kind == "self":
        detail = (f"requeued itself {seconds:g}s after the fault, on its {rec.signal} (checkpoint)"
                  if rec.phase is Phase.GRACE else f"requeued itself {seconds:g}s after the fault ({rec.heals})")
        step(w, "requeue", rec.ref, "self", t0, jobs=[rec.ref], signal=rec.signal, seconds_from_fault=seconds,
             requeued_by="self", detail=detail)
    elif kind == "ours" and rec.phase is Phase.IN_JOB:
        grace = rec.grace_until - rec.signalled_at
        detail = (f"heals in place ({rec.heals}), but did not leave {w.node} within [interop] in_job_grace "
                  f"({grace:g}s): requeued {seconds:g}s after the fault")
        step(w, "requeue", rec.ref, "ok", t0, jobs=[rec.ref], signal=rec.signal, seconds_from_fault=seconds,
             requeued_by="ours", heals=rec.heals, detail=detail)
    elif kind == "failed":
        detail = (f"ended {state or JobState.FAILED} in its grace after its {rec.signal} (its framework could not "
                  f"checkpoint it): requeued {seconds:g}s after the fault")
        step(w, "requeue", rec.ref, "ok", t0, jobs=[rec.ref], signal=rec.signal, seconds_from_fault=seconds,
             requeued_by="ours", ended=state, detail=detail)
    else:
        detail = f"no checkpoint: requeued after the grace ({rec.signal} sent, {seconds:g}s after the fault)"
        step(w, "requeue", rec.ref, "ok", t0, jobs=[rec.ref], signal=rec.signal, seconds_from_fault=seconds,
             requeued_by="ours", detail=detail)
    record_requeue_seconds(w, "self" if kind == "self" else "ours", seconds)
    annotate_jobs(w, [rec.ref], f"{detail}, from {w.node}")


def record_requeue_seconds(w: Wiring, kind: str, seconds: float) -> None:
    """The metric of seconds from fault to requeue, by kind ("self", "ours")."""
    if not w.config.metrics.textfile_dir:
        return
    from slurm_hooks.observe import metrics

    metrics.record(w.config, w.node, None, requeue_seconds=[(kind, seconds)])


def finish_followed(w: Wiring) -> dict[str, str]:
    """Finish what a follower left: jobs touched on this node that are still in their grace or
    waiting out the requeue delay.

    A listing of one directory when there is nothing to do (the prolog's healthy
    path stays off slurmctld); jobs whose follower still runs are its business;
    for the others one squeue: a job whose grace is over is requeued, and each
    PENDING job is released (our hold only) and made eligible now.
    """
    refs = []
    for name, path in _following_records(w):
        try:
            age = time.time() - os.stat(path).st_mtime
        except OSError:
            continue
        record = fsutil.read_json(path, missing=None, error=None)
        if not isinstance(record, dict):
            continue
        pid = record.get("pid")
        if age > FOLLOW_RECORD_TTL_S:
            _remove(path)
        elif record.get("phase") == Phase.HEALED.value:
            continue  # nothing to follow: it stays so that later runs leave the job be
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
    """Whether the follower that owns a record still runs: this process, a ``follow-jobs``
    process, or the watcher whose thread follows (a pid reused by anything else does not count)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    if pid == os.getpid():
        return True
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = fh.read().split(b"\0")
    except OSError:
        return False
    return b"follow-jobs" in argv or (b"watch" in argv and any(a.endswith(b"slurm_hooks") or a.endswith(b"slurm-hooks")
                                                              for a in argv))


def read_record(w: Wiring, ref: str) -> Followed | None:
    """The job's record on this node; ``None`` when there is none or it does not read."""
    try:
        return Followed.from_dict(fsutil.read_json(_following_path(w, ref), missing=None, error=None))
    except (ValueError, TypeError):
        return None


def write_record(w: Wiring, rec: Followed) -> None:
    rec = replace(rec, node=w.node, ts=rec.ts or time.time())
    try:
        os.makedirs(_following_dir(w), mode=0o700, exist_ok=True)
        fsutil.atomic_write(_following_path(w, rec.ref), rec.to_json(), mode=0o600, durable=False)
    except OSError as exc:
        print(f"slurm-hooks: cannot write {_following_path(w, rec.ref)}: {exc.strerror}", file=sys.stderr)


def _claim(w: Wiring, ref: str, pid: int) -> None:
    rec = read_record(w, ref)
    if rec is not None:
        write_record(w, replace(rec, pid=pid))


def forget_record(w: Wiring, ref: str) -> None:
    _remove(_following_path(w, ref))


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
