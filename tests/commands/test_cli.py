"""The command line as an admin and slurmd run it: real processes, exit codes, one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
from fakes.config import write_sim_config

from slurm_hooks.observe import events as ev
from slurm_hooks.observe import timeline

T0 = 1764412800.0  # 2025-11-29 10:40:00 UTC


@pytest.fixture
def conf(tmp_path) -> Path:
    return write_sim_config(tmp_path, "[expect]\ngpus = 8")


def slurm_hooks(*args, env=None, node="n1"):
    full_env = {k: v for k, v in os.environ.items()
                if k not in ("SLURM_HOOKS_CONFIG", "SLURMD_NODENAME", "SLURM_HOOKS_DEBUG")}
    if node:
        full_env["SLURMD_NODENAME"] = node
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "slurm_hooks", *args], capture_output=True, text=True,
                          env=full_env, timeout=60)


def sim(conf, *args):
    r = slurm_hooks("sim", *args, "--config", str(conf))
    assert r.returncode == 0, r.stderr
    return r


def assert_one_line_error(r, code):
    assert r.returncode == code, (r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1, r.stderr
    assert "Traceback" not in r.stderr + r.stdout


# --- check -----------------------------------------------------------------------------------


def test_healthy_simulated_node_exits_0_and_prints_nothing(conf):
    sim(conf, "init", "--node", "n1", "--gpus", "8")
    r = slurm_hooks("check", "--dry-run", "--config", str(conf))
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")


def test_xid79_on_gpu3_exits_1_and_names_gpu_xid_and_action(conf):
    sim(conf, "init", "--node", "n1", "--gpus", "8")
    sim(conf, "inject", "--node", "n1", "--gpu", "3", "--xid", "79")
    r = slurm_hooks("check", "--dry-run", "--config", str(conf))
    assert (r.returncode, r.stdout, r.stderr) == (1, "gpu3 xid: XID 79 (GPU has fallen off the bus) -> reboot\n", "")


def test_check_reads_the_config_from_the_env_var(conf):
    sim(conf, "init", "--node", "n1", "--gpus", "8")
    sim(conf, "inject", "--node", "n1", "--gpu", "3", "--xid", "79")
    r = slurm_hooks("check", "--dry-run", env={"SLURM_HOOKS_CONFIG": str(conf)})
    assert r.returncode == 1 and "XID 79" in r.stdout


def test_check_node_option_wins_over_slurmd_nodename(conf):
    sim(conf, "init", "--node", "n2", "--gpus", "8")
    r = slurm_hooks("check", "--dry-run", "--node", "n2", "--config", str(conf), node="n1")
    assert (r.returncode, r.stdout) == (0, "")


def test_check_never_imports_the_bridge_or_kubernetes(conf):
    sim(conf, "init", "--node", "n1", "--gpus", "8")
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "slurm_hooks", "check", "--dry-run",
                        "--config", str(conf), "--node", "n1"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0
    imported = {line.rsplit("|", 1)[-1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")}
    assert "slurm_hooks.engine" in imported
    assert not {m for m in imported if m.startswith(("slurm_hooks.bridge", "kubernetes", "pynvml"))}


def test_check_json_has_findings_healthy_and_action(conf):
    sim(conf, "init", "--node", "n1", "--gpus", "8")
    sim(conf, "inject", "--node", "n1", "--gpu", "3", "--xid", "79")
    r = slurm_hooks("check", "--dry-run", "--json", "--config", str(conf))
    assert r.returncode == 1
    data = json.loads(r.stdout)
    assert (data["node"], data["context"], data["healthy"], data["action"]) == ("n1", "check", False, "reboot")
    assert data["findings"] == [{"check": "xid", "severity": "fail", "action": "reboot", "gpu": 3,
                                 "message": "XID 79 (GPU has fallen off the bus)", "summary": "XID 79 on GPU 3", "config_based": False,
                                     "scope": "gpu", "urgency": "now", "rule": "xid.79"}]
    assert "remediation" not in data  # a dry run did nothing


def test_check_json_of_a_healthy_node(conf):
    sim(conf, "init", "--node", "n1", "--gpus", "8")
    data = json.loads(slurm_hooks("check", "--dry-run", "--json", "--config", str(conf)).stdout)
    assert (data["healthy"], data["action"], data["findings"]) == (True, "none", [])


def test_warnings_are_printed_but_exit_0(conf):
    sim(conf, "init", "--node", "n1", "--gpus", "8")
    sim(conf, "inject", "--node", "n1", "--gpu", "6", "--temp", "88")
    r = slurm_hooks("check", "--dry-run", "--config", str(conf))
    assert (r.returncode, r.stdout) == (0, "gpu6 thermal: temperature 88 C (warn at 85 C) -> warn\n")


def test_seven_of_eight_gpus_exits_1(conf):
    sim(conf, "init", "--node", "n1", "--gpus", "7")
    r = slurm_hooks("check", "--dry-run", "--config", str(conf))
    assert (r.returncode, r.stdout) == (1, "node gpu-count: 7 GPUs visible, 8 expected -> reboot\n")


def test_repeated_checks_do_not_count_one_xid_event_twice(conf):
    conf.write_text(conf.read_text().replace("gpus = 8\n", "gpus = 8\nxid_repeat_count = 2\n"))
    sim(conf, "init", "--node", "n1", "--gpus", "8")
    sim(conf, "inject", "--node", "n1", "--gpu", "1", "--xid", "74")
    for _ in range(3):
        r = slurm_hooks("check", "--dry-run", "--config", str(conf))
        assert r.stdout == "gpu1 xid: XID 74 (NVLINK Error) -> reset\n"
    sim(conf, "inject", "--node", "n1", "--gpu", "1", "--xid", "74")  # a second event: now it is the hardware
    r = slurm_hooks("check", "--dry-run", "--config", str(conf))
    assert r.stdout == "gpu1 xid: XID 74 (NVLINK Error), 2nd time in 24h -> hardware -> replace\n"


def test_check_without_drain_writes_alerts_and_touches_no_slurm(conf, tmp_path):
    conf.write_text(conf.read_text() + "\n[check]\ndrain = false\n\n[slurm]\nbin_dir = \"/nonexistent\"\n")
    sim(conf, "init", "--node", "n1", "--gpus", "8")
    sim(conf, "inject", "--node", "n1", "--gpu", "3", "--xid", "79")
    r = slurm_hooks("check", "--config", str(conf))
    assert (r.returncode, r.stderr) == (1, "")
    alert, step = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert (alert["kind"], alert["node"], alert["gpu"], alert["check"]) == ("alert", "n1", 3, "xid")
    assert alert["monitor_only"] is True  # found and told, not acted on
    assert (step["kind"], step["action"], step["result"], step["reason"]) == (
        "action", "drain", "monitor-only", "slurm-hooks: XID 79 on GPU 3 [reboot]")


def test_corrupt_sim_file_exits_1_with_a_one_line_finding(conf, tmp_path):
    sim(conf, "init", "--node", "n1", "--gpus", "8")
    state = tmp_path / "sim" / "n1.json"
    state.write_text('{"version": 1, "gpus": [{"index": 0,')
    r = slurm_hooks("check", "--dry-run", "--config", str(conf))
    assert (r.returncode, r.stderr) == (1, "")
    assert r.stdout.startswith(f"node gpu-probe: cannot read GPUs: {state}: corrupt sim state: ")
    assert r.stdout.endswith(" -> drain\n") and r.stdout.count("\n") == 1


def test_uninitialised_sim_node_exits_1_and_says_how_to_fix_it(conf):
    r = slurm_hooks("check", "--dry-run", "--config", str(conf))
    assert r.returncode == 1
    assert "(run: slurm-hooks sim init --node n1)" in r.stdout


def test_bad_config_exits_2_with_one_line_naming_file_and_line(conf):
    conf.write_text(conf.read_text() + "\n[check]\ndeadlin = 30\n")
    line = conf.read_text().splitlines().index("deadlin = 30") + 1
    r = slurm_hooks("check", "--dry-run", "--config", str(conf))
    assert_one_line_error(r, 2)
    assert r.stderr.startswith(f"slurm-hooks: config error: {conf}:{line}: [check] deadlin: unknown key")
    assert r.stdout == ""


def test_config_that_is_not_toml_exits_2_with_its_line(conf):
    conf.write_text('[gpu]\nbackend = "sim\n')
    r = slurm_hooks("check", "--dry-run", "--config", str(conf))
    assert_one_line_error(r, 2)
    assert r.stderr.startswith(f"slurm-hooks: config error: {conf}:2: ")


def test_missing_explicit_config_exits_2(tmp_path):
    missing = tmp_path / "nope.toml"
    r = slurm_hooks("check", "--dry-run", "--config", str(missing))
    assert_one_line_error(r, 2)
    assert r.stderr == f"slurm-hooks: config error: {missing}: file not found\n"


def test_missing_config_named_by_the_env_var_exits_2(tmp_path):
    r = slurm_hooks("check", "--dry-run", env={"SLURM_HOOKS_CONFIG": str(tmp_path / "nope.toml")})
    assert_one_line_error(r, 2)
    assert "file not found" in r.stderr


def test_unknown_command_exits_2():
    r = slurm_hooks("frobnicate")
    assert r.returncode == 2
    assert "No such command 'frobnicate'" in r.stderr
    assert "Traceback" not in r.stderr


def test_unknown_option_exits_2(conf):
    r = slurm_hooks("check", "--frobnicate", "--config", str(conf))
    assert r.returncode == 2
    assert "--frobnicate" in r.stderr and "Traceback" not in r.stderr


def test_help_lists_every_command_even_on_a_node_without_the_bridge_dependencies():
    r = slurm_hooks("--help")
    assert (r.returncode, r.stderr) == (0, "")
    listed = {line.split()[0] for line in r.stdout.split("Commands:")[1].splitlines() if line.strip()}
    assert {"check", "prolog", "epilog", "sim", "events", "watch", "validate", "bridge"} <= listed


@pytest.mark.parametrize("command", ["check", "prolog", "epilog", "sim", "events"])
def test_node_side_commands_have_help(command):
    r = slurm_hooks(command, "--help")
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout.startswith(f"Usage: slurm-hooks {command} [OPTIONS]")


def test_the_installed_script_behaves_like_python_m(conf):
    script = Path(sys.executable).parent / "slurm-hooks"
    if not script.exists():
        pytest.skip("slurm-hooks script not installed next to this interpreter")
    sim(conf, "init", "--node", "n1", "--gpus", "8")
    env = {k: v for k, v in os.environ.items() if k != "SLURM_HOOKS_CONFIG"}
    r = subprocess.run([str(script), "check", "--dry-run", "--config", str(conf), "--node", "n1"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")


# --- events ------------------------------------------------------------------------------------


def write_audit(tmp_path, records):
    with open(tmp_path / "audit.jsonl", "w") as fh:
        for r in records:
            fh.write(json.dumps(r) + "\n")


INCIDENT = [
    {"ts": T0, "kind": "alert", "node": "n1", "context": "check", "gpu": 3, "check": "xid", "severity": "fail",
     "action": "replace", "message": "XID 79 (GPU has fallen off the bus)"},
    {"ts": T0 + 0.412, "kind": "action", "node": "n1", "action": "drain", "target": "n1", "result": "ok",
     "duration_s": 0.02, "reason": "slurm-hooks: XID 79 on GPU 3 [replace]"},
    {"ts": T0 + 0.9, "kind": "action", "node": "n1", "action": "requeue", "target": "4711", "result": "ok",
     "duration_s": 0.05, "jobs": [4711]},
    {"ts": T0 + 3600, "kind": "alert", "node": "n2", "context": "epilog", "gpu": 1, "check": "leftover",
     "severity": "fail", "action": "drain", "message": "1 process(es) left after the job (pid 48213)"},
    {"ts": T0 + 7200, "kind": "action", "node": "n1", "action": "resume", "target": "n1", "result": "ok",
     "duration_s": 0.01, "reason": "slurm-hooks: XID 79 on GPU 3 [replace]"},
]


def test_events_shows_incidents_grouped_per_node_in_time_order(conf, tmp_path):
    write_audit(tmp_path, INCIDENT)
    r = slurm_hooks("events", "--config", str(conf))
    assert (r.returncode, r.stderr) == (0, "")
    lines = r.stdout.splitlines()
    heads = [line for line in lines if not line.startswith(" ")]
    # One incident under its id from its alert to its resume two hours later (no 600 s gap splits
    # it); the alert on n2 that took nothing out of service is not called an incident.
    assert heads == ["incident n1-20251129T104000.412Z on n1: drained [replace] at 2025-11-29 10:40:00 UTC; back in "
                     "service after 2h 00m, resumed by slurm-hooks",
                     "n2 at 2025-11-29 11:40:00 UTC: no incident (the node was not taken out of service)"]
    first = lines[1:5]
    assert first[0].startswith("  +   0.000s  alert   gpu3 xid: XID 79 (GPU has fallen off the bus) -> replace")
    assert first[1] == "  +   0.412s  drain   n1 ok (slurm-hooks: XID 79 on GPU 3 [replace])"
    assert first[2] == "  +   0.900s  requeue job 4711 requeued"
    assert first[3] == "  +7200.000s  resume  n1 ok (slurm-hooks: XID 79 on GPU 3 [replace])"


def test_events_node_filter(conf, tmp_path):
    write_audit(tmp_path, INCIDENT)
    r = slurm_hooks("events", "--node", "n2", "--config", str(conf))
    lines = r.stdout.splitlines()
    assert lines[0] == "n2 at 2025-11-29 11:40:00 UTC: no incident (the node was not taken out of service)"
    assert len(lines) == 2 and "leftover" in lines[1]


@pytest.mark.parametrize("since", [str(T0 + 3000), "2025-11-29T11:30:00", "2025-11-29T11:30:00+00:00"])
def test_events_since_an_absolute_time(conf, tmp_path, since):
    write_audit(tmp_path, INCIDENT)
    r = slurm_hooks("events", "--since", since, "--records", "--config", str(conf))
    assert r.returncode == 0, r.stderr
    assert [json.loads(line)["ts"] for line in r.stdout.splitlines()] == [T0 + 3600, T0 + 7200]


def test_events_since_an_iso_time_in_utc_with_z(conf, tmp_path):
    write_audit(tmp_path, INCIDENT)
    r = slurm_hooks("events", "--since", "2025-11-29T11:30:00Z", "--records", "--config", str(conf))
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == 2


def test_events_since_a_relative_time(conf, tmp_path):
    now = time.time()
    write_audit(tmp_path, [dict(INCIDENT[0], ts=now - 7200), dict(INCIDENT[1], ts=now - 600)])
    r = slurm_hooks("events", "--since", "30m", "--records", "--config", str(conf))
    assert [json.loads(line)["kind"] for line in r.stdout.splitlines()] == ["action"]
    r = slurm_hooks("events", "--since", "3h", "--records", "--config", str(conf))
    assert len(r.stdout.splitlines()) == 2


def test_events_records_gives_the_records_sorted_by_time(conf, tmp_path):
    write_audit(tmp_path, list(reversed(INCIDENT)))
    r = slurm_hooks("events", "--records", "--config", str(conf))
    assert [json.loads(line) for line in r.stdout.splitlines()] == INCIDENT


def test_events_json_gives_incidents_by_their_id_as_pages_and_the_report_name_them(conf, tmp_path):
    write_audit(tmp_path, INCIDENT)
    r = slurm_hooks("events", "--json", "--config", str(conf))
    [inc] = [json.loads(line) for line in r.stdout.splitlines()]
    assert (inc["incident"], inc["node"], inc["records"]) == ("n1-20251129T104000.412Z", "n1", 4)
    assert inc["jobs"][0]["job_id"] == "4711" and inc["out_of_service_s"] == pytest.approx(7199.588)


def test_events_without_a_log_says_no_events(conf):
    r = slurm_hooks("events", "--config", str(conf))
    assert (r.returncode, r.stdout) == (0, "no events\n")


def test_events_bad_since_exits_2(conf, tmp_path):
    write_audit(tmp_path, INCIDENT)
    r = slurm_hooks("events", "--since", "yesterday", "--config", str(conf))
    assert r.returncode == 2
    assert "--since" in r.stderr and "cannot read time 'yesterday'" in r.stderr
    assert "Traceback" not in r.stderr


def test_events_after_a_real_check_shows_its_alert(conf, tmp_path):
    conf.write_text(conf.read_text() + "\n[check]\ndrain = false\n")
    sim(conf, "init", "--node", "n1", "--gpus", "8")
    sim(conf, "inject", "--node", "n1", "--gpu", "3", "--xid", "79")
    assert slurm_hooks("check", "--config", str(conf)).returncode == 1
    r = slurm_hooks("events", "--node", "n1", "--config", str(conf))
    lines = r.stdout.splitlines()
    assert lines[0].startswith("n1 at ") and lines[0].endswith(": no incident (the node was not taken out of service)")
    assert "alert   gpu3 xid: XID 79 (GPU has fallen off the bus) -> reboot" in lines[1]


@pytest.mark.parametrize("text, expected", [
    ("30m", T0 - 1800), ("2h", T0 - 7200), ("1d", T0 - 86400), ("90s", T0 - 90), ("1.5h", T0 - 5400),
    (str(T0 - 5), T0 - 5),
    ("2025-11-29T10:40:00", T0), ("2025-11-29T11:40:00+01:00", T0),
])
def test_parse_since(text, expected):
    assert ev.parse_since(text, now=T0) == expected


def test_incidents_split_on_a_gap_and_per_node():
    records = [{"ts": T0, "node": "n1"}, {"ts": T0 + 599, "node": "n1"}, {"ts": T0 + 1300, "node": "n1"},
               {"ts": T0 + 10, "node": "n2"}]
    groups = ev.incidents(ev.select(records))
    assert [[(r["node"], r["ts"] - T0) for r in g] for g in groups] == [
        [("n1", 0), ("n1", 599)], [("n2", 10)], [("n1", 1300)]]


def test_render_stamps_records_in_utc():
    [head, line] = timeline.render([(None, [{"ts": T0, "node": "n1", "kind": "note", "message": "hello"}])])
    assert head.startswith(f"n1 at {datetime.fromtimestamp(T0, tz=timezone.utc):%Y-%m-%d %H:%M:%S} UTC: ")
    assert line == "  +   0.000s  note    hello"


# --- check --verdict / --deadline (NHC's check_slurm_hooks) -----------------------------------


def test_verdict_of_a_healthy_node_is_one_ok_line(conf):
    sim(conf, "init", "--node", "n1", "--gpus", "8")
    r = slurm_hooks("check", "--dry-run", "--verdict", "--config", str(conf))
    assert (r.returncode, r.stdout, r.stderr) == (0, "slurm-hooks-verdict: ok\n", "")


def test_verdict_of_xid79_is_the_reason_without_the_action_tag_after_the_findings(conf):
    sim(conf, "init", "--node", "n1", "--gpus", "8")
    sim(conf, "inject", "--node", "n1", "--gpu", "3", "--xid", "79")
    r = slurm_hooks("check", "--dry-run", "--verdict", "--config", str(conf))
    assert r.returncode == 1, r.stderr
    assert r.stdout == ("gpu3 xid: XID 79 (GPU has fallen off the bus) -> reboot\n"
                        "slurm-hooks-verdict: slurm-hooks: XID 79 on GPU 3\n")


def test_a_warning_alone_is_an_ok_verdict(conf):
    sim(conf, "init", "--node", "n1", "--gpus", "8")
    sim(conf, "inject", "--node", "n1", "--gpu", "6", "--temp", "88")
    r = slurm_hooks("check", "--dry-run", "--verdict", "--config", str(conf))
    assert (r.returncode, r.stdout.splitlines()[-1]) == (0, "slurm-hooks-verdict: ok"), r.stderr


@pytest.mark.parametrize("value", ["0", "-1", "soon"])
def test_deadline_must_be_positive_seconds(conf, value):
    r = slurm_hooks("check", "--deadline", value, "--config", str(conf))
    assert r.returncode == 2 and "--deadline" in r.stderr


def test_a_short_deadline_still_probes_and_judges(conf):
    sim(conf, "init", "--node", "n1", "--gpus", "8")
    sim(conf, "inject", "--node", "n1", "--gpu", "3", "--xid", "79")
    r = slurm_hooks("check", "--dry-run", "--deadline", "3", "--config", str(conf))
    assert r.returncode == 1 and "XID 79" in r.stdout, r.stderr
