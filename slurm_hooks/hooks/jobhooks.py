"""Prolog and epilog: judge only the job's GPUs, as fast as the launch path needs.

The prolog's healthy path is a probe, pure checks, this node's XID history and
one small baseline file; it never calls scontrol. On a bad GPU it drains the
node with a reason naming the fault and exits 1; Slurm then requeues the job,
and a detached follower releases it if held and clears the requeue delay so it
starts elsewhere now. Both hooks then finish a remediation an earlier run left
pending on this node (one failed ``open`` when there is none), within the time
their deadline leaves.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Mapping

from slurm_hooks import fsutil
from slurm_hooks.engine import parse_gpu_list
from slurm_hooks.errors import SlurmHooksError
from slurm_hooks.hooks import healthcheck
from slurm_hooks.models import Context, NodeSnapshot, Report, Severity, snapshot_from_dict, snapshot_to_dict
from slurm_hooks.remedy import drain, follower, repairs
from slurm_hooks.remedy.audit import annotate_jobs
from slurm_hooks.remedy.outcome import Outcome, record_alerts
from slurm_hooks.remedy.requeue import in_slurms_numbering
from slurm_hooks.remedy.wiring import Wiring


def job_gpus(env: Mapping[str, str]) -> list[str] | None:
    """SLURM_JOB_GPUS (Slurm's GRES indexes) first, then CUDA_VISIBLE_DEVICES or ROCR_VISIBLE_DEVICES
    (indexes or UUIDs: ROCm's ``GPU-<16 hex>`` in the latter), whichever the job's environment has."""
    return (parse_gpu_list(env.get("SLURM_JOB_GPUS")) or parse_gpu_list(env.get("CUDA_VISIBLE_DEVICES"))
            or parse_gpu_list(env.get("ROCR_VISIBLE_DEVICES")))


def job_id(env: Mapping[str, str]) -> str | None:
    value = env.get("SLURM_JOB_ID", "").strip()
    return value if value.isdigit() else None


def prolog(w: Wiring, env: Mapping[str, str] = os.environ) -> int:
    return _run(w, _prolog, env)


def epilog(w: Wiring, env: Mapping[str, str] = os.environ) -> int:
    return _run(w, _epilog, env)


def _run(w: Wiring, hook: Callable[[Wiring, Mapping[str, str]], int], env: Mapping[str, str]) -> int:
    """The hook under one deadline, then whatever an earlier run left on this node: a pending
    action, and jobs a requeue follower left waiting (one failed open and one directory listing
    when there are none)."""
    w.start_deadline(w.config.check.deadline)
    try:
        return hook(w, env)
    finally:
        healthcheck.finish_pending(w, respect_backoff=True)
        follower.finish_followed(w)


def _prolog(w: Wiring, env: Mapping[str, str]) -> int:
    gpus, jid = job_gpus(env), job_id(env)
    if gpus is None:
        return 0  # a job without GPUs is not ours to judge; the health check covers the node
    report = healthcheck.judge(w, Context.PROLOG, gpus=gpus)
    if not report.drain_findings():
        if jid:
            _save_baseline(w, jid, report.snapshot)
        _print(report)
        return 0
    outcome = _drain(w, report, jid)
    if outcome.monitor_only:
        print("slurm-hooks prolog: not refusing the job: monitor-only ([check] drain = false)", file=sys.stderr)
        return 0
    if outcome.guarded:
        print("slurm-hooks prolog: not refusing the job: the drain guard suspects the config (see the audit log)",
              file=sys.stderr)
        return 0
    if jid:
        # The job is requeued once this prolog exits: no point in waiting for it here.
        now = time.time()
        rec = follower.Followed(jid, w.node, fault_at=now, ts=now, nodes=_node_count(env), refused=True)
        follower.follow_jobs(w, [jid], follower.Follow.DETACHED, fallback=False, records=[rec])
        held = [int(g) for g in env.get("SLURM_JOB_GPUS", "").split(",") if g.strip().isdigit()]
        annotate_jobs(w, [jid], f"refused by the prolog on {w.node}, "
                      f"{drain.findings_summary(report.drain_findings())}{_not_requeued_note(w, jid)}"
                      + in_slurms_numbering(w, held))
    return 1


def _node_count(env: Mapping[str, str]) -> int:
    """The job's node count from the prolog's SLURM_JOB_NODELIST (1 when it does not say)."""
    from slurm_hooks.slurm import hostlist

    try:
        return max(1, len(hostlist.expand(env.get("SLURM_JOB_NODELIST", "").strip() or "x")))
    except ValueError:
        return 1


def _not_requeued_note(w: Wiring, jid: str) -> str:
    """What Slurm does with a job the prolog refuses and cannot requeue: a ``--no-requeue`` batch
    job (unless ``PrologFlags=ForceRequeueOnFail``) and every salloc/srun allocation are cancelled,
    not started elsewhere (slurmd's ``_launch_job_fail``); the note reads ``PrologFlags`` to say which.
    "" for a job Slurm requeues, or when Slurm cannot say."""
    try:
        job = w.slurm.job(jid)
    except SlurmHooksError:
        return ""
    if not job.batch:
        return "; an interactive allocation cannot be requeued: Slurm ends it, run it again"
    if not job.requeue:
        if force_requeue_on_fail():
            return "; --no-requeue, but PrologFlags=ForceRequeueOnFail: Slurm requeues it all the same"
        return "; --no-requeue: Slurm cancels the job rather than start it elsewhere, resubmit it"
    return ""


def force_requeue_on_fail(path: str | None = None) -> bool:
    """slurm.conf's ``PrologFlags`` has ``ForceRequeueOnFail``: a refused ``--no-requeue`` batch job is
    requeued all the same. Read only on a refusal, never on the prolog's healthy path."""
    from slurm_hooks.slurm.conffile import global_values

    flags = global_values(("PrologFlags",), path).get("prologflags", "")
    return "forcerequeueonfail" in {f.strip().lower() for f in flags.split(",")}


def _epilog(w: Wiring, env: Mapping[str, str]) -> int:
    gpus, jid = job_gpus(env), job_id(env)
    if gpus is None:
        return 0
    baseline = _pop_baseline(w, jid) if jid else None
    failed = env.get("SLURM_JOB_EXIT_CODE", "0").strip() not in ("", "0")
    report = healthcheck.judge(w, Context.EPILOG, gpus=gpus, baseline=baseline, job_failed=failed)
    if not report.drain_findings():
        _print(report)
        repairs.repair_after_job(w, jid, healthcheck.rejudge(w))  # the last job off a node we drained: the ladder may climb
        if failed:  # what a framework's exit says (remedy/selfheal.py), else a multi-node job's suspect
            from slurm_hooks.remedy import jobexit, suspect

            said = jobexit.after_job(w, env, jid)
            if said:
                print(f"slurm-hooks epilog: job {jid}: {said}", file=sys.stderr)
            else:
                suspect.after_job(w, env, jid)
        return 0
    outcome = _drain(w, report, jid)
    repairs.repair_after_job(w, jid, healthcheck.rejudge(w))
    # Our drain carries the reason; if it could not be written, a non-zero exit
    # makes Slurm drain the node itself ("Epilog error"), so nothing is lost.
    return 0 if outcome.drained or outcome.monitor_only else 1


def _drain(w: Wiring, report: Report, jid: str | None) -> Outcome:
    """Audit the findings and drain the node, both naming the job; then print the findings.
    A drain that fails for a transient reason stays pending for the next run."""
    record_alerts(w, report, job=jid)
    outcome = Outcome()
    healthcheck.take_out(w, report, outcome, follow="none", requeue=False, job=jid, context=report.context.value)
    _print(report)
    return outcome


def _print(report: Report) -> None:
    """Each fault, and each of the job's GPUs that could not be told apart (judged as every GPU)."""
    for f in report.findings:
        if f.severity is not Severity.OK or f.check == "gpu-count":
            print(f"slurm-hooks {report.context.value}: {f.line()}", file=sys.stderr)


def _baseline_path(w: Wiring, jid: str) -> str:
    return w.state_path("jobs", f"{w.node}-{jid}.json")


def _save_baseline(w: Wiring, jid: str, snap: NodeSnapshot | None) -> None:
    if snap is None or snap.error:
        return
    try:
        fsutil.atomic_write(_baseline_path(w, jid), json.dumps(snapshot_to_dict(snap)), mode=0o600, durable=False)
    except OSError as exc:
        print(f"slurm-hooks prolog: cannot save baseline: {exc.strerror}", file=sys.stderr)


def _pop_baseline(w: Wiring, jid: str) -> NodeSnapshot | None:
    path = _baseline_path(w, jid)
    try:
        snap = snapshot_from_dict(fsutil.read_json(path, missing=None, error=None))
    except (AttributeError, KeyError, TypeError, ValueError):  # none, unreadable, or not a snapshot
        return None
    try:
        os.unlink(path)
    except OSError:
        pass
    return snap
