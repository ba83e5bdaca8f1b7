"""Jobs that heal themselves: work with the job's own resilience, never against it.

A job that heals in place (NVRx's ``ft_launcher``, torchrun with elastic ``--nnodes``, or
declared: :mod:`slurm_hooks.slurm.jobheal`) and sits on a node we drain is not requeued under
it. Its ranks on this node get SIGTERM (Slurm has no way to signal one node's part of a step:
``scancel --nodelist`` picks jobs, not nodes; we run on the node, so its processes are ours to
reach), and it opens the follower's in-job window (:attr:`.follower.Phase.IN_JOB`,
``[interop] in_job_grace``): a job whose ranks left this node and that runs on is *healed in
place*, never requeued (the record stays, :attr:`.follower.Phase.HEALED`, so that later checks of
the drained node leave it be); one still here when the window is over is requeued as any other.
A job whose batch script runs on this node cannot leave it, and one with no rank here to tell
cannot be seen to leave: both are requeued at once, as before.

What the job learned is used (:func:`after_job`, from the epilog): Megatron-LM's exit 16
("resume on other GPUs") and 17 (validation failed), and NVRx's exit 1 after an unhealthy node
health check, record a suspect on the node (fed to ``isolate`` and the repeat-offender count);
exit 16 is requeued once with this node excluded; NVRx's exit 93 ("do not restart") is never
requeued by us. Exit codes are only taken at their framework's word for a job marked with it: a
plain script that exits 16 is a plain failure.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping

from slurm_hooks.errors import SlurmHooksError
from slurm_hooks.remedy import checkpoint
from slurm_hooks.remedy.audit import annotate_jobs, step
from slurm_hooks.remedy.wiring import Wiring
from slurm_hooks.slurm import JobInfo, JobRecord, jobheal, jobsignal
from slurm_hooks.slurm.jobheal import Heals, Marks
from slurm_hooks.values import dataclass

#: Megatron-LM's RerunStateMachine: resume on other GPUs to disambiguate; validation failed.
EXIT_MEGATRON_RESUME = 16
EXIT_MEGATRON_VALIDATION = 17
#: NVRx: the launcher decided not to restart (never requeued); an unhealthy node (its health check said so).
EXIT_NVRX_NO_RESTART = 93
EXIT_NVRX_UNHEALTHY = 1


@dataclass(frozen=True)
class Proc:
    """One process of the job on this node."""

    pid: int
    #: Its step (``SLURM_STEP_ID``); "" for the batch script and what it starts outside srun.
    step: str
    environ: bytes
    cmdline: str


def job_processes(job_id: int, node: str, proc: str = "") -> list[Proc]:
    """The job's processes on this node, as :func:`.checkpoint.job_environs` tells them."""
    proc = proc or checkpoint.PROC_ROOT
    out = []
    for pid, environ in checkpoint.job_environs(job_id, node, proc):
        cmd = checkpoint.read_head(os.path.join(proc, pid, "cmdline"), 8192) or b""
        out.append(Proc(int(pid), jobsignal.environ_value(environ, "SLURM_STEP_ID") or "", environ,
                        cmd.replace(b"\0", b" ").decode("utf-8", "replace").strip()))
    return out


def ranks(procs: list[Proc]) -> list[Proc]:
    """The processes of the job's steps (srun's tasks and what they start), not its batch script."""
    return [p for p in procs if p.step and p.step not in ("batch", "extern")]


def marks(w: Wiring, job: JobInfo, record: JobRecord | None = None, procs: list[Proc] | None = None) -> Marks:
    """What the job says of its own resilience: its ``--comment`` or environment declaration first,
    else what its processes' command lines on this node and its batch script show."""
    if record is None:
        record = read_record(w, job)
    declared = jobheal.from_comment(record.comment)
    if declared:
        return Marks(declared, "comment")
    if procs is None:
        procs = job_processes(job.job_id, w.node)
    for p in procs:
        declared = jobheal.parse_declared(jobsignal.environ_value(p.environ, jobheal.ENV_KEY))
        if declared:
            return Marks(declared, "environment")
    seen = frozenset().union(*(jobheal.from_text(p.cmdline) for p in procs))
    if seen:
        return Marks(seen, "command line")
    seen = jobheal.from_text(record.command) | jobheal.from_text(checkpoint.script(w, job))
    return Marks(seen, "script") if seen else jobheal.NONE


def read_record(w: Wiring, job: JobInfo | str) -> JobRecord:
    try:
        return w.slurm.job_record(job.ref if isinstance(job, JobInfo) else job)
    except SlurmHooksError:
        return JobRecord()


def tell_ranks(w: Wiring, job: JobInfo, found: Marks, record: JobRecord, procs: list[Proc]) -> tuple[float, str]:
    """Tell the job's ranks on this node to go (SIGTERM): the in-job window's length, or 0 and why
    the job is requeued now instead."""
    grace = w.config.interop.in_job_grace
    if grace <= 0:
        return 0.0, "[interop] in_job_grace = 0"
    if record.batch_host == w.node:
        return 0.0, f"its batch script runs on {w.node}: it cannot leave the node"
    here = ranks(procs)
    if not here:
        return 0.0, f"no rank of it found on {w.node} to tell"
    t0 = time.monotonic()
    told = tell(here)
    if not told:
        return 0.0, f"none of its {len(here)} process(es) on {w.node} could be signalled"
    step(w, "signal", job.ref, "ok", t0, jobs=[job.ref], signal="TERM", via="ranks", heals=found.spec,
         source=found.source, ranks=told, grace_s=round(grace, 3),
         detail=f"heals in place ({found.spec}, from its {found.source}): SIGTERM to its {told} process(es) on "
                f"{w.node}; requeued only if it has not left the node within {grace:g}s")
    annotate_jobs(w, [job.ref], f"heals in place ({found.spec}): its ranks on {w.node} were told to leave (SIGTERM); "
                                f"requeued only if still there after {grace:g}s")
    return grace, ""


def tell(procs: list[Proc]) -> int:
    """SIGTERM to each process (gone ones aside); how many got it."""
    told = 0
    for p in procs:
        try:
            os.kill(p.pid, signal.SIGTERM)
            told += 1
        except (ProcessLookupError, PermissionError):
            continue
    return told


def judge_window(w: Wiring, job: JobInfo, now: float, *, restarts: int, until: float, heals: str) -> checkpoint.Grace:
    """Where a job in its in-job window stands: requeued by itself, ended (FAILED: ours to requeue,
    unless it is NVRx's "do not restart"), left this node (healed), still here (waiting, then over)."""
    if job.pending or job.restarts > restarts:
        return checkpoint.Grace.SELF_REQUEUED
    if job.finished:
        if job.failed and not no_restart(w, job, heals):
            return checkpoint.Grace.FAILED
        return checkpoint.Grace.ENDED
    if job.completing:
        return checkpoint.Grace.WAITING
    if not ranks(job_processes(job.job_id, w.node)):
        return checkpoint.Grace.LEFT
    return checkpoint.Grace.WAITING if now < until else checkpoint.Grace.OVER


def no_restart(w: Wiring, job: JobInfo, heals: str) -> bool:
    """An NVRx job that ended with exit 93: its launcher decided not to restart."""
    if Heals.NVRX.value not in heals.split(","):
        return False
    return read_record(w, job).exit_code == EXIT_NVRX_NO_RESTART


def still_away(w: Wiring, job: JobInfo, restarts: int) -> bool:
    """A job healed in place is still off this node (no rank here) and has not been requeued since."""
    return job.restarts == restarts and not ranks(job_processes(job.job_id, w.node))


# -- what the job's exit says (the epilog: :mod:`.jobexit`)


def exit_status(env: Mapping[str, str]) -> tuple[int, int] | None:
    """(exit code, signal) of the job, from the epilog's ``SLURM_JOB_EXIT_CODE2`` (``16:0``), else
    ``SLURM_JOB_EXIT_CODE`` (a wait status); ``None`` when neither reads."""
    text = env.get("SLURM_JOB_EXIT_CODE2", "").strip()
    code, _, sig = text.partition(":")
    if code.isdigit():
        return int(code), int(sig) if sig.isdigit() else 0
    raw = env.get("SLURM_JOB_EXIT_CODE", "").strip()
    if raw.isdigit():
        status = int(raw)
        return (status >> 8) & 0xFF, status & 0x7F
    return None
