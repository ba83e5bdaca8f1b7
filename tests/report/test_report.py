"""The fleet report from audit logs: counts, repair times, RMA candidates, and its three renderings."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from slurm_hooks import report
from slurm_hooks.report import html, slurmdb, text

NOW = time.time()
DAY = 86400.0


def incident(node: str, gpu: int, xid: int, t: float, back: float | None, jobs=(), serial: str = "") -> list[dict]:
    """The records the hooks write for one XID: alert, drain, requeue and start_now per job, resume."""
    recs = [{"ts": t, "kind": "alert", "node": node, "context": "watch", "gpu": gpu, "check": "xid",
             "severity": "fail", "action": "replace", "message": f"XID {xid} (test)", "serial": serial},
            {"ts": t + 0.5, "kind": "action", "node": node, "action": "drain", "target": node, "result": "ok",
             "reason": f"slurm-hooks: XID {xid} on GPU {gpu} [replace]"}]
    for j in jobs:
        recs.append({"ts": t + 0.6, "kind": "action", "node": node, "action": "requeue", "target": str(j),
                     "result": "ok", "jobs": [j]})
        recs.append({"ts": t + 2.5, "kind": "action", "node": node, "action": "start_now", "target": str(j),
                     "result": "ok", "jobs": [j]})
    if back is not None:
        recs.append({"ts": t + 0.5 + back, "kind": "action", "node": node, "action": "resume", "target": node,
                     "result": "ok"})
    return recs


@pytest.fixture
def records() -> list[dict]:
    return (incident("n1", 3, 79, NOW - 20 * DAY, 3600, jobs=(11,), serial="S-3")
            + incident("n1", 3, 79, NOW - 10 * DAY, 7200, jobs=(12, 13), serial="S-3")
            + incident("n2", 0, 48, NOW - 5 * DAY, 600)
            + incident("n3", 1, 94, NOW - 1 * DAY, None)
            + incident("n4", 0, 79, NOW - 40 * DAY, 60))  # outside --since 30d


def test_counts_repair_times_and_rma_candidates(records):
    rep = report.build(records, NOW - 30 * DAY, NOW)
    s = rep["summary"]
    assert (s["incidents"], s["open"], s["nodes"], s["jobs_requeued"]) == (4, 1, 3, 3)
    assert s["mttr"] == {"count": 3, "median_s": 3600.0, "p90_s": pytest.approx(6480.0)}
    assert s["time_to_drain"]["median_s"] == 0.5
    assert s["time_to_job_eligible"] == {"count": 2, "median_s": 2.0, "p90_s": 2.0}
    assert s["time_to_job_running"]["count"] == 0  # made eligible is not running: no look saw them run
    assert s["gpu_hours_lost"] is None and "needs accounting" in s["gpu_hours_lost_how"]
    nodes = {n["node"]: n for n in rep["nodes"]}
    assert set(nodes) == {"n1", "n2", "n3"}
    assert (nodes["n1"]["incidents"], nodes["n1"]["mttr_seconds"]) == (2, 5400.0)
    assert nodes["n3"]["mttr_seconds"] is None and nodes["n3"]["open"] == 1
    assert nodes["n1"]["gpus"] == [{"gpu": "S-3", "node": "n1", "index": 3, "uuid": None, "serial": "S-3",
                                    "incidents": [i["incident"] for i in rep["incidents"][:2]]}]
    assert rep["repeat_offenders"] == ["n1"]
    assert [r["gpu"] for r in rep["rma_candidates"]] == ["S-3"]
    assert "came back after the node was repaired" in rep["rma_candidates"][0]["why"][0]
    assert rep["by_finding"] == {"XID 79": 2, "XID 48": 1, "XID 94": 1}
    assert sum(p["incidents"] for p in rep["trend"]["points"]) == 4 and rep["trend"]["bucket"] == "day"
    assert {"incidents", "nodes", "rma_candidates"} <= set(rep)


def test_a_gpu_failing_three_times_unrepaired_is_an_rma_candidate_too():
    recs = []
    for k in range(3):  # resumed after the first two, still out after the third
        recs += incident("n5", 2, 79, NOW - (9 - k) * DAY, None if k == 2 else 60, serial="S-9")
    rep = report.build(recs, NOW - 30 * DAY, NOW)
    [cand] = rep["rma_candidates"]
    assert cand["incidents"] == 3 and "3 incidents in the window" in cand["why"]


def test_percentile_interpolates_like_numpy():
    assert report.percentile([1, 2, 3, 4], 0.9) == pytest.approx(3.7)
    assert report.percentile([5], 0.9) == 5
    assert report.percentile([], 0.9) is None


def test_accounting_incidents_fill_what_no_audit_log_here_saw(records):
    events = slurmdb.parse_events(
        "n9|2026-11-01T10:00:00|2026-11-01T11:30:00|DRAIN|slurm-hooks: XID 79 on GPU 4 [replace]|root(0)\n"
        "n9|2026-11-01T11:30:00|2026-11-01T12:00:00|DRAIN|slurm-hooks: XID 79 on GPU 4; XID 48 on GPU 1 [replace]|root(0)\n"
        "n8|2026-11-02T10:00:00|Unknown|DRAIN|someone else's drain|alice(1000)\n")
    runs = slurmdb.parse_runs("77|bob|REQUEUED|2026-11-01T08:00:00|2026-11-01T10:00:01|n9|"
                              "billing=4,cpu=4,gres/gpu=4,node=1|\n"
                              "77|bob|RUNNING|2026-11-01T10:00:30|Unknown|n1|billing=4,cpu=4,gres/gpu=4,node=1|"
                              "slurm-hooks: requeued from n9\n")
    since = events[0].start - DAY
    rep = report.build([], since, since + 3 * DAY, events, runs)
    [inc] = rep["incidents"]
    assert (inc["node"], inc["out_of_service_s"], inc["seen_by"]) == ("n9", 7200.0, ["accounting"])
    assert inc["gpus"][0]["index"] == 4
    assert rep["summary"]["gpu_hours_lost"] == pytest.approx(4 * (2 + 1 / 3600), abs=0.001)
    assert runs[1].admin_comment == "slurm-hooks: requeued from n9"


def test_terminal_table_names_nodes_and_repair_times(records):
    lines = text.render(report.build(records, NOW - 30 * DAY, NOW))
    body = "\n".join(lines)
    assert re.search(r"^back in service\s+1h 00m\s+1h 48m\s+3$", body, re.M)
    assert re.search(r"^n1\s+2\s+0\s+1h 30m\s+XID 79 x2$", body, re.M)
    assert "n1 GPU 3 (serial S-3): 2 incidents" in body


def test_html_is_one_file_with_charts_and_no_url(records):
    records[0]["message"] = "XID 79 <b>see https://example.invalid/x</b>"
    page = html.render(report.build(records, NOW - 30 * DAY, NOW))
    assert page.count("<svg") == 3
    assert "<script" not in page and "<link" not in page and "@import" not in page and "url(" not in page
    outside_data = page.replace("see https://example.invalid/x", "")
    assert "http" not in outside_data
    assert "&lt;b&gt;see" in page  # data is escaped, never markup


def test_report_cli_json_html_and_a_bad_since(records, tmp_path):
    log = tmp_path / "audit.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = subprocess.run([sys.executable, "-m", "slurm_hooks", "report", "--audit", str(log), "--no-accounting",
                          "--json", "--html", str(tmp_path / "r.html")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    rep = json.loads(out.stdout)
    assert [n["node"] for n in rep["nodes"]] == ["n1", "n2", "n3"]
    assert (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>")
    bad = subprocess.run([sys.executable, "-m", "slurm_hooks", "report", "--audit", str(log), "--since", "soon"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "--since" in bad.stderr


def _fake_bin(tmp_path, sacctmgr: str, sacct: str = "exit 0"):
    """A bin_dir whose sacctmgr/sacct are scripts: they record their argv and environment and do ``body``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("sacctmgr", sacctmgr), ("sacct", sacct)):
        script = bin_dir / name
        script.write_text(f'#!/bin/sh\necho "{name} $* TZ=$TZ FMT=$SLURM_TIME_FORMAT" >> {tmp_path}/argv\n{body}\n')
        script.chmod(0o755)
    return bin_dir


def test_a_query_that_times_out_is_an_error_naming_the_command(tmp_path):
    bin_dir = _fake_bin(tmp_path, "sleep 5")
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[slurm]\nbin_dir = "{bin_dir}"\ntimeout = 0.3\n[log]\naudit = "{tmp_path}/a.jsonl"\n')
    out = subprocess.run([sys.executable, "-m", "slurm_hooks", "report", "--config", str(cfg)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 3 and "Traceback" not in out.stderr  # EXIT_UNAVAILABLE
    assert "accounting query timed out after 0.9s: sacctmgr -n -P show event Event=Node States=DRAIN" in out.stderr
    assert "not used" not in out.stdout


def test_queries_are_bounded_and_times_read_as_utc_epoch_whatever_the_caller_says(tmp_path):
    drain = 1796139592  # 2026-12-01T15:39:52Z
    bin_dir = _fake_bin(
        tmp_path,
        f"echo 'n1|{drain}|{drain + 3600}|DRAIN|slurm-hooks: XID 79 on GPU 0 [reboot]|root(0)'\n"
        f"echo 'n7|{drain}|Unknown|DRAIN|admin: cable|root(0)'",
        'case "$*" in *" -j "*) echo "5|bob|REQUEUED|1796139000|1796139592|n1|gres/gpu=2|"; '
        'echo "5|bob|RUNNING|1796139600|Unknown|n2|gres/gpu=2|";; '
        '*) echo "5|bob|REQUEUED|1796139000|1796139592|n1|gres/gpu=2|";; esac')
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[slurm]\nbin_dir = "{bin_dir}"\n[log]\naudit = "{tmp_path}/a.jsonl"\n')
    env = {**os.environ, "TZ": "America/New_York", "SLURM_TIME_FORMAT": "relative"}
    out = subprocess.run([sys.executable, "-m", "slurm_hooks", "report", "--config", str(cfg), "--json",
                          "--since", str(drain - 86400), "--accounting"], capture_output=True, text=True, timeout=60,
                         env=env)
    assert out.returncode == 0, out.stderr
    rep = json.loads(out.stdout)
    [inc] = rep["incidents"]
    assert (inc["node"], inc["opened_at"], inc["out_of_service_s"]) == ("n1", "2026-12-01T15:39:52Z", 3600.0)
    assert rep["summary"]["gpu_hours_lost"] == pytest.approx(592 / 3600 * 2, abs=0.001)
    calls = (tmp_path / "argv").read_text().splitlines()
    assert all(c.endswith("TZ=UTC FMT=%s") for c in calls)
    [events, requeued, runs] = calls
    assert events.startswith("sacctmgr -n -P show event Event=Node States=DRAIN Start=2026-11-30T15:39:52 ")
    assert " -s REQUEUED -N n1 --starttime=2026-11-30T15:39:52 " in requeued  # only the incident's node
    assert " -j 5 " in runs
    assert rep["sources"]["accounting_queries"][0].startswith("sacctmgr -n -P show event")


def test_a_report_scoped_to_nodes_asks_slurmdbd_for_those_nodes_only(tmp_path):
    bin_dir = _fake_bin(tmp_path, "echo 'n2|1796139592|Unknown|DRAIN|slurm-hooks: XID 48 on GPU 1 [reset]|root(0)'")
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[slurm]\nbin_dir = "{bin_dir}"\n[log]\naudit = "{tmp_path}/a.jsonl"\n')
    out = subprocess.run([sys.executable, "-m", "slurm_hooks", "report", "--config", str(cfg), "--json",
                          "--nodes", "n[1-2]"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    events, requeued = (tmp_path / "argv").read_text().splitlines()
    assert " States=DRAIN Nodes=n1,n2 Start=" in events
    assert " -s REQUEUED -N n2 " in requeued
    bad = subprocess.run([sys.executable, "-m", "slurm_hooks", "report", "--config", str(cfg), "--nodes", "n[1-"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--nodes" in bad.stderr and "Traceback" not in bad.stderr


def test_a_persons_resume_counts_at_slurms_time_not_at_the_check_that_saw_it():
    """Drained at t, a person drains it for their own reason at t+20 and resumes at t+64; the health check
    sees it at t+70. Out of service 64 s: from Slurm's accounting (their drain chained to ours), or from
    the time the closing record says it happened (``at``: the watcher's), never the check's clock."""
    from slurm_hooks.report.slurmdb import NodeEvent

    t0 = NOW - 3600
    recs = [{"ts": t0, "kind": "action", "node": "n2", "action": "drain", "target": "n2", "result": "ok",
             "reason": "slurm-hooks: XID 48 on GPU 0 [replace]"},
            {"ts": t0 + 70, "kind": "incident", "node": "n2", "stage": "closed", "by": "person"}]
    events = [NodeEvent("n2", t0, t0 + 20, "DRAIN", "slurm-hooks: XID 48 on GPU 0 [replace]", "root"),
              NodeEvent("n2", t0 + 20, t0 + 64, "DRAIN", "maint: admin checks cabling", "alice")]
    assert report.build(recs, NOW - DAY, NOW)["incidents"][0]["out_of_service_s"] == 70.0
    assert report.build(recs, NOW - DAY, NOW, node_events=events)["incidents"][0]["out_of_service_s"] == 64.0
    recs[1]["at"] = t0 + 64.5  # the watcher saw the resume then
    assert report.build(recs, NOW - DAY, NOW)["incidents"][0]["out_of_service_s"] == 64.5


def receiver_records(log_path) -> None:
    """Outages as the notifier writes them (one record at each start and end, by the host whose
    notifier delivers): oncall from login1, out 15 min two days ago and back; pager from login2,
    out an hour ago and still out; an old one, over before the window."""
    from slurm_hooks.observe import receivers
    from slurm_hooks.observe.audit import AuditLog

    log = AuditLog(str(log_path))
    out = [("login1", "webhook-1", "oncall", NOW - 2 * DAY, NOW - 2 * DAY + 900, 7, "HTTP 401 (check its credentials)"),
           ("login2", "pagerduty-1", "pager", NOW - 3600, None, 0, "connection refused"),
           ("login1", "webhook-1", "oncall", NOW - 40 * DAY, NOW - 40 * DAY + 60, 2, "timed out")]
    for host, name, where, since, until, tries, error in sorted(out, key=lambda o: o[3]):
        log.write(receivers.KIND, node=host, **receivers.out_record(name, where, since, error))
        if until is not None:
            log.write(receivers.KIND, node=host, **receivers.back_record(name, where, since, until, tries, 0))


def test_receiver_outages_in_the_window_are_in_the_report_json_text_and_html(records, tmp_path):
    receiver_records(tmp_path / "a.jsonl")
    rep = report.build(records + report.read_audit([str(tmp_path / "a.jsonl")]), NOW - 30 * DAY, NOW)
    got = rep["receiver_outages"]
    assert [(o["where"], o["node"], o["open"], o["tries"]) for o in got] == [("oncall", "login1", False, 7),
                                                                              ("pager", "login2", True, None)]
    assert got[0]["out_s"] == 900.0 and got[0]["until"] is not None and got[0]["error"].startswith("HTTP 401")
    assert got[1]["until"] is None and got[1]["out_s"] == pytest.approx(3600.0, abs=1)
    body = "\n".join(text.render(rep))
    assert "RECEIVER OUTAGES (notifications held back, delivered late)" in body
    assert re.search(r"^  oncall \(webhook-1\) \(notifier on login1\): back at \S+ after 15m 00s out \(7 failed tries\)",
                     body, re.M)
    assert re.search(r"^  pager \(pagerduty-1\) \(notifier on login2\): out since \S+ \(1h 00m\), "
                     r"last error: connection refused", body, re.M)
    page = html.render(rep)
    assert "<h2>Receiver outages</h2>" in page and '<span class="open">still out</span>' in page
    assert "RECEIVER OUTAGES: none" in "\n".join(text.render(report.build(records, NOW - 30 * DAY, NOW)))


def test_a_report_scoped_to_nodes_keeps_the_receivers_outages_its_notifier_host_told(records, tmp_path):
    log = tmp_path / "audit.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    receiver_records(log)
    out = subprocess.run([sys.executable, "-m", "slurm_hooks", "report", "--audit", str(log), "--no-accounting",
                          "--json", "--nodes", "n[1-2]"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    rep = json.loads(out.stdout)
    assert [n["node"] for n in rep["nodes"]] == ["n1", "n2"]
    assert [(o["where"], o["open"]) for o in rep["receiver_outages"]] == [("oncall", False), ("pager", True)]
