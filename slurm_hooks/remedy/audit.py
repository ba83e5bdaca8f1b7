"""One audit record per remediation step, and the job's own account of why (its AdminComment).

Shared by the remediation (:mod:`.drain`, :mod:`.requeue`), the job follower (:mod:`.follower`) and the
checkpoint path (:mod:`.checkpoint`), so each writes the same record the same way.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from slurm_hooks import REASON_PREFIX
from slurm_hooks.errors import SlurmHooksError
from slurm_hooks.remedy.wiring import Wiring
from slurm_hooks.slurm import ADMIN_COMMENT_MAX, join_admin_comment

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing (~3 ms of each start)
if TYPE_CHECKING:
    from typing import Any


def step(w: Wiring, action: str, target: str, result: str, started: float, **fields: Any) -> None:
    """``action`` on ``target`` ended in ``result``; ``started`` is its ``time.monotonic()``."""
    w.audit.write("action", node=w.node, action=action, target=target, result=result,
                  duration_s=round(time.monotonic() - started, 4), **fields)


def gpu_fields(report: Any, index: int | None) -> dict[str, str]:
    """The GPU's identity for an audit record (``uuid``, ``serial``, ``pci_bus_id`` from the run's
    snapshot), so the RMA list and the report name a board by serial: a replaced board starts a
    clean history. {} for a node-wide finding or a GPU the snapshot lacks."""
    snap = getattr(report, "snapshot", None)
    gpu = snap.gpu(index) if snap is not None and index is not None else None
    if gpu is None:
        return {}
    return {k: v for k, v in (("uuid", gpu.uuid), ("serial", gpu.serial), ("pci_bus_id", gpu.pci_bus_id)) if v}


#: An AdminComment is written only with at least this much of the run's deadline left.
ANNOTATE_MIN_S = 1.0
#: What one line says at most (many findings make a long summary).
ANNOTATE_WHAT_MAX = 200


def annotate_jobs(w: Wiring, refs: Iterable[str], what: str) -> None:
    """Tell each job's owner why: append ``slurm-hooks: <what>, <UTC minute>`` to its AdminComment
    (``scontrol show job``, ``sacct -o AdminComment``), keeping what is there.

    Called once the requeue (or the prolog's refusal) is done, and never in its way: each call is
    bounded by what is left of the run's deadline, and a failure is a warning in the audit log,
    never a pending requeue. The AdminComment joined to is the one the run read with the job's GPUs
    where it did (the run's record, :mod:`slurm_hooks.slurm.recording`), else it is read here.
    """
    what = what if len(what) <= ANNOTATE_WHAT_MAX else what[: ANNOTATE_WHAT_MAX - 3].rstrip() + "..."
    line = f"{REASON_PREFIX} {what}, {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}"
    for ref in refs:
        t0 = time.monotonic()
        if w.time_left(ANNOTATE_MIN_S) < ANNOTATE_MIN_S:
            step(w, "annotate", ref, "skipped", t0, jobs=[ref], level="warning", comment=line,
                 detail="too little of the run's deadline left to write the job's AdminComment")
            continue
        try:
            joined = join_admin_comment(w.slurm.admin_comment(ref), line)
            if joined is None:
                step(w, "annotate", ref, "skipped", t0, jobs=[ref], level="warning", comment=line,
                     detail=f"no room in the job's AdminComment (at most {ADMIN_COMMENT_MAX} characters) "
                            "without cutting what others wrote")
                continue
            w.slurm.set_admin_comment(ref, joined)
        except SlurmHooksError as exc:
            step(w, "annotate", ref, "failed", t0, jobs=[ref], level="warning", comment=line, error=str(exc))
            continue
        step(w, "annotate", ref, "ok", t0, jobs=[ref], comment=line)
