"""Slurm through its command line: ``scontrol``, ``squeue``, ``scancel``.

The portable backend: ``scontrol -o show node|job`` prints one line per record
on every Slurm version we support (22.05 and later), and the commands take
argv lists, so nothing read from Slurm (a job name, a comment) ever reaches a
shell. Every call has a timeout; failures become the project's typed errors.
"""

from __future__ import annotations

import copy
import os
import re
import time
from collections.abc import Mapping

from slurm_hooks import hostlist
from slurm_hooks.errors import CommandError, PermanentError, TransientError
from slurm_hooks.runner import Runner, run_command
from slurm_hooks.slurm import JobInfo, NodeInfo, may_drain, may_resume

#: Job states in which a job still holds (or is releasing) a node.
ACTIVE_JOB_STATES = ("RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED", "SIGNALING")


class SlurmUnavailable(TransientError):
    """The controller did not answer (down, restarting, or too slow)."""


class SlurmTimeout(SlurmUnavailable):
    """A Slurm command ran past its timeout and was killed."""


class SlurmCommandFailed(PermanentError):
    """Slurm refused the request; retrying the same request will not help."""

    def __init__(self, message: str, argv: list[str] | None = None, stderr: str = ""):
        self.argv, self.stderr = argv or [], stderr
        super().__init__(message)


class SlurmNotFound(SlurmCommandFailed):
    """No such node or job (a finished job is forgotten after MinJobAge)."""


class ReasonNotOurs(PermanentError):
    """Another party's drain reason is on the node: we neither overwrite nor resume it.

    Callers record it ("not drained: already drained by someone else with
    reason X") rather than treat it as a failure of the health check.
    """

    def __init__(self, node: NodeInfo, wanted: str):
        self.node, self.reason, self.wanted = node, node.reason, wanted
        verb = "drained" if wanted == "drain" else "resumed"
        super().__init__(f"{node.name}: not {verb}: already drained by someone else with reason {node.reason!r}")


# --- parsing ``scontrol -o show`` lines --------------------------------------

#: A ``Key=`` at the start of the line or after a space. Keys may hold ``:`` and
#: ``/`` (``AllocNode:Sid``, ``CPUs/Task``); values separate items with commas,
#: so ``cpu=8`` inside ``CfgTRES=cpu=8,mem=1M`` is never taken for a key.
_KEY = re.compile(r"(?:^|(?<= ))([A-Za-z][A-Za-z0-9_:/.\-]*)=")

#: ``Reason=<text> [user@time]``: the bracket closes the reason whatever its text
#: holds; without one (no reason time) the next known key does.
_REASON_BRACKETED = r"(?:^|(?<= ))Reason=(?P<text>.*?) \[(?P<user>[^\[\]@ ]*)@(?P<time>[^\[\]]*)\](?= (?:%s)=| *$)"
_REASON_BARE = r"(?:^|(?<= ))Reason=(?P<text>.*?)(?= (?:%s)=| *$)"

NODE_KEYS = frozenset(
    """NodeName Arch CpuBind CoresPerSocket CPUAlloc CPUEfctv CPUTot CPULoad AvailableFeatures ActiveFeatures
    Features Gres GresDrain GresUsed NodeAddr NodeHostName BcastAddr Port Version OS RealMemory AllocMem FreeMem
    Sockets Boards CoreSpecCount CPUSpecList MemSpecLimit RestrictedCoresPerGPU State ThreadsPerCore TmpDisk
    Weight Owner MCS_label NextState Partitions BootTime SlurmdStartTime LastBusyTime ResumeAfterTime CfgTRES
    AllocTRES CapWatts CurrentWatts AveWatts LowestJoules ConsumedJoules ExtSensorsJoules ExtSensorsWatts
    ExtSensorsTemp Reason Comment Extra InstanceId InstanceType ReservationName Topology TopologyQuality
    CertFlags TLSCertExpiration""".split()
)
#: Node fields whose values are free text (may hold spaces and ``=``).
NODE_FREE_TEXT = frozenset({"OS", "Reason", "Comment", "Extra", "AvailableFeatures", "ActiveFeatures"})

JOB_KEYS = frozenset(
    """JobId ArrayJobId ArrayTaskId ArrayTaskThrottle HetJobId HetJobOffset HetJobIdSet JobName UserId GroupId
    MCS_label Priority Nice Account QOS WCKey JobState Reason Dependency Requeue Restarts BatchFlag Reboot
    ExitCode DerivedExitCode RunTime TimeLimit TimeMin SubmitTime EligibleTime AccrueTime StartTime EndTime
    Deadline PreemptEligibleTime PreemptTime SuspendTime SecsPreSuspend LastSchedEval Scheduler Partition
    AllocNode:Sid ReqNodeList ExcNodeList NodeList SchedNodeList BatchHost StepMgr NumNodes NumCPUs NumTasks
    CPUs/Task ReqB:S:C:T ReqTRES AllocTRES TRES Socks/Node NtasksPerN:B:S:C CoreSpec ThreadSpec MinCPUsNode
    MinMemoryNode MinMemoryCPU MinTmpDiskNode Features ClusterFeatures Prefer DelayBoot Reservation OverSubscribe
    Contiguous Licenses LicensesAlloc Network Command WorkDir AdminComment SystemComment Comment Extra StdErr
    StdIn StdOut Power CpusPerTres MemPerTres TresBind TresFreq TresPerJob TresPerNode TresPerSocket TresPerTask
    NtasksPerTRES MailUser MailType CpuFreqMin CpuFreqMax CpuFreqGov Switches Wait4Switch BurstBuffer
    BurstBufferState Container ContainerID KillOInInvalidDependent SelinuxContext ResvPort SegmentSize
    OOMKillStep""".split()
)
JOB_FREE_TEXT = frozenset(
    {"JobName", "Command", "WorkDir", "AdminComment", "SystemComment", "Comment", "Extra", "StdErr", "StdIn",
     "StdOut", "Features", "Dependency", "MailUser"}
)

_NULLS = ("(null)", "N/A")
_NODE_KEY_ALT = "|".join(re.escape(k) for k in sorted(NODE_KEYS - {"Reason"}))
_NODE_REASON_BRACKETED = re.compile(_REASON_BRACKETED % _NODE_KEY_ALT)
_NODE_REASON_BARE = re.compile(_REASON_BARE % _NODE_KEY_ALT)


#: Free-text fields that Slurm always follows with one fixed key: only that key ends them.
FIXED_FOLLOWER = {"JobName": "UserId"}


def parse_fields(line: str, known: frozenset[str], free_text: frozenset[str]) -> dict[str, str]:
    """Split one ``scontrol -o`` line into ``{key: value}``.

    A value runs to the next ``Key=``. Inside a free-text value only a key Slurm
    is known to print ends it (for a job name: only ``UserId=``, which always
    follows it), so ``Reason=gpu=3 is bad`` and fields added by a newer Slurm
    both parse. The first occurrence of a key wins.
    """
    line = line.rstrip("\n")
    fields: dict[str, str] = {}
    key: str | None = None
    start = 0
    for m in _KEY.finditer(line):
        name = m.group(1)
        if key is not None and key in free_text and name not in known:
            continue
        if key in FIXED_FOLLOWER and name != FIXED_FOLLOWER[key]:
            continue
        if key is not None:
            fields.setdefault(key, line[start : m.start()].rstrip(" "))
        key, start = name, m.end()
    if key is not None:
        fields.setdefault(key, line[start:].rstrip(" "))
    return fields


def _clean(value: str | None) -> str:
    return "" if value is None or value in _NULLS else value


def parse_node_line(line: str) -> NodeInfo:
    """One ``scontrol -o show node`` line -> :class:`NodeInfo` (reason without ``[user@time]``)."""
    reason, reason_user, reason_time = "", "", ""
    rest = line.rstrip("\n")
    m = _NODE_REASON_BRACKETED.search(rest) or _NODE_REASON_BARE.search(rest)
    if m:
        reason = m.group("text")
        if "user" in m.groupdict():
            reason_user, reason_time = m.group("user"), m.group("time")
        rest = rest[: m.start()].rstrip(" ") + " " + rest[m.end() :].lstrip(" ")
    fields = parse_fields(rest, NODE_KEYS, NODE_FREE_TEXT)
    if "NodeName" not in fields or "State" not in fields:
        raise SlurmCommandFailed(f"not a scontrol node line: {line[:120]!r}")
    extra = {k: v for k, v in fields.items() if k not in ("NodeName", "State", "Comment", "Gres")}
    if m:
        extra["ReasonUser"], extra["ReasonTime"] = reason_user, reason_time
    return NodeInfo(
        name=fields["NodeName"],
        state=fields["State"],
        reason=reason.strip(),
        comment=_clean(fields.get("Comment")),
        gres=_clean(fields.get("Gres")),
        extra=extra,
    )


def parse_job_line(line: str) -> JobInfo:
    """One ``scontrol -o show job`` line -> :class:`JobInfo`."""
    fields = parse_fields(line, JOB_KEYS, JOB_FREE_TEXT)
    if "JobId" not in fields or "JobState" not in fields:
        raise SlurmCommandFailed(f"not a scontrol job line: {line[:120]!r}")
    try:
        job_id = int(fields["JobId"])
        restarts = int(fields.get("Restarts") or 0)
    except ValueError:
        raise SlurmCommandFailed(f"bad JobId/Restarts in scontrol job line: {line[:120]!r}") from None
    own = ("JobId", "JobName", "JobState", "NodeList", "Requeue", "BatchFlag", "Restarts", "Reason")
    return JobInfo(
        job_id=job_id,
        name=fields.get("JobName", ""),
        state=fields["JobState"],
        nodes=_clean(fields.get("NodeList")),
        requeue=fields.get("Requeue", "1") == "1",
        batch=fields.get("BatchFlag", "1") == "1",
        restarts=restarts,
        reason=_clean(fields.get("Reason")),
        extra={k: v for k, v in fields.items() if k not in own},
    )


#: ``squeue -O`` fields for :meth:`ScontrolSlurm.job`, ``|``-separated. Every field but the
#: last is a token Slurm makes (state, node list, flags, counts, its reason codes); the job
#: name, which the user writes and may fill with ``|`` or ``JobState=...``, comes last, so
#: nothing in it can shift or fake the fields remediation decides on. (A ``scontrol -o``
#: line cannot promise that: its free-text name runs into the fields after it.)
SQUEUE_JOB_FORMAT = "JobID:|,State:|,NodeList:|,Requeue:|,RestartCnt:|,BatchFlag:|,PriorityLong:|,Reason:|,Name:"
_SQUEUE_JOB_FIELDS = SQUEUE_JOB_FORMAT.count(",") + 1


def parse_squeue_job(line: str) -> JobInfo | None:
    """One line of ``squeue -O SQUEUE_JOB_FORMAT`` -> :class:`JobInfo` (``None`` for a blank line)."""
    if not line.strip():
        return None
    parts = line.rstrip("\n").split("|", _SQUEUE_JOB_FIELDS - 1)
    if len(parts) != _SQUEUE_JOB_FIELDS:
        raise SlurmCommandFailed(f"not a squeue job line: {line[:120]!r}")
    job_id, state, nodes, requeue, restarts, batch, priority, reason, name = parts
    try:
        return JobInfo(
            job_id=int(job_id.split("_")[0]),
            name=name,
            state=state.strip(),
            nodes=_clean(nodes.strip()),
            requeue=requeue.strip() not in ("0", "no"),
            batch=batch.strip() not in ("0", "no"),
            restarts=int(restarts.strip() or 0),
            reason=_clean(reason.strip()),
            extra={"priority": priority.strip()},
        )
    except ValueError:
        raise SlurmCommandFailed(f"bad number in squeue job line: {line[:120]!r}") from None


# --- the backend ----------------------------------------------------------------

_UNAVAILABLE = (
    "unable to contact slurm controller",
    "socket timed out",
    "zero bytes were transmitted or received",
    "slurm backup controller in standby mode",
    "slurmctld is not responding",
    "communication connection failure",
    "connection refused",
    "resource temporarily unavailable",
    "munge",
)
_NOT_FOUND = ("invalid job id", "invalid node name", "not found", "no nodes in the system")


def classify_message(text: str) -> str | None:
    """``"unavailable"`` (retry later), ``"not_found"``, or None for Slurm's error text."""
    low = text.lower()
    if any(s in low for s in _UNAVAILABLE):
        return "unavailable"
    if any(s in low for s in _NOT_FOUND):
        return "not_found"
    return None


#: A call is not started with less time than this left before its run's deadline.
MIN_CALL_S = 0.5


def call_timeout(timeout: float, deadline: float | None) -> float:
    """``timeout``, cut to what is left before ``deadline`` (a ``time.monotonic()``; None: no
    deadline). Raises :class:`SlurmTimeout` when too little is left to start a call at all."""
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left < MIN_CALL_S:
        raise SlurmTimeout("no time left before this run's deadline for a Slurm call")
    return min(timeout, left)


_SIGNAL = re.compile(r"^(?:SIG)?([A-Z][A-Z0-9+]*|[0-9]{1,2})$")


class ScontrolSlurm:
    """:class:`slurm_hooks.slurm.Slurm` over the Slurm command line.

    ``env`` is laid over this process's environment for every command (the
    testbed passes ``SLURM_CONF``); ``SLURM_TIME_FORMAT`` is pinned so times parse
    the same everywhere.
    """

    name = "scontrol"

    def __init__(
        self,
        bin_dir: str = "/usr/bin",
        timeout: float = 10.0,
        runner: Runner = run_command,
        env: Mapping[str, str] | None = None,
    ):
        self.bin_dir = bin_dir
        self.timeout = float(timeout)
        self.runner = runner
        self.env = {**os.environ, **(env or {}), "SLURM_TIME_FORMAT": "standard"}
        #: ``time.monotonic()`` past which no call runs (one deadline for a whole hook run).
        self.deadline: float | None = None

    def bounded(self, deadline: float | None) -> ScontrolSlurm:
        """This adapter with every call's timeout cut to what is left before ``deadline``."""
        other = copy.copy(self)
        other.deadline = deadline
        return other

    # -- plumbing

    def _run(self, tool: str, *args: str) -> str:
        argv = [os.path.join(self.bin_dir, tool), *args]
        timeout = call_timeout(self.timeout, self.deadline)
        try:
            return self.runner(argv, timeout, env=self.env).stdout
        except CommandError as exc:
            raise self._translate(tool, argv, exc, timeout) from None

    def _translate(self, tool: str, argv: list[str], exc: CommandError, timeout: float | None = None) -> Exception:
        if exc.timed_out:
            took = self.timeout if timeout is None else round(timeout, 1)
            return SlurmTimeout(f"{tool} timed out after {took:g}s ({' '.join(argv[1:5])}): controller not answering")
        text = (exc.stderr or exc.stdout or "").strip()
        last = text.splitlines()[-1] if text else f"exit {exc.returncode}"
        if exc.returncode is None:
            return SlurmCommandFailed(f"{argv[0]}: cannot run: {last}", argv, text)
        kind = classify_message(text)
        if kind == "unavailable":
            return SlurmUnavailable(f"{tool}: {last}")
        if kind == "not_found":
            return SlurmNotFound(f"{tool}: {last}", argv, text)
        return SlurmCommandFailed(f"{tool} {' '.join(argv[1:3])}: {last}", argv, text)

    @staticmethod
    def _node_arg(name: str) -> str:
        if not name or any(c.isspace() or c in ",=[]" for c in name) or name.startswith("-"):
            raise SlurmCommandFailed(f"invalid node name {name!r}")
        return name

    @staticmethod
    def _job_arg(job_id: int) -> str:
        if isinstance(job_id, bool) or not isinstance(job_id, int) or job_id <= 0:
            raise SlurmCommandFailed(f"invalid job id {job_id!r}")
        return str(job_id)

    # -- nodes

    def node(self, name: str) -> NodeInfo:
        out = self._run("scontrol", "-o", "show", "node", self._node_arg(name))
        for line in out.splitlines():
            if line.strip():
                info = parse_node_line(line)
                if info.name == name:
                    return info
        raise SlurmNotFound(f"scontrol: node {name} not found")

    def nodes(self) -> list[NodeInfo]:
        out = self._run("scontrol", "-o", "show", "nodes")
        return [parse_node_line(line) for line in out.splitlines() if line.startswith("NodeName=")]

    def drained_count(self, reason: str) -> int:
        """``sinfo -R``: one line per distinct reason, so the answer is small on any cluster."""
        out = self._run("sinfo", "-h", "-R", "-o", "%D|%E")
        total = 0
        for line in out.splitlines():
            count, _, text = line.partition("|")
            if text.strip() == reason and count.strip().isdigit():
                total += int(count)
        return total

    def drain(self, name: str, reason: str) -> None:
        """Drain with ``reason`` unless another party's reason is on the node.

        Raises :class:`ReasonNotOurs` (carrying the node and its reason) when it
        leaves the node alone. Read-then-update: an admin racing us within the
        same second can still lose their reason; Slurm offers no compare-and-set.
        """
        current = self.node(name)
        if not may_drain(current):
            raise ReasonNotOurs(current, "drain")
        if not reason or "\n" in reason:
            raise SlurmCommandFailed(f"{name}: refusing to drain with an empty or multi-line reason")
        self._run("scontrol", "update", f"NodeName={self._node_arg(name)}", "State=DRAIN", f"Reason={reason}")

    def resume(self, name: str) -> None:
        """Undrain a node we drained; a node that is not drained is left as it is.

        Raises :class:`ReasonNotOurs` for a node drained by someone else
        (an admin, ``Prolog error``, ``slurm-operator:``).
        """
        current = self.node(name)
        if not current.drained:
            return
        if not may_resume(current):
            raise ReasonNotOurs(current, "resume")
        self._run("scontrol", "update", f"NodeName={self._node_arg(name)}", "State=RESUME")

    # -- jobs

    def job(self, job_id: int) -> JobInfo:
        """What remediation decides on, from squeue fields Slurm writes itself (see SQUEUE_JOB_FORMAT)."""
        out = self._run("squeue", "-h", "-t", "all", "-j", self._job_arg(job_id), "-O", SQUEUE_JOB_FORMAT)
        for line in out.splitlines():
            info = parse_squeue_job(line)
            if info is not None and info.job_id == job_id:
                return info
        raise SlurmNotFound(f"squeue: job {job_id} not found")

    def jobs_on_node(self, name: str) -> list[JobInfo]:
        """Jobs holding the node: running, completing, configuring or suspended."""
        out = self._run("squeue", "-h", "-w", self._node_arg(name), "-t", ",".join(ACTIVE_JOB_STATES), "-o", "%A")
        jobs = []
        for token in out.split():
            if not token.isdigit():
                continue
            try:
                job = self.job(int(token))
            except SlurmNotFound:
                continue  # finished and purged between the two calls
            if job.state.split("+")[0] in ACTIVE_JOB_STATES and _names(job, name):
                jobs.append(job)
        return jobs

    def requeue(self, job_id: int) -> None:
        """``scontrol requeue``: SIGTERM, KillWait, SIGKILL, then PENDING (held back 121 s unless start_now)."""
        self._run("scontrol", "requeue", self._job_arg(job_id))

    def release(self, job_id: int) -> None:
        self._run("scontrol", "release", self._job_arg(job_id))

    def start_now(self, job_id: int) -> None:
        """Make a PENDING job eligible at once (issue it after the requeue has landed)."""
        self._run("scontrol", "update", f"JobId={self._job_arg(job_id)}", "StartTime=now")

    def signal(self, job_id: int, signal: str) -> None:
        """Send ``signal`` to the batch script, its children and every step.

        ``scancel --batch`` alone reaches only the batch shell, which defers a
        trap until its foreground child exits; ``--full`` also reaches that
        child (the training process), so the job can checkpoint inside the grace
        window. Steps launched with srun are signalled too.
        """
        m = _SIGNAL.match(str(signal).upper())
        if not m:
            raise SlurmCommandFailed(f"invalid signal {signal!r}")
        self._run("scancel", f"--signal={m.group(1)}", "--full", self._job_arg(job_id))


def _names(job: JobInfo, node: str) -> bool:
    if not job.nodes:
        return True  # completing jobs may have dropped their node list already
    try:
        return node in hostlist.expand(job.nodes)
    except ValueError:
        return True
