"""``slurm-hooks events`` over the lifecycle: an incident keeps its real start under --since, repeats
are one line with a count, rotated files are read."""

from __future__ import annotations

import gzip
import json
import time

from click.testing import CliRunner
from fakes.config import write_sim_config

from slurm_hooks.cli import cli


def write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_events_since_a_minute_keeps_a_two_day_old_incidents_start_and_its_repeats_in_one_line(tmp_path):
    conf = write_sim_config(tmp_path)
    now = time.time()
    t0 = now - 2 * 86400
    log = tmp_path / "audit.jsonl"
    with gzip.open(f"{log}.1.gz", "wt") as fh:  # rotated by logrotate since
        fh.write(json.dumps({"ts": t0, "kind": "alert", "node": "n1", "gpu": 0, "check": "xid",
                             "message": "XID 79", "action": "reboot"}) + "\n")
        fh.write(json.dumps({"ts": t0 + 1, "kind": "action", "node": "n1", "action": "drain", "target": "n1",
                             "result": "ok", "reason": "slurm-hooks: XID 79 on GPU 0 [reboot]"}) + "\n")
    write(log, [{"ts": now - 30, "kind": "repeat", "node": "n1", "count": 17000, "first_ts": t0 + 10,
                 "last_ts": now - 30, "of": {"kind": "alert", "node": "n1", "gpu": 0, "check": "xid",
                                             "message": "XID 79", "action": "reboot"}}])
    out = CliRunner().invoke(cli, ["events", "--since", "1m", "--config", str(conf)])
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t0 + 1))
    assert lines[0].startswith("incident n1-") and f"drained [reboot] at {stamp}" in lines[0]
    assert lines[2].startswith("  +   0.000s  alert ")  # shown from its first alert, two days back
    assert len(lines) == 5 and lines[1].startswith("  next: ")
    assert "again   17000 more times until " in lines[4] and "alert   gpu0 xid: XID 79 -> reboot" in lines[4]


def test_events_show_a_persons_resume_and_a_wait_for_a_person(tmp_path):
    conf = write_sim_config(tmp_path)
    now = time.time()
    write(tmp_path / "audit.jsonl", [
        {"ts": now - 60, "kind": "action", "node": "n2", "action": "drain", "target": "n2", "result": "ok",
         "reason": "slurm-hooks: DCGM diag L2 failed on GPU 5 [reset]"},
        {"ts": now - 50, "kind": "incident", "node": "n2", "stage": "waiting", "waiting_for": "a person",
         "why": "the periodic check does not run DCGM", "todo": "mend it, then resume it"},
        {"ts": now - 5, "kind": "incident", "node": "n2", "stage": "closed", "by": "person", "user": "alice"}])
    out = CliRunner().invoke(cli, ["events", "--config", str(conf)])
    assert out.exit_code == 0, out.output
    assert "waiting for a person; the periodic check does not run DCGM; to do: mend it, then resume it" in out.output
    assert "closed  resumed by alice" in out.output


def test_two_incidents_close_together_on_one_node_are_shown_apart_under_their_own_ids(tmp_path):
    conf = write_sim_config(tmp_path)
    now = time.time()
    drain = {"kind": "action", "node": "n3", "action": "drain", "target": "n3", "result": "ok",
             "reason": "slurm-hooks: XID 79 on GPU 0 [reboot]"}
    resume = {"kind": "action", "node": "n3", "action": "resume", "target": "n3", "result": "ok"}
    write(tmp_path / "audit.jsonl", [
        {"ts": now - 500, "kind": "watch", "node": "n3", "message": "watcher started"},
        {**drain, "ts": now - 400}, {**resume, "ts": now - 300},
        {**drain, "ts": now - 200, "reason": "slurm-hooks: XID 48 on GPU 1 [reset]"}, {**resume, "ts": now - 100}])
    out = CliRunner().invoke(cli, ["events", "--config", str(conf)])
    heads = [line for line in out.output.splitlines() if not line.startswith(" ")]
    # 100 s apart, well within one 600 s gap: still two incidents, each under its id; the watcher's
    # start is not an incident.
    assert [h.split(" on n3")[0] for h in heads] == [
        "n3 at " + time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(now - 500)) + ": no incident (the node was "
        "not taken out of service)",
        "incident n3-" + time.strftime("%Y%m%dT%H%M%S", time.gmtime(now - 400)) + f".{int(round((now - 400) * 1000)) % 1000:03d}Z",
        "incident n3-" + time.strftime("%Y%m%dT%H%M%S", time.gmtime(now - 200)) + f".{int(round((now - 200) * 1000)) % 1000:03d}Z"]
    described = CliRunner().invoke(cli, ["events", "--config", str(conf), "--json"]).output.splitlines()
    assert [json.loads(line)["action"] for line in described] == ["reboot", "reset"]
