"""Slurm through pyslurm (the 23.x+ object API), used only where it matches Slurm.

pyslurm X.Y builds against Slurm X.Y alone and links libslurmfull, so it is
used only when ``import pyslurm`` works and its major.minor equals the running
Slurm's; :mod:`slurm_hooks.slurm.factory` decides. It saves a process per call
(the scontrol backend costs a few milliseconds each) and nothing else, so the
two backends keep exactly the same behaviour: same reason-ownership rules,
same errors.

Written against pyslurm 23.x-25.x: ``Node.load``, ``Nodes.load``,
``Node.modify(Node(state=..., reason=...))``, ``Job.load``, ``Jobs.load``,
``Job.requeue/release/modify/send_signal``, ``JobSubmitDescription``,
``RPCError``. Not exercised here (PyPI has only 25.11; this host runs 22.05).
"""

from __future__ import annotations

import copy
import importlib
import threading
from typing import Any, Callable

from slurm_hooks import hostlist
from slurm_hooks.slurm import JobInfo, NodeInfo, may_drain, may_resume
from slurm_hooks.slurm.scontrol import (
    ACTIVE_JOB_STATES,
    ReasonNotOurs,
    SlurmCommandFailed,
    SlurmNotFound,
    SlurmTimeout,
    SlurmUnavailable,
    call_timeout,
    classify_message,
)


class PyslurmSlurm:
    """:class:`slurm_hooks.slurm.Slurm` over pyslurm; every call bounded by ``timeout``."""

    name = "pyslurm"

    def __init__(self, timeout: float = 10.0, module: Any = None):
        self.timeout = float(timeout)
        self.ps = module if module is not None else importlib.import_module("pyslurm")
        self.deadline: float | None = None

    def bounded(self, deadline: float | None) -> PyslurmSlurm:
        """This adapter with every call's timeout cut to what is left before ``deadline``."""
        other = copy.copy(self)
        other.deadline = deadline
        return other

    def _call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Run one library call in a worker thread so a hung controller cannot hang us."""
        box: dict[str, Any] = {}

        def work() -> None:
            try:
                box["value"] = fn(*args)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                box["error"] = exc

        timeout = call_timeout(self.timeout, self.deadline)
        worker = threading.Thread(target=work, name=f"pyslurm-{what}", daemon=True)
        worker.start()
        worker.join(timeout)
        if worker.is_alive():
            raise SlurmTimeout(f"pyslurm {what} timed out after {timeout:g}s: controller not answering")
        if "error" in box:
            raise self._translate(what, box["error"])
        return box.get("value")

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
        return _node_info(self._call(f"load node {name}", self.ps.Node.load, name))

    def drained_count(self, reason: str) -> int:
        return sum(1 for n in self.nodes() if n.reason == reason and (n.drained or n.base_state == "DOWN"))

    def nodes(self) -> list[NodeInfo]:
        loaded = self._call("load nodes", self.ps.Nodes.load)
        items = loaded.values() if hasattr(loaded, "values") else loaded
        return [_node_info(n) for n in items]

    def drain(self, name: str, reason: str) -> None:
        current = self.node(name)
        if not may_drain(current):
            raise ReasonNotOurs(current, "drain")
        if not reason or "\n" in reason:
            raise SlurmCommandFailed(f"{name}: refusing to drain with an empty or multi-line reason")
        changes = self.ps.Node(state="DRAIN", reason=reason)
        self._call(f"drain {name}", self.ps.Node(name).modify, changes)

    def resume(self, name: str) -> None:
        current = self.node(name)
        if not current.drained:
            return
        if not may_resume(current):
            raise ReasonNotOurs(current, "resume")
        self._call(f"resume {name}", self.ps.Node(name).modify, self.ps.Node(state="RESUME"))

    # -- jobs

    def job(self, job_id: int) -> JobInfo:
        return _job_info(self._call(f"load job {job_id}", self.ps.Job.load, job_id))

    def jobs_on_node(self, name: str) -> list[JobInfo]:
        loaded = self._call("load jobs", self.ps.Jobs.load)
        items = loaded.values() if hasattr(loaded, "values") else loaded
        out = []
        for raw in items:
            job = _job_info(raw)
            if job.state.split("+")[0] not in ACTIVE_JOB_STATES or not job.nodes:
                continue
            try:
                if name in hostlist.expand(job.nodes):
                    out.append(job)
            except ValueError:
                continue
        return out

    def requeue(self, job_id: int) -> None:
        self._call(f"requeue {job_id}", self.ps.Job(job_id).requeue)

    def release(self, job_id: int) -> None:
        self._call(f"release {job_id}", self.ps.Job(job_id).release)

    def start_now(self, job_id: int) -> None:
        changes = self.ps.JobSubmitDescription(begin_time="now")
        self._call(f"start_now {job_id}", self.ps.Job(job_id).modify, changes)

    def signal(self, job_id: int, signal: str) -> None:
        """Like ``scancel --full``: the batch script, its children and all steps."""
        sig = str(signal).upper()
        sig = sig if sig.startswith("SIG") or sig.isdigit() else f"SIG{sig}"
        self._call(f"signal {job_id}", self.ps.Job(job_id).send_signal, int(sig) if sig.isdigit() else sig, "all")


def _node_info(node: Any) -> NodeInfo:
    gres = getattr(node, "configured_gres", None) or {}
    gres_text = ",".join(f"{k}:{v}" for k, v in gres.items()) if isinstance(gres, dict) else str(gres)
    return NodeInfo(
        name=node.name,
        state=node.state or "",
        reason=node.reason or "",
        comment=getattr(node, "comment", None) or "",
        gres=gres_text,
        extra={"ReasonUser": getattr(node, "reason_user", None) or "", "Version": getattr(node, "slurm_version", "")},
    )


def _job_info(job: Any) -> JobInfo:
    return JobInfo(
        job_id=int(job.id),
        name=job.name or "",
        state=job.state or "",
        nodes=job.allocated_nodes or "",
        requeue=bool(job.is_requeueable),
        batch=bool(job.is_batch_job),
        restarts=int(job.requeue_count or 0),
        reason=job.state_reason or "",
        extra={"Comment": getattr(job, "comment", None) or ""},
    )
