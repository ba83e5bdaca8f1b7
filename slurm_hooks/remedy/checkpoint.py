"""The job's own checkpoint: its framework's signal first, then a requeue only if it does not requeue itself.

Training launchers speak different contracts: submitit (``--signal=USR2@90``) and
Lightning (``SIGUSR1``) checkpoint on their signal and run ``scontrol requeue`` themselves,
ignoring SIGTERM; Megatron-LM checkpoints on SIGTERM and does not requeue itself. A
plain ``scontrol requeue`` (SIGTERM, KillWait, SIGKILL) loses every step of the first
kind since their last periodic save. So on a fault a job that declares a signal
(:mod:`slurm_hooks.slurm.jobsignal`; or the site's ``[requeue] signal`` policy) gets it
first, the way Slurm would send it, and then has a grace to requeue itself or end;
the follower (:mod:`.follower`) watches the grace and requeues it only if it did not.
Jobs without a signal keep the plain requeue.

What is read here is the user's: a script is read without following links, only
if it is a regular file, and only its head; nothing read reaches a command line
but the signal's name from a fixed table.
"""

from __future__ import annotations

import enum
import os
import stat
from collections.abc import Iterator

from slurm_hooks.errors import SlurmHooksError
from slurm_hooks.remedy.wiring import Wiring
from slurm_hooks.slurm import JobInfo, JobState, jobsignal
from slurm_hooks.slurm.jobheal import Heals, Marks
from slurm_hooks.slurm.jobsignal import JobSignal, Source, Target

#: Largest ``/proc/<pid>/environ`` read (the kernel caps a process's environment far above this).
ENVIRON_MAX_BYTES = 256 * 1024
#: Processes looked at on this node for the job's environment, at most.
PROC_SCAN_MAX = 4096
#: Where a job's processes are read (its environment, its ranks, what it declares): the kernel's.
#: A test suite off the testbed points it at a tree of its own, since the machine's real jobs carry
#: the same job ids and node names as its in-memory Slurm's.
PROC_ROOT = "/proc"


def read_signal(w: Wiring, job: JobInfo, heals: Marks | None = None) -> JobSignal | None:
    """The job's checkpoint signal, in sbatch's order: command line (its submit line:
    ``scontrol show job`` on 25.11+, else ``sacct -o SubmitLine``) over ``SBATCH_SIGNAL`` in its
    environment over its script's ``#SBATCH --signal``; else the site's policy for its
    partition, else ``[requeue] signal``; ``None`` for none at all.

    The script is read from the batch host's spool copy when this node is the batch host
    (a file read), else from ``scontrol write batch_script``. A source that cannot be read
    is skipped: at worst the job keeps the plain requeue. A Lightning job (``heals``) that declares
    none gets Lightning's own default, SIGUSR1, before the site's policy.
    """
    cfg = w.config.requeue
    line = None
    if cfg.submit_line:
        try:
            line = jobsignal.from_submit_line(w.slurm.submit_line(job.ref))
        except SlurmHooksError:
            line = None  # no slurmdbd before 25.11, or it does not answer: the other sources still count
    found = line or jobsignal.from_environment(environment_value(job.job_id, "SBATCH_SIGNAL", w.node)) \
        or jobsignal.from_script(script(w, job))
    if found is None and heals is not None and Heals.LIGHTNING in heals:
        found = jobsignal.JobSignal("USR1", source=Source.FRAMEWORK)
    return found or policy(w, job)


def policy(w: Wiring, job: JobInfo) -> JobSignal | None:
    """``[requeue] partitions`` for the job's partition, else ``[requeue] signal`` ("" = none)."""
    cfg = w.config.requeue
    spec = cfg.signal
    if cfg.partitions:
        try:
            partition = w.slurm.job_partition(job.ref)
        except SlurmHooksError:
            partition = ""
        spec = cfg.partitions.get(partition, spec)
    return jobsignal.parse_spec(spec, Source.POLICY) if spec else None


def script(w: Wiring, job: JobInfo) -> bytes:
    """The head of the job's batch script: the batch host's spool copy, else ``scontrol write batch_script``."""
    data = spool_script(w.config.requeue.spool_dir, w.node, job.job_id)
    if data is not None:
        return data
    try:
        return w.slurm.batch_script(job.ref)[: jobsignal.SCRIPT_MAX_BYTES]
    except SlurmHooksError:
        return b""


def spool_script(spool_dir: str, node: str, job_id: int) -> bytes | None:
    """The head of the batch host's copy of the job's script (``<SlurmdSpoolDir>/job<id>/slurm_script``);
    ``None`` when this node does not hold it. Never follows a link, never opens a FIFO or device."""
    path = os.path.join(spool_dir.replace("%n", node).replace("%h", os.uname().nodename),
                        f"job{job_id:05d}", "slurm_script")
    return read_head(path, jobsignal.SCRIPT_MAX_BYTES)


def read_head(path: str, limit: int) -> bytes | None:
    """At most ``limit`` bytes of a regular file, opened without following a link and without
    blocking; ``None`` for anything else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks, left = [], limit
        while left > 0:
            chunk = os.read(fd, min(left, 65536))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def environment_value(job_id: int, key: str, node: str, proc: str = "") -> str | None:
    """``key`` in the environment of one of the job's processes on this node (the first found);
    ``None`` when none runs here or none has it."""
    for _, environ in job_environs(job_id, node, proc):
        return jobsignal.environ_value(environ, key)
    return None


def job_environs(job_id: int, node: str, proc: str = "") -> Iterator[tuple[str, bytes]]:
    """(pid, environment) of each of the job's processes on this node. A process is the job's when
    its ``SLURM_JOB_ID`` and ``SLURMD_NODENAME`` say so (and its ``SLURM_CONF`` is ours, where we
    have one: several clusters on one host, as the testbeds, reuse job ids). Looks at
    PROC_SCAN_MAX processes at most, ENVIRON_MAX_BYTES each; ``proc``: :data:`PROC_ROOT` unless given."""
    proc = proc or PROC_ROOT
    marker = f"SLURM_JOB_ID={job_id}".encode()
    conf = os.environ.get("SLURM_CONF")
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit()][:PROC_SCAN_MAX]
    except OSError:
        return
    for pid in pids:
        data = read_head(os.path.join(proc, pid, "environ"), ENVIRON_MAX_BYTES)
        if not data or marker not in data:
            continue
        if jobsignal.environ_value(data, "SLURM_JOB_ID") != str(job_id) \
                or jobsignal.environ_value(data, "SLURMD_NODENAME") != node \
                or (conf and jobsignal.environ_value(data, "SLURM_CONF") not in (None, conf)):
            continue
        yield pid, data


def grace_seconds(w: Wiring, sig: JobSignal) -> float:
    """``[requeue] checkpoint_grace``, never past the job's own ``@TIME`` nor KillWait."""
    grace = min(w.config.requeue.checkpoint_grace, float(sig.warn_s))
    try:
        kill_wait = w.slurm.kill_wait()
    except SlurmHooksError:
        kill_wait = None
    return max(0.0, min(grace, kill_wait) if kill_wait is not None else grace)


def target(w: Wiring, sig: JobSignal) -> str:
    """How to send it: as Slurm would (steps; the batch shell for ``B:``), or ``--full`` where configured."""
    if w.config.requeue.full:
        return "full"
    return "batch" if sig.target is Target.BATCH else "steps"


def deliver(w: Wiring, job: JobInfo, sig: JobSignal) -> str:
    """Send the job its signal as Slurm sends its warning signal: SIGCONT first (a stopped or
    suspended job could not act on it otherwise; best effort), then the signal. Returns the
    target used. Raises the adapter's error for the signal itself."""
    how = target(w, sig)
    if sig.name != "CONT":
        try:
            w.slurm.signal(job.ref, "CONT", how)
        except SlurmHooksError:
            pass  # the signal itself says whether the job can be reached
    w.slurm.signal(job.ref, sig.name, how)
    return how


class Grace(str, enum.Enum):
    """Where a signalled job stands in its grace."""

    WAITING = "waiting"
    SELF_REQUEUED = "self"
    ENDED = "ended"
    #: Ended FAILED in its grace: its framework could not honour the signal (submitit late in
    #: its time limit raises "timed-out and not checkpointable"), or the fault crashed it.
    FAILED = "failed"
    OVER = "over"
    #: A job that heals in place left the node (:mod:`.selfheal`): healed, not requeued.
    LEFT = "left"


#: States a job that ends in its grace is requeued from: it did not choose to stop (COMPLETED),
#: was not cancelled, and did not run out of time; Slurm requeues a finished batch job.
REQUEUE_ENDED_STATES = (JobState.FAILED,)


def judge_grace(job: JobInfo, now: float, grace_until: float, restarts: int) -> Grace:
    """A job is self-requeued once it is PENDING again or its restart count rose past ``restarts``
    (it may already run elsewhere); failed once it ended in :data:`REQUEUE_ENDED_STATES` (ours to
    requeue: the fault touched it); ended once otherwise finished; a job still completing is on
    its way (never requeue one: Slurm would run it again); a running one is waited for until
    ``grace_until``."""
    if job.pending or job.restarts > restarts:
        return Grace.SELF_REQUEUED
    if job.base_state in REQUEUE_ENDED_STATES:
        return Grace.FAILED
    if job.finished:
        return Grace.ENDED
    if job.completing or now < grace_until:
        return Grace.WAITING
    return Grace.OVER
