"""The one shared in-memory Slurm, for unit tests of remediation.

It implements the :class:`slurm_hooks.slurm.Slurm` protocol, keeps node state
and reason and job states the way slurmctld reports them, and records every
call. Real-Slurm behaviour is tested against the local testbed, not here::

    slurm = FakeSlurm()
    slurm.add_node("n1", "MIXED")
    slurm.add_job(101, "n1")
    slurm.job_states(101, ["COMPLETING", "PENDING"], reason="JobHeldAdmin")
    slurm.fail("drain", TransientError("slurm_update error: Socket timed out"))
    ...
    assert slurm.calls == [("node", "n1"), ("drain", "n1", "slurm-hooks: ... [replace]")]

The Kubernetes bridge's tests build it from nodes, the way ``scontrol show node`` lists them
(the Slinky operator's JSON in ``comment``), and place jobs by node::

    slurm = FakeSlurm(NodeInfo("n1", "IDLE+DRAIN", XID79), NodeInfo("n2", "IDLE"))
    slurm.place_jobs("n1", [4711])
    slurm.fail("nodes", CommandTimeout(...))
"""

from __future__ import annotations

import dataclasses

from slurm_hooks.errors import PermanentError, SlurmHooksError
from slurm_hooks.slurm import JobDetail, JobInfo, JobRecord, JobState, NodeInfo, NodeState, hostlist
from slurm_hooks.slurm.errors import AlreadyRequeued

_ON_NODE = (JobState.RUNNING, JobState.CONFIGURING, JobState.COMPLETING)
_DONE = (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT, JobState.OUT_OF_MEMORY,
         JobState.NODE_FAIL)
_DRAIN, _DOWN, _REBOOT = NodeState.DRAIN, NodeState.DOWN, NodeState.REBOOT_REQUESTED


class FakeSlurm:
    def __init__(self, *nodes: NodeInfo) -> None:
        self._nodes: dict[str, NodeInfo] = {n.name: n for n in nodes}
        self._jobs: dict[int, JobInfo] = {}
        self._scripts: dict[int, list[dict]] = {}
        self._failures: dict[tuple[str, object], SlurmHooksError] = {}
        self._job_gpus: dict[str, tuple[int, ...] | None] = {}
        #: AdminComment by job id ("" when none), as scontrol show job has it.
        self.admin_comments: dict[int, str] = {}
        #: What a job was submitted with, by job id: its batch script, its sbatch line (sacct's
        #: SubmitLine; none: accounting off) and partition; and slurm.conf's KillWait.
        self.scripts: dict[int, bytes] = {}
        self.submit_lines: dict[int, str] = {}
        self.partitions: dict[int, str] = {}
        self.kill_wait_s: float | None = 30.0
        #: What ``scontrol show job`` says of a job beyond squeue (comment, command, batch host, exit code;
        #: the AdminComment it says comes from ``admin_comments``).
        self.records: dict[int, JobRecord] = {}
        self.calls: list[tuple] = []
        #: Slurm >= 23.11 without accounting: RESUME leaves the reason (and its ReasonTime) on the
        #: node (verified on 24.11, Debian 13's testbed).
        self.keeps_reason = False
        #: Every reason set gets the next ReasonTime (whole seconds, as scontrol prints them).
        self._reason_clock = 0

    # --- test set-up -------------------------------------------------------------

    def add_node(self, name: str, state: str = NodeState.IDLE, reason: str = "", comment: str = "",
                 extra: str = "") -> NodeInfo:
        """Add the node, or replace it whole (``comment``: the Slinky operator's JSON, as the bridge reads it;
        ``extra``: the node's Extra field)."""
        self._nodes[name] = NodeInfo(name, state, reason, comment, extra={"Extra": extra} if extra else {})
        return self._nodes[name]

    def add_job(self, job_id: int, node: str, state: str = JobState.RUNNING, *, batch: bool = True, requeue: bool = True,
                name: str = "train", restarts: int = 0, reason: str = "None", **ids) -> JobInfo:
        """``ids``: array_job_id/array_task_id for an array task, het_job_id for a het component."""
        self._jobs[job_id] = JobInfo(job_id, name, state, node, requeue, batch, restarts, reason, **ids)
        return self._jobs[job_id]

    def place_jobs(self, node: str, job_ids: list[int]) -> None:
        """Exactly these jobs run on ``node`` now (named ``job<id>``); the ones there before are gone."""
        for job_id in [j.job_id for j in self._jobs.values() if j.nodes == node]:
            del self._jobs[job_id]
        for job_id in job_ids:
            self.add_job(job_id, node, name=f"job{job_id}")

    def job_states(self, job_id: int, states: list[str], **fields) -> None:
        """What ``job(job_id)`` answers on its next calls, one state per call; the last one stays.

        ``fields`` (reason, nodes, restarts, extra) apply from the first scripted answer on.
        """
        self._scripts[job_id] = [dict(fields, state=s) for s in states]

    def fail(self, method: str, error: SlurmHooksError | None, target: object = None) -> None:
        """Make every call of ``method`` raise ``error`` (``None`` heals it).

        With ``target`` only calls whose first argument (node name or job id) equals it fail.
        """
        if error is None:
            self._failures.pop((method, target), None)
        else:
            self._failures[(method, target)] = error

    def set_node(self, name: str, **changes) -> NodeInfo:
        """Change a node behind the hooks' back (an admin, slurmctld, the operator)."""
        self._nodes[name] = dataclasses.replace(self._nodes[name], **changes)
        return self._nodes[name]

    def peek(self, name: str) -> NodeInfo:
        """Node state for assertions, without recording a call."""
        return self._nodes[name]

    def peek_job(self, job_id: int) -> JobInfo:
        return self._jobs[job_id]

    def called(self, method: str) -> list[tuple]:
        return [c for c in self.calls if c[0] == method]

    @property
    def job_calls(self) -> list[str]:
        """The nodes ``jobs_on_node`` was asked about, in order."""
        return [c[1] for c in self.called("jobs_on_node")]

    # --- the Slurm protocol ----------------------------------------------------------

    def _call(self, method: str, *args) -> None:
        # A plain job id is recorded as an int whichever form it came in; an array task as "100_7".
        args = tuple(int(a) if isinstance(a, str) and a.isdigit() else a for a in args)
        self.calls.append((method, *args))
        error = self._failures.get((method, args[0] if args else None)) or self._failures.get((method, None))
        if error is not None:
            raise error

    def _node(self, name: str) -> NodeInfo:
        try:
            return self._nodes[name]
        except KeyError:
            raise PermanentError(f"Node {name} not found") from None

    def _job(self, ref: int | str) -> JobInfo:
        """By unique id or ref (a het job's ref finds its leader). An array's base id is refused:
        Slurm would act on every task, and remediation must never ask for that."""
        ref = str(ref)
        if ref.isdigit() and int(ref) in self._jobs:
            job = self._jobs[int(ref)]
            if job.array_job_id and job.ref != ref:
                raise PermanentError(f"fake: {ref} is array {ref}'s id and addresses every task; use {job.ref}")
            return job
        found = next((j for j in self._jobs.values() if j.ref == ref), None)
        if found is None:
            raise PermanentError(f"Invalid job id specified: {ref}")
        return found

    def _update(self, job: JobInfo, **changes) -> JobInfo:
        self._jobs[job.job_id] = dataclasses.replace(job, **changes)
        return self._jobs[job.job_id]

    def bounded(self, deadline: float | None) -> FakeSlurm:
        """Itself: the fake answers at once, within any deadline."""
        return self

    def node(self, name: str) -> NodeInfo:
        self._call("node", name)
        return self._node(name)

    def drained_count(self, reason: str) -> int:
        self._call("drained_count", reason)
        return sum(1 for n in self._nodes.values() if n.reason == reason)

    def nodes(self) -> list[NodeInfo]:
        self._call("nodes")
        return list(self._nodes.values())

    def stamped(self, node: NodeInfo, reason: str, user: str = "root", **changes) -> NodeInfo:
        """``node`` with ``reason`` set now: a new ReasonTime and ReasonUser, as slurmctld stamps them."""
        self._reason_clock += 1
        extra = {**node.extra, "ReasonTime": f"2026-01-01T00:00:{self._reason_clock:02d}", "ReasonUser": user}
        return dataclasses.replace(node, reason=reason, extra=extra, **changes)

    def drain(self, name: str, reason: str, *, current: NodeInfo | None = None) -> None:
        self._call("drain", name, reason)
        node = self._node(name)
        flags = [f for f in node.state.split("+") if f != _DRAIN]
        self._nodes[name] = self.stamped(node, reason, state="+".join([*flags, _DRAIN]))

    def resume(self, name: str) -> None:
        """A node that is neither drained nor DOWN is left as it is (as the adapters do)."""
        self._call("resume", name)
        node = self._node(name)
        if not node.out_of_service:
            return
        # Slurm's RESUME also brings a DOWN node back (IDLE once it answers).
        flags = [f for f in node.state.split("+") if f not in (_DRAIN, NodeState.DRAINED, NodeState.DRAINING, _DOWN)]
        self._nodes[name] = dataclasses.replace(node, state="+".join(flags) or NodeState.IDLE,
                                                reason=node.reason if self.keeps_reason else "")

    def reboot(self, name: str, reason: str, nextstate: str = _DOWN) -> None:
        """Slurm's ``reboot ASAP``: drained with the reason and a reboot requested."""
        self._call("reboot", name, reason, nextstate)
        node = self._node(name)
        flags = [f for f in node.state.split("+") if f not in (_DRAIN, _REBOOT)]
        self._nodes[name] = self.stamped(node, reason, state="+".join([*flags, _DRAIN, _REBOOT]))

    def set_node_extra(self, name: str, text: str) -> None:
        self._call("set_node_extra", name, text)
        node = self._node(name)
        self._nodes[name] = dataclasses.replace(node, extra={**node.extra, "Extra": text})

    def jobs_on_node(self, name: str) -> list[JobInfo]:
        self._call("jobs_on_node", name)
        self._node(name)
        return [j for j in self._jobs.values()
                if j.nodes and hostlist.matches(j.nodes, name) and j.state.upper().startswith(_ON_NODE)]

    def _scripted(self, job: JobInfo) -> JobInfo:
        script = self._scripts.get(job.job_id)
        if script:
            step = script.pop(0) if len(script) > 1 else script[0]
            job = self._update(job, **step)
        return job

    def job_gpus(self, ref: int | str, node: str) -> tuple[int, ...] | None:
        """What ``set_job_gpus`` said (``None``: unknown, as for a job Slurm gives no IDX for)."""
        self._call("job_gpus", ref, node)
        return self._job_gpus.get(str(ref))

    def job_detail(self, ref: int | str, node: str) -> JobDetail:
        """``job_gpus``, the AdminComment and the job's record, as one ``scontrol -d show job`` says them."""
        self._call("job_detail", ref, node)
        try:
            record = self._record(ref)
        except PermanentError:
            record = None
        return JobDetail(self._job_gpus.get(str(ref)), record)

    def _record(self, ref: int | str) -> JobRecord:
        job_id = self._job(ref).job_id
        return dataclasses.replace(self.records.get(job_id, JobRecord()), admin_comment=self.admin_comments.get(job_id, ""))

    def set_job_gpus(self, job_id: int | str, gpus: tuple[int, ...] | None) -> None:
        self._job_gpus[str(job_id)] = gpus

    def job(self, ref: int | str) -> JobInfo:
        self._call("job", ref)
        return self._scripted(self._job(ref))

    def jobs(self, refs) -> list[JobInfo]:
        """One call for all; unknown ones are left out, as squeue does."""
        self._call("jobs", tuple(str(r) for r in refs))
        found = []
        for ref in refs:
            try:
                found.append(self._scripted(self._job(ref)))
            except PermanentError:
                continue
        return found

    def requeue(self, ref: int | str) -> None:
        self._call("requeue", ref)
        job = self._job(ref)
        if job.state.upper().startswith(JobState.PENDING):
            raise AlreadyRequeued(f"Job is pending execution for job {ref}")
        if not job.requeue or not job.batch or job.state.upper().startswith(_DONE):
            raise PermanentError(f"Requested operation is presently disabled for job {ref}")
        self._update(job, state=JobState.COMPLETING, restarts=job.restarts + 1)

    def release(self, ref: int | str) -> None:
        self._call("release", ref)
        job = self._job(ref)
        self._update(job, reason="None", priority="1", extra={**job.extra, "priority": "1"})

    def start_now(self, ref: int | str) -> None:
        self._call("start_now", ref)
        self._job(ref)

    def signal(self, ref: int | str, signal: str, target: str = "full") -> None:
        self._call("signal", ref, signal, target)
        self._job(ref)

    # What a job was submitted with: read only for a touched job, and not recorded in ``calls``
    # unless it fails (tests of the requeue look at what is done, not at what is read).

    def batch_script(self, ref: int | str) -> bytes:
        return self.scripts.get(self._job(ref).job_id, b"#!/bin/sh\n")

    def submit_line(self, ref: int | str) -> str:
        job = self._job(ref)
        if job.job_id not in self.submit_lines:
            raise PermanentError("sacct: Slurm accounting storage is disabled")
        return self.submit_lines[job.job_id]

    def job_partition(self, ref: int | str) -> str:
        return self.partitions.get(self._job(ref).job_id, "batch")

    def kill_wait(self) -> float | None:
        return self.kill_wait_s

    def exclude_nodes(self, ref: int | str, nodes: str) -> None:
        self._call("exclude_nodes", ref, nodes)
        job_id = self._job(ref).job_id
        self.records[job_id] = dataclasses.replace(self.records.get(job_id, JobRecord()), excluded=nodes)

    def admin_comment(self, ref: int | str) -> str:
        self._call("admin_comment", ref)
        return self.admin_comments.get(self._job(ref).job_id, "")

    def job_record(self, ref: int | str) -> JobRecord:
        """A read of the job as any other (one ``scontrol show job``): recorded in ``calls``."""
        self._call("job_record", ref)
        return self._record(ref)

    def set_admin_comment(self, ref: int | str, text: str) -> None:
        self._call("set_admin_comment", ref, text)
        self.admin_comments[self._job(ref).job_id] = text
