"""The fleet report: which nodes and GPUs keep failing, and how long repairs take.

Sources: audit logs (one file, or a directory of per-node logs on shared storage),
made into incidents by :mod:`slurm_hooks.observe.incidents`; and, where slurmdbd is
reachable, Slurm's accounting (:mod:`slurm_hooks.report.slurmdb`): node drain
history for incidents no audit log here saw and for when a node came back, and the
runs of requeued jobs for the GPU-hours they lost.

:func:`build` returns one plain dict; ``text`` and ``html`` render it.
"""

from __future__ import annotations

import glob
import os
import re
import statistics
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any

from slurm_hooks.observe import incidents
from slurm_hooks.observe.audit import AuditLog, read_file, rotated
from slurm_hooks.observe.incidents import Finding, Incident
from slurm_hooks.report.slurmdb import OUR_PREFIX, JobRun, NodeEvent

#: An accounting drain event this close to an audit drain on the same node is the same incident.
MATCH_S = 120.0
#: A GPU with this many incidents in the window is an RMA candidate even if each was repaired.
RECUR_COUNT = 3
_REASON_FINDING = re.compile(r"(?:XID (\d+) on )?GPU (\d+)")

HOW_GPU_HOURS = ("for each run a requeue ended (sacct -D, state REQUEUED): its run time x the GPUs it held "
                 "(AllocTRES gres/gpu); an upper bound: work since the job's last checkpoint is what was lost")


def audit_files(path: str) -> list[str]:
    """One log, or every ``*.jsonl`` under a directory; each with its rotated files (``.1``, ``.2.gz``)."""
    if os.path.isdir(path):
        live = glob.glob(os.path.join(path, "**", "*.jsonl"), recursive=True)
    else:
        live = [path]
    found: list[str] = []
    for p in sorted(set(live)):
        found += rotated(p) + ([p] if os.path.exists(p) else [])
    return found


def read_audit(paths: Iterable[str]) -> list[dict[str, Any]]:
    """Every record of these files (``.gz`` ones too), and the repeats a live log has counted."""
    out: list[dict[str, Any]] = []
    for p in paths:
        out.extend(r for r in read_file(p) if isinstance(r, dict) and isinstance(r.get("ts"), (int, float)))
        if p.endswith(".jsonl"):
            out.extend(AuditLog(p).counted())
    return out


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); ``None`` for no values."""
    if not values:
        return None
    xs = sorted(values)
    k = (len(xs) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def _stats(values: list[float]) -> dict[str, Any]:
    return {"count": len(values),
            "median_s": None if not values else round(statistics.median(values), 3),
            "p90_s": None if not values else round(percentile(values, 0.9) or 0.0, 3)}


def from_accounting(events: list[NodeEvent]) -> list[Incident]:
    """Our drains as slurmdbd recorded them. A new reason the second the last one ended is the same
    drain rewritten (escalated): one incident; the same reason again is the node drained anew."""
    ours = sorted((e for e in events if e.reason.startswith(OUR_PREFIX)), key=lambda e: (e.node, e.start))
    theirs: dict[str, list[NodeEvent]] = {}
    for e in events:
        if not e.reason.startswith(OUR_PREFIX):
            theirs.setdefault(e.node, []).append(e)
    out: list[Incident] = []
    for e in ours:
        last = out[-1] if out and out[-1].node == e.node else None
        if last is not None and last.resolved_at is not None and abs(e.start - last.resolved_at) <= 1.0 \
                and e.reason != last.reason:
            last.resolved_at = e.end
            if incidents.action_rank(incidents.reason_action(e.reason)) > incidents.action_rank(last.action):
                last.escalations.append([e.start, incidents.reason_action(e.reason)])
                last.action, last.reason = incidents.reason_action(e.reason), e.reason
            continue
        inc = Incident(id=incidents.incident_id(e.node, e.start), node=e.node, first_seen=e.start, opened_at=e.start,
                       reason=e.reason, action=incidents.reason_action(e.reason), contexts=["accounting"],
                       resolved_at=e.end, resolved_by="slurm" if e.end is not None else "")
        for xid, gpu in _REASON_FINDING.findall(e.reason):
            inc.findings.append(Finding(check="xid" if xid else "", message=e.reason[len(OUR_PREFIX):].strip(),
                                        action=inc.action, gpu=int(gpu), xid=int(xid) if xid else None))
        out.append(inc)
    for inc in out:
        inc.resolved_at = _back_in_service(inc.resolved_at, theirs.get(inc.node, []))
    return out


def _back_in_service(end: float | None, others: list[NodeEvent]) -> float | None:
    """When the node really came back: a person's own drain that replaced ours the second ours ended
    keeps it out until that one ends too (the resume is theirs)."""
    while end is not None:
        nxt = next((e for e in others if abs(e.start - end) <= 1.0 and (e.end is None or e.end > end)), None)
        if nxt is None:
            return end
        end = nxt.end
    return end


def merge(audit: list[Incident], accounted: list[Incident]) -> list[Incident]:
    """Audit incidents, completed by accounting (when a node came back that no log here saw),
    plus the accounting incidents no audit log here covers."""
    out = list(audit)
    for acc in accounted:
        twin = next((i for i in audit if i.node == acc.node and abs(i.opened_at - acc.opened_at) <= MATCH_S), None)
        if twin is None:
            out.append(acc)
        elif twin.resolved_at is None and acc.resolved_at is not None:
            twin.resolved_at, twin.resolved_by = acc.resolved_at, "slurm"
        elif twin.closed_by == incidents.ClosedBy.PERSON.value and acc.resolved_at is not None \
                and twin.opened_at <= acc.resolved_at < (twin.resolved_at or float("inf")):
            # A person's resume, seen by a health check minutes later: Slurm's own time of it counts.
            twin.resolved_at = acc.resolved_at
    out.sort(key=lambda i: i.opened_at)
    return out


def _gpu_key(node: str, f: Finding) -> str:
    return f.gpu_key or f"{node}:gpu{f.gpu}"


def build(records: list[dict[str, Any]], since: float, until: float | None = None,
          node_events: list[NodeEvent] | None = None, job_runs: list[JobRun] | None = None,
          sources: dict[str, Any] | None = None, rma_list: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """``rma_list``: the repair ladder's RMA list (``rma.json`` entries), where readable."""
    until = until or time.time()
    fleet = incidents.fold(records)  # the one state `slurm-hooks status` reads too
    found = fleet.incidents
    if node_events is not None:
        found = merge(found, from_accounting(node_events))
    found = [i for i in found if since <= i.opened_at <= until]
    rows = [incidents.summary(i) for i in found]

    lost: float | None = None
    requeued_runs: dict[str, list[JobRun]] = {}
    if job_runs is not None:
        lost = 0.0
        for run in job_runs:
            if run.requeued and run.start is not None and run.end is not None:
                lost += (run.end - run.start) / 3600.0 * run.gpus
                requeued_runs.setdefault(run.job_id, []).append(run)
        _job_restarts_from_accounting(found, rows, job_runs)

    nodes: dict[str, dict[str, Any]] = {}
    gpus: dict[str, dict[str, Any]] = {}
    for inc in found:
        n = nodes.setdefault(inc.node, {"node": inc.node, "incidents": 0, "open": 0, "mttr_seconds": None,
                                        "mttr_each_seconds": [], "gpus": [], "findings": Counter()})
        n["incidents"] += 1
        n["open"] += inc.open
        if inc.mttr is not None:
            n["mttr_each_seconds"].append(round(inc.mttr, 3))
        n["findings"][_finding_label(inc)] += 1
        for f in inc.gpus():
            key = _gpu_key(inc.node, f)
            g = gpus.setdefault(key, {"gpu": key, "node": inc.node, "index": f.gpu, "uuid": f.uuid or None,
                                      "serial": f.serial or None, "incidents": [], "_spans": []})
            g["incidents"].append(inc.id)
            g["_spans"].append((inc.opened_at, inc.resolved_at))
    for n in nodes.values():
        n["mttr_seconds"] = round(statistics.median(n["mttr_each_seconds"]), 3) if n["mttr_each_seconds"] else None
        n["findings"] = dict(n["findings"])
        n["gpus"] = [{k: v for k, v in g.items() if k != "_spans"} for g in gpus.values() if g["node"] == n["node"]]

    rma = _rma_candidates(found, gpus, rma_list or [])

    mttrs = [i.mttr for i in found if i.mttr is not None]
    return {
        "since": incidents.utc(since),
        "until": incidents.utc(until),
        "sources": sources or {},
        "summary": {
            "incidents": len(found),
            "open": sum(i.open for i in found),
            "nodes": len(nodes),
            "gpus": len(gpus),
            "jobs_requeued": sum(len(r["jobs"]) for r in rows),
            "gpu_hours_lost": None if lost is None else round(lost, 3),
            "gpu_hours_lost_how": HOW_GPU_HOURS if lost is not None else "needs accounting (slurmdbd): not counted",
            "time_to_drain": _stats([i.time_to_drain for i in found if "accounting" not in i.contexts]),
            "time_to_job_eligible": _stats([r["time_to_job_eligible_s"] for r in rows
                                            if r["time_to_job_eligible_s"] is not None]),
            "time_to_job_running": _stats([r["time_to_job_running_s"] for r in rows
                                           if r["time_to_job_running_s"] is not None]),
            # When a requeued job ran again: sacct's start where slurmdbd answers, else the follower's look.
            "time_to_job_running_how": "started again (sacct)" if job_runs is not None else
                                       "seen running by the follower",
            "mttr": _stats(mttrs),
        },
        "incidents": rows,
        "nodes": sorted(nodes.values(), key=lambda n: (-n["incidents"], n["node"])),
        "by_finding": dict(Counter(_finding_label(i) for i in found).most_common()),
        "repeat_offenders": [n["node"] for n in sorted(nodes.values(), key=lambda n: (-n["incidents"], n["node"]))
                             if n["incidents"] >= 2],
        # Nodes held for a person as repeat offenders (too many remediations on one node): each
        # hold, with the remediations that made it.
        "held_offenders": [{"node": i.node, "incident": i.id, "held_at": incidents.utc(i.opened_at), "open": i.open,
                            "held": i.held, "history": [dict(h) for h in i.history]}
                           for i in found if i.held],
        "rma_candidates": rma,
        "waiting_for_a_person": [{**e, "since": incidents.utc(e["since"])} for e in fleet.for_a_person(until)
                                 if e["in_service"] or any(i.id == e["incident"] for i in found)],
        "trend": _trend(found, since, until),
        "receiver_outages": receiver_outages(records, since, until),
    }


def receiver_outages(records: list[dict[str, Any]], since: float, until: float) -> list[dict[str, Any]]:
    """The notification receivers' outages within the window, oldest first (as ``status`` shows
    the recent ones: :mod:`slurm_hooks.observe.receivers`): each that began before its end and had
    not ended before its start; one still open is out at ``until``. While one lasted, what the
    notifier had to tell waited: a page reached a person late, each message saying so."""
    from slurm_hooks.observe import receivers

    out = []
    for o in receivers.fold(records):
        if o.since > until or (o.until is not None and o.until < since):
            continue
        out.append({"receiver": o.receiver, "where": o.where, "node": o.node or None, "open": o.open,
                    "since": incidents.utc(o.since), "until": None if o.open else incidents.utc(o.until or until),
                    "out_s": round(max(0.0, (until if o.until is None else o.until) - o.since), 3),
                    "tries": o.tries if not o.open else None, "error": o.error or None, "line": o.line(until)})
    return out


def _rma_candidates(found: list[Incident], gpus: dict[str, dict[str, Any]],
                    rma_list: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """GPUs to send back, keyed by serial (else UUID, else node and slot): the ones the repair ladder
    tagged [replace] or put on its RMA list, and the ones whose fault keeps coming back. A replaced
    board has a new serial: it starts a clean history."""
    out: dict[str, dict[str, Any]] = {}

    def entry(key: str, node: str, index: Any, uuid: Any, serial: Any, pci: Any = None) -> dict[str, Any]:
        e = out.setdefault(key, {"gpu": key, "node": node, "index": index, "uuid": uuid or None,
                                 "serial": serial or None, "pci_bus_id": pci or None, "incidents": 0, "why": [],
                                 "evidence": []})
        for k, v in (("uuid", uuid), ("serial", serial), ("pci_bus_id", pci)):
            e[k] = e[k] or v or None
        return e

    for g in gpus.values():
        spans = sorted(g["_spans"])
        why = []
        if any(end is not None and any(s > end for s, _ in spans[k + 1:]) for k, (_, end) in enumerate(spans)):
            why.append("fault came back after the node was repaired and back in service")
        if len(spans) >= RECUR_COUNT:
            why.append(f"{len(spans)} incidents in the window")
        if why:
            e = entry(g["gpu"], g["node"], g["index"], g["uuid"], g["serial"])
            e["incidents"] = len(spans)
            e["why"] += why
    for inc in found:
        for r in inc.rma:
            key = str(r.get("serial") or r.get("uuid") or f"{inc.node}:gpu{r.get('index')}")
            e = entry(key, inc.node, r.get("index"), r.get("uuid"), r.get("serial"), r.get("pci_bus_id"))
            e["incidents"] = max(e["incidents"], len(gpus.get(key, {}).get("_spans", [])) or 1)
            why = f"[replace]: {inc.why or inc.reason} (incident {inc.id})"
            if why not in e["why"]:
                e["why"].append(why)
            e["evidence"] += [p for p in inc.evidence if p not in e["evidence"]]
    for r in rma_list:
        key = str(r.get("serial") or r.get("uuid") or f"{r.get('node')}:gpu{r.get('gpu')}")
        e = entry(key, str(r.get("node") or ""), r.get("gpu"), r.get("uuid"), r.get("serial"), r.get("pci_bus_id"))
        e["incidents"] = max(e["incidents"], 1)
        if not any(w.startswith("[replace]") for w in e["why"]):
            e["why"].append(f"on the repair ladder's RMA list: {r.get('reason') or 'tagged [replace]'}")
        if r.get("evidence") and r["evidence"] not in e["evidence"]:
            e["evidence"].append(r["evidence"])
    return sorted(out.values(), key=lambda r: (-r["incidents"], r["gpu"]))


def _job_restarts_from_accounting(found: list[Incident], rows: list[dict], job_runs: list[JobRun]) -> None:
    """Time to job running again from sacct: the first run of a requeued job that started after the drain."""
    starts: dict[str, list[float]] = {}
    for run in job_runs:
        if run.start is not None:
            starts.setdefault(run.job_id, []).append(run.start)
    for inc, row in zip(found, rows):
        later = [s for j in inc.jobs for s in starts.get(j, []) if s >= inc.opened_at]
        if later:
            row["time_to_job_running_s"] = round(min(later) - inc.opened_at, 3)


def _finding_label(inc: Incident) -> str:
    f = inc.main_finding()
    if f is not None and f.xid is not None:
        return f"XID {f.xid}"
    if f is not None and f.check:
        return f.check
    return inc.reason.replace(OUR_PREFIX, "").strip().split(" on ")[0] or "unknown"


def _trend(found: list[Incident], since: float, until: float) -> dict[str, Any]:
    """Incidents per day (per week over more than 90 days)."""
    step = 86400.0 if until - since <= 90 * 86400 else 7 * 86400.0
    start = since - since % 86400
    buckets = []
    t = start
    while t <= until:
        buckets.append({"start": incidents.utc(t)[:10], "incidents": 0})
        t += step
    for i in found:
        k = int((i.opened_at - start) // step)
        if 0 <= k < len(buckets):
            buckets[k]["incidents"] += 1
    return {"bucket": "day" if step == 86400.0 else "week", "points": buckets}
