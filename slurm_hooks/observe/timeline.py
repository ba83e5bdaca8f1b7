"""The audit log as a person reads it: each incident under its id (as pages and the report name it),
with where it stands and who acts next, then its records; records outside any incident in runs of
their own. Above both :mod:`.events` (records, their words) and :mod:`.incidents` (the lifecycle),
which it joins."""

from __future__ import annotations

from typing import Any

from slurm_hooks.observe import events
from slurm_hooks.observe.events import stamp
from slurm_hooks.observe.incidents import duration, next_step


def by_incident(found: list[Any], records: list[dict[str, Any]],
                since: float | None = None) -> list[tuple[Any, list[dict[str, Any]]]]:
    """Each incident (:class:`slurm_hooks.observe.incidents.Incident`) with the records of its node
    from its first alert to its close, whatever the quiet between them; the node's other records in
    runs of their own (incident ``None``), a run after :data:`.events.INCIDENT_GAP_S` of quiet. ``since``: only
    what goes on from then (an incident going on then is shown whole). Oldest first."""
    windows: dict[str, list[tuple[float, float, Any]]] = {}
    for inc in found:
        end = float("inf") if inc.resolved_at is None else max(inc.resolved_at, inc.last_seen or 0.0)
        windows.setdefault(inc.node, []).append((inc.first_seen, end, inc))
    held: dict[str, list[dict[str, Any]]] = {inc.id: [] for inc in found}
    loose: list[dict[str, Any]] = []
    for r in records:
        ts = float(r.get("ts", 0))
        owner = next((inc for start, end, inc in windows.get(str(r.get("node")), ()) if start <= ts <= end), None)
        if owner is not None:
            held[owner.id].append(r)
        elif since is None or ts >= since:
            loose.append(r)
    out: list[tuple[Any, list[dict[str, Any]]]] = [
        (inc, held[inc.id]) for inc in found if held[inc.id]
        and (since is None or inc.resolved_at is None or max(inc.resolved_at, inc.last_seen or 0.0) >= since)]
    out += [(None, run) for run in events.incidents(loose)]
    out.sort(key=lambda e: float(e[1][0]["ts"]))
    return out


def render(groups: list[tuple[Any, list[dict[str, Any]]]]) -> list[str]:
    """Each incident under its id (as pages and the report name it): what it was, where it stands,
    who acts next; then its records. Records outside any incident under their node."""
    lines: list[str] = []
    for inc, run in groups:
        t0 = float(run[0]["ts"])
        if inc is None:
            lines.append(f"{run[0].get('node')} at {stamp(t0)}: no incident (the node was not taken out of service)")
        else:
            if inc.open:
                where = f"open, {inc.stage.value}" + (f" for {inc.waiting_for}" if inc.waiting_for else "")
            else:
                where = f"back in service after {duration(inc.mttr or 0.0)}, resumed by {inc.resolved_by}"
            lines.append(f"incident {inc.id} on {inc.node}: drained [{inc.action}] at {stamp(inc.opened_at)}; {where}")
            who, what = next_step(inc)
            if who:
                lines.append(f"  next: {who} must {what}" if who == "a person" else f"  next: {who} {what}")
            if inc.evidence:
                lines.append(f"  evidence: {', '.join(inc.evidence)} (on {inc.node})")
        for r in run:
            lines.append(f"  +{float(r['ts']) - t0:8.3f}s  {events.describe(r)}")
    return lines
