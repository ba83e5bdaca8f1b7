"""The repair ladder's entry points: what the hooks and commands call to let it act.

The hooks decide when (a health check on a drained node, the epilog of a node's last job); these
functions take the ladder's turn (:mod:`slurm_hooks.remedy.repair`), run its detached worker, or a
person's validation. Cheap to import, and cheap to call where the ladder has nothing to look at
(a ``stat`` or two): the ladder itself is imported only then. Each takes the hook's ``rejudge``
(:data:`slurm_hooks.remedy.repair.Rejudge`): how to judge the whole node again, which only the
health check knows.
"""

from __future__ import annotations

import os
import time

from slurm_hooks.models import Report
from slurm_hooks.remedy.outcome import Outcome, record_metrics
from slurm_hooks.remedy.wiring import Wiring

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing (~3 ms of each start)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from slurm_hooks.remedy.repair import Rejudge


def repair_under_way(w: Wiring) -> bool:
    """A repair worker (or a person's ``repair --validate``) holds this node's repair lock now.
    One ``stat`` when no repair ever ran on the node."""
    if not (w.config.repair.enabled and os.path.exists(w.repair_state())):
        return False
    from slurm_hooks.remedy import repair

    with repair.worker_lock(w) as mine:
        return not mine


def take_turn(w: Wiring, report: Report, outcome: Outcome, rejudge: Rejudge, own_job: str = "",
              mode: str = "detached") -> bool:
    """The repair ladder's turn (:func:`slurm_hooks.remedy.repair.step`); True when it holds the node.
    Off with ``[check] drain = false`` too: a node side that may not drain repairs nothing."""
    if not w.policy.may_repair:
        return False
    if not report.drain_findings() and not os.path.exists(w.repair_state()):
        return False  # healthy and no repair under way: the ladder has nothing to look at (not even an import)
    from slurm_hooks.remedy import repair

    return repair.step(w, report, outcome, rejudge, own_job=own_job, mode=mode)


def repair_after_job(w: Wiring, job: str | None, rejudge: Rejudge, mode: str = "detached") -> Outcome | None:
    """The epilog of a job on a node we drained: judge the whole node and let the ladder climb,
    once no other job is on it. Only a ``stat`` when we have not drained the node."""
    if not w.config.repair.enabled or not os.path.exists(w.drained_marker()):
        return None
    report = rejudge(0, None)
    outcome = Outcome()
    take_turn(w, report, outcome, rejudge, own_job=job or "", mode=mode)
    record_metrics(w, report, outcome)
    return outcome


def repair_worker(w: Wiring, rejudge: Rejudge, own_job: str = "",
                  ready: Callable[[], Any] | None = None) -> Outcome | None:
    """The detached repair worker (``slurm-hooks repair-worker``, started by the hooks): take the
    node's repair lock, say it runs, and run the ladder's due rung within ``[repair]
    worker_timeout``. ``None`` when another worker holds the node (one per node)."""
    from slurm_hooks.remedy import repair

    with repair.worker_lock(w) as mine:
        if ready is not None:
            ready()
        if not mine:
            return None
        w.start_deadline(w.config.repair.worker_timeout)
        t0 = time.monotonic()
        w.audit.write("action", node=w.node, action="repair-worker", target=w.node, result="start",
                      duration_s=0.0, pid=os.getpid(), budget_s=w.config.repair.worker_timeout)
        report = rejudge(0, None)
        outcome = Outcome()
        if w.policy.may_drain:
            repair.step(w, report, outcome, rejudge, own_job=own_job, mode="held")
        w.audit.write("action", node=w.node, action="repair-worker", target=w.node,
                      result="failed" if outcome.failed else "done", duration_s=round(time.monotonic() - t0, 4),
                      pid=os.getpid(), repairs=list(outcome.repairs),
                      **({"error": "; ".join(outcome.failed)} if outcome.failed else {}))
        record_metrics(w, report, outcome)
        return outcome


def validate_node(w: Wiring, who: str, rejudge: Rejudge) -> str:
    """A person's ``slurm-hooks repair --validate`` on this node, in the foreground under the
    node's repair lock: "ok" (validated, back in service), "failed", "unverified", or "busy"."""
    from slurm_hooks.remedy import repair

    with repair.worker_lock(w) as mine:
        if not mine:
            return "busy"
        w.start_deadline(w.config.repair.worker_timeout)
        return repair.validate_on_request(w, Outcome(), rejudge, who)


def repair_plan(w: Wiring, report: Report) -> str:
    """What ``--dry-run`` says the ladder would do ("" for nothing)."""
    if not w.config.repair.enabled or not report.drain_findings():
        return ""
    from slurm_hooks.remedy import repair

    p = repair.plan(w, report)
    return p.text(w.node) if p is not None else ""
