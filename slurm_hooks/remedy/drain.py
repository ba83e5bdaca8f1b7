"""Drain a node with a reason we own, and resume it once it is healthy, only when that drain is ours.

Every step writes one audit record with its result and duration. Nothing here raises for a Slurm
failure: an unreachable slurmctld is recorded and reported so the caller can pick an exit code,
and the next run tries again. Whether a drain is ours is :mod:`.ownership`'s to say.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable

from slurm_hooks.errors import SlurmHooksError
from slurm_hooks.models import Context, Finding, Report
from slurm_hooks.remedy import offenders
from slurm_hooks.remedy.audit import step
from slurm_hooks.remedy.ownership import (
    DrainMarker,
    MarkerUnreadable,
    foreign,
    let_go,
    load_marker,
    recover_marker,
    still_ours,
    write_marker,
)
from slurm_hooks.remedy.wiring import Wiring
from slurm_hooks.slurm import (
    NodeInfo,
    format_reason,
    format_status_reason,
    held_for,
    held_tag,
    is_held,
    may_drain,
    parse_reason,
    split_reason,
    waits_for_job_end,
)

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing (~3 ms of each start)
if TYPE_CHECKING:
    from typing import Any

    from slurm_hooks.remedy.outcome import Outcome

__all__ = ["covers", "drain", "drain_reason", "findings_summary", "not_acted", "resume_if_ours"]


def not_acted(w: Wiring, report: Report, outcome: Outcome, **extra: Any) -> None:
    """Monitor-only (``[check] drain = false``): audit the drain we would have made, and make none."""
    outcome.monitor_only = True
    extra.setdefault("context", report.context.value)
    step(w, "drain", w.node, "monitor-only", time.monotonic(), reason=drain_reason(report),
          detail="not acted on: [check] drain = false", **extra)


def drain(w: Wiring, report: Report, outcome: Outcome, **extra: Any) -> None:
    """Drain this node with ``slurm-hooks: <what broke> [<action>]`` unless someone else owns it.

    A drain of a node that was not out by us is a remediation (:mod:`.offenders`): the one that
    makes ``[remediation] node_limit`` within ``node_window`` says ``[held: N remediations in 7d]``
    instead of the action, and a held drain is kept as it is by every later run."""
    started, now = time.monotonic(), time.time()
    reason = drain_reason(report)
    try:
        info = w.slurm.node(w.node)
        if info.drained and info.ours and split_reason(info.reason)[0] == reason and still_ours(w, info):
            outcome.drained = outcome.node_out = True
            outcome.node_empty = _empty(info)
            write_marker(w, reason, report, info)  # an earlier drain may have landed after its scontrol timed out
            step(w, "drain", w.node, "already", started, reason=reason, **extra)
            return
        if info.out_of_service and info.ours and is_held(info.reason) and still_ours(w, info):
            # held for a person: the reason that says why stays as it is, whatever this run found
            outcome.drained = outcome.node_out = True
            outcome.node_empty = _empty(info)
            step(w, "drain", w.node, "already", started, reason=split_reason(info.reason)[0], found=reason, **extra)
            return
        if (report.context is not Context.CHECK and info.drained and info.ours
                and covers(split_reason(info.reason)[0], reason) and still_ours(w, info)):
            # a hook that judges fewer GPUs (prolog, epilog: the job's; the watcher: one event) keeps our
            # wider reason; the check judges every GPU: what it no longer finds leaves the reason
            outcome.drained = outcome.node_out = True
            outcome.node_empty = _empty(info)
            step(w, "drain", w.node, "already", started, reason=split_reason(info.reason)[0], found=reason, **extra)
            return
        if _config_suspected(w, report, reason, started, extra):
            outcome.guarded = True
            return
        if not may_drain(info):
            outcome.node_out = True
            step(w, "drain", w.node, "skipped", started, reason=reason,
                  detail=f"already drained by someone else: {info.reason!r}", **extra)
            return
        anew = not (info.out_of_service and info.ours)  # not a rewrite of our own drain: a remediation
        history = _history(w, info, now) if anew else []
        if anew and history:
            reason = format_status_reason(findings_summary(report.drain_findings()),
                                          held_tag(len(history) + 1, offenders.span(w.config.remediation.node_window)))
        w.slurm.drain(w.node, reason, current=info)
    except SlurmHooksError as exc:
        outcome.failed.append(f"drain: {exc}")
        step(w, "drain", w.node, "failed", started, reason=reason, error=str(exc), **extra)
        return
    outcome.drained = outcome.node_out = True
    write_marker(w, reason, report, _after_drain(w, reason))
    counted = _count(w, report, now, history) if anew else {}
    step(w, "drain", w.node, "ok", started, reason=reason, **counted, **extra)


def _history(w: Wiring, info: NodeInfo, now: float) -> list[offenders.Remediation]:
    """The remediations on record that make this new drain the node's ``[remediation] node_limit``-th
    within ``node_window`` ([] when it does not hold the node). A hold of ours that a person has
    ended since (our marker is of a held drain, the node is no longer out by us) is released first."""
    try:
        marker = load_marker(w)
    except MarkerUnreadable:
        marker = None
    if marker is not None and is_held(marker.reason):
        let_go(w, marker, info)
    cfg = w.config.remediation
    return offenders.holds(offenders.log(w).read(), now, cfg.node_limit, cfg.node_window)


def _count(w: Wiring, report: Report, now: float, history: list[offenders.Remediation]) -> dict[str, Any]:
    """Keep this drain on the node's record of remediations; what its audit record says of it:
    how many within the window, and for a drain that holds the node, why and the whole history."""
    cfg = w.config.remediation
    entry = offenders.of_report(report, findings_summary(report.drain_findings()), now)
    fields: dict[str, Any] = {}
    trouble = offenders.record(w, entry)
    if trouble:
        print(f"slurm-hooks: {trouble}", file=sys.stderr)
        fields["detail"] = trouble + ": this drain may go uncounted toward [remediation] node_limit"
    if history:
        seen = [*history, entry]
        fields.update(held=f"{len(seen)} remediations within {offenders.span(cfg.node_window)} "
                           f"(limit {cfg.node_limit})",
                      history=[e.to_json() for e in seen])
    return fields


def _empty(info: NodeInfo) -> bool:
    """A drained node Slurm shows IDLE (not ALLOCATED, MIXED or COMPLETING) runs no job and gets none."""
    return info.drained and info.idle and not info.completing


def _after_drain(w: Wiring, reason: str) -> NodeInfo | None:
    """The node as Slurm shows it right after our drain: its ReasonTime/ReasonUser are what tell
    our drain from a later party's with the same text. ``None`` when it cannot be read now."""
    try:
        info = w.slurm.node(w.node)
    except SlurmHooksError:
        return None
    return info if split_reason(info.reason)[0] == reason else None


def drain_reason(report: Report) -> str:
    """``slurm-hooks: <what broke> [<action>]``, with ``, at job end`` when no finding is urgent."""
    return format_reason(findings_summary(report.drain_findings()), report.worst_action,
                         at_job_end=not report.urgent())


def findings_summary(findings: Iterable[Finding]) -> str:
    """``XID 79 on GPU 3; row remap pending on GPU 6``: one text for one set of findings, whichever
    hook found them in whichever order: worst action first, then node-wide before each GPU in
    order, then the text; each text once."""
    def order(f: Finding) -> tuple[int, int, str]:
        return -f.action.rank, -1 if f.gpu is None else f.gpu, f.summary or f.message

    parts: list[str] = []
    for f in sorted(findings, key=order):
        text = f.summary or f.message
        if text not in parts:
            parts.append(text)
    return "; ".join(parts)


def covers(current: str, reason: str) -> bool:
    """Whether our drain reason ``current`` already says everything ``reason`` says: each of its
    findings, an action at least as strong, and no later remedy. A hook that judges fewer GPUs
    (the prolog and epilog judge the job's) then keeps the wider reason the check wrote instead of
    narrowing it, and the next check widening it again: the reason does not flap."""
    now, new = parse_reason(current), parse_reason(reason)
    if now is None or new is None or now[1] is None or new[1] is None:
        return False
    if now[1].rank < new[1].rank or (waits_for_job_end(current) and not waits_for_job_end(reason)):
        return False
    have = set(now[0].split("; "))
    return all(part in have for part in new[0].split("; "))


def _config_suspected(w: Wiring, report: Report, reason: str, started: float, extra: dict) -> bool:
    """Every drain-worthy finding is judged against a configured value, and that many nodes
    are already drained for exactly it: a wrong value in [expect]/[groups] fails every node
    alike, and must not take the whole fleet out one health check at a time."""
    limit = w.config.check.drain_guard
    if limit <= 0 or not all(f.config_based for f in report.drain_findings()):
        return False
    already = w.slurm.drained_count(reason)
    if already < limit:
        return False
    step(w, "drain", w.node, "guarded", started, reason=reason, level="critical", **extra,
          detail=f"{already} nodes are already drained for {reason!r}: that looks like a wrong value in the "
                 f"config ([expect]/[groups] for this node's group), not {already + 1} broken nodes; not draining. "
                 "Fix the config, or raise [check] drain_guard if the fault is real")
    return True


def resume_if_ours(w: Wiring, outcome: Outcome, report: Report) -> None:
    """A healthy node that we drained goes back into service; anyone else's drain stays.

    Only what this check could judge again is taken as mended, and only the exact
    drain it judged: the node's drain must be the one our marker records
    (:meth:`DrainMarker.owns`: our text with at most Slurm's owner-keeping suffixes,
    ReasonTime/ReasonUser unchanged, no reboot pending that we did not ask for). A newer
    drain (a DCGM failure after a thermal drain, a drain whose record could not be
    written) is not covered by this verdict, nor is a drain whose record is unreadable
    (then Slurm is asked, as when the record is lost). A drain for a check the periodic
    run does not do (the epilog's DCGM diagnostic) waits for a person. A drain written
    after this check took its snapshot (the watcher, an epilog) is newer than our verdict
    and is left alone.
    """
    try:
        marker = load_marker(w)
    except MarkerUnreadable:
        marker = None  # what we drained for is unknown: as when the record is lost
    if marker is None:
        marker = recover_marker(w)
        if marker is None:
            return
    snap = report.snapshot
    if snap is not None and marker.ts >= snap.taken_at:
        return
    started = time.monotonic()
    try:
        info = w.node_now()  # a resume decides on Slurm's answer now, not on one read earlier in the run
        if not info.out_of_service:
            let_go(w, marker, info)
            return
        theirs = foreign(info)
        if theirs:
            let_go(w, marker, info)
            step(w, "resume", w.node, "skipped", started, detail=f"drained by someone else: {theirs}")
            return
        why_not = _not_rejudged(w, marker, report, info)
        if why_not:
            step(w, "resume", w.node, "skipped", started, reason=info.reason, detail=why_not)
            return
        w.slurm.resume(w.node)
    except SlurmHooksError as exc:
        outcome.failed.append(f"resume: {exc}")
        step(w, "resume", w.node, "failed", started, error=str(exc))
        return
    let_go(w, marker, info)
    outcome.resumed = True
    step(w, "resume", w.node, "ok", started, reason=info.reason)


def _not_rejudged(w: Wiring, marker: DrainMarker, report: Report, info: NodeInfo) -> str:
    """Why this healthy verdict does not cover what the node was drained for ("" when it does)."""
    if is_held(info.reason):
        return (f"held for a person ({held_for(info.reason)}): look at its "
                f"history (slurm-hooks events --node {w.node}), then resume it by hand "
                f"(scontrol update NodeName={w.node} State=RESUME); the count then starts afresh")
    why = marker.why_not_ours(info)
    if why:
        if split_reason(info.reason)[0] != marker.reason:
            return (f"{why}: this check did not judge the newer drain; resume by hand "
                    "(scontrol update State=RESUME) once mended")
        return f"{why}: not ours to resume"
    leftovers = {"leftover", "busy"} & set(marker.checks)
    ran = set(report.checks_run)
    if any(f.check == "dcgm" for f in report.findings):
        ran.discard("dcgm")  # a diag that could not run or did not pass in full vouches for nothing
    missing = sorted(set(marker.checks) - ran - leftovers)
    if missing:
        return (f"drained for {', '.join(missing)}, which the periodic check does not run: "
                "resume by hand (scontrol update State=RESUME) once mended")
    if report.snapshot is not None and info.empty:
        # An idle node's GPUs should be empty: what is on them now is left over.
        left = report.if_idle
        if left:
            return "still " + "; ".join(f.message for f in left[:3]) + " on an idle node"
    return ""
