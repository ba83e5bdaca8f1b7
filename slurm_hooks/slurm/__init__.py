"""Slurm adapter: one small interface, two backends (scontrol CLI, pyslurm).

Hooks and the bridge talk to Slurm only through :class:`Slurm`. The scontrol
backend takes its command runner from outside, so tests give it a real local
cluster. Reason ownership lives here too: we drain only with our prefix, never
overwrite a reason that is not ours, and resume only nodes we drained.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from slurm_hooks import REASON_PREFIX
from slurm_hooks.models import AT_JOB_END, REASON_TAG, Action
from slurm_hooks.slurm import hostlist
from slurm_hooks.values import compile_later, dataclass, field

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing (~3 ms of each start)
if TYPE_CHECKING:
    from typing import Protocol
else:
    Protocol = object  # the classes below are interfaces only


class NodeState:
    """Slurm's words for a node's state, the only place they are spelled: scontrol prints a base
    state and ``+`` flags (``IDLE+DRAIN``, ``MIXED+COMPLETING``, ``DOWN*+DRAIN``; ``*``: not
    responding). Ask :class:`NodeInfo`'s properties what a state means; these are for what
    Slurm is told (``State=RESUME``, ``nextstate=DOWN``) and for playing slurmctld in tests."""

    IDLE = "IDLE"
    ALLOCATED = "ALLOCATED"
    ALLOC = "ALLOC"
    MIXED = "MIXED"
    COMPLETING = "COMPLETING"
    DOWN = "DOWN"
    DRAIN = "DRAIN"
    DRAINED = "DRAINED"
    DRAINING = "DRAINING"
    FAIL = "FAIL"
    FAILING = "FAILING"
    NOT_RESPONDING = "NOT_RESPONDING"
    UNKNOWN = "UNKNOWN"
    FUTURE = "FUTURE"
    INVAL = "INVAL"
    POWERED_DOWN = "POWERED_DOWN"
    REBOOT_REQUESTED = "REBOOT_REQUESTED"
    REBOOT_ISSUED = "REBOOT_ISSUED"
    RESUME = "RESUME"
    #: scontrol's mark on a node that does not answer (``IDLE*``).
    NOT_RESPONDING_MARK = "*"


#: Base states and flags of a node that still has (or is finishing) a job.
_BUSY = frozenset({NodeState.ALLOCATED, NodeState.ALLOC, NodeState.MIXED, NodeState.COMPLETING, NodeState.DRAINING})
_DRAIN_FLAGS = frozenset({NodeState.DRAIN, NodeState.DRAINED, NodeState.DRAINING})
#: States in which a node does not serve, whatever its drain flag says.
_TROUBLE = frozenset({NodeState.DOWN, NodeState.FAIL, NodeState.FAILING, NodeState.NOT_RESPONDING, NodeState.UNKNOWN,
                      NodeState.FUTURE, NodeState.INVAL})
#: Base states that show no job on a node.
_EMPTY = (NodeState.IDLE, NodeState.DRAINED, NodeState.DOWN)
_UNREGISTERED = (NodeState.UNKNOWN, NodeState.FUTURE)
_SILENT = frozenset({NodeState.NOT_RESPONDING, NodeState.POWERED_DOWN})


@dataclass(frozen=True)
class NodeInfo:
    name: str
    #: Full state as scontrol prints it, e.g. "IDLE+DRAIN", "MIXED", "DOWN*+DRAIN".
    state: str
    reason: str = ""
    comment: str = ""
    gres: str = ""
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def flags(self) -> frozenset[str]:
        return frozenset(part.rstrip("*~#!%$@^-") for part in self.state.upper().split("+"))

    @property
    def base_state(self) -> str:
        return self.state.upper().split("+")[0].rstrip("*~#!%$@^-")

    @property
    def drained(self) -> bool:
        """DRAIN flag set (draining or drained) or a DRAINED/DRAINING base state."""
        return bool(_DRAIN_FLAGS & self.flags)

    @property
    def idle(self) -> bool:
        """Base state IDLE (flags aside: ``IDLE+DRAIN`` is idle)."""
        return self.base_state == NodeState.IDLE

    @property
    def ready(self) -> bool:
        """Exactly ``IDLE``: no flag at all (not drained, responding, in no reboot)."""
        return self.state.upper() == NodeState.IDLE

    @property
    def completing(self) -> bool:
        """A job is ending on it (``COMPLETING``, base state or flag)."""
        return NodeState.COMPLETING in self.flags

    @property
    def busy(self) -> bool:
        """A job still runs or completes on it: ALLOCATED, MIXED, COMPLETING or DRAINING."""
        return bool(self.flags & _BUSY)

    @property
    def draining(self) -> bool:
        """Drained, but a job still runs or completes on it."""
        return self.drained and self.busy

    @property
    def empty(self) -> bool:
        """Slurm shows no job on it: base state IDLE, DRAINED or DOWN."""
        return self.base_state in _EMPTY

    @property
    def down(self) -> bool:
        return self.base_state == NodeState.DOWN

    @property
    def serving(self) -> bool:
        """In service as Slurm sees it: not drained, and not DOWN, FAIL(ING), NOT_RESPONDING, UNKNOWN,
        FUTURE or INVAL."""
        return not self.drained and not (self.flags & _TROUBLE)

    @property
    def registered(self) -> bool:
        """slurmd has registered and answers pings (``*`` marks a node that does not), whatever an admin set."""
        return NodeState.NOT_RESPONDING_MARK not in self.state and self.base_state not in _UNREGISTERED \
            and not (_SILENT & self.flags)

    @property
    def responding(self) -> bool:
        """Registered, answering, and not DOWN."""
        return self.registered and not self.down

    @property
    def reboot_pending(self) -> bool:
        """Slurm has a reboot of this node requested or under way (``REBOOT_REQUESTED``, ``REBOOT_ISSUED``)."""
        return any(flag.startswith("REBOOT") for flag in self.flags)

    @property
    def reboot_issued(self) -> bool:
        return NodeState.REBOOT_ISSUED in self.flags

    @property
    def out_of_service(self) -> bool:
        """Drained, or DOWN (how our ``nextstate=DOWN`` reboot brings a node back)."""
        return self.drained or self.down

    @property
    def ours(self) -> bool:
        """Our reason, as Slurm shows it (``" : Not responding"`` and a reboot's suffixes allowed).

        What Slurm alone can say: the node side also holds it against what it recorded
        at the drain (:class:`slurm_hooks.remedy.ownership.DrainMarker`)."""
        return reason_is_ours(self.reason)

    @property
    def reason_time(self) -> str:
        """Slurm's ReasonTime as printed (``2026-11-29T21:27:07``, or epoch seconds from JSON); "" unknown."""
        return str(self.extra.get("ReasonTime", "") or "")

    @property
    def reason_user(self) -> str:
        return str(self.extra.get("ReasonUser", "") or "")

    @property
    def extra_text(self) -> str:
        """The node's ``Extra`` field (free text, settable with ``scontrol update Extra=``; Slurm 22.05+)."""
        return str(self.extra.get("Extra") or "")


class JobState:
    """Slurm's words for a job's state (squeue's ``State``, sacct's), the only place they are spelled;
    ask :class:`JobInfo`'s properties what a state means."""

    PENDING = "PENDING"
    REQUEUED = "REQUEUED"
    REQUEUE_HOLD = "REQUEUE_HOLD"
    REQUEUE_FED = "REQUEUE_FED"
    CONFIGURING = "CONFIGURING"
    RUNNING = "RUNNING"
    COMPLETING = "COMPLETING"
    SUSPENDED = "SUSPENDED"
    STOPPED = "STOPPED"
    SIGNALING = "SIGNALING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    NODE_FAIL = "NODE_FAIL"
    PREEMPTED = "PREEMPTED"
    BOOT_FAIL = "BOOT_FAIL"
    DEADLINE = "DEADLINE"
    REVOKED = "REVOKED"
    SPECIAL_EXIT = "SPECIAL_EXIT"


#: Job states in which a job still holds (or is releasing) a node.
ACTIVE_JOB_STATES = (JobState.RUNNING, JobState.COMPLETING, JobState.CONFIGURING, JobState.SUSPENDED,
                     JobState.STOPPED, JobState.SIGNALING)
#: States of a job that has ended (squeue -t all shows them until MinJobAge).
FINISHED_JOB_STATES = (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT,
                       JobState.OUT_OF_MEMORY, JobState.NODE_FAIL, JobState.PREEMPTED, JobState.BOOT_FAIL,
                       JobState.DEADLINE, JobState.REVOKED, JobState.SPECIAL_EXIT)
#: States of a job waiting to run (again, after a requeue).
PENDING_JOB_STATES = (JobState.PENDING, JobState.REQUEUED, JobState.REQUEUE_HOLD, JobState.REQUEUE_FED)
#: The hold Slurm puts on a batch job whose launch failed (our prolog refused it on a bad GPU):
#: squeue prints the first form, scontrol the second (verified on 22.05). The only hold we release.
LAUNCH_FAILED_HOLD = ("launch failed requeued held", "launch_failed_requeued_held")

_REF = compile_later(r"^[1-9][0-9]*(?:_[0-9]+)?$")


def job_ref(value: int | str) -> str:
    """``123`` or ``"123_4"`` (an array task) as the string Slurm commands take; ValueError otherwise."""
    text = str(value).strip() if not isinstance(value, bool) else ""
    if not _REF.match(text):
        raise ValueError(f"invalid job id {value!r}")
    return text


@dataclass(frozen=True)
class JobInfo:
    job_id: int
    name: str
    state: str
    nodes: str = ""
    requeue: bool = True
    batch: bool = True
    restarts: int = 0
    reason: str = ""
    #: The array's id and this task's index ("" and 0 outside an array). Slurm gives one task
    #: of every array the array's id as its job id, and ``scontrol requeue <that id>`` acts
    #: on every task: address a task only as ``<array id>_<task id>`` (:attr:`ref`).
    array_job_id: int = 0
    array_task_id: str = ""
    #: The leader's job id for a component of a heterogeneous job (0 otherwise): Slurm
    #: requeues, releases and starts a het job only through its leader.
    het_job_id: int = 0
    priority: str = ""
    extra: dict = field(default_factory=dict, compare=False, hash=False)
    #: Who owns it (squeue's UserName; "" where Slurm did not say).
    user: str = ""

    @property
    def ref(self) -> str:
        """The string that addresses exactly this job in scontrol/squeue: ``123``, ``100_7``, or the het leader."""
        if self.het_job_id:
            return str(self.het_job_id)
        if self.array_job_id and self.array_task_id.isdigit():
            return f"{self.array_job_id}_{self.array_task_id}"
        return str(self.job_id)

    @property
    def base_state(self) -> str:
        """``RUNNING`` of ``RUNNING``, ``CANCELLED`` of ``CANCELLED by 1000``, upper case."""
        return self.state.strip().split("+")[0].split(" ")[0].upper()

    @property
    def pending(self) -> bool:
        """Waiting to run: PENDING, or REQUEUED (held or not) on its way back to it."""
        return self.base_state in PENDING_JOB_STATES

    @property
    def running(self) -> bool:
        return self.base_state == JobState.RUNNING

    @property
    def started(self) -> bool:
        """Running or being set up to run (CONFIGURING: its nodes boot or its prolog runs)."""
        return self.base_state in (JobState.RUNNING, JobState.CONFIGURING)

    @property
    def completed(self) -> bool:
        """Ended with exit code 0 (COMPLETED)."""
        return self.base_state == JobState.COMPLETED

    @property
    def failed(self) -> bool:
        """Ended with a non-zero exit code (FAILED; not cancelled, timed out or preempted)."""
        return self.base_state == JobState.FAILED

    @property
    def active(self) -> bool:
        """Holds a node: running, configuring, suspended, or completing."""
        return self.base_state in ACTIVE_JOB_STATES

    @property
    def completing(self) -> bool:
        """Ending (it exited, or a requeue is under way): requeuing it now would run it again."""
        return self.base_state == JobState.COMPLETING or JobState.COMPLETING in self.state.upper().split("+")[1:]

    @property
    def finished(self) -> bool:
        return self.base_state in FINISHED_JOB_STATES

    @property
    def held_by_admin(self) -> bool:
        return self.reason == "JobHeldAdmin"

    @property
    def held_by_user(self) -> bool:
        return self.reason == "JobHeldUser"

    @property
    def held_by_launch_failure(self) -> bool:
        """Held by Slurm because its launch (our prolog) failed: the one hold that is ours to release."""
        return self.pending and self.reason.lower() in LAUNCH_FAILED_HOLD

    def answers_to(self, ref: int | str) -> bool:
        """Whether ``ref`` names this job: its unique id, or its :attr:`ref`."""
        return str(ref) in (str(self.job_id), self.ref)

    def runs_on(self, node: str) -> bool:
        """Whether ``node`` is in the job's node list (a list that does not parse counts as yes)."""
        if not self.nodes:
            return False
        try:
            return node in hostlist.expand(self.nodes)
        except ValueError:
            return True


@dataclass(frozen=True)
class JobRecord:
    """What ``scontrol show job`` says of a job beyond squeue's fields: how it runs, how it ended, and
    its AdminComment (one read)."""

    #: The user's ``--comment`` ("" when none).
    comment: str = ""
    #: Its batch script's path or its command (``Command=``).
    command: str = ""
    #: The node that runs its batch script ("" when none, or not said).
    batch_host: str = ""
    #: ``ExitCode=<code>:<signal>`` of a job that ended (``None``: not said).
    exit_code: int | None = None
    exit_signal: int = 0
    #: Its ``--exclude`` node list ("" when none).
    excluded: str = ""
    #: Its AdminComment ("" when none); ``None`` when this read could not say.
    admin_comment: str | None = None


@dataclass(frozen=True)
class JobDetail:
    """What one ``scontrol -d show job`` says: the job's record, and the GPUs it holds on one node."""

    #: The GPU indexes (Slurm's GRES IDX) it holds on the node asked about; ``None`` when unknown.
    gpus: tuple[int, ...] | None
    #: Its record, from the same read; ``None`` when this read could not say.
    record: JobRecord | None = None

    @property
    def admin_comment(self) -> str | None:
        """Its AdminComment ("" when none); ``None`` when this read could not say."""
        return None if self.record is None else self.record.admin_comment


class Slurm(Protocol):
    def bounded(self, deadline: float | None) -> Slurm:
        """This adapter with every call's timeout cut to what is left before ``deadline`` (a
        ``time.monotonic()``; None: no deadline). The caller's adapter is left as it was."""
        ...

    def node(self, name: str) -> NodeInfo: ...

    def nodes(self) -> list[NodeInfo]: ...

    def drain(self, name: str, reason: str, *, current: NodeInfo | None = None) -> None:
        """Drain unless someone else's reason is on the node; ``current``: the node just read (no second read)."""
        ...

    def drained_count(self, reason: str) -> int:
        """How many nodes are drained (or down) with exactly this reason."""
        ...

    def resume(self, name: str) -> None: ...

    def set_node_extra(self, name: str, text: str) -> None:
        """``scontrol update NodeName=<name> Extra=<text>``: never touches the state or the reason."""
        ...

    def reboot(self, name: str, reason: str, nextstate: str = "DOWN") -> None:
        """``scontrol reboot ASAP nextstate=<nextstate> reason=<reason> <name>``: drained at once,
        rebooted through RebootProgram once idle. Only a node that carries no one else's reason."""
        ...

    def jobs_on_node(self, name: str) -> list[JobInfo]: ...

    def job(self, job_id: int | str) -> JobInfo:
        """One job by its id or :attr:`JobInfo.ref` (``123_4`` for an array task)."""
        ...

    def jobs(self, refs: Sequence[int | str]) -> list[JobInfo]:
        """Every job asked for that Slurm still knows, in one query (missing ones are left out)."""
        ...

    def job_gpus(self, ref: int | str, node: str) -> tuple[int, ...] | None:
        """The GPU indexes (Slurm's GRES IDX) the job holds on ``node``; ``None`` when unknown."""
        ...

    def job_detail(self, ref: int | str, node: str) -> JobDetail:
        """:meth:`job_gpus`, :meth:`admin_comment` and :meth:`job_record` from one read of the job."""
        ...

    def requeue(self, ref: int | str) -> None: ...

    def release(self, ref: int | str) -> None: ...

    def start_now(self, ref: int | str) -> None: ...

    def signal(self, ref: int | str, signal: str, target: str = "full") -> None:
        """``scancel --signal``: ``target`` "steps", "batch" (``B:``) or "full"."""

    def batch_script(self, ref: int | str) -> bytes:
        """The job's batch script as submitted (``scontrol write batch_script``)."""

    def submit_line(self, ref: int | str) -> str:
        """The job's sbatch command line (``sacct -o SubmitLine``; needs slurmdbd)."""

    def job_partition(self, ref: int | str) -> str:
        """The job's partition ("" when Slurm does not say)."""

    def kill_wait(self) -> float | None:
        """slurm.conf's KillWait (s), or None when it cannot be read."""

    def admin_comment(self, ref: int | str) -> str:
        """The job's AdminComment ("" when none)."""
        ...

    def job_record(self, ref: int | str) -> JobRecord:
        """The job's comment, command, batch host, exit code, excluded nodes and AdminComment (one read)."""
        ...

    def exclude_nodes(self, ref: int | str, nodes: str) -> None:
        """``scontrol update JobId=<ref> ExcNodeList=<nodes>`` on a PENDING job (the whole list: merge first)."""
        ...

    def set_admin_comment(self, ref: int | str, text: str) -> None:
        """Replace the job's AdminComment with ``text`` (Slurm has no append: read, join, write)."""
        ...


class Reserving(Protocol):
    """Maintenance reservations and root's own jobs in them (``slurm-hooks sweep`` and ``isolate``):
    through Slurm's commands, so only the scontrol backend has them (``hasattr(slurm, "jobs_named")``)."""

    def create_reservation(self, name: str, node: str | Sequence[str], minutes: int, flags: str = "MAINT") -> None:
        """A reservation of one node or a list of nodes for root, starting now; Slurm refuses it while a
        job runs on any of them."""
        ...

    def delete_reservation(self, name: str) -> None: ...

    def reservations(self) -> list[str]: ...

    def submit(self, argv: Sequence[str], *, name: str, node: str | Sequence[str], reservation: str, minutes: int,
               output: str = "/dev/null", partition: str = "", ntasks_per_node: int = 0, chdir: str = "",
               srun: bool = False, gpus_per_node: int = 0) -> str:
        """One exclusive, non-requeued job running ``argv`` on ``node`` (or across a list of nodes, with
        ``srun``: ``ntasks_per_node`` tasks on each) in ``reservation``, asking ``gpus_per_node`` GPUs of
        each; its id."""
        ...

    def jobs_named(self, name: str) -> list[str]:
        """The ids of the jobs Slurm still knows by this job name."""
        ...

    def cancel(self, ref: int | str) -> None: ...


#: Slurm refuses a longer comment at submission ("parameter too long", 22.05); an update takes
#: more, but what we write stays within what a submission may carry.
ADMIN_COMMENT_MAX = 1024
ADMIN_COMMENT_SEP = "; "
#: The UTC minute our lines end with: a retry a minute later says the same thing.
_ADMIN_COMMENT_STAMP = compile_later(r",\s*\d{4}-\d\d-\d\dT\d\d:\d\dZ$")


def admin_comment_line(text: str) -> str:
    """One entry: on one line, without the separator (a summary of several findings joins them with
    "; " too: written as is, its second half would read as someone else's entry)."""
    return " ".join(text.split()).replace(";", ",")


def join_admin_comment(existing: str, line: str, limit: int = ADMIN_COMMENT_MAX) -> str | None:
    """``existing`` with ``line`` appended (``; ``), within ``limit``. What others wrote is kept
    whole; our own older lines go first when room is short. A line said already (the same words,
    whatever minute it was stamped with: a retried run) is not said again.
    ``None``: no room without cutting theirs."""
    line = admin_comment_line(line)
    parts = [p for p in (existing or "").split(ADMIN_COMMENT_SEP) if p.strip()]
    if _ADMIN_COMMENT_STAMP.sub("", line) in {_ADMIN_COMMENT_STAMP.sub("", p.strip()) for p in parts}:
        return existing  # said already (a retried run)
    while True:
        joined = ADMIN_COMMENT_SEP.join([*parts, line])
        if len(joined) <= limit:
            return joined
        ours = next((i for i, p in enumerate(parts) if p.startswith(REASON_PREFIX)), None)
        if ours is None:
            return None
        del parts[ours]


#: What Slurm appends to a node's existing reason (``" : <msg>"``, ``set_node_reason`` in
#: node_mgr.c) without anyone else taking the node: it stays the drain of whoever wrote the text.
#: Any other suffix (``Prolog error``, ``Epilog error``, ``Kill task failed``, ...) is a new drain
#: by Slurm itself that kept the old text in front (:mod:`.quirks`: 23.11 keeps reasons).
OWNER_KEEPING_SUFFIXES = ("Not responding", "reboot issued", "reboot complete", "reboot timed out")
#: Reasons other tools own whatever follows: NHC (``node-mark-online`` resumes only its own)
#: and Slinky's slurm-operator (``IsNodeReasonOurs``).
FOREIGN_PREFIXES = ("NHC:", "slurm-operator: ")
SUFFIX_SEP = " : "


def split_reason(reason: str) -> tuple[str, tuple[str, ...]]:
    """``(text, suffixes)``: the reason as its writer set it, and what Slurm appended since.

    Only our reasons are split (their text never holds the separator: :func:`format_reason`);
    anyone else's is returned whole."""
    if not reason.startswith(REASON_PREFIX):
        return reason, ()
    m = _TAGGED.match(reason)
    if m:
        text, rest = m.group("text"), m.group("rest")
    else:
        text, _, rest = reason.partition(SUFFIX_SEP)
        rest = SUFFIX_SEP + rest if rest else ""
    return text, tuple(part.strip() for part in rest.split(SUFFIX_SEP)[1:])


def reason_is_ours(reason: str) -> bool:
    """Our prefix, and nothing appended but Slurm's own owner-keeping suffixes."""
    if not reason.startswith(REASON_PREFIX) or reason.startswith(FOREIGN_PREFIXES):
        return False
    return all(suffix in OWNER_KEEPING_SUFFIXES for suffix in split_reason(reason)[1])


def may_drain(node: NodeInfo) -> bool:
    """Drain unless the node carries someone else's reason: an admin's DRAIN, DOWN or FAIL,
    or Slurm's own (``Not responding``, ``Prolog error``). Ours we may replace."""
    return not node.reason or node.ours


def may_resume(node: NodeInfo) -> bool:
    """Resume only a node we took out ourselves (drained, or DOWN after our reboot)."""
    return node.out_of_service and node.ours


#: Our reason's action tag (:data:`slurm_hooks.models.REASON_TAG`), at its end.
_ACTION_TAG = compile_later(rf"\s{REASON_TAG}$")
#: Our reason up to its action tag, then Slurm's suffixes.
_TAGGED = compile_later(rf"^(?P<text>{re.escape(REASON_PREFIX)}.*{REASON_TAG})(?P<rest>(?: : .*)?)$", re.S)


def format_reason(summary: str, action: Action, limit: int = 120, at_job_end: bool = False,
                  attempt: tuple[int, int] | None = None) -> str:
    """``slurm-hooks: XID 79 on GPU 3 [reboot]``: what broke, then what it needs;
    ``slurm-hooks: row remap pending on GPU 6 [reset, at job end]`` when the remedy waits
    for the running jobs to end (nothing was requeued for it); ``[reboot 1/2]`` for the
    repair ladder's first of two reboots (``attempt``).

    The bracketed action is how the bridge, which sees only Slurm's node state,
    knows whether a node needs a reboot or a replacement.
    """
    count = f" {attempt[0]}/{attempt[1]}" if attempt else ""
    return _tagged(summary, f" [{action.value}{count}, {AT_JOB_END}]" if at_job_end else f" [{action.value}{count}]",
                   limit)


def format_status_reason(summary: str, status: str, limit: int = 120) -> str:
    """``slurm-hooks: row remap pending on GPU 3 [validating]``: our drain while the node is in a
    state of the repair rather than waiting for an action (``validating``, ``unverified``)."""
    return _tagged(summary, f" [{status}]", limit)


def _tagged(summary: str, tag: str, limit: int) -> str:
    """Our prefix, the summary (printable, cut to fit) and the tag, within ``limit`` characters."""
    summary = "".join(ch if ch.isprintable() else " " for ch in summary).replace(SUFFIX_SEP, " - ").strip()
    room = limit - len(REASON_PREFIX) - 1 - len(tag)
    if len(summary) > room:
        summary = summary[: room - 3].rstrip() + "..."
    return f"{REASON_PREFIX} {summary}{tag}"


def status_tag(reason: str) -> str:
    """``validating`` of ``slurm-hooks: ... [validating]`` (Slurm's own `` : ...`` suffixes
    aside); "" for any other reason."""
    if not reason.startswith(REASON_PREFIX):
        return ""
    m = _STATUS_TAG.search(reason)
    return m.group(1) if m else ""


_STATUS_TAG = compile_later(r"\s\[(validating|unverified)\](?:\s:\s.*)?$")

#: The word of our reason's tag that says a node is held for a person (remedy.offenders):
#: ``slurm-hooks: XID 79 on GPU 3 [held: 5 remediations in 7d]``.
HELD = "held"
#: Our reason's held tag, at its end (Slurm's `` : ...`` suffixes aside).
_HELD_TAG = compile_later(rf"\s\[{HELD}: [^\[\]]*\]$")


def held_tag(count: int, window: str) -> str:
    """``held: 5 remediations in 7d`` (``window`` as a reason says it): the status of a held drain
    (:func:`format_status_reason`; short: Slurm's reasons are cut)."""
    return f"{HELD}: {count} remediations in {window}"


def is_held(reason: str) -> bool:
    """Whether our reason says the node is held for a person (Slurm's own suffixes aside)."""
    return bool(held_for(reason))


def held_for(reason: str) -> str:
    """``5 remediations in 7d`` of our held reason; "" for any other reason."""
    m = _HELD_TAG.search(split_reason(reason)[0]) if (reason or "").startswith(REASON_PREFIX) else None
    return m.group(0).strip()[len(HELD) + 3:-1] if m else ""


def parse_reason(reason: str) -> tuple[str, Action | None] | None:
    """Inverse of :func:`format_reason` (Slurm's suffixes dropped); ``None`` when the reason is not ours."""
    if not reason.startswith(REASON_PREFIX):
        return None
    body = split_reason(reason)[0][len(REASON_PREFIX):].strip()
    m = _ACTION_TAG.search(body)
    if not m:
        return body, None
    return body[: m.start()].strip(), Action(m.group("action"))


def reason_attempt(reason: str) -> tuple[Action, int, int] | None:
    """``(action, n, of)`` of our reason's ``[reboot 1/2]``; ``None`` without a count."""
    m = _ACTION_TAG.search(split_reason(reason)[0]) if reason.startswith(REASON_PREFIX) else None
    if not m or m.group("n") is None:
        return None
    return Action(m.group("action")), int(m.group("n")), int(m.group("of"))


def waits_for_job_end(reason: str) -> bool:
    """Whether our drain reason says the remedy waits for the running jobs (``[reset, at job end]``)."""
    m = _ACTION_TAG.search(split_reason(reason)[0]) if reason.startswith(REASON_PREFIX) else None
    return bool(m and m.group("end"))
