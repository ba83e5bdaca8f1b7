"""Validation before return to service: after a reset or a reboot (and on a person's
``slurm-hooks repair --validate``) the node stays drained ``[validating]`` while the node's GPU
diagnostic runs at ``[repair] dcgm_level`` (``dcgmi diag -r``, ``rvs -r`` on AMD nodes, each named
in its own words), with the per-node fabric tests where ``[repair] fabric_tests`` (the hooks'
rejudge runs them and adds their findings, :data:`FABRIC`); only a diagnostic that ran and passed
in full resumes it. One that could not run in full, or a fabric test with a floor that could not
run, leaves it ``[unverified]`` for a person; a fabric figure under its floor fails it."""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Callable, Optional

from slurm_hooks.engine import drain_summary
from slurm_hooks.errors import SlurmHooksError
from slurm_hooks.models import Report
from slurm_hooks.remedy import drain, ownership
from slurm_hooks.remedy.repair import state as repair_state
from slurm_hooks.remedy.repair.state import RepairStateUnreadable, Validating
from slurm_hooks.remedy.repair.store import Ledger, load
from slurm_hooks.slurm import format_status_reason, parse_reason
from slurm_hooks.values import replace

TYPE_CHECKING = False
if TYPE_CHECKING:

    from slurm_hooks.remedy.outcome import Outcome
    from slurm_hooks.remedy.wiring import Wiring
    from slurm_hooks.slurm import NodeInfo

#: ``judge(dcgm_level, dcgm_timeout)``: the node judged afresh after a repair (a new snapshot),
#: with the GPU diagnostic at least that deep bounded by that timeout (None: ``[dcgm] timeout``).
Rejudge = Callable[[int, Optional[float]], Report]
#: Reason tags of a node proving itself (``[validating]``) or left for a person because its
#: diagnostic did not run in full (``[unverified]``).
VALIDATING, UNVERIFIED = "validating", repair_state.UNVERIFIED
#: A validation interrupted this often (its worker died) is given up: ``[unverified]``.
VALIDATE_TRIES = 2
#: The check of the per-node fabric tests' findings in a validation (and in its ``checks_run``):
#: a figure under its floor takes the node out (reboot, then replace); one not run is no pass.
FABRIC = "node-fabric"


def validate_and_resume(w: Wiring, summary: str, after: str, outcome: Outcome, rejudge: Rejudge,
                        ledger: Ledger, info: NodeInfo | None = None) -> tuple[str, str, Report | None]:
    """The node checked healthy after ``after`` (reset, reboot, request): hold it drained
    ``[validating]`` while the configured diagnostic runs, then resume it only on a full pass.
    Returns (result, detail, the report judged): "ok", "failed" (the diagnostic found a fault: the
    caller climbs on that report), or "unverified" (the node stays drained for a person)."""

    from slurm_hooks import probes

    level = w.config.repair.dcgm_level
    name, command = probes.diagnostic(w.config, w.node)
    if level <= 0:
        report = rejudge(0, None)
        if report.drain_findings():
            return "failed", f"still {drain_summary(report)}", report
        return (*_resume_validated(w, outcome, report, info, "no diagnostic configured ([repair] dcgm_level = 0)"),
                report)
    reason = format_status_reason(summary, VALIDATING)
    was = ledger.state.validating or Validating(time.time(), after)
    ledger.update(validating=replace(was, summary=summary, reason=reason, result="running", tries=was.tries + 1))
    t0 = time.monotonic()
    try:
        w.slurm.drain(w.node, reason)
    except SlurmHooksError as exc:
        outcome.failed.append(f"drain: {exc}")
        forget(ledger)
        return "failed", f"could not mark the node {reason!r}: {exc}", None
    ownership.write_marker(w, reason, None)
    budget = min(w.config.repair.validate_timeout, w.time_left(w.config.repair.validate_timeout))
    w.audit.write("action", node=w.node, action="repair-validate", target=w.node, result="start", duration_s=0.0,
                  reason=reason, level=level, after=after, timeout_s=round(budget, 1),
                  detail=f"{command} {level} before the node returns to service")
    report = rejudge(level, budget)
    found, detail = verdict(report, level, name)
    w.audit.write("action", node=w.node, action="repair-validate", target=w.node, result=found,
                  duration_s=round(time.monotonic() - t0, 4), reason=reason, level=level, after=after, detail=detail,
                  **({"gpus": sorted({f.gpu for f in report.drain_findings() if f.gpu is not None})}
                     if found == "failed" else {}))
    if found == "ok":
        forget(ledger)
        return (*_resume_validated(w, outcome, report, info, detail), report)
    if found == "failed":
        forget(ledger)
        return "failed", detail, report
    unverified(w, ledger, summary, detail)
    return UNVERIFIED, detail, report


def verdict(report: Report, level: int, name: str) -> tuple[str, str]:
    """Passed only when the diagnostic (``name``: what it is called, ``probes.diagnostic``) ran and
    every test passed; one that could not run (not installed, host engine down, timed out, cut by
    the deadline) is "unverified", never a pass."""
    if report.drain_findings():
        return "failed", f"{drain_summary(report)}: " + "; ".join(f.message for f in report.drain_findings()[:3])
    dcgm = [f for f in report.findings if f.check == "dcgm"]
    if dcgm:
        return UNVERIFIED, dcgm[0].message
    if "dcgm" not in report.checks_run:
        return UNVERIFIED, f"{name} L{level} did not run"
    fabric = [f for f in report.findings if f.check == FABRIC]
    if fabric:
        return UNVERIFIED, "; ".join(f.message for f in fabric[:3])
    if FABRIC in report.checks_run:
        return "ok", f"{name} L{level} and the fabric tests passed"
    return "ok", f"{name} L{level} passed"


def _resume_validated(w: Wiring, outcome: Outcome, report: Report, info: NodeInfo, detail: str) -> tuple[str, str]:
    """Back into service after a validation (or none configured): a node that came back DOWN from
    our reboot is drained with our reason first, which resume accepts."""

    try:
        node = w.node_now()
        if not node.drained and node.down and node.ours:
            w.slurm.drain(w.node, node.reason)
    except SlurmHooksError as exc:
        outcome.failed.append(f"resume: {exc}")
        return "failed", f"{detail}, but not resumed: {exc}"
    drain.resume_if_ours(w, outcome, report)
    if outcome.resumed:
        return "ok", f"{detail}, resumed"
    return "failed", f"{detail}, but not resumed: " + "; ".join(outcome.failed or ["see the resume record"])


def unverified(w: Wiring, ledger: Ledger, summary: str, detail: str) -> None:
    """The diagnostic did not run in full: the node stays drained, tagged for a person."""

    reason = format_status_reason(summary, UNVERIFIED)
    was = ledger.state.validating or Validating()
    ledger.update(validating=replace(was, result=UNVERIFIED, reason=reason, detail=detail))
    with contextlib.suppress(SlurmHooksError):
        w.slurm.drain(w.node, reason)
        ownership.write_marker(w, reason, None)


def begin(w: Wiring, ledger: Ledger, info: NodeInfo, after: str) -> bool:
    """Hold a node that is still out (new hardware after ``[replace]``) for its validation,
    which a worker then runs; False when none is configured ([repair] dcgm_level = 0)."""
    if w.config.repair.dcgm_level <= 0:
        return False
    parsed = parse_reason(info.reason)
    summary = parsed[0] if parsed else "hardware replaced"
    ledger.update(validating=Validating(time.time(), after, 0, summary, "running"))
    return True


def forget(ledger: Ledger) -> None:
    """The validation on record ends (passed, failed, or the node taken over by someone else)."""
    if ledger.state.validating is not None:
        ledger.update(validating=None)


def validate_on_request(w: Wiring, outcome: Outcome, rejudge: Rejudge, who: str) -> str:
    """A person's ``slurm-hooks repair --validate``: drain ``[validating]``, run the configured
    diagnostic, resume on a full pass. The caller holds the repair lock. Returns the verdict
    ("failed", the node left as it is, when the ladder's memory cannot be read)."""
    try:
        state = load(w)
    except RepairStateUnreadable as exc:
        print(f"slurm-hooks: repair: {exc}: mend or remove it first", file=sys.stderr)
        return "failed"
    report = rejudge(0, None)
    if report.drain_findings():
        return "failed"
    # A validation on record (a worker's) gives way to this one, a new count of tries.
    ledger = Ledger(w, replace(state, validating=None))
    result, _, judged = validate_and_resume(w, f"validation asked by {who}", "request", outcome, rejudge, ledger)
    if result == "failed" and judged is not None and judged.drain_findings():
        drain.drain(w, judged, outcome)  # what failed, as the reason: the ladder takes it from there
    return result
