"""What a job's own exit says, read by the epilog: the frameworks' exit codes (:mod:`.selfheal`).

Megatron-LM's exit 16 (resume on other GPUs) and 17 (validation failed) and NVRx's exit 1 after an
unhealthy node health check record a suspect on the node (and its GPU, where the job held one
here); exit 16 of a job that ran on this node alone is requeued once without the node; NVRx's exit
93 ("do not restart") is never requeued by us. Only for a job marked with its framework: a plain
script that exits 16 is a plain failure (:mod:`.suspect` sees to those).
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from slurm_hooks.errors import SlurmHooksError
from slurm_hooks.remedy import follower, offenders
from slurm_hooks.remedy import suspect as suspects
from slurm_hooks.remedy.audit import annotate_jobs, step
from slurm_hooks.remedy.follower import Followed, Phase
from slurm_hooks.remedy.selfheal import (
    EXIT_MEGATRON_RESUME,
    EXIT_MEGATRON_VALIDATION,
    EXIT_NVRX_NO_RESTART,
    EXIT_NVRX_UNHEALTHY,
    exit_status,
    marks,
    read_record,
)
from slurm_hooks.remedy.wiring import Wiring
from slurm_hooks.slurm import JobInfo
from slurm_hooks.slurm.errors import AlreadyRequeued
from slurm_hooks.slurm.jobheal import Heals, Marks


def after_job(w: Wiring, env: Mapping[str, str], jid: str | None) -> str:
    """The epilog's look at how a marked job ended (see the module's doc). Returns what it did ("" for
    nothing: any exit but 1, 16, 17 and 93 costs a dict lookup). Never raises: an epilog that fails
    drains the node, and none of this is a reason to."""
    status = exit_status(env)
    if not jid or status is None or status[1] or status[0] not in (
            EXIT_MEGATRON_RESUME, EXIT_MEGATRON_VALIDATION, EXIT_NVRX_NO_RESTART, EXIT_NVRX_UNHEALTHY):
        return ""
    try:
        return _after_marked_job(w, env, jid, status[0])
    except Exception as exc:  # noqa: BLE001 - see above
        return f"job's exit not read: {type(exc).__name__}: {exc}"


def _after_marked_job(w: Wiring, env: Mapping[str, str], jid: str, code: int) -> str:
    try:
        job = w.slurm.job(jid)
    except SlurmHooksError as exc:
        return f"job {jid} not read: {exc}"
    record = read_record(w, job)
    found = marks(w, job, record, procs=[])
    if code in (EXIT_MEGATRON_RESUME, EXIT_MEGATRON_VALIDATION) and Heals.MEGATRON in found:
        why = ("Megatron-LM exit 16: a result that reproduced on this GPU, to be resumed on other GPUs"
               if code == EXIT_MEGATRON_RESUME else "Megatron-LM exit 17: result validation failed")
        said = suspect(w, env, job, code, why, found)
        if code == EXIT_MEGATRON_RESUME:
            said += "; " + _requeue_elsewhere(w, env, job, why)
        return said
    if code == EXIT_NVRX_UNHEALTHY and Heals.NVRX in found:
        return suspect(w, env, job, code, "NVRx ft_launcher exit 1: its node health check found this node unhealthy",
                       found)
    if code == EXIT_NVRX_NO_RESTART and Heals.NVRX in found:
        step(w, "requeue", job.ref, "not requeued", time.monotonic(), jobs=[job.ref], heals=found.spec, exit_code=code,
             detail="NVRx exit 93: its launcher decided not to restart the job; not requeued by us")
        return "exit 93: not requeued"
    return ""


def suspect(w: Wiring, env: Mapping[str, str], job: JobInfo, code: int, why: str, found: Marks) -> str:
    """A suspect on this node (and its GPU, where the job held one here), from what the job said: an
    audit ``suspect`` record that ``isolate`` reads, one entry of the suspects' history (a repeat
    starts ``isolate`` under ``[isolate] auto``), and one entry of the node's repeat-offender count."""
    nodes = suspects.job_nodes(env) or [w.node]
    held = [int(g) for g in env.get("SLURM_JOB_GPUS", "").split(",") if g.strip().isdigit()]
    gpus = tuple(held) if len(held) == 1 else ()
    where = f"{w.node}" + (f" GPU {gpus[0]} (Slurm's numbering)" if gpus else "")
    detail = f"job {job.ref}: {why}: {where} is a suspect (no drain)"
    w.audit.write("action", node=w.node, action="suspect", target=w.node, result="recorded", jobs=[job.ref],
                  detail=detail, nodes=nodes, exit_code=f"{code}:0", heals=found.spec, source=found.source,
                  **({"gpus": list(gpus)} if gpus else {}), partition=env.get("SLURM_JOB_PARTITION", ""))
    suspects.remember(w, job.ref, nodes, f"{code}:0", env.get("SLURM_JOB_PARTITION", ""))
    trouble = offenders.record(w, offenders.Remediation(time.time(), why, "suspect", gpus, context="epilog"))
    return f"suspect recorded ({where})" + (f"; {trouble}" if trouble else "")


def _requeue_elsewhere(w: Wiring, env: Mapping[str, str], job: JobInfo, why: str) -> str:
    """Requeue a job that ran on this node alone once, excluding this node; never one on its way back
    already (it requeued itself, or Slurm's ``RequeueExit`` did), never a ``--no-requeue`` one. A job
    on several nodes is not: every node's epilog sees the same exit and none is named, so each is a
    suspect and ``isolate`` finds the culprit (requeued on the same nodes, Megatron-LM would only
    ask again)."""
    nodes = suspects.job_nodes(env) or [w.node]
    if nodes != [w.node]:
        return f"on {len(nodes)} nodes, none named: not requeued by us (each node is a suspect)"
    t0 = time.monotonic()
    if not job.requeue:
        step(w, "requeue", job.ref, "not requeued", t0, jobs=[job.ref], level="warning",
             detail=f"{why}; --no-requeue: not requeued")
        return "not requeued (--no-requeue)"
    if job.pending or job.restarts > _started_as(env):
        step(w, "requeue", job.ref, "already", t0, jobs=[job.ref], detail=f"{why}; already requeued: not again")
        return "already requeued"
    exclude = w.node
    now = time.time()
    rec = Followed(job.ref, w.node, Phase.REQUEUED, fault_at=now, ts=now, exclude=exclude)
    follower.write_record(w, rec)
    try:
        w.slurm.requeue(job.ref)
    except AlreadyRequeued as exc:
        step(w, "requeue", job.ref, "already", t0, jobs=[job.ref], detail=str(exc))
        return "already requeued"
    except SlurmHooksError as exc:
        follower.forget_record(w, job.ref)
        step(w, "requeue", job.ref, "failed", t0, jobs=[job.ref], error=str(exc), detail=why)
        return f"requeue failed: {exc}"
    detail = f"{why}: requeued once, to run without {exclude}"
    step(w, "requeue", job.ref, "ok", t0, jobs=[job.ref], requeued_by="ours", exclude=exclude, detail=detail)
    annotate_jobs(w, [job.ref], f"{detail}, from {w.node}")
    follower.follow_jobs(w, [job.ref], follower.Follow.DETACHED, fallback=False, records=[rec])
    return f"requeued without {exclude}"


def _started_as(env: Mapping[str, str]) -> int:
    try:
        return int(env.get("SLURM_JOB_RESTART_COUNT", "0") or 0)
    except ValueError:
        return 0
