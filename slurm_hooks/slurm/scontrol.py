"""Slurm through its command line: ``scontrol``, ``squeue``, ``scancel``.

The portable backend: ``scontrol -o show node`` prints one line per node on every
Slurm version we support (22.05 and later; ``--json`` where it exists), jobs are read
from ``squeue -O`` fields Slurm writes itself, and the commands take
argv lists, so nothing read from Slurm (a job name, a comment) ever reaches a
shell. Every call has a timeout; failures become the project's typed errors.

What each read costs slurmctld (``sdiag``, 22.05): ``squeue`` asks for the partition table
beside the jobs, and without ``--local`` for the federation's too, so every job read here is
``--local`` (a node's jobs are its own cluster's): ``squeue --local -j <one>`` is 2 RPCs, ``-j
<several>`` 2 (the job table, once), ``-w <node>`` 3 (the node table too), ``scontrol --local
show job`` 1, with ``-d`` 2 (the node table).
"""

from __future__ import annotations

import contextlib
import copy
import os
import re
import shlex
import time
from collections.abc import Mapping, Sequence

from slurm_hooks.errors import CommandError, SlurmHooksError
from slurm_hooks.runner import Runner, run_command
from slurm_hooks.slurm import (
    ACTIVE_JOB_STATES,
    ADMIN_COMMENT_MAX,
    JobDetail,
    JobInfo,
    JobRecord,
    NodeInfo,
    gres,
    hostlist,
    job_ref,
    may_resume,
    quirks,
)
from slurm_hooks.slurm.errors import (
    AlreadyRequeued,
    ReasonNotOurs,
    SlurmCommandFailed,
    SlurmNotFound,
    SlurmTimeout,
    SlurmUnavailable,
    check_drain,
    classify_message,
    requeue_refused,
)
from slurm_hooks.slurm.version import parse_version

__all__ = ["AlreadyRequeued", "ReasonNotOurs", "ScontrolSlurm", "SlurmCommandFailed", "SlurmNotFound", "SlurmTimeout",
           "SlurmUnavailable", "classify_message"]


# --- parsing ``scontrol -o show`` lines --------------------------------------

#: A ``Key=`` at the start of the line or after a space. Keys may hold ``:`` and
#: ``/`` (``AllocNode:Sid``, ``CPUs/Task``); values separate items with commas,
#: so ``cpu=8`` inside ``CfgTRES=cpu=8,mem=1M`` is never taken for a key.
_KEY = re.compile(r"(?:^|(?<= ))([A-Za-z][A-Za-z0-9_:/.\-]*)=")

#: ``Reason=<text> [user@time]``: the bracket (Slurm's) closes the reason whatever its
#: text holds, and any key may follow it, even one this parser has never heard of
#: (later Slurm versions add keys: :data:`.quirks.NODE_KEYS_ADDED`); without a bracket (no
#: reason time) only the next known key ends the reason.
_REASON_BRACKETED = (r"(?:^|(?<= ))Reason=(?P<text>.*?) \[(?P<user>[^\[\]@ ]*)@(?P<time>[^\[\]]*)\]"
                     r"(?= [A-Za-z][A-Za-z0-9_:/.\-]*=| *$)")
_REASON_BARE = r"(?:^|(?<= ))Reason=(?P<text>.*?)(?= (?:%s)=| *$)"

#: Every key any supported Slurm prints for a node (which version added which: :mod:`.quirks`).
NODE_KEYS = quirks.NODE_KEYS
#: Node fields whose values are free text (may hold spaces and ``=``).
NODE_FREE_TEXT = frozenset({"OS", "Reason", "Comment", "Extra", "AvailableFeatures", "ActiveFeatures"})

_NULLS = ("(null)", "N/A")
_NODE_KEY_ALT = "|".join(re.escape(k) for k in sorted(NODE_KEYS - {"Reason"}))
_NODE_REASON_BRACKETED = re.compile(_REASON_BRACKETED)
_NODE_REASON_BARE = re.compile(_REASON_BARE % _NODE_KEY_ALT)


def parse_fields(line: str, known: frozenset[str], free_text: frozenset[str]) -> dict[str, str]:
    """Split one ``scontrol -o`` line into ``{key: value}``.

    A value runs to the next ``Key=``. Inside a free-text value only a key Slurm
    is known to print ends it, so ``Comment=gpu=3 is bad`` and fields added by a
    newer Slurm both parse. The first occurrence of a key wins.
    """
    line = line.rstrip("\n")
    fields: dict[str, str] = {}
    key: str | None = None
    start = 0
    for m in _KEY.finditer(line):
        name = m.group(1)
        if key is not None and key in free_text and name not in known:
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


#: ``squeue -O`` fields, ``|``-separated, for every job read. All but one are tokens Slurm
#: makes (ids, state, node list, flags, counts, its reason codes); the job name, which the
#: user writes and may fill with ``|``, ``JobState=...`` or a newline, comes second to last,
#: and the unique job id is printed again after it. So nothing in a name can shift the
#: fields remediation decides on, and a name with a newline cannot pass for another job's
#: record (see :func:`parse_squeue_jobs`). ``JobID`` is the unique id (``%A``); an array
#: task is addressed through ``ArrayJobID``/``ArrayTaskID``, a het component through ``HetJobID``.
SQUEUE_JOB_FORMAT = ("JobID:|,ArrayJobID:|,ArrayTaskID:|,HetJobID:|,State:|,NodeList:|,Requeue:|,RestartCnt:|,"
                     "BatchFlag:|,PriorityLong:|,Reason:|,UserName:|,Name:|,JobID:")
#: The same without the name, for output in which some name broke a line.
SQUEUE_JOB_FORMAT_NO_NAME = ",".join(f for f in SQUEUE_JOB_FORMAT.split(",") if f != "Name:|")
_SQUEUE_FIXED = SQUEUE_JOB_FORMAT.split(",").index("Name:|")


_SHOW_KEY = re.compile(r"^ {3}[A-Za-z][A-Za-z0-9/:_]*=")


def parse_admin_comment(text: str) -> str:
    """AdminComment of the first job in ``scontrol show job`` output: ``   AdminComment=<text> `` on its
    own line (absent when there is none); a value holding newlines runs on until the next key line."""
    return parse_show_job_text(text, "AdminComment")


def parse_submit_line(text: str) -> str:
    """``SubmitLine`` of the first job in ``scontrol show job`` output (25.11+: ``   SubmitLine=sbatch
    ... job.sh``); "" when it has none."""
    return parse_show_job_text(text, "SubmitLine")


def parse_show_job_text(text: str, key: str) -> str:
    """A free-text value that ``scontrol show job`` prints on its own line (``   <key>=<text> ``)."""
    lead = f"   {key}="
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if line.startswith(lead):
            value = [line[len(lead):]]
            for more in lines[i + 1:]:
                if _SHOW_KEY.match(more) or more.startswith("JobId=") or not more.strip():
                    break
                value.append(more)
            joined = "\n".join(value)
            return joined[:-1] if joined.endswith(" ") else joined
        if i and line.startswith("JobId="):
            break  # the next job's record
    return ""


_NODE_LIST = re.compile(r"^[A-Za-z0-9_.\-\[\],]+$")


def parse_job_record(text: str) -> JobRecord:
    """:class:`JobRecord` of the first job in ``scontrol show job`` output."""
    head = text.split("\nJobId=", 1)[0]

    def word(key: str) -> str:
        m = re.search(rf"(?:^|\s){key}=(\S*)", head)
        value = m.group(1) if m else ""
        return "" if value in ("(null)", "None") else value

    code = re.search(r"(?:^|\s)ExitCode=(\d+):(\d+)", head)
    return JobRecord(comment=parse_show_job_text(text, "Comment"), command=parse_show_job_text(text, "Command"),
                     batch_host=word("BatchHost"), exit_code=int(code.group(1)) if code else None,
                     exit_signal=int(code.group(2)) if code else 0, excluded=word("ExcNodeList"),
                     admin_comment=parse_admin_comment(text))


class _BadLine(ValueError):
    pass


def parse_squeue_job(line: str, named: bool = True) -> JobInfo | None:
    """One line of ``squeue -O SQUEUE_JOB_FORMAT`` -> :class:`JobInfo` (``None`` for a blank line)."""
    if not line.strip():
        return None
    try:
        return _squeue_record(line.rstrip("\n"), named)
    except _BadLine as exc:
        raise SlurmCommandFailed(f"not a squeue job line ({exc}): {line[:120]!r}") from None


def _squeue_record(line: str, named: bool) -> JobInfo:
    head = line.split("|", _SQUEUE_FIXED)
    if len(head) != _SQUEUE_FIXED + 1:
        raise _BadLine("too few fields")
    *fixed, rest = head
    if named:
        name, sep, trailer = rest.rpartition("|")
        if not sep:
            raise _BadLine("no trailing job id")
    else:
        name, trailer = "", rest
    job_id, array_id, task_id, het_id, state, nodes, requeue, restarts, batch, priority, reason, user = \
        (f.strip() for f in fixed)
    if not job_id.isdigit() or trailer.strip() != job_id:
        raise _BadLine("job id not repeated after the name")
    if not state or not state.replace("_", "").isalpha():
        raise _BadLine("bad state")
    try:
        return JobInfo(
            job_id=int(job_id),
            name=name,
            state=state,
            nodes=_clean(nodes),
            requeue=requeue not in ("0", "no"),
            batch=batch not in ("0", "no"),
            restarts=int(restarts or 0),
            reason=_clean(reason),
            user=_clean(user),
            array_job_id=int(array_id) if array_id.isdigit() and task_id.isdigit() else 0,
            array_task_id=task_id if task_id.isdigit() else "",
            het_job_id=int(het_id) if het_id.isdigit() else 0,
            priority=priority,
            extra={"priority": priority},
        )
    except ValueError:
        raise _BadLine("bad number") from None


def parse_squeue_jobs(text: str, named: bool = True) -> list[JobInfo] | None:
    """Every record of ``squeue -O SQUEUE_JOB_FORMAT`` output; ``None`` when a job name broke a line.

    A record is ``<id>|<Slurm's fields>|<name>|<id>``. A name holding a newline
    splits its record, and the last piece always ends in that job's own id, so
    the output cannot come out as whole records each starting and ending with
    one unique id: either some line does not parse or an id repeats. Then the
    caller asks again without names (``named=False``), where every line is Slurm's.
    """
    jobs: list[JobInfo] = []
    seen: set[int] = set()
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            job = _squeue_record(line, named)
        except _BadLine:
            if named:
                return None
            raise SlurmCommandFailed(f"not a squeue job line: {line[:120]!r}") from None
        if job.job_id in seen:
            if named:
                return None
            raise SlurmCommandFailed(f"squeue printed job {job.job_id} twice")
        seen.add(job.job_id)
        jobs.append(job)
    return jobs


#: One node's share of a job in ``scontrol -d show job``: ``Nodes=n1 CPU_IDs=0-3 Mem=0 GRES=gpu:2(IDX:0-1)``
#: (a job with no GRES on the node: ``GRES=`` and nothing after it).
_JOB_NODE_GRES = re.compile(r"(?:^|\s)Nodes=(?P<nodes>\S+)\s+(?:\S+=\S*\s+)*?GRES=(?P<gres>\S*)")


def parse_job_gpus(text: str, node: str) -> tuple[int, ...] | None:
    """The GPU indexes (Slurm's GRES index) ``node`` holds for a job, from ``scontrol -d [-o] show
    job`` output: ``()`` when its line for the node holds no GPU (a CPU-only job); ``None`` when
    the output does not say which (no detail line for the node, ``IDX:N/A``, ``CNT:``, garbled).

    ``gpu:2(IDX:0-1)`` and ``gpu:a100:1(IDX:5)`` name indexes; a share of a GPU names it by
    position: ``shard:2(2/4,0/4,...)`` (Slurm 23.02+: per GPU, held/available) holds GPU 0,
    ``shard:2(IDX:0)`` (22.05) too. Every detail line for the node counts (a het job's
    components, each its own record): a job name that imitates one can only add indexes, so at
    worst its own job is requeued."""
    found: set[int] = set()
    here = False
    for m in _JOB_NODE_GRES.finditer(text):
        try:
            if node not in hostlist.expand(m.group("nodes")):
                continue
        except ValueError:
            continue
        here = True
        indexes = gres.gpu_indexes(m.group("gres"))
        if indexes is None:
            return None
        found.update(indexes)
    if not here:
        return None
    return tuple(sorted(found))


# --- ``scontrol --json`` (Slurm 23.02 and later) ----------------------------------------------


def parse_node_json(text: str) -> list[NodeInfo]:
    """``scontrol --json show node`` -> :class:`NodeInfo` list.

    Handles both shapes Slurm has printed: ``"state": ["IDLE", "DRAIN"]`` (23.11+)
    and ``"state": "idle"`` with ``"state_flags": [...]`` (the older data parsers).
    Not run against a live Slurm here (the testbed is 22.05); tested on the
    examples in Slurm's own documentation.
    """
    import json

    try:
        data = json.loads(text)
        nodes = data["nodes"]
        if not isinstance(nodes, list):
            raise TypeError("nodes is not a list")
        return [_node_from_json(n) for n in nodes]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise SlurmCommandFailed(f"scontrol --json: unexpected output ({type(exc).__name__}: {exc})") from None


def _listed(value: object) -> list:
    """A JSON list as a list; a comma-separated string split; anything else none."""
    if isinstance(value, list):
        return value
    return value.split(",") if isinstance(value, str) else []


def _node_from_json(raw: dict) -> NodeInfo:
    state = raw["state"]
    if isinstance(state, list):
        parts = [str(p).upper() for p in state]
    else:
        parts = [str(state).upper(), *(str(f).upper() for f in raw.get("state_flags") or [])]
    changed = raw.get("reason_changed_at")
    if isinstance(changed, dict):
        changed = changed.get("number") if changed.get("set", True) else None
    extra = {"ReasonUser": str(raw.get("reason_set_by_user") or ""), "ReasonTime": str(changed or ""),
             "Version": str(raw.get("version") or raw.get("slurmd_version") or ""),
             "Extra": str(raw.get("extra") or ""),
             "Partitions": ",".join(str(p) for p in _listed(raw.get("partitions")) if p)}
    return NodeInfo(name=str(raw["name"]), state="+".join(p for p in parts if p) or "UNKNOWN",
                    reason=str(raw.get("reason") or "").strip(), comment=str(raw.get("comment") or ""),
                    gres=str(raw.get("gres") or ""), extra=extra)


# --- the backend ----------------------------------------------------------------

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


_RESV_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
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
    def _job_arg(ref: int | str) -> str:
        """``123`` or ``123_4``; anything else (a flag, a list, a name) is refused before it reaches argv."""
        try:
            return job_ref(ref)
        except ValueError as exc:
            raise SlurmCommandFailed(str(exc)) from None

    # -- version

    def version(self) -> tuple[int, int] | None:
        """The running Slurm's (major, minor) from ``scontrol --version``, asked once per bin_dir."""
        key = self.bin_dir
        if key not in _VERSIONS:
            try:
                text = self._run("scontrol", "--version")
            except SlurmHooksError:
                return None  # asked again next time: a failed call says nothing about the version
            _VERSIONS[key] = parse_version(text)
        return _VERSIONS[key]

    def _json(self) -> bool:
        """``scontrol --json`` where this Slurm has it (:func:`.quirks.scontrol_json`), else the ``-o`` lines."""
        return quirks.scontrol_json(self.version())

    # -- nodes

    def node(self, name: str) -> NodeInfo:
        arg = self._node_arg(name)
        if self._json():
            found = [n for n in parse_node_json(self._run("scontrol", "--json", "show", "node", arg)) if n.name == name]
        else:
            out = self._run("scontrol", "-o", "show", "node", arg)
            found = [info for info in (parse_node_line(line) for line in out.splitlines() if line.strip())
                     if info.name == name]
        if not found:
            raise SlurmNotFound(f"scontrol: node {name} not found")
        return found[0]

    def nodes(self) -> list[NodeInfo]:
        if self._json():
            return parse_node_json(self._run("scontrol", "--json", "show", "nodes"))
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

    def drain(self, name: str, reason: str, *, current: NodeInfo | None = None) -> None:
        """Drain with ``reason`` unless another party's reason is on the node.

        ``current``: the node as the caller has just read it (one ``show node`` per drain);
        read here when not given. Raises :class:`ReasonNotOurs` (carrying the node and its
        reason) when it leaves the node alone (:func:`.errors.check_drain`). Read-then-update:
        an admin racing us within the same second can still lose their reason; Slurm offers
        no compare-and-set.
        """
        check_drain(current if current is not None and current.name == name else self.node(name), reason)
        self._run("scontrol", "update", f"NodeName={self._node_arg(name)}", "State=DRAIN", f"Reason={reason}")

    def resume(self, name: str) -> None:
        """Undrain a node we drained; a node that is not drained is left as it is.

        Raises :class:`ReasonNotOurs` for a node drained by someone else
        (an admin, ``Prolog error``, ``slurm-operator:``).
        """
        current = self.node(name)
        if not current.out_of_service:
            return
        if not may_resume(current):
            raise ReasonNotOurs(current, "resume")
        if not quirks.may_set_idle(self.version(), current.flags):
            raise SlurmCommandFailed(f"{name}: not resumed while its reboot is issued (REBOOT_ISSUED): Slurm "
                                     "25.11+ refuses it; the reboot's registration brings the node back")
        self._run("scontrol", "update", f"NodeName={self._node_arg(name)}", "State=RESUME")

    def set_node_extra(self, name: str, text: str) -> None:
        """``scontrol update NodeName=<name> Extra=<text>`` (one argv element; ``""`` clears it)."""
        if "\n" in text:
            raise SlurmCommandFailed(f"{name}: refusing a multi-line Extra")
        self._run("scontrol", "update", f"NodeName={self._node_arg(name)}", f"Extra={text}")

    def reboot(self, name: str, reason: str, nextstate: str = "DOWN") -> None:
        """``scontrol reboot ASAP nextstate=... reason=... <node>``; the reason is one argv element.

        ``nextstate=DOWN``: after the reboot the node stays out until the health check passes on
        it (verified on 22.05: with RESUME, registration clears a drain that the start-up health
        check set, and the node takes jobs whatever the check found)."""
        if nextstate not in ("DOWN", "RESUME"):
            raise SlurmCommandFailed(f"{name}: nextstate must be DOWN or RESUME, not {nextstate!r}")
        check_drain(self.node(name), reason)  # the same gate as a drain: never over someone else's reason
        self._run("scontrol", *quirks.reboot_args(self.version(), self._node_arg(name), reason, nextstate))

    # -- jobs

    def _squeue(self, *selection: str) -> list[JobInfo]:
        """Jobs from one ``squeue --local -O`` call (a second, without names, only when a name broke a line)."""
        out = self._run("squeue", "--local", "-h", *selection, "-O", SQUEUE_JOB_FORMAT)
        jobs = parse_squeue_jobs(out)
        if jobs is None:
            jobs = parse_squeue_jobs(self._run("squeue", "--local", "-h", *selection, "-O", SQUEUE_JOB_FORMAT_NO_NAME),
                                     named=False)
        return jobs or []

    def _show_job(self, ref: int | str, *flags: str) -> str:
        """``scontrol --local [flags] show job <ref>``: one RPC (the job alone)."""
        return self._run("scontrol", "--local", *flags, "show", "job", self._job_arg(ref))

    def job(self, job_id: int | str) -> JobInfo:
        """One job by id or ref, from squeue fields Slurm writes itself (see SQUEUE_JOB_FORMAT)."""
        ref = self._job_arg(job_id)
        for info in self._squeue("-t", "all", "-j", ref):
            if info.answers_to(ref):
                return info
        raise SlurmNotFound(f"squeue: job {ref} not found")

    def jobs(self, refs: Sequence[int | str]) -> list[JobInfo]:
        """All of ``refs`` that Slurm still knows, in one squeue call (the same 2 RPCs however many jobs)."""
        wanted = list(dict.fromkeys(self._job_arg(r) for r in refs))
        if not wanted:
            return []
        try:
            found = self._squeue("-t", "all", "-j", ",".join(wanted))
        except SlurmNotFound:
            if len(wanted) == 1:
                return []  # that one is what squeue did not know
            found = []  # a squeue that fails the whole call when one id is unknown: ask one by one
            for ref in wanted:
                with contextlib.suppress(SlurmNotFound):
                    found.append(self.job(ref))
        return [info for info in found if any(info.answers_to(ref) for ref in wanted)]

    def jobs_on_node(self, name: str) -> list[JobInfo]:
        """Jobs holding the node (running, completing, configuring, suspended), in one squeue call
        (``-a``: hidden partitions' too). ``-w`` costs slurmctld its node table as well (3 RPCs), but
        squeue picks the node's jobs itself: without it every caller would parse the cluster's whole
        job table (0.4 s for 20,000 jobs here), the bridge and the repair worker once per node and pass."""
        listed = self._squeue("-a", "-w", self._node_arg(name), "-t", ",".join(ACTIVE_JOB_STATES))
        return [job for job in listed if job.active and (not job.nodes or job.runs_on(name))]

    def job_gpus(self, ref: int | str, node: str) -> tuple[int, ...] | None:
        """The GPU indexes the job holds on ``node`` (``scontrol -d show job``: ``GRES=gpu:2(IDX:0-1)``);
        ``None`` when Slurm does not say."""
        return self.job_detail(ref, node).gpus

    def job_detail(self, ref: int | str, node: str) -> JobDetail:
        """The job's GPUs on ``node``, its AdminComment and its record, from one ``scontrol -d show
        job`` (each free-text value on its own line, as :func:`parse_show_job_text` reads it)."""
        where = self._node_arg(node)
        text = self._show_job(ref, "-d")
        return JobDetail(parse_job_gpus(text, where), parse_job_record(text))

    def requeue(self, ref: int | str) -> None:
        """``scontrol requeue``: SIGTERM, KillWait, SIGKILL, then PENDING (held back 121 s unless start_now).

        Pass :attr:`JobInfo.ref`: the array's base id would requeue every task of the array.
        Raises :class:`AlreadyRequeued` when the job is PENDING again already (it requeued
        itself, or another run did).
        """
        try:
            self._run("scontrol", "requeue", self._job_arg(ref))
        except SlurmCommandFailed as exc:
            if requeue_refused(exc.stderr or str(exc)):
                raise AlreadyRequeued(str(exc), exc.argv, exc.stderr) from None
            raise

    def release(self, ref: int | str) -> None:
        self._run("scontrol", "release", self._job_arg(ref))

    def start_now(self, ref: int | str) -> None:
        """Make a PENDING job eligible at once (issue it after the requeue has landed)."""
        self._run("scontrol", "update", f"JobId={self._job_arg(ref)}", "StartTime=now")

    def admin_comment(self, ref: int | str) -> str:
        """From ``scontrol show job`` (squeue has no AdminComment field in 22.05)."""
        return parse_admin_comment(self._show_job(ref))

    def job_record(self, ref: int | str) -> JobRecord:
        """From one ``scontrol show job`` (free-text values on their own lines)."""
        return parse_job_record(self._show_job(ref))

    def exclude_nodes(self, ref: int | str, nodes: str) -> None:
        if not _NODE_LIST.match(nodes):
            raise SlurmCommandFailed(f"job {ref}: refusing node list {nodes!r}")
        self._run("scontrol", "update", f"JobId={self._job_arg(ref)}", f"ExcNodeList={nodes}")

    def set_admin_comment(self, ref: int | str, text: str) -> None:
        """``scontrol update JobId=<ref> AdminComment=<text>``, the text as one argv element."""
        if "\n" in text or len(text) > ADMIN_COMMENT_MAX:
            raise SlurmCommandFailed(f"job {ref}: refusing a multi-line AdminComment or one over {ADMIN_COMMENT_MAX}")
        self._run("scontrol", "update", f"JobId={self._job_arg(ref)}", f"AdminComment={text}")

    def signal(self, ref: int | str, signal: str, target: str = "full") -> None:
        """Send ``signal`` the way ``--signal`` would: ``target`` "steps" (every step, not the
        batch shell: Slurm's own way without ``B:``), "batch" (only the batch shell: ``B:``), or
        "full" (the batch shell, its children and every step).

        ``--batch`` alone reaches only the batch shell, which defers a trap until its foreground
        child exits; "full" also reaches that child. A shell without a trap for the signal dies
        of it: "full" is for jobs known to handle it.
        """
        m = _SIGNAL.match(str(signal).upper())
        if not m:
            raise SlurmCommandFailed(f"invalid signal {signal!r}")
        how = {"steps": [], "batch": ["--batch"], "full": ["--full"]}.get(target)
        if how is None:
            raise SlurmCommandFailed(f"invalid signal target {target!r} (steps, batch or full)")
        self._run("scancel", f"--signal={m.group(1)}", *how, self._job_arg(ref))

    def batch_script(self, ref: int | str) -> bytes:
        """``scontrol write batch_script <ref> -``: the job's script as submitted (its size is
        bounded by Slurm's max_script_size; callers read only its head)."""
        return self._run("scontrol", "write", "batch_script", self._job_arg(ref), "-").encode("utf-8", "replace")

    def submit_line(self, ref: int | str) -> str:
        """The job's sbatch command line: ``SubmitLine`` in ``scontrol show job`` on 25.11+ (no slurmdbd
        needed), else ``sacct -o SubmitLine`` (21.08+, with slurmdbd); "" when neither says."""
        if quirks.submit_line_in_show_job(self.version()):
            return parse_submit_line(self._show_job(ref))
        out = self._run("sacct", "-n", "-P", "-X", "-j", self._job_arg(ref), "-o", "SubmitLine")
        return next((line for line in out.splitlines() if line.strip()), "")

    def job_partition(self, ref: int | str) -> str:
        """The job's partition (``scontrol -o show job``; "" when Slurm does not say)."""
        m = re.search(r"(?:^| )Partition=(\S+)", self._show_job(ref, "-o"))
        return m.group(1) if m else ""

    def kill_wait(self) -> float | None:
        """slurm.conf's KillWait in seconds (``scontrol show config``), asked once per bin_dir."""
        if self.bin_dir not in _KILL_WAITS:
            try:
                text = self._run("scontrol", "show", "config")
            except SlurmHooksError:
                return None
            m = re.search(r"^KillWait\s*=\s*(\d+)", text, re.M)
            _KILL_WAITS[self.bin_dir] = float(m.group(1)) if m else None
        return _KILL_WAITS[self.bin_dir]

    # -- maintenance reservations and jobs of our own (slurm-hooks sweep)

    @staticmethod
    def _name_arg(name: str) -> str:
        if not _RESV_NAME.match(name or ""):
            raise SlurmCommandFailed(f"invalid reservation name {name!r}")
        return name

    def partition_nodes(self, partition: str) -> list[str]:
        """The nodes of one partition (``sinfo -N``), each once."""
        if not _RESV_NAME.match(partition or ""):
            raise SlurmCommandFailed(f"invalid partition name {partition!r}")
        out = self._run("sinfo", "-h", "-N", "-p", partition, "-o", "%N")
        return list(dict.fromkeys(line.strip() for line in out.splitlines() if line.strip()))

    def create_reservation(self, name: str, node: str | Sequence[str], minutes: int, flags: str = "MAINT") -> None:
        """A reservation of one node (or a list of nodes) for root, starting now; refused by Slurm while a
        job runs on any of them."""
        nodes = [node] if isinstance(node, str) else list(node)
        if not nodes:
            raise SlurmCommandFailed(f"reservation {name!r}: no nodes")
        self._run("scontrol", "create", "reservation", f"ReservationName={self._name_arg(name)}",
                  "Nodes=" + ",".join(self._node_arg(n) for n in nodes), "StartTime=now",
                  f"Duration={max(1, int(minutes))}", "Users=root", f"Flags={flags}")

    def delete_reservation(self, name: str) -> None:
        """Delete it; one that is already gone is not an error."""
        try:
            self._run("scontrol", "delete", f"ReservationName={self._name_arg(name)}")
        except SlurmCommandFailed as exc:
            if "invalid reservation" not in str(exc).lower() and "not found" not in str(exc).lower():
                raise

    def reservations(self) -> list[str]:
        """Names of every reservation Slurm holds."""
        out = self._run("scontrol", "show", "reservation", "-o")
        return [m.group(1) for m in re.finditer(r"(?:^|\s)ReservationName=(\S+)", out)]

    def submit(self, argv: Sequence[str], *, name: str, node: str | Sequence[str], reservation: str, minutes: int,
               output: str = "/dev/null", partition: str = "", ntasks_per_node: int = 0, chdir: str = "",
               srun: bool = False, gpus_per_node: int = 0) -> str:
        """``sbatch`` one job that runs ``argv`` on ``node`` (one name, or a list: one job across them all)
        in ``reservation``, alone on its nodes; returns its id. The argv is quoted into the job's script
        (``--wrap``), never interpreted; ``srun``: the script launches it with ``srun --kill-on-bad-exit=1``
        (one task per node with ``ntasks_per_node=1``). ``partition``: where to submit it, one name or a
        comma list ("" = Slurm's default partition, which may not hold the nodes). ``output`` may hold
        sbatch's ``%j``; ``chdir``: the job's working directory; ``gpus_per_node``: the GPUs it asks for on
        each node (``--gres=gpu:N``: ``--exclusive`` alone gives a job no GRES, and with
        ``ConstrainDevices=yes`` its steps would see no GPU)."""
        nodes = [node] if isinstance(node, str) else list(node)
        if not nodes:
            raise SlurmCommandFailed(f"job {name!r}: no nodes")
        script = " ".join(shlex.quote(str(a)) for a in argv)
        if srun:
            script = "exec srun --kill-on-bad-exit=1 " + script
        if partition and not all(_RESV_NAME.match(p) for p in partition.split(",")):
            raise SlurmCommandFailed(f"invalid partition name {partition!r}")
        where = [f"--partition={partition}"] if partition else []
        tasks = [f"--ntasks-per-node={int(ntasks_per_node)}"] if ntasks_per_node else []
        here = [f"--chdir={chdir}"] if chdir else []
        gres = [f"--gres=gpu:{int(gpus_per_node)}"] if gpus_per_node else []
        out = self._run("sbatch", "--parsable", f"--job-name={name}", *where,
                        f"--reservation={self._name_arg(reservation)}",
                        "--nodelist=" + ",".join(self._node_arg(n) for n in nodes), f"--nodes={len(nodes)}", *tasks, *gres,
                        "--exclusive", f"--time={max(1, int(minutes))}", *here, f"--output={output}", "--no-requeue",
                        f"--wrap={script}")
        job = out.strip().split(";")[0]
        return self._job_arg(job)

    def jobs_named(self, name: str) -> list[str]:
        """The ids of the jobs Slurm still knows by this job name (``squeue -n``): our own test jobs."""
        if not _RESV_NAME.match(name or ""):
            raise SlurmCommandFailed(f"invalid job name {name!r}")
        return [j.strip() for j in self._run("squeue", "-h", "-n", name, "-o", "%i").split() if j.strip()]

    def cancel(self, ref: int | str) -> None:
        self._run("scancel", self._job_arg(ref))


#: KillWait per bin_dir, asked once per process (a change needs a reconfigure; hooks are short-lived).
_KILL_WAITS: dict[str, float | None] = {}

#: (major, minor) of the Slurm whose commands are in a bin_dir, asked once per process.
_VERSIONS: dict[str, tuple[int, int] | None] = {}
