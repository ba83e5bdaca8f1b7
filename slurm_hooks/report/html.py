"""The fleet report as one self-contained HTML file: inline CSS and SVG, no script, font or URL.

It opens offline, from a mail attachment or a shared drive. Every value from the
data is escaped; the SVG is inline HTML5 (no namespace URL needed).
"""

from __future__ import annotations

from html import escape
from typing import Any

from slurm_hooks.observe.incidents import duration, history_line

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px auto;max-width:1100px;color:#1d2330;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:16px;margin:28px 0 8px;border-bottom:1px solid #dde2ea;padding-bottom:4px}
.sub{color:#5b6577;margin-bottom:16px}.cards{display:flex;gap:12px;flex-wrap:wrap}
.card{border:1px solid #dde2ea;border-radius:8px;padding:10px 14px;min-width:130px}
.card b{display:block;font-size:22px}.card span{color:#5b6577;font-size:12px}
.charts{display:grid;grid-template-columns:repeat(auto-fit,minmax(330px,1fr));gap:16px}
.chart{border:1px solid #dde2ea;border-radius:8px;padding:10px}.chart h3{margin:0 0 6px;font-size:13px;color:#333}
table{border-collapse:collapse;width:100%;font-size:13px}th,td{text-align:left;padding:4px 8px;border-bottom:1px solid #eef1f5}
th{background:#f5f7fa}td.n{text-align:right;font-variant-numeric:tabular-nums}.open{color:#b42318;font-weight:600}
.rma{color:#b42318}svg text{font:11px system-ui,sans-serif;fill:#444}
"""

_BAR, _BAR2, _AXIS = "#3b6fd4", "#e07a1f", "#c9ced8"


def _d(seconds: float | None) -> str:
    return "-" if seconds is None else duration(seconds) if seconds >= 1 else f"{seconds:.1f}s"


def _svg(width: int, height: int, body: str, label: str) -> str:
    return (f'<svg width="100%" viewBox="0 0 {width} {height}" role="img" aria-label="{escape(label)}">'
            f"{body}</svg>")


def _columns(values: list[tuple[str, float]], color: str, label: str, width: int = 420, height: int = 200) -> str:
    """Vertical bars with a label under every few bars and the value above each non-zero one."""
    if not values:
        return "<p>no data</p>"
    top = max(v for _, v in values) or 1
    left, bottom, plot_h = 28, 34, height - 50
    step = (width - left - 8) / len(values)
    parts = [f'<line x1="{left}" y1="{height - bottom}" x2="{width - 4}" y2="{height - bottom}" stroke="{_AXIS}"/>']
    every = max(1, len(values) // 8)
    for k, (name, v) in enumerate(values):
        h = plot_h * v / top
        x = left + k * step
        parts.append(f'<rect x="{x + step * 0.12:.1f}" y="{height - bottom - h:.1f}" width="{step * 0.76:.1f}" '
                     f'height="{h:.1f}" fill="{color}"><title>{escape(name)}: {v:g}</title></rect>')
        if v:
            parts.append(f'<text x="{x + step / 2:.1f}" y="{height - bottom - h - 3:.1f}" '
                         f'text-anchor="middle">{v:g}</text>')
        if k % every == 0:
            parts.append(f'<text x="{x + step / 2:.1f}" y="{height - bottom + 14}" text-anchor="middle">'
                         f"{escape(name)}</text>")
    parts.append(f'<text x="4" y="12">{escape(label)}</text>')
    return _svg(width, height, "".join(parts), label)


def _rows(values: list[tuple[str, float]], color: str, label: str, width: int = 420) -> str:
    """Horizontal bars, one per row, longest first."""
    if not values:
        return "<p>no data</p>"
    values = values[:15]
    top = max(v for _, v in values) or 1
    row, left = 20, 90
    height = row * len(values) + 10
    parts = []
    for k, (name, v) in enumerate(values):
        w = (width - left - 40) * v / top
        y = 5 + k * row
        parts.append(f'<text x="{left - 6}" y="{y + 13}" text-anchor="end">{escape(name)}</text>'
                     f'<rect x="{left}" y="{y + 2}" width="{w:.1f}" height="{row - 6}" fill="{color}">'
                     f"<title>{escape(name)}: {v:g}</title></rect>"
                     f'<text x="{left + w + 4:.1f}" y="{y + 13}">{v:g}</text>')
    return _svg(width, height, "".join(parts), label)


def _mttr_histogram(mttrs: list[float]) -> list[tuple[str, float]]:
    edges = [(0, 600, "<10m"), (600, 3600, "10m-1h"), (3600, 4 * 3600, "1-4h"), (4 * 3600, 86400, "4-24h"),
             (86400, 3 * 86400, "1-3d"), (3 * 86400, float("inf"), ">3d")]
    return [(name, float(sum(lo <= m < hi for m in mttrs))) for lo, hi, name in edges]


def render(rep: dict[str, Any]) -> str:
    s = rep["summary"]
    src = rep.get("sources", {})
    mttrs = [i["out_of_service_s"] for i in rep["incidents"] if i["out_of_service_s"] is not None]
    cards = [("incidents", str(s["incidents"])), ("still open", str(s["open"])), ("nodes", str(s["nodes"])),
             ("GPUs", str(s["gpus"])), ("jobs requeued", str(s["jobs_requeued"])),
             ("GPU-hours lost", "-" if s["gpu_hours_lost"] is None else f"{s['gpu_hours_lost']:.1f}"),
             ("MTTR median", _d(s["mttr"]["median_s"])), ("MTTR p90", _d(s["mttr"]["p90_s"]))]
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           f"<title>slurm-hooks fleet report {escape(rep['since'][:10])} to {escape(rep['until'][:10])}</title>",
           f"<style>{_CSS}</style></head><body>",
           "<h1>slurm-hooks fleet report</h1>",
           f'<div class="sub">{escape(rep["since"])} to {escape(rep["until"])} &middot; '
           f"{src.get('audit_files', 0)} audit log(s) &middot; accounting: {escape(str(src.get('accounting', 'off')))}</div>",
           '<div class="cards">' + "".join(f'<div class="card"><b>{escape(v)}</b><span>{escape(k)}</span></div>'
                                           for k, v in cards) + "</div>",
           '<h2>Charts</h2><div class="charts">',
           '<div class="chart"><h3>Incidents over time (per ' + escape(rep["trend"]["bucket"]) + ")</h3>"
           + _columns([(p["start"][5:], float(p["incidents"])) for p in rep["trend"]["points"]], _BAR, "incidents")
           + "</div>",
           '<div class="chart"><h3>Time to back in service (MTTR)</h3>'
           + _columns(_mttr_histogram(mttrs), _BAR2, "incidents") + "</div>",
           '<div class="chart"><h3>Nodes by incidents</h3>'
           + _rows([(n["node"], float(n["incidents"])) for n in rep["nodes"]], _BAR, "nodes by incidents") + "</div>",
           "</div>"]
    out.append("<h2>Repair times</h2><table><tr><th></th><th>median</th><th>p90</th><th>incidents</th></tr>")
    for label, key in (("time to drain", "time_to_drain"), ("job made eligible", "time_to_job_eligible"),
                       ("job running again", "time_to_job_running"), ("back in service (MTTR)", "mttr")):
        st = s.get(key) or {"median_s": None, "p90_s": None, "count": 0}
        out.append(f'<tr><td>{label}</td><td class="n">{_d(st["median_s"])}</td><td class="n">{_d(st["p90_s"])}</td>'
                   f'<td class="n">{st["count"]}</td></tr>')
    out.append("</table>")
    if rep.get("held_offenders"):
        out.append("<h2>Held for a person: repeat offenders</h2><table><tr><th>node</th><th>held at (UTC)</th>"
                   "<th>why</th><th>remediations</th></tr>")
        for h in rep["held_offenders"]:
            said = "<br>".join(escape(history_line(e)) for e in h["history"])
            out.append(f"<tr><td>{escape(h['node'])}</td><td>{escape(h['held_at'].replace('T', ' ').rstrip('Z'))}"
                       f"{'' if h['open'] else ' (since resumed)'}</td><td>{escape(h['held'])}</td>"
                       f"<td>{said}</td></tr>")
        out.append("</table>")
    out.append("<h2>RMA candidates</h2>")
    if rep["rma_candidates"]:
        out.append("<table><tr><th>node</th><th>GPU</th><th>UUID</th><th>serial</th><th>incidents</th><th>why</th></tr>")
        for r in rep["rma_candidates"]:
            out.append(f'<tr class="rma"><td>{escape(r["node"])}</td><td>{escape(str(r["index"]))}</td>'
                       f'<td>{escape(r["uuid"] or "")}</td><td>{escape(r["serial"] or "")}</td>'
                       f'<td class="n">{r["incidents"]}</td><td>{escape("; ".join(r["why"]))}</td></tr>')
        out.append("</table>")
    else:
        out.append("<p>none</p>")
    if rep.get("receiver_outages"):
        out.append("<h2>Receiver outages</h2><table><tr><th>receiver</th><th>notifier on</th><th>out (UTC)</th>"
                   "<th>back (UTC)</th><th>out for</th><th>last error</th></tr>")
        for o in rep["receiver_outages"]:
            back = '<span class="open">still out</span>' if o["open"] else \
                escape(o["until"].replace("T", " ").rstrip("Z"))
            out.append(f"<tr><td>{escape(o['where'])} ({escape(o['receiver'])})</td><td>{escape(o['node'] or '')}</td>"
                       f"<td>{escape(o['since'].replace('T', ' ').rstrip('Z'))}</td><td>{back}</td>"
                       f'<td class="n">{_d(o["out_s"])}</td><td>{escape(o["error"] or "")}</td></tr>')
        out.append("</table>")
    out.append("<h2>Nodes</h2><table><tr><th>node</th><th>incidents</th><th>open</th><th>MTTR (median)</th>"
               "<th>findings</th><th>GPUs</th></tr>")
    for n in rep["nodes"]:
        gpus = ", ".join(f"GPU {g['index']}" + (f" ({g['serial'] or g['uuid']})" if g["serial"] or g["uuid"] else "")
                         for g in n["gpus"])
        found = ", ".join(f"{k} x{v}" for k, v in n["findings"].items())
        out.append(f'<tr><td>{escape(n["node"])}</td><td class="n">{n["incidents"]}</td>'
                   f'<td class="n">{n["open"]}</td><td class="n">{_d(n["mttr_seconds"])}</td>'
                   f"<td>{escape(found)}</td><td>{escape(gpus)}</td></tr>")
    out.append("</table>")
    out.append("<h2>Incidents</h2><table><tr><th>opened (UTC)</th><th>node</th><th>finding</th><th>action</th>"
               "<th>jobs</th><th>to drain</th><th>back after</th></tr>")
    for i in reversed(rep["incidents"]):
        finding = (i["finding"] or {}).get("message") or i["reason"]
        back = '<span class="open">open</span>' if i["out_of_service_s"] is None else _d(i["out_of_service_s"])
        out.append(f"<tr><td>{escape(i['opened_at'].replace('T', ' ').rstrip('Z'))}</td><td>{escape(i['node'])}</td>"
                   f"<td>{escape(finding)}</td><td>{escape(i['action'])}</td>"
                   f"<td>{escape(', '.join(j['job_id'] + (' (' + j['user'] + ')' if j.get('user') else '') for j in i['jobs']))}</td>"
                   f'<td class="n">{_d(i["time_to_drain_s"])}</td><td class="n">{back}</td></tr>')
    out.append("</table>")
    out.append(f"<p class=\"sub\">GPU-hours lost: {escape(s['gpu_hours_lost_how'])}.</p></body></html>")
    return "\n".join(out) + "\n"
