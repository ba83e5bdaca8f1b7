"""The ladder's rungs: reset the faulty GPUs, reboot through Slurm, leave the node for
replacement. Each runs once and returns its result; none climbs (:mod:`.worker` does)."""

from __future__ import annotations

import contextlib
import os
import time

from slurm_hooks.engine import drain_summary
from slurm_hooks.errors import PermanentError, SlurmHooksError
from slurm_hooks.models import Action, Report
from slurm_hooks.remedy import ownership
from slurm_hooks.remedy.repair.evidence import keep_evidence
from slurm_hooks.remedy.repair.ladder import Rung
from slurm_hooks.remedy.repair.planner import Plan, attempt
from slurm_hooks.remedy.repair.rma import add_to_rma, gpu_ids
from slurm_hooks.remedy.repair.state import Active, Replaced, Stopped
from slurm_hooks.remedy.repair.validation import Rejudge, validate_and_resume
from slurm_hooks.slurm import NodeState, format_reason
from slurm_hooks.slurm.errors import ReasonNotOurs

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from slurm_hooks.probes.gpureset import GpuResetter, NvidiaSmiReset
    from slurm_hooks.remedy.outcome import Outcome
    from slurm_hooks.remedy.repair.store import Ledger
    from slurm_hooks.remedy.wiring import Wiring


def reset(w: Wiring, p: Plan, outcome: Outcome, rejudge: Rejudge, ledger: Ledger,
          resetter: GpuResetter | None, report: Report | None = None) -> str:
    """Rung 1: "ok" when the node is healthy again and resumed, "unverified" when it checked
    healthy but its diagnostic did not run in full, else "failed"."""
    from slurm_hooks.remedy.wiring import xid_history

    backend = resetter or resetter_for(w, ledger)
    indexes = sorted(i for i, _ in p.gpus if i is not None)
    started, t0 = time.time(), time.monotonic()
    # counted before it acts: a worker killed mid-reset still used this attempt
    record = ledger.record(attempt("reset", p, started, "started"))
    audit(w, "reset", "start", 0.0, p, gpus=indexes, backend=backend.name)
    result, detail = "failed", ""
    try:
        backend.reset(indexes)
    except SlurmHooksError as exc:
        detail = str(exc)
    else:
        # The reset cleared what the XIDs we drained for reported; they stay in the kernel log. So it
        # dealt with the ECC counts judged before it, where they outlive a reset (checks.ecc says why
        # only those, and only this boot's).
        history = xid_history(w).load()
        history.ack(ownership.drained_for(w) or [])
        history.ack_ecc(_boot(), _ecc_counts(report, p))
        with contextlib.suppress(SlurmHooksError):
            history.save()
        after = rejudge(0, None)
        if after.drain_findings():
            detail = f"still {drain_summary(after)} after the reset"
        else:
            result, detail, _ = validate_and_resume(w, p.summary, "reset", outcome, rejudge, ledger)
    ledger.settle(record, result)
    outcome.repairs.append(f"reset:{result}")
    audit(w, "reset", result, time.monotonic() - t0, p, gpus=indexes, detail=detail)
    return result


def reboot(w: Wiring, p: Plan, outcome: Outcome, ledger: Ledger, resetter: GpuResetter | None,
           report: Report | None = None) -> str:
    """Rung 2: "start" once Slurm took the reboot (the node comes back DOWN; the first check on the
    new boot judges it), "refused" (counted: the ladder moves on), "skipped" or "failed"."""
    since = time.time() - w.config.repair.window
    tried = sum(1 for a in ledger.state.attempts if a.rung == "reboot" and a.t >= since
                and set(a.gpus) & {g for _, g in p.gpus})
    # The count rides in Slurm's reason ([reboot 1/2]): a lost state dir does not reset it.
    reason = format_reason(p.summary, Action.REBOOT, attempt=(tried + 1, w.config.repair.attempts))
    evidence = keep_evidence(w, report, "reboot")  # a reboot wipes the kernel log and the GPU's state
    t0, started = time.monotonic(), time.time()
    boot = (resetter or resetter_for(w, ledger)).boot_id()
    try:
        w.slurm.reboot(w.node, reason, NodeState.DOWN)
    except ReasonNotOurs as exc:
        audit(w, "reboot", "skipped", time.monotonic() - t0, p, reason=reason, detail=str(exc))
        return "skipped"
    except PermanentError as exc:
        # Refused (no RebootProgram: "Unspecified error"): that was the attempt. Counted once,
        # and the ladder moves on now instead of asking again at every check.
        ledger.record(attempt("reboot", p, started, "refused"))
        outcome.repairs.append("reboot:refused")
        audit(w, "reboot", "refused", time.monotonic() - t0, p, reason=reason, error=str(exc),
               detail="Slurm refused the reboot (is RebootProgram set in slurm.conf?): the ladder moves on")
        return "refused"
    except SlurmHooksError as exc:
        outcome.failed.append(f"reboot: {exc}")
        audit(w, "reboot", "failed", time.monotonic() - t0, p, reason=reason, error=str(exc))
        return "failed"
    ownership.write_marker(w, reason, None)
    ledger.update(active=Active(time.time(), boot, reason, p.why, p.summary, tuple(p.gpus),
                                tuple((f.check, f.gpu) for f in report.drain_findings()) if report else ()))
    outcome.repairs.append("reboot:start")
    audit(w, "reboot", "start", time.monotonic() - t0, p, reason=reason, gpu_ids=gpu_ids(report, p),
           evidence=evidence,
           detail="scontrol reboot ASAP nextstate=DOWN: back in service only after a passing check on the new boot")
    return "start"


def replace(w: Wiring, p: Plan, report: Report, outcome: Outcome, ledger: Ledger) -> str:
    """Rung 3: the drain stays, tagged ``[replace]``, the GPUs go on the RMA list: "ok" (or "failed"
    when Slurm would not take the drain)."""
    summary = drain_summary(report) if report.drain_findings() else p.summary
    reason = format_reason(summary, Action.REPLACE)
    t0 = time.monotonic()
    try:
        w.slurm.drain(w.node, reason)
    except SlurmHooksError as exc:
        outcome.failed.append(f"drain: {exc}")
        audit(w, "replace", "failed", time.monotonic() - t0, p, reason=reason, error=str(exc))
        return "failed"
    ownership.write_marker(w, reason, report)
    outcome.drained = outcome.node_out = True
    ledger.record(attempt("replace", p, time.time(), "ok"),
                  replaced=Replaced(time.time(), reason, tuple(g for _, g in p.gpus)))
    evidence = keep_evidence(w, report, "replace")
    rma = add_to_rma(w, p, report, ledger.state, evidence)
    outcome.repairs.append("replace:ok")
    audit(w, "replace", "ok", time.monotonic() - t0, p, reason=reason, rma=rma, gpu_ids=gpu_ids(report, p),
           evidence=evidence, detail=f"{p.why}; drain stays for a person or the bridge; GPU(s) on the RMA list")
    return "ok"


def _boot() -> str:
    from slurm_hooks.probes.kmsg import boot_id

    return boot_id()


def _ecc_counts(report: Report | None, p: Plan) -> dict[str, dict[str, int]]:
    """The per-block uncorrectable counts of the plan's GPUs as the ladder judged them before the
    reset (GPU identity -> block -> count); none for GPUs without per-block counts (NVIDIA's)."""
    if report is None or report.snapshot is None:
        return {}
    from slurm_hooks.models import gpu_identity

    mine = {ident for _, ident in p.gpus}
    out: dict[str, dict[str, int]] = {}
    for g in report.snapshot.gpus:
        ident = gpu_identity(g.uuid, g.index, g.pci_bus_id)
        if ident in mine and g.ecc_blocks:
            counts = {b.block: b.uncorrectable for b in g.ecc_blocks if b.uncorrectable}
            if counts:
                out[ident] = counts
    return out


def run(rung: Rung, w: Wiring, p: Plan, report: Report, outcome: Outcome, rejudge: Rejudge, ledger: Ledger,
        resetter: GpuResetter | None) -> str:
    """Run one rung for the plan; its result says whether the worker climbs on (:data:`CLIMBS_ON`)."""
    if rung is Rung.RESET:
        return reset(w, p, outcome, rejudge, ledger, resetter, report)
    if rung is Rung.REBOOT:
        return reboot(w, p, outcome, ledger, resetter, report)
    return replace(w, p, report, outcome, ledger)


#: The results on which the worker climbs to the next rung in the same run: a failed reset (the
#: node is out anyway), a reboot Slurm refused (counted: asking again would be refused again).
CLIMBS_ON = {Rung.RESET: frozenset({"failed"}), Rung.REBOOT: frozenset({"refused"}), Rung.REPLACE: frozenset()}


def restore_services(w: Wiring, ledger: Ledger) -> list[str]:
    """Start the services the record says are stopped (a worker died between its stop and its
    start); returns those still not running. Call with the repair lock held."""
    stopped = ledger.state.stopped
    names = list(stopped.services) if stopped is not None else []
    if stopped is None or not names:
        return []
    t0 = time.monotonic()
    backend = resetter_for(w, ledger)
    errors: list[str] = []
    left = backend.start_services(names, errors)
    _journal(ledger, left)
    w.audit.write("action", node=w.node, action="repair-services", target=w.node,
                  result="failed" if left else "ok", duration_s=round(time.monotonic() - t0, 4),
                  services=names, **({"error": "; ".join(errors)} if errors else {}),
                  detail=f"left stopped by a repair worker that did not finish (pid {stopped.pid})")
    return left


def _journal(ledger: Ledger, services: list[str]) -> None:
    """Record the services a reset is about to stop (before it stops them), or none left stopped."""
    ledger.update(stopped=Stopped(tuple(services), time.time(), os.getpid()) if services else None)


def resetter_for(w: Wiring, ledger: Ledger) -> NvidiaSmiReset:
    """The node's reset backend, bounded by this run's budget, journaling the services it stops."""
    from slurm_hooks.probes.gpureset import from_config

    return from_config(w.config, w.node, time_left=lambda: w.time_left(w.config.repair.reset_timeout),
                       journal=lambda services: _journal(ledger, services))


def audit(w: Wiring, rung: str, result: str, duration: float, p: Plan, **fields: Any) -> None:
    w.audit.write("action", node=w.node, action=f"repair-{rung}", target=w.node, result=result,
                  duration_s=round(duration, 4), why=p.why, **{k: v for k, v in fields.items() if v not in (None, "")})
