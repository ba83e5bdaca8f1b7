"""Slurm through pyslurm (the 23.x+ object API), used only where it matches Slurm.

pyslurm X.Y builds against Slurm X.Y alone and links libslurmfull, so it is
used only when its major.minor equals the running Slurm's and libslurm will find
a slurm.conf; :mod:`slurm_hooks.slurm.factory` decides, without importing it. It
saves a process per call (the scontrol backend costs a few milliseconds each) and
nothing else, so the two backends keep exactly the same behaviour: same
reason-ownership rules, same errors, same addressing of array tasks and
heterogeneous jobs. One contract suite (tests/slurm/test_slurm_adapter.py) runs
against both, on a real Slurm 25.11 with PyPI's pyslurm 25.11 (docs/dev/testing.md).

Written against pyslurm 23.x-25.x: ``Node.load``, ``Nodes.load``,
``Node.modify(Node(state=..., reason=...))``, ``Job.load``, ``Jobs.load``,
``Job.requeue/release/modify``, ``JobSubmitDescription``, ``RPCError``.
"""

from __future__ import annotations

import copy
import importlib
from collections.abc import Sequence
from typing import Any, Callable

from slurm_hooks.slurm import JobDetail, JobInfo, JobRecord, NodeInfo, job_ref, may_resume, quirks
from slurm_hooks.slurm.errors import (
    AlreadyRequeued,
    ReasonNotOurs,
    SlurmCommandFailed,
    SlurmNotFound,
    SlurmUnavailable,
    check_drain,
    classify_message,
    requeue_refused,
)
from slurm_hooks.slurm.scontrol import call_timeout
from slurm_hooks.slurm.version import parse_version


class PyslurmSlurm:
    """:class:`slurm_hooks.slurm.Slurm` over pyslurm.

    A pyslurm call holds the interpreter (its Cython calls keep the GIL) until libslurm gives up on
    the controller, after slurm.conf's ``MessageTimeout`` (``message_timeout``; seen on 25.11: a
    stopped slurmctld holds ``Nodes.load`` 5.0 s with MessageTimeout=5, and no other thread runs
    meanwhile). So no thread or alarm can cut it shorter: where ``timeout``, or the time left before
    the run's deadline, is shorter than that, the call goes through the scontrol backend instead,
    whose process is killed at the bound."""

    name = "pyslurm"

    def __init__(self, timeout: float = 10.0, module: Any = None, cli: Any = None, message_timeout: float = 10.0):
        self.timeout = float(timeout)
        self.ps = module if module is not None else importlib.import_module("pyslurm")
        #: The scontrol backend: for what pyslurm's ``Job(int)`` cannot address (one task of an
        #: array: ``Job(<array id>)`` would act on every task), and for calls that must end sooner
        #: than libslurm would give up.
        self.cli = cli
        #: libslurm's own bound on one call (slurm.conf's MessageTimeout, Slurm's default 10 s).
        self.message_timeout = float(message_timeout)
        self.deadline: float | None = None

    def bounded(self, deadline: float | None) -> PyslurmSlurm:
        """This adapter with every call's timeout cut to what is left before ``deadline``."""
        other = copy.copy(self)
        other.deadline = deadline
        if self.cli is not None:
            other.cli = self.cli.bounded(deadline)
        return other

    def _short(self) -> bool:
        """Whether this call must end sooner than libslurm would give up (then scontrol makes it)."""
        return self.cli is not None and call_timeout(self.timeout, self.deadline) < self.message_timeout

    def _call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """One library call, bounded by libslurm's MessageTimeout; its failure as our typed error."""
        call_timeout(self.timeout, self.deadline)  # SlurmTimeout when the run's deadline is too close
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001 - pyslurm raises RPCError, ValueError, ...
            raise self._translate(what, exc) from None

    def _translate(self, what: str, exc: BaseException) -> Exception:
        rpc_error = getattr(self.ps, "RPCError", None)
        if rpc_error is not None and isinstance(exc, rpc_error):
            kind = classify_message(str(exc))
            if kind == "unavailable":
                return SlurmUnavailable(f"pyslurm {what}: {exc}")
            if kind == "not_found":
                return SlurmNotFound(f"pyslurm {what}: {exc}")
            return SlurmCommandFailed(f"pyslurm {what}: {exc}")
        if isinstance(exc, (ValueError, TypeError)):
            return SlurmCommandFailed(f"pyslurm {what}: {exc}")
        return exc if isinstance(exc, Exception) else RuntimeError(str(exc))

    # -- nodes

    def node(self, name: str) -> NodeInfo:
        if self._short():
            return self.cli.node(name)
        return _node_info(self._call(f"load node {name}", self.ps.Node.load, name))

    def drained_count(self, reason: str) -> int:
        return sum(1 for n in self.nodes() if n.reason == reason and (n.drained or n.base_state == "DOWN"))

    def nodes(self) -> list[NodeInfo]:
        if self._short():
            return self.cli.nodes()
        loaded = self._call("load nodes", self.ps.Nodes.load)
        items = loaded.values() if hasattr(loaded, "values") else loaded
        return [_node_info(n) for n in items]

    def drain(self, name: str, reason: str, *, current: NodeInfo | None = None) -> None:
        """As :meth:`.scontrol.ScontrolSlurm.drain`: ``current`` saves reading the node again."""
        node = current if current is not None and current.name == name else self.node(name)
        check_drain(node, reason)
        if self._short():
            self.cli.drain(name, reason, current=node)
            return
        changes = self.ps.Node(state="DRAIN", reason=reason)
        self._call(f"drain {name}", self.ps.Node(name).modify, changes)

    def resume(self, name: str) -> None:
        if self._short():
            self.cli.resume(name)
            return
        current = self.node(name)
        if not current.out_of_service:
            return
        if not may_resume(current):
            raise ReasonNotOurs(current, "resume")
        if not quirks.may_set_idle(parse_version(current.extra.get("Version", "")), current.flags):
            raise SlurmCommandFailed(f"{name}: not resumed while its reboot is issued (REBOOT_ISSUED): Slurm "
                                     "25.11+ refuses it; the reboot's registration brings the node back")
        self._call(f"resume {name}", self.ps.Node(name).modify, self.ps.Node(state="RESUME"))

    def reboot(self, name: str, reason: str, nextstate: str = "DOWN") -> None:
        """pyslurm has no reboot request that takes a reason: scontrol does it."""
        self._array_cli().reboot(name, reason, nextstate)

    def set_node_extra(self, name: str, text: str) -> None:
        """Through scontrol, like the reboot: one place that writes a node's Extra."""
        self._array_cli("set a node's Extra").set_node_extra(name, text)

    # -- jobs

    def job(self, job_id: int | str) -> JobInfo:
        ref = _ref(job_id)
        if "_" in ref or self._short():
            return self._array_cli().job(ref)
        return _job_info(self._call(f"load job {ref}", self.ps.Job.load, int(ref)))

    def jobs(self, refs: Sequence[int | str]) -> list[JobInfo]:
        """In one query, as squeue asks: ``Job.load`` for one job, ``Jobs.load`` (the job table) for
        several; array tasks through the scontrol backend, all in its one squeue."""
        wanted = list(dict.fromkeys(_ref(r) for r in refs))
        plain = [r for r in wanted if "_" not in r]
        tasks = [r for r in wanted if "_" in r]
        found = self._array_cli().jobs(tasks) if tasks else []
        if len(plain) == 1:
            try:
                found.append(self.job(plain[0]))
            except SlurmNotFound:
                pass
        elif plain:
            loaded = self._call("load jobs", self.ps.Jobs.load)
            items = loaded.values() if hasattr(loaded, "values") else loaded
            found += [job for job in map(_job_info, items) if any(job.answers_to(r) for r in plain)]
        return found

    def jobs_on_node(self, name: str) -> list[JobInfo]:
        if self._short():
            return self.cli.jobs_on_node(name)
        loaded = self._call("load jobs", self.ps.Jobs.load)
        items = loaded.values() if hasattr(loaded, "values") else loaded
        return [job for job in map(_job_info, items) if job.active and job.runs_on(name)]

    def job_gpus(self, ref: int | str, node: str) -> tuple[int, ...] | None:
        """From ``scontrol -d show job`` (pyslurm's GRES detail differs between its versions);
        ``None`` (unknown: the job counts as touched) without the scontrol backend."""
        return self.cli.job_gpus(ref, node) if self.cli is not None else None

    def job_detail(self, ref: int | str, node: str) -> JobDetail:
        """Through scontrol's backend, as :meth:`job_gpus`; without it nothing is known."""
        return self.cli.job_detail(ref, node) if self.cli is not None else JobDetail(None)

    def _array_cli(self, what: str = "address one task of a job array") -> Any:
        """The scontrol backend this one delegates to (arrays; AdminComment, kept in one place)."""
        if self.cli is None:
            raise SlurmCommandFailed(f"pyslurm backend cannot {what} without scontrol")
        return self.cli

    def _act(self, what: str, ref: int | str, *args: Any) -> None:
        ref = _ref(ref)
        if "_" in ref or self._short():
            getattr(self._array_cli(), what)(ref, *args)
            return
        job = self.ps.Job(int(ref))
        if what == "start_now":
            self._call(f"{what} {ref}", job.modify, self.ps.JobSubmitDescription(begin_time="now"))
        else:
            self._call(f"{what} {ref}", getattr(job, what))

    def requeue(self, ref: int | str) -> None:
        try:
            self._act("requeue", ref)
        except SlurmCommandFailed as exc:
            if isinstance(exc, AlreadyRequeued) or not requeue_refused(str(exc)):
                raise
            raise AlreadyRequeued(str(exc), exc.argv, exc.stderr) from None

    def release(self, ref: int | str) -> None:
        self._act("release", ref)

    def start_now(self, ref: int | str) -> None:
        self._act("start_now", ref)

    def admin_comment(self, ref: int | str) -> str:
        return self._array_cli("read an AdminComment").admin_comment(_ref(ref))

    def set_admin_comment(self, ref: int | str, text: str) -> None:
        self._array_cli("set an AdminComment").set_admin_comment(_ref(ref), text)

    def signal(self, ref: int | str, signal: str, target: str = "full") -> None:
        """Through scontrol's backend (``scancel``): pyslurm's ``send_signal`` has no ``--batch``
        without ``--full``, and one place keeps the targets."""
        self._array_cli("signal a job").signal(_ref(ref), signal, target)

    def batch_script(self, ref: int | str) -> bytes:
        return self._array_cli("read a batch script").batch_script(_ref(ref))

    def submit_line(self, ref: int | str) -> str:
        return self._array_cli("read a submit line").submit_line(_ref(ref))

    def job_partition(self, ref: int | str) -> str:
        return self._array_cli("read a job's partition").job_partition(_ref(ref))

    def kill_wait(self) -> float | None:
        return self._array_cli("read KillWait").kill_wait()

    def job_record(self, ref: int | str) -> JobRecord:
        return self._array_cli("read a job's record").job_record(_ref(ref))

    def exclude_nodes(self, ref: int | str, nodes: str) -> None:
        self._array_cli("exclude nodes").exclude_nodes(_ref(ref), nodes)


def _node_info(node: Any) -> NodeInfo:
    """pyslurm's ``Node`` as the scontrol backend's JSON read fills :class:`NodeInfo`: the reason's
    user and time (epoch seconds, as ``scontrol --json``), ``Extra``, the partitions, the version."""
    gres = getattr(node, "configured_gres", None) or {}
    gres_text = ",".join(f"{k}:{v}" for k, v in gres.items()) if isinstance(gres, dict) else str(gres)
    changed = getattr(node, "reason_time", None)
    partitions = getattr(node, "partitions", None) or []
    if isinstance(partitions, str):
        partitions = partitions.split(",")
    return NodeInfo(
        name=node.name,
        state=node.state or "",
        reason=(node.reason or "").strip(),
        comment=getattr(node, "comment", None) or "",
        gres=gres_text,
        extra={"ReasonUser": getattr(node, "reason_user", None) or "",
               "ReasonTime": str(changed) if _num(changed) else "",
               "Version": getattr(node, "slurm_version", None) or "",
               "Extra": getattr(node, "extra", None) or "",
               "Partitions": ",".join(str(p) for p in partitions if p)},
    )


def _ref(value: int | str) -> str:
    try:
        return job_ref(value)
    except ValueError as exc:
        raise SlurmCommandFailed(str(exc)) from None


def _num(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _array(job: Any) -> tuple[int, str]:
    """(array id, task index) as squeue's ``ArrayJobID``/``ArrayTaskID`` give them: pyslurm says
    ``None`` for task 0 as for no task (it reads 0 as unset), so an array's record with no
    tasks still waiting is task 0; the record of the tasks still waiting (``1-3``) and a job
    outside an array are (0, "")."""
    array_id = _num(getattr(job, "array_id", None))
    if not array_id:
        return 0, ""
    task = getattr(job, "array_task_id", None)
    if isinstance(task, int) and not isinstance(task, bool) and task >= 0:
        return array_id, str(task)
    if task is None and not getattr(job, "array_tasks_waiting", None):
        return array_id, "0"
    return 0, ""


def _job_info(job: Any) -> JobInfo:
    array_id, task = _array(job)
    priority = getattr(job, "priority", None)
    return JobInfo(
        job_id=int(job.id),
        name=job.name or "",
        state=job.state or "",
        nodes=job.allocated_nodes or "",
        requeue=bool(job.is_requeueable),
        batch=bool(job.is_batch_job),
        restarts=int(job.requeue_count or 0),
        reason=job.state_reason or "",
        user=str(getattr(job, "user_name", None) or ""),
        array_job_id=array_id,
        array_task_id=task,
        het_job_id=_num(getattr(job, "heterogeneous_id", None)),
        priority="" if priority is None else str(priority),
        extra={"Comment": getattr(job, "comment", None) or ""},
    )
