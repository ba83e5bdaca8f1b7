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
from dataclasses import dataclass, field
from typing import Any

from slurm_hooks import checks as registry
from slurm_hooks import fsutil, hostlist
from slurm_hooks.checks import processes
from slurm_hooks.engine import PROBE_FAILED, dcgm_level, drain_summary, snapshot_xids
from slurm_hooks.errors import SlurmHooksError
from slurm_hooks.hooks.wiring import Wiring
from slurm_hooks.models import CheckInput, Context, Report, Severity
from slurm_hooks.slurm import format_reason, may_drain, may_resume


@dataclass
class Outcome:
    drained: bool = False
    #: Not drained because the drain guard suspects the config, not the node.
    guarded: bool = False
    #: The node takes no new jobs (drained by us now or before, or by someone else).
    node_out: bool = False
    failed: list[str] = field(default_factory=list)
    requeued: list[int] = field(default_factory=list)
    resumed: bool = False
    #: What became of a pending action in this run: "retry", "done", "superseded", "dropped" or "".
    pending: str = ""

    @property
    def ok(self) -> bool:
        return not self.failed


def record_alerts(w: Wiring, report: Report, **extra: Any) -> None:
    for f in report.findings:
        if f.severity is Severity.OK:
            continue
        w.audit.write("alert", node=w.node, context=report.context.value, gpu=f.gpu, check=f.check,
                      severity=f.severity.value, action=f.action.value, message=f.message, **extra)


def _step(w: Wiring, action: str, target: str, result: str, started: float, **fields: Any) -> None:
    w.audit.write("action", node=w.node, action=action, target=target, result=result,
                  duration_s=round(time.monotonic() - started, 4), **fields)


def drain(w: Wiring, report: Report, outcome: Outcome, **extra: Any) -> None:
    """Drain this node with ``slurm-hooks: <what broke> [<action>]`` unless someone else owns it."""
    started = time.monotonic()
    reason = format_reason(drain_summary(report), report.worst_action)
    try:
        info = w.slurm.node(w.node)
        if info.drained and info.reason == reason:
            outcome.drained = outcome.node_out = True
            _write_marker(w, reason, report)  # an earlier drain may have landed after its scontrol timed out
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
        w.slurm.drain(w.node, reason)
    except SlurmHooksError as exc:
        outcome.failed.append(f"drain: {exc}")
        _step(w, "drain", w.node, "failed", started, reason=reason, error=str(exc), **extra)
        return
    outcome.drained = outcome.node_out = True
    _write_marker(w, reason, report)
    _step(w, "drain", w.node, "ok", started, reason=reason, **extra)


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


def requeue_jobs(w: Wiring, outcome: Outcome, follow: str = "detached") -> None:
    """Requeue every job on this node, then make it eligible at once on a healthy node.

    ``scontrol requeue`` sends SIGTERM and gives the job KillWait seconds to
    checkpoint before SIGKILL; whatever it exits with, it is requeued, not
    failed. Requeued jobs wait out a ~121 s delay unless told ``StartTime=now``
    once PENDING; :func:`follow_requeued` does that, ``follow`` says where:
    "detached" (a process that outlives the health check), "thread" (the
    watcher, a daemon), "inline", or "none".
    """
    started = time.monotonic()
    try:
        jobs = w.slurm.jobs_on_node(w.node)
    except SlurmHooksError as exc:
        outcome.failed.append(f"list jobs: {exc}")
        _step(w, "requeue", w.node, "failed", started, error=f"cannot list jobs: {exc}")
        return
    for job in jobs:
        t0 = time.monotonic()
        if not job.batch:
            _step(w, "requeue", str(job.job_id), "skipped", t0, jobs=[job.job_id],
                  detail="interactive job (srun/salloc) cannot be requeued; it will fail with the node")
            continue
        if not job.requeue:
            _step(w, "requeue", str(job.job_id), "skipped", t0, jobs=[job.job_id],
                  detail="job was submitted with --no-requeue (or JobRequeue=0); it will fail with the node")
            continue
        try:
            w.slurm.requeue(job.job_id)
        except SlurmHooksError as exc:
            if "pending" in str(exc).lower():
                # Another run (the watcher, the next health check) requeued it a moment ago.
                _step(w, "requeue", str(job.job_id), "already", t0, jobs=[job.job_id], detail=str(exc))
                continue
            outcome.failed.append(f"requeue {job.job_id}: {exc}")
            _step(w, "requeue", str(job.job_id), "failed", t0, jobs=[job.job_id], error=str(exc))
            continue
        outcome.requeued.append(job.job_id)
        _step(w, "requeue", str(job.job_id), "ok", t0, jobs=[job.job_id])
    if outcome.requeued:
        follow_jobs(w, outcome.requeued, follow)


def follow_jobs(w: Wiring, job_ids: Iterable[int], how: str) -> None:
    job_ids = [int(j) for j in job_ids]
    timeout = float(w.config.remediation.requeue_grace) + 60.0
    if how == "inline":
        follow_requeued(w, job_ids, timeout)
    elif how == "thread":
        threading.Thread(target=follow_requeued, args=(w, job_ids, timeout), name="follow-jobs", daemon=True).start()
    elif how == "detached":
        import subprocess  # only when a job has to be followed: not on the healthy path

        # -I: never import from the current directory (slurmd's log dir, an admin's /tmp) as root.
        argv = [sys.executable, "-I", "-m", "slurm_hooks", "follow-jobs", "--node", w.node,
                "--timeout", str(timeout), *[str(j) for j in job_ids]]
        env = dict(os.environ)
        if w.config.path:
            env["SLURM_HOOKS_CONFIG"] = w.config.path
        subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True, close_fds=True, env=env, cwd="/")


def follow_requeued(w: Wiring, job_ids: list[int], timeout: float, poll: float = 0.2) -> dict[int, str]:
    """Wait for each job to be PENDING again, release it if held, and make it start now."""
    pending = {int(j): time.monotonic() for j in job_ids}
    results: dict[int, str] = {}
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        for job_id in list(pending):
            try:
                job = w.slurm.job(job_id)
            except SlurmHooksError as exc:
                if time.monotonic() + poll >= deadline:
                    t0 = pending.pop(job_id)
                    results[job_id] = f"failed: {exc}"
                    _step(w, "start_now", str(job_id), "failed", t0, jobs=[job_id], error=str(exc))
                continue
            state = job.state.upper()
            if state.startswith("PENDING"):
                t0 = pending.pop(job_id)
                try:
                    if "held" in job.reason.lower() or job.extra.get("priority") == "0":
                        w.slurm.release(job_id)
                        _step(w, "release", str(job_id), "ok", t0, jobs=[job_id])
                    w.slurm.start_now(job_id)
                    results[job_id] = "ok"
                    _step(w, "start_now", str(job_id), "ok", t0, jobs=[job_id])
                except SlurmHooksError as exc:
                    results[job_id] = f"failed: {exc}"
                    _step(w, "start_now", str(job_id), "failed", t0, jobs=[job_id], error=str(exc))
            elif state.startswith(("RUNNING", "CONFIGURING")) and job.restarts > 0 and job.nodes \
                    and not hostlist.matches(job.nodes, w.node):
                pending.pop(job_id)
                results[job_id] = "already running"
            elif state.startswith(("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL")):
                t0 = pending.pop(job_id)
                results[job_id] = f"ended {state}"
                _step(w, "start_now", str(job_id), "skipped", t0, jobs=[job_id], detail=f"job ended {state}")
        if pending:
            time.sleep(poll)
    for job_id, t0 in pending.items():
        results[job_id] = "timed out"
        _step(w, "start_now", str(job_id), "failed", t0, jobs=[job_id],
              error=f"job not PENDING again within {timeout:g}s")
    return results


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
    expect = w.config.expectations_for(w.node)
    ran = {c.name for c in registry.for_context(report.context)} | {PROBE_FAILED}
    if dcgm_level(report.context, expect) <= 0:
        ran.discard("dcgm")
    leftovers = {"leftover", "busy"} & set(record.get("checks", ()))
    missing = sorted(set(record.get("checks", ())) - ran - leftovers)
    if missing:
        return (f"drained for {', '.join(missing)}, which the periodic check does not run: "
                "resume by hand (scontrol update State=RESUME) once mended")
    snap = report.snapshot
    if snap is not None and info.base_state in ("IDLE", "DRAINED", "DOWN"):
        # An idle node's GPUs should be empty: what is on them now is left over.
        left = list(processes.check_leftovers(CheckInput(snap, expect, Context.EPILOG)))
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


def _write_marker(w: Wiring, reason: str, report: Report) -> None:
    """Remember that we drained this node: when, why, and for which XID events and checks."""
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
