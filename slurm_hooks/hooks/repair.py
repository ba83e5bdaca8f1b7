"""The repair ladder: GPU reset -> reboot -> replace, climbed only as far as the fault needs.

Taken only on a node that we drained, with no job on it (the health check on the idle
drained node, or the epilog of its last job), one repair at a time per node (an flock
that a crash lets go of), never on a node someone else drained.

1. **reset** the faulty GPUs (:mod:`slurm_hooks.probes.gpureset`), acknowledge the XIDs
   the reset cleared, judge the node again (with a DCGM diag when configured): healthy
   -> resume.
2. **reboot** through Slurm: ``scontrol reboot ASAP nextstate=DOWN reason="... [reboot]"``.
   The node comes back DOWN, whatever the start-up health check found (verified on 22.05:
   with ``nextstate=RESUME`` the registration clears a drain the start-up check set); the
   first health check on the new boot resumes it when healthy, else climbs on.
3. **replace**: the fault survived the reboot (or came back on the same GPU within the
   window after one): the drain stays, tagged ``[replace]`` (the bridge acts on it), the
   GPUs go on the RMA list, and nothing is tried again until a person resumes the node.

Where to start is the finding's action (reset-class faults at reset; XID 79, a lost GPU,
a missing GPU at reboot). A fault back on the same GPU (UUID) within ``[repair] window``
after a repair starts one rung above it; a rung is tried at most ``attempts`` times per GPU
in the window. Everything is kept in ``<state dir>/repair-<node>.json``, so it counts
across reboots. Every rung is an audit record (start, result, duration) and a metric.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Callable

from slurm_hooks import fsutil
from slurm_hooks.engine import drain_summary
from slurm_hooks.errors import PermanentError, SlurmHooksError
from slurm_hooks.hooks import remediate
from slurm_hooks.models import Action, Finding, Report, Urgency, gpu_identity
from slurm_hooks.slurm import format_reason, parse_reason, reason_attempt, reboot_pending
from slurm_hooks.slurm.errors import ReasonNotOurs
from slurm_hooks.values import dataclass, field

if TYPE_CHECKING:
    from slurm_hooks.hooks.remediate import Outcome
    from slurm_hooks.hooks.wiring import Wiring
    from slurm_hooks.probes.gpureset import GpuResetter

RUNGS = ("reset", "reboot", "replace")
_RUNG_ACTION = {"reset": Action.RESET, "reboot": Action.REBOOT, "replace": Action.REPLACE}
#: XIDs whose first remedy is a reboot (NVIDIA's immediate action RESTART_BM): the GPU fell
#: off the bus. The catalogue gives XID 79 ``reboot`` itself; this keeps a finding that says
#: ``replace`` for it without being an escalation ("-> hardware") at the reboot rung.
_REBOOT_FIRST_XIDS = frozenset({79})
_XID = re.compile(r"^XID (\d+) ")
VERSION = 1
#: Attempts older than this are dropped from the state file whatever the window.
KEEP_S = 30 * 86400

#: ``judge(dcgm_level)``: the node judged afresh after a repair (a new snapshot).
Rejudge = Callable[[int], Report]


def start_rung(finding: Finding) -> str | None:
    """The rung a finding starts at; ``None`` for one no repair mends (a person must look)."""
    action = finding.action
    if action is Action.RESET:
        return "reset"
    if action is Action.REBOOT:
        return "reboot"
    if action is Action.REPLACE:
        m = _XID.match(finding.message)
        if m and int(m.group(1)) in _REBOOT_FIRST_XIDS and "-> hardware" not in finding.message:
            return "reboot"
        if finding.check == "gpu-lost":
            return "reboot"
        return "replace"
    return None


@dataclass
class Plan:
    rung: str
    #: (index, identity) of the GPUs the findings name; identity "node" for node-wide findings.
    gpus: list[tuple[int | None, str]]
    why: str
    summary: str
    skipped: list[str] = field(default_factory=list)

    def text(self, node: str) -> str:
        what = {"reset": "reset GPU(s) " + ", ".join(str(i) for i, _ in self.gpus if i is not None),
                "reboot": "reboot the node through Slurm", "replace": "leave it drained for replacement [replace]"}
        return f"{node}: repair would {what[self.rung]} ({self.why})"


def plan(w: Wiring, report: Report, state: dict[str, Any] | None = None, now: float | None = None) -> Plan | None:
    """What the ladder would do for this report; ``None`` when nothing is to repair."""
    cfg = w.config.repair
    now = time.time() if now is None else now
    state = load(w) if state is None else state
    findings = report.drain_findings()
    if not findings:
        return None
    starts = [start_rung(f) for f in findings]
    if any(s is None for s in starts):
        return None  # a finding no rung mends (a config mismatch, firmware): a person decides
    rung = max(starts, key=RUNGS.index)
    why = f"{drain_summary(report)}: starts at {rung}"
    gpus = _gpus(report, findings)
    since = now - float(cfg.window)
    recent = [a for a in state["attempts"] if a["t"] >= since and set(a["gpus"]) & {g for _, g in gpus}]
    if recent:
        top = max((a["rung"] for a in recent), key=RUNGS.index)
        higher = RUNGS[min(RUNGS.index(top) + 1, len(RUNGS) - 1)]
        if RUNGS.index(higher) > RUNGS.index(rung):
            if all(a.get("result") == "refused" for a in recent if a["rung"] == top):
                why = (f"{drain_summary(report)}: {top} refused by Slurm (is RebootProgram set in slurm.conf?): "
                       "a person must act")
            else:
                why = f"{drain_summary(report)}: back on the same GPU within {_span(cfg.window)} after a {top}"
            rung = higher
    skipped = []
    while rung != "replace":
        tried = sum(1 for a in recent if a["rung"] == rung)
        if not getattr(cfg, rung):
            skipped.append(f"{rung} is off ([repair] {rung} = false)")
        elif rung == "reboot" and any(a["rung"] == "reboot" and a.get("result") == "refused" for a in recent):
            skipped.append("reboot refused by Slurm (is RebootProgram set in slurm.conf?): a person must act")
        elif rung == "reset" and not any(i is not None for i, _ in gpus):
            skipped.append("reset: no single GPU to reset (a node-wide fault)")
        elif tried >= int(cfg.attempts):
            skipped.append(f"{rung} tried {tried} time(s) within {_span(cfg.window)}")
        else:
            break
        rung = RUNGS[RUNGS.index(rung) + 1]
    if skipped:
        why += "; " + "; ".join(skipped)
    return Plan(rung, gpus, why, drain_summary(report), skipped)


def step(w: Wiring, report: Report, outcome: Outcome, rejudge: Rejudge, *, own_job: str = "",
         resetter: GpuResetter | None = None) -> bool:
    """One look at the ladder for this run; True when the repair holds the node (the caller
    then neither drains nor resumes it). Cheap on a healthy node with no repair under way
    (one failed ``open``); never raises."""
    cfg = w.config.repair
    if not cfg.enabled:
        return False
    state = load(w)
    active = state.get("active")
    if active is None and not report.drain_findings() and not state.get("replaced"):
        return False
    try:
        info = w.slurm.node(w.node)
        # A person's resume (or new hardware) ends our [replace] whatever reason Slurm kept after it.
        ended = bool(state.get("replaced")) and active is None and _replace_ended(w, report, state, info)
        if info.reason and remediate.holds(w, info, our_reboot=active is not None):
            return False  # someone else's drain (or Slurm's own): never ours to repair
        if state.get("replaced") and active is None and (info.drained or _down(info)):
            return True  # waiting for a person (or new hardware): no reboot loop, no resume
        if ended and not report.drain_findings():
            return False  # healthy: the caller resumes it
        if active is None and not (info.drained or _down(info)):
            return False  # not drained (yet): the caller drains first
        jobs = [j for j in w.slurm.jobs_on_node(w.node) if j.active and j.ref != own_job and str(j.job_id) != own_job]
    except SlurmHooksError as exc:
        print(f"slurm-hooks: repair: {exc}", file=sys.stderr)
        return active is not None
    if jobs and active is None:
        return False  # repaired once the last job has left (its epilog, or the next check)
    with _locked(w) as mine:
        if not mine:
            return True  # another repair of this node runs right now
        state = load(w)  # as the lock holder sees it
        active = state.get("active")
        if active is not None:
            return _after_reboot(w, report, outcome, rejudge, state, active, info, resetter)
        if _recall(w, report, state, info):
            return True  # the state dir was lost, and Slurm's reason says a person must act
        return _climb(w, report, outcome, rejudge, state, resetter)


def _climb(w: Wiring, report: Report, outcome: Outcome, rejudge: Rejudge, state: dict[str, Any],
           resetter: GpuResetter | None) -> bool:
    p = plan(w, report, state)
    if p is None:
        return False
    if p.rung == "reset":
        if _reset(w, p, outcome, rejudge, state, resetter):
            return True
        p = plan(w, report, state)  # the reset is now an attempt: the next rung
        if p is None:
            return True
    if p.rung == "reboot":
        _reboot(w, p, outcome, state, resetter, report)
    else:
        _replace(w, p, report, outcome, state)
    return True


def _reset(w: Wiring, p: Plan, outcome: Outcome, rejudge: Rejudge, state: dict[str, Any],
           resetter: GpuResetter | None) -> bool:
    """Rung 1; True when the node is healthy again (and resumed)."""
    from slurm_hooks.hooks.wiring import xid_history

    backend = resetter or _resetter(w)
    indexes = sorted(i for i, _ in p.gpus if i is not None)
    started, t0 = time.time(), time.monotonic()
    _audit(w, "reset", "start", 0.0, p, gpus=indexes, backend=backend.name)
    result, detail = "failed", ""
    try:
        backend.reset(indexes)
    except SlurmHooksError as exc:
        detail = str(exc)
    else:
        # The reset cleared what the XIDs we drained for reported; they stay in the kernel log.
        history = xid_history(w).load()
        history.ack(remediate.drained_for(w) or [])
        with contextlib.suppress(SlurmHooksError):
            history.save()
        after = rejudge(_dcgm_level(w))
        if after.drain_findings():
            detail = f"still {drain_summary(after)} after the reset"
        else:
            remediate.resume_if_ours(w, outcome, after)
            result = "ok" if outcome.resumed else "failed"
            detail = "checked healthy, resumed" if outcome.resumed else "checked healthy, but not resumed: " + \
                "; ".join(outcome.failed or ["see the resume record"])
    _attempt(state, "reset", p, started, result)
    save(w, state)
    outcome.repairs.append(f"reset:{result}")
    _audit(w, "reset", result, time.monotonic() - t0, p, gpus=indexes, detail=detail)
    return result == "ok"


def _reboot(w: Wiring, p: Plan, outcome: Outcome, state: dict[str, Any], resetter: GpuResetter | None,
            report: Report | None = None) -> None:
    since = time.time() - float(w.config.repair.window)
    tried = sum(1 for a in state["attempts"] if a["rung"] == "reboot" and a["t"] >= since
                and set(a["gpus"]) & {g for _, g in p.gpus})
    # The count rides in Slurm's reason ([reboot 1/2]): a lost state dir does not reset it.
    reason = format_reason(p.summary, Action.REBOOT, attempt=(tried + 1, int(w.config.repair.attempts)))
    t0, started = time.monotonic(), time.time()
    boot = (resetter or _resetter(w)).boot_id()
    try:
        w.slurm.reboot(w.node, reason, "DOWN")
    except ReasonNotOurs as exc:
        _audit(w, "reboot", "skipped", time.monotonic() - t0, p, reason=reason, detail=str(exc))
        return
    except PermanentError as exc:
        # Refused (no RebootProgram: "Unspecified error"): that was the attempt. Counted once,
        # and the ladder moves on now instead of asking again at every check.
        _attempt(state, "reboot", p, started, "refused")
        save(w, state)
        outcome.repairs.append("reboot:refused")
        _audit(w, "reboot", "refused", time.monotonic() - t0, p, reason=reason, error=str(exc),
               detail="Slurm refused the reboot (is RebootProgram set in slurm.conf?): the ladder moves on")
        if report is not None:
            _replace(w, plan(w, report, state) or p, report, outcome, state)
        return
    except SlurmHooksError as exc:
        outcome.failed.append(f"reboot: {exc}")
        _audit(w, "reboot", "failed", time.monotonic() - t0, p, reason=reason, error=str(exc))
        return
    remediate.write_marker(w, reason, None)
    state["active"] = {"rung": "reboot", "t": time.time(), "boot": boot, "reason": reason, "why": p.why,
                       "summary": p.summary, "gpus": [list(g) for g in p.gpus],
                       "findings": [[f.check, f.gpu] for f in report.drain_findings()] if report else []}
    save(w, state)
    outcome.repairs.append("reboot:start")
    _audit(w, "reboot", "start", time.monotonic() - t0, p, reason=reason,
           detail="scontrol reboot ASAP nextstate=DOWN: back in service only after a passing check on the new boot")


def _after_reboot(w: Wiring, report: Report, outcome: Outcome, rejudge: Rejudge, state: dict[str, Any],
                  active: dict[str, Any], info: Any, resetter: GpuResetter | None) -> bool:
    p = Plan("reboot", [tuple(g) for g in active.get("gpus", [])], active.get("why", ""),  # type: ignore[misc]
             active.get("summary", ""))
    elapsed = time.time() - float(active.get("t", 0))
    booted = (resetter or _resetter(w)).boot_id() != active.get("boot")
    if not booted and not reboot_pending(info) and not _down(info):
        # No reboot happened and none is pending: a person cancelled it (cancel_reboot) or resumed
        # the node. Their decision: our tracking ends, no [replace] over it.
        state.pop("active", None)
        _attempt(state, "reboot", p, float(active.get("t", time.time())), "cancelled")
        save(w, state)
        outcome.repairs.append("reboot:cancelled")
        _audit(w, "reboot", "cancelled", elapsed, p, reason=active.get("reason"),
               detail=f"the reboot was cancelled or the node resumed by someone else (node {info.state}, "
                      f"reason {info.reason!r}): tracking ends")
        return False
    if reboot_pending(info) or not booted:
        if elapsed < float(w.config.repair.reboot_timeout):
            return True  # the reboot is still to come, or under way: leave the node to Slurm
        result, detail = "failed", f"no reboot within {elapsed:.0f}s"
    elif info.reason and remediate.holds(w, info, our_reboot=True):
        state.pop("active", None)
        save(w, state)
        return False  # an admin took the node over meanwhile
    elif report.drain_findings():
        result, detail = "failed", f"still {drain_summary(report)} after the reboot"
    else:
        after = rejudge(_dcgm_level(w)) if _dcgm_level(w) else report
        if after.drain_findings():
            result, detail = "failed", f"still {drain_summary(after)} after the reboot"
        else:
            result, detail = _back_in_service(w, active["reason"], info, outcome)
    state.pop("active", None)
    _attempt(state, "reboot", p, float(active.get("t", time.time())), result)
    save(w, state)
    outcome.repairs.append(f"reboot:{result}")
    _audit(w, "reboot", result, elapsed, p, detail=detail, reason=active.get("reason"))
    if result != "ok" and report.drain_findings():
        _climb(w, report, outcome, rejudge, state, resetter)
    elif result != "ok":
        _replace(w, p, report, outcome, state)
    return True


def _back_in_service(w: Wiring, reason: str, info: Any, outcome: Outcome) -> tuple[str, str]:
    """The node came back DOWN (nextstate=DOWN) with our reason, and checked healthy: resume it."""
    try:
        if not info.drained:
            w.slurm.drain(w.node, reason)  # DOWN -> DOWN+DRAIN with our reason, which resume accepts
        w.slurm.resume(w.node)
    except SlurmHooksError as exc:
        outcome.failed.append(f"resume: {exc}")
        return "failed", f"checked healthy, but not resumed: {exc}"
    remediate.forget_drain(w)
    outcome.resumed = True
    w.audit.write("action", node=w.node, action="resume", target=w.node, result="ok", duration_s=0.0,
                  reason=reason, detail="after the reboot, a passing check on the new boot")
    return "ok", "checked healthy on the new boot, resumed"


def _replace(w: Wiring, p: Plan, report: Report, outcome: Outcome, state: dict[str, Any]) -> None:
    summary = drain_summary(report) if report.drain_findings() else p.summary
    reason = format_reason(summary, Action.REPLACE)
    t0 = time.monotonic()
    try:
        w.slurm.drain(w.node, reason)
    except SlurmHooksError as exc:
        outcome.failed.append(f"drain: {exc}")
        _audit(w, "replace", "failed", time.monotonic() - t0, p, reason=reason, error=str(exc))
        return
    remediate.write_marker(w, reason, report)
    outcome.drained = outcome.node_out = True
    _attempt(state, "replace", p, time.time(), "ok")
    state["replaced"] = {"t": time.time(), "reason": reason, "gpus": [g for _, g in p.gpus]}
    save(w, state)
    rma = add_to_rma(w, p, report, state)
    outcome.repairs.append("replace:ok")
    _audit(w, "replace", "ok", time.monotonic() - t0, p, reason=reason, rma=rma,
           detail=f"{p.why}; drain stays for a person or the bridge; GPU(s) on the RMA list")


def new_urgent(w: Wiring, report: Report) -> list[Finding]:
    """Urgent findings that our pending reboot was not for (a new fault while the node waits for
    its jobs to end): their jobs are requeued even though the repair holds the node."""
    active = load(w).get("active")
    if not active:
        return []
    known = {(c, g) for c, g in active.get("findings", [])}
    return [f for f in report.drain_findings() if f.urgency is Urgency.NOW and (f.check, f.gpu) not in known]


def _down(info: Any) -> bool:
    """DOWN with our reason: how our ``nextstate=DOWN`` reboot brings a node back."""
    return info.base_state == "DOWN" and info.ours


def _replace_ended(w: Wiring, report: Report, state: dict[str, Any], info: Any) -> bool:
    """Whether our ``[replace]`` is over: a person resumed the node, or every GPU it named is
    gone from the node (new hardware: new UUIDs). The same GPU passing a check is not enough
    (flaky hardware passes now and then). The RMA entry stays. True when it ended now."""
    replaced = state["replaced"]
    gpus = [g for g in replaced.get("gpus", []) if _is_uuid(g)]
    snap = report.snapshot
    if not (info.drained or _down(info)):
        detail = "the node was resumed by a person"
    elif gpus and snap is not None and snap.error is None and snap.gpus \
            and not set(gpus) & {g.uuid for g in snap.gpus}:
        detail = f"GPU(s) {', '.join(gpus)} no longer in the node: the hardware was replaced"
    else:
        return False
    state.pop("replaced", None)
    state["attempts"] = [a for a in state["attempts"] if not set(a["gpus"]) & set(replaced.get("gpus", []))]
    save(w, state)
    w.audit.write("action", node=w.node, action="repair-replace", target=w.node, result="ended", duration_s=0.0,
                  reason=replaced.get("reason", ""), detail=f"{detail}; the ladder starts afresh on this node")
    return True


def _has_marker(w: Wiring) -> bool:
    try:
        return remediate.load_marker(w) is not None
    except SlurmHooksError:
        return True  # there, though unreadable: the state dir was not lost


def _is_uuid(ident: str) -> bool:
    return ident.startswith(("GPU-", "MIG-"))


def _recall(w: Wiring, report: Report, state: dict[str, Any], info: Any) -> bool:
    """With no attempt on record (the state dir was lost: a diskless node, a reimage), take the
    ladder's memory from Slurm's reason: ``[replace]`` waits for a person, ``[reboot 1/1]``
    counts as that many reboots of the GPUs now at fault. True when the node waits for a person."""
    if state["attempts"] or _has_marker(w):
        return False  # the state dir is there: what it holds is the ladder's memory
    parsed = parse_reason(info.reason)
    if parsed is None:
        return False
    if parsed[1] is Action.REPLACE and (info.drained or _down(info)):
        state["replaced"] = {"t": time.time(), "reason": info.reason, "gpus": [], "recalled": True}
        save(w, state)
        return True
    counted = reason_attempt(info.reason)
    if counted is None or counted[0] is not Action.REBOOT:
        return False
    p = plan(w, report, state)
    if p is None:
        return False
    for _ in range(counted[1]):
        _attempt(state, "reboot", p, time.time(), "recalled")
    save(w, state)
    w.audit.write("action", node=w.node, action="repair-reboot", target=w.node, result="recalled", duration_s=0.0,
                  reason=info.reason, detail=f"no repair state on this node (state dir lost?): {counted[1]} reboot(s) "
                                             "taken from Slurm's reason")
    return False


# -- the RMA list -------------------------------------------------------------


def rma_path(w: Wiring) -> str:
    return w.state_path("rma.json")


def read_rma(path: str) -> list[dict[str, Any]]:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        return []
    except (OSError, ValueError):
        return []
    return [e for e in data.get("gpus", []) if isinstance(e, dict)] if isinstance(data, dict) else []


def add_to_rma(w: Wiring, p: Plan, report: Report, state: dict[str, Any]) -> list[str]:
    """Put the plan's GPUs on the RMA list (UUID, serial, PCI bus id, history); returns their UUIDs."""
    snap = report.snapshot
    path = rma_path(w)
    added = []
    with fsutil.locked(path):
        entries = read_rma(path)
        for index, ident in p.gpus:
            gpu = snap.gpu(index) if snap is not None and index is not None else None
            entry = {"uuid": gpu.uuid if gpu else ident, "serial": gpu.serial if gpu else "",
                     "pci_bus_id": gpu.pci_bus_id if gpu else "", "node": w.node, "gpu": index,
                     "reason": p.why, "added": time.time(),
                     "history": [a for a in state["attempts"] if ident in a["gpus"]]}
            entries = [e for e in entries if e.get("uuid") != entry["uuid"]] + [entry]
            added.append(entry["uuid"])
        fsutil.atomic_write(path, json.dumps({"version": VERSION, "gpus": entries}, indent=1), mode=0o600)
    return added


# -- state ---------------------------------------------------------------------


def state_path(w: Wiring) -> str:
    return w.repair_state()


def load(w: Wiring) -> dict[str, Any]:
    try:
        with open(state_path(w), encoding="utf-8") as fh:
            data = json.load(fh)
        if isinstance(data, dict) and isinstance(data.get("attempts"), list):
            return data
    except (OSError, ValueError):
        pass
    return {"version": VERSION, "attempts": []}


def save(w: Wiring, state: dict[str, Any]) -> None:
    oldest = time.time() - max(KEEP_S, float(w.config.repair.window))
    state["attempts"] = [a for a in state["attempts"] if a.get("t", 0) >= oldest]
    try:
        os.makedirs(w.config.state.dir, mode=0o700, exist_ok=True)
        fsutil.atomic_write(state_path(w), json.dumps(state), mode=0o600)
    except OSError as exc:
        print(f"slurm-hooks: cannot write {state_path(w)}: {exc.strerror}", file=sys.stderr)


def _attempt(state: dict[str, Any], rung: str, p: Plan, started: float, result: str) -> None:
    state["attempts"].append({"rung": rung, "t": started, "result": result, "gpus": [g for _, g in p.gpus],
                              "summary": p.summary})


def _locked(w: Wiring) -> contextlib.AbstractContextManager[bool]:
    """One repair per node at a time: an flock, which the kernel drops when its holder dies."""
    return fsutil.try_locked(w.state_path(f"repair-{w.node}.lock"), dir_mode=0o700)


# -- helpers -------------------------------------------------------------------


def _gpus(report: Report, findings: Sequence[Finding]) -> list[tuple[int | None, str]]:
    snap = report.snapshot
    out: dict[str, int | None] = {}
    for f in findings:
        gpu = snap.gpu(f.gpu) if snap is not None and f.gpu is not None else None
        ident = gpu_identity(gpu.uuid, gpu.index, gpu.pci_bus_id) if gpu else (f"gpu{f.gpu}" if f.gpu is not None
                                                                              else "node")
        out.setdefault(ident, f.gpu)
    return [(i, g) for g, i in out.items()]


def _resetter(w: Wiring) -> GpuResetter:
    from slurm_hooks.probes.gpureset import from_config

    return from_config(w.config, w.node)


def _dcgm_level(w: Wiring) -> int:
    level = int(w.config.repair.dcgm_level)
    return level if level > 0 and os.access(w.config.dcgm.dcgmi, os.X_OK) else 0


def _audit(w: Wiring, rung: str, result: str, duration: float, p: Plan, **fields: Any) -> None:
    w.audit.write("action", node=w.node, action=f"repair-{rung}", target=w.node, result=result,
                  duration_s=round(duration, 4), why=p.why, **{k: v for k, v in fields.items() if v not in (None, "")})


def _span(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}h" if s % 3600 == 0 else f"{s}s"

