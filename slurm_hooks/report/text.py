"""The fleet report as a terminal table."""

from __future__ import annotations

from typing import Any

from slurm_hooks.observe.incidents import duration, history_line


def _d(seconds: float | None) -> str:
    return "-" if seconds is None else duration(seconds) if seconds >= 1 else f"{seconds:.1f}s"


def render(rep: dict[str, Any], width: int = 40) -> list[str]:
    s = rep["summary"]
    src = rep.get("sources", {})
    lines = [f"slurm-hooks fleet report {rep['since']} .. {rep['until']}",
             f"sources: {src.get('audit_files', 0)} audit log(s); accounting: {src.get('accounting', 'off')}", ""]
    lost = "-" if s["gpu_hours_lost"] is None else f"{s['gpu_hours_lost']:.1f}"
    lines.append(f"{s['incidents']} incidents ({s['open']} open) on {s['nodes']} nodes, {s['gpus']} GPUs; "
                 f"{s['jobs_requeued']} jobs requeued; GPU-hours lost: {lost}")
    lines += ["", f"{'':<20}{'median':>10}{'p90':>10}{'n':>5}"]
    for label, key in (("time to drain", "time_to_drain"), ("job made eligible", "time_to_job_eligible"),
                       ("job running again", "time_to_job_running"), ("back in service", "mttr")):
        st = s.get(key) or {"median_s": None, "p90_s": None, "count": 0}
        lines.append(f"{label:<20}{_d(st['median_s']):>10}{_d(st['p90_s']):>10}{st['count']:>5}")
    lines += ["", f"{'NODE':<16}{'INCIDENTS':>10}{'OPEN':>6}{'MTTR':>10}  FINDINGS"]
    for n in rep["nodes"]:
        found = ", ".join(f"{k} x{v}" if v > 1 else k for k, v in n["findings"].items())
        lines.append(f"{n['node']:<16}{n['incidents']:>10}{n['open']:>6}{_d(n['mttr_seconds']):>10}  {found}")
    if not rep["nodes"]:
        lines.append("(no incidents)")
    if rep["by_finding"]:
        lines += ["", "BY FINDING"]
        lines += [f"  {k:<24}{v:>5}" for k, v in rep["by_finding"].items()]
    lines += ["", "REPEAT OFFENDERS: " + (", ".join(rep["repeat_offenders"]) or "none")]
    for h in rep.get("held_offenders") or ():
        lines.append(f"  {h['node']} held for a person at {h['held_at']} ({h['held']})"
                     + ("" if h["open"] else ", since resumed") + ":")
        lines += [f"    {history_line(e)}" for e in h["history"]]
    lines += ["", "RMA CANDIDATES" + ("" if rep["rma_candidates"] else ": none")]
    for r in rep["rma_candidates"]:
        ids = ", ".join(x for x in (r["uuid"], f"serial {r['serial']}" if r["serial"] else "") if x)
        lines.append(f"  {r['node']} GPU {r['index']}" + (f" ({ids})" if ids else "") +
                     f": {r['incidents']} incidents; {'; '.join(r['why'])}")
    waiting = rep.get("waiting_for_a_person") or []
    lines += ["", "WAITING FOR A PERSON" + ("" if waiting else ": none")]
    for w in waiting:
        where = "in service, " if w.get("in_service") else ""
        lines.append(f"  {w['node']} [{w['action']}] {where}for {_d(w['waited_s'])}: {w.get('who') or 'a person'} "
                     f"must {w['todo'] or 'look at it'}" + (f" (why: {w['why']})" if w["why"] else "")
                     + (f"; evidence: {', '.join(w['evidence'])} (on {w['node']})" if w.get("evidence") else ""))
    outages = rep.get("receiver_outages") or []
    lines += ["", "RECEIVER OUTAGES" + (" (notifications held back, delivered late)" if outages else ": none")]
    lines += [f"  {o['line']}" for o in outages]
    points = rep["trend"]["points"]
    if points and any(p["incidents"] for p in points):
        top = max(p["incidents"] for p in points)
        lines += ["", f"TREND (per {rep['trend']['bucket']})"]
        first = next(k for k, p in enumerate(points) if p["incidents"])
        for p in points[first:]:
            bar = "#" * max(1 if p["incidents"] else 0, round(p["incidents"] / top * width))
            lines.append(f"  {p['start']}  {bar} {p['incidents'] or ''}".rstrip())
    return lines
