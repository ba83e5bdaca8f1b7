"""What one run of a hook found and did (:class:`Outcome`), and how it is recorded: an ``alert``
audit record per finding, the node's metrics textfile."""

from __future__ import annotations

from slurm_hooks.models import Report, Severity
from slurm_hooks.remedy.audit import gpu_fields
from slurm_hooks.remedy.wiring import Wiring
from slurm_hooks.values import dataclass, field

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing (~3 ms of each start)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["Outcome", "record_alerts", "record_metrics"]


@dataclass
class Outcome:
    """What one run did to the node and its jobs; the hook's exit code and metrics come from it."""

    drained: bool = False
    #: Not drained because the drain guard suspects the config, not the node.
    guarded: bool = False
    #: The node takes no new jobs (drained by us now or before, or by someone else).
    node_out: bool = False
    failed: list[str] = field(default_factory=list)
    #: Refs of the jobs requeued (``123``, ``100_7`` for an array task; see JobInfo.ref).
    requeued: list[str] = field(default_factory=list)
    #: Refs of the jobs sent their checkpoint signal and left their grace to requeue themselves.
    signalled: list[str] = field(default_factory=list)
    resumed: bool = False
    #: What became of a pending action in this run: "retry", "done", "superseded", "dropped" or "".
    pending: str = ""
    #: Repair rungs taken in this run, as "<rung>:<result>" (remedy.repair).
    repairs: list[str] = field(default_factory=list)
    #: ``[check] drain = false``: a fault was found and audited, and not acted on.
    monitor_only: bool = False
    #: The GPUs each touched job holds here as Slurm numbers them (its owner's SLURM_JOB_GPUS), by ref.
    job_gpus: dict[str, tuple[int, ...]] = field(default_factory=dict)
    #: Slurm showed the node drained by us and IDLE (no job, none completing): it can get none, so
    #: there is nothing to requeue and no job list to read (a storm's later rounds ask Slurm less).
    node_empty: bool = False

    @property
    def ok(self) -> bool:
        return not self.failed


def record_alerts(w: Wiring, report: Report, **extra: Any) -> None:
    if w.policy.monitor_only:
        extra["monitor_only"] = True  # [check] drain = false: found, told, not acted on
    for f in report.findings:
        if f.severity is Severity.OK:
            continue
        w.audit.write("alert", node=w.node, context=report.context.value, gpu=f.gpu, check=f.check,
                      rule=f.rule_key, severity=f.severity.value, action=f.action.value, message=f.message,
                      **gpu_fields(report, f.gpu), **extra)


def record_metrics(w: Wiring, report: Report, outcome: Outcome) -> None:
    """This run's verdict and what it did, in the node's metrics textfile ([metrics] textfile_dir)."""
    if not w.config.metrics.textfile_dir:
        return
    from slurm_hooks.observe import metrics
    from slurm_hooks.remedy import pending

    done = ["drain"] * int(outcome.drained) + ["requeue"] * len(outcome.requeued) + ["resume"] * int(outcome.resumed)
    done += [f"repair-{r.split(':')[0]}" for r in outcome.repairs if not r.endswith(":start")]
    done += ["drain-monitor-only"] * int(outcome.monitor_only)  # found, and not acted on: [check] drain = false
    waiting = pending.load(w.config.state.dir, w.node)
    metrics.record(w.config, w.node, report, remediations=done, pending=len(waiting.steps) if waiting else 0)
