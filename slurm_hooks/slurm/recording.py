"""One hook run's Slurm adapter: each call goes to the real one; errors are noted, reads reused.

:class:`RecordingSlurm` is the :class:`slurm_hooks.slurm.Slurm` a run talks through
(:meth:`slurm_hooks.remedy.wiring.Wiring.recording`); what it keeps is the run's :class:`Record`:

- **every error a call raised**: the caller keeps a step that failed for a transient reason
  (slurmctld unreachable, too slow, the deadline spent) pending, and records one that failed
  for good once (:meth:`Record.transient`, :meth:`Record.last_error`);
- **the reads it may answer again**, until a write of the run's may have changed them:

  ``node(name)``
      until a write to that node (drain, resume, reboot, its Extra) or to any job's state
      (requeue, release, start_now, signal: a node's state follows its jobs').
  ``jobs_on_node(name)``
      until a write to that node or to any job's state.
  ``job_gpus(ref, node)``
      one ``scontrol -d show job`` (:meth:`~slurm_hooks.slurm.Slurm.job_detail`), until a
      write to that job's state.
  ``job_record(ref)``
      from that same read of the job, else one ``scontrol show job`` of its own, until a write
      to that job (its state, its ExcNodeList, its AdminComment): a fault's requeue reads what
      the job says of itself (its comment, command, batch host) from the read that said its GPUs.
  ``admin_comment(ref)``
      from either read of the job, until a write of its AdminComment, or of its state other
      than its requeue: a requeue leaves the AdminComment as it was, so the line that says why
      a job was requeued is joined to what the job showed just before (no second read), while a
      job sent its checkpoint signal is read afresh when its grace ends.

  A caller about to resume or repair the node reads it afresh (:meth:`Record.forget_node`,
  through :meth:`slurm_hooks.remedy.wiring.Wiring.node_now`).

  Read afresh every time: ``job`` and ``jobs`` (the follower polls them until a job is
  PENDING again), ``nodes``, ``drained_count``, and what a job was submitted with. A read that
  failed is not kept. So what the run reads after a write of its own is Slurm's answer (the
  ReasonTime right after our drain, the ownership checks after it), never one from before.

Reads are reused only within the run: the run ends its record (:meth:`Record.end`), and a
follower thread that outlives it reads afresh from then on. Errors are noted all along.
"""

from __future__ import annotations

from collections.abc import Sequence

from slurm_hooks.errors import SlurmHooksError, TransientError
from slurm_hooks.slurm import JobDetail, JobInfo, JobRecord, NodeInfo

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing (~3 ms of each start)
if TYPE_CHECKING:
    from typing import Any

    from slurm_hooks.slurm import Slurm


class Record:
    """What one run's Slurm calls left: the errors they raised, and the reads the run may reuse."""

    __slots__ = ("_comments", "_details", "_jobs_on", "_nodes", "_records", "errors", "open")

    def __init__(self) -> None:
        #: Every error a call raised, in order.
        self.errors: list[SlurmHooksError] = []
        #: Reads are reused while the run goes on (:meth:`end`).
        self.open = True
        self._nodes: dict[str, NodeInfo] = {}
        self._jobs_on: dict[str, list[JobInfo]] = {}
        self._details: dict[tuple[str, str], JobDetail] = {}
        self._comments: dict[str, str] = {}
        self._records: dict[str, JobRecord] = {}

    def transient(self, since: int = 0) -> bool:
        """Whether a call failed for a transient reason (since the ``since``-th error)."""
        return any(isinstance(e, TransientError) for e in self.errors[since:])

    def last_error(self, since: int = 0) -> str:
        """The last transient error's text (since the ``since``-th error); "" for none."""
        transient = [e for e in self.errors[since:] if isinstance(e, TransientError)]
        return str(transient[-1]) if transient else ""

    def end(self) -> None:
        """The run is over: from now on every read goes to Slurm (errors are still noted)."""
        self.open = False
        self._forget_state()
        self._comments.clear()

    def _forget_state(self) -> None:
        self._nodes.clear()
        self._jobs_on.clear()
        self._details.clear()
        self._records.clear()

    def forget_node(self, name: str) -> None:
        """The next read of this node (and of its jobs) goes to Slurm: after a write to it, and
        before a resume or a repair decides (a person may have drained or resumed the node since)."""
        self._nodes.pop(name, None)
        self._jobs_on.pop(name, None)

    def _keep_record(self, ref: str, record: JobRecord) -> None:
        self._records[ref] = record
        if record.admin_comment is not None:
            self._comments[ref] = record.admin_comment

    def _forget_job(self, ref: str, *, comment: bool) -> None:
        self._nodes.clear()
        self._jobs_on.clear()
        for key in [k for k in self._details if k[0] == ref]:
            del self._details[key]
        self._records.pop(ref, None)
        if comment:
            self._comments.pop(ref, None)


class RecordingSlurm:
    """:class:`slurm_hooks.slurm.Slurm` over ``base`` for one run, keeping ``record`` (see the module)."""

    def __init__(self, base: Slurm, record: Record) -> None:
        self._base = base
        self.record = record

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except SlurmHooksError as exc:
            self.record.errors.append(exc)
            raise

    def bounded(self, deadline: float | None) -> RecordingSlurm:
        """The same run's record over ``base`` bounded by ``deadline``."""
        return RecordingSlurm(self._base.bounded(deadline), self.record)

    # -- nodes

    def node(self, name: str) -> NodeInfo:
        rec = self.record
        if rec.open and name in rec._nodes:
            return rec._nodes[name]
        info = self._call(self._base.node, name)
        if rec.open:
            rec._nodes[name] = info
        return info

    def nodes(self) -> list[NodeInfo]:
        return self._call(self._base.nodes)

    def drained_count(self, reason: str) -> int:
        return self._call(self._base.drained_count, reason)

    def drain(self, name: str, reason: str, *, current: NodeInfo | None = None) -> None:
        try:
            self._call(self._base.drain, name, reason, current=current)
        finally:
            self.record.forget_node(name)

    def resume(self, name: str) -> None:
        try:
            self._call(self._base.resume, name)
        finally:
            self.record.forget_node(name)

    def set_node_extra(self, name: str, text: str) -> None:
        try:
            self._call(self._base.set_node_extra, name, text)
        finally:
            self.record.forget_node(name)

    def reboot(self, name: str, reason: str, nextstate: str = "DOWN") -> None:
        try:
            self._call(self._base.reboot, name, reason, nextstate)
        finally:
            self.record.forget_node(name)

    # -- jobs

    def jobs_on_node(self, name: str) -> list[JobInfo]:
        rec = self.record
        if rec.open and name in rec._jobs_on:
            return list(rec._jobs_on[name])
        jobs = self._call(self._base.jobs_on_node, name)
        if rec.open:
            rec._jobs_on[name] = list(jobs)
        return jobs

    def job(self, job_id: int | str) -> JobInfo:
        return self._call(self._base.job, job_id)

    def jobs(self, refs: Sequence[int | str]) -> list[JobInfo]:
        return self._call(self._base.jobs, refs)

    def job_detail(self, ref: int | str, node: str) -> JobDetail:
        rec = self.record
        key = (str(ref), node)
        if rec.open and key in rec._details:
            return rec._details[key]
        detail = self._call(self._base.job_detail, ref, node)
        if rec.open:
            rec._details[key] = detail
            if detail.record is not None:
                rec._keep_record(str(ref), detail.record)
        return detail

    def job_gpus(self, ref: int | str, node: str) -> tuple[int, ...] | None:
        return self.job_detail(ref, node).gpus

    def admin_comment(self, ref: int | str) -> str:
        rec = self.record
        if rec.open and str(ref) in rec._comments:
            return rec._comments[str(ref)]
        return self._call(self._base.admin_comment, ref)

    def job_record(self, ref: int | str) -> JobRecord:
        rec = self.record
        if rec.open and str(ref) in rec._records:
            return rec._records[str(ref)]
        record = self._call(self._base.job_record, ref)
        if rec.open:
            rec._keep_record(str(ref), record)
        return record

    def set_admin_comment(self, ref: int | str, text: str) -> None:
        try:
            self._call(self._base.set_admin_comment, ref, text)
        finally:
            self.record._comments.pop(str(ref), None)
            self.record._records.pop(str(ref), None)

    def requeue(self, ref: int | str) -> None:
        self._job_write(self._base.requeue, ref, comment=False)

    def release(self, ref: int | str) -> None:
        self._job_write(self._base.release, ref)

    def start_now(self, ref: int | str) -> None:
        self._job_write(self._base.start_now, ref)

    def signal(self, ref: int | str, signal: str, target: str = "full") -> None:
        self._job_write(self._base.signal, ref, signal, target)

    def _job_write(self, fn: Any, ref: int | str, *args: Any, comment: bool = True) -> None:
        """A write to the job's state: what the run read of it, and of every node and job list, is old."""
        try:
            self._call(fn, ref, *args)
        finally:
            self.record._forget_job(str(ref), comment=comment)

    # -- what a job was submitted with (read afresh: each is read once a run at most)

    def batch_script(self, ref: int | str) -> bytes:
        return self._call(self._base.batch_script, ref)

    def submit_line(self, ref: int | str) -> str:
        return self._call(self._base.submit_line, ref)

    def job_partition(self, ref: int | str) -> str:
        return self._call(self._base.job_partition, ref)

    def kill_wait(self) -> float | None:
        return self._call(self._base.kill_wait)

    def exclude_nodes(self, ref: int | str, nodes: str) -> None:
        self._job_write(self._base.exclude_nodes, ref, nodes, comment=False)
