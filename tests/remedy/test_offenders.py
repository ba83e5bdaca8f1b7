"""Repeat offenders per node: five remediations of any kind within seven days hold the node for a person.

With simulated GPUs and ports and the shared fake Slurm, under a wall clock the test moves on. A
remediation is one time we drained the node anew (a flaky link drained, XID 79 rebooted on one GPU
then another); the drain that makes it the fifth within the window holds the node: its reason says
so, no check resumes it, the repair ladder runs no rung on it, and a person's resume starts the
count afresh. The history is in the drain's audit record, so the page, ``status`` and the report
show it.
"""

from __future__ import annotations

import time

import pytest
from fakes.config import repair_config, sim_config, sim_node

from slurm_hooks import report as fleet
from slurm_hooks.commands import status
from slurm_hooks.hooks import healthcheck
from slurm_hooks.observe import incidents
from slurm_hooks.observe.notify import OPENED, compose
from slurm_hooks.probes import sim
from slurm_hooks.remedy import offenders
from slurm_hooks.report import html, text

HOUR = 3600.0
DOWN = "slurm-hooks: IB mlx5_0 port 1 down [drain]"
HELD = "slurm-hooks: IB mlx5_0 port 1 down [held: 5 remediations in 7d]"


@pytest.fixture
def clock(monkeypatch):
    """The wall clock, moved on by the test (``clock[0] += seconds``)."""
    real, later = time.time, [0.0]
    monkeypatch.setattr(time, "time", lambda: real() + later[0])
    return later


def check(w):
    return healthcheck.run(w, follow="none", repair="inline")


def link_node(tmp_path, extra: str = ""):
    cfg = sim_config(tmp_path, "[expect]\ngpus = 8\nib_ports = 8\nib_rate_gbps = 400\n" + extra)
    slurm, w = sim_node(cfg, "IDLE")
    sim.init_ib(cfg.gpu.sim_dir, "n1", 8)
    return slurm, w


def port(w, clock, state: str, hours: float = 6.0):
    """``mlx5_0`` port 1 goes ``state`` (as its sysfs says), ``hours`` later the health check runs."""
    sim.inject_ib(w.config.gpu.sim_dir, "n1", "mlx5_0:1", state=state)
    clock[0] += hours * HOUR
    return check(w)[1]


def flaps(w, slurm, clock, n: int, hours: float = 6.0) -> None:
    """``n`` times: the port goes down (drained) and up again (resumed)."""
    for _ in range(n):
        assert port(w, clock, "down", hours).drained and slurm.peek("n1").reason == DOWN
        assert port(w, clock, "up", hours).resumed


def test_a_flaky_link_drained_and_resumed_five_times_is_held_and_not_resumed_on_the_next_good_readings(
        tmp_path, clock):
    slurm, w = link_node(tmp_path)
    flaps(w, slurm, clock, 4)
    assert port(w, clock, "down").drained
    assert slurm.peek("n1").reason == HELD
    for _ in range(3):
        assert not port(w, clock, "up").resumed
    assert slurm.peek("n1").drained and slurm.peek("n1").reason == HELD
    skipped = [r for r in w.audit.history() if r.get("action") == "resume" and r.get("result") == "skipped"]
    assert skipped and skipped[-1]["detail"].startswith("held for a person (5 remediations in 7d): ")
    assert "scontrol update NodeName=n1 State=RESUME" in skipped[-1]["detail"]


def test_checks_that_find_the_node_still_drained_add_no_remediation_even_when_its_reason_widens(tmp_path, clock):
    slurm, w = link_node(tmp_path)
    for _ in range(4):
        assert port(w, clock, "down", hours=1).drained
    sim.inject_ib(w.config.gpu.sim_dir, "n1", "mlx5_1:1", state="down")  # a second port, the node still out
    for _ in range(4):
        assert port(w, clock, "down", hours=1).drained
    assert slurm.peek("n1").reason == "slurm-hooks: IB mlx5_0 port 1 down; IB mlx5_1 port 1 down [drain]"
    assert [r.what for r in offenders.log(w).read()] == ["IB mlx5_0 port 1 down"]


def test_a_held_node_keeps_its_held_reason_while_the_fault_stays_and_after_it_clears(tmp_path, clock):
    """Checks that still find the port down must not write the plain [drain] reason over the hold
    (the next good reading would then resume the node)."""
    slurm, w = link_node(tmp_path)
    flaps(w, slurm, clock, 4)
    for _ in range(3):
        assert port(w, clock, "down").drained
        assert slurm.peek("n1").reason == HELD
    assert not port(w, clock, "up").resumed and slurm.peek("n1").reason == HELD
    assert len(offenders.log(w).read()) == 5


def test_faults_only_alerted_on_never_count_toward_a_hold(tmp_path, clock):
    """Monitor-only ([check] drain = false): each fault is found and recorded, none is a remediation."""
    slurm, w = link_node(tmp_path, "[check]\ndrain = false\n")
    for _ in range(6):
        assert port(w, clock, "down").monitor_only
        port(w, clock, "up")
    assert offenders.log(w).read() == [] and not slurm.peek("n1").drained


def xid79_node(tmp_path):
    cfg = repair_config(tmp_path)
    slurm, w = sim_node(cfg, "IDLE")
    sim.set_diag_seconds(cfg.gpu.sim_dir, "n1", 0.0)
    return slurm, w


def xid79(w, slurm, clock, gpu: int):
    """14 h on, XID 79 on ``gpu``: the check drains the node, the ladder reboots it through Slurm, it
    comes back DOWN with our reason and the next check resumes it. The first check's outcome."""
    clock[0] += 14 * HOUR  # the same GPU every 42 h: never back within the ladder's 24 h window
    sim.inject(w.config.gpu.sim_dir, "n1", gpu, xid=79)
    _, out = check(w)
    reason = slurm.peek("n1").reason
    if out.repairs == ["reboot:start"]:
        sim.reboot(w.config.gpu.sim_dir, "n1")
        slurm.set_node("n1", state="DOWN", reason=f"{reason} : reboot issued : reboot complete")
        assert check(w)[1].resumed
    return out


def test_reboots_spread_over_three_gpus_hold_the_node_at_the_fifth_remediation_in_a_week(tmp_path, clock):
    """Each GPU on its own never meets the ladder's per-GPU repeat rule: the node's count does.
    Each fault's drain and reboot count once (a reboot counted apart would hold it at the third)."""
    slurm, w = xid79_node(tmp_path)
    for i in range(4):
        assert xid79(w, slurm, clock, i % 3).repairs == ["reboot:start"]
    out = xid79(w, slurm, clock, 1)
    assert out.drained and out.repairs == []
    assert slurm.peek("n1").reason == "slurm-hooks: XID 79 on GPU 1 [held: 5 remediations in 7d]"
    for _ in range(3):  # later checks: no reboot, no resume
        assert check(w)[1].repairs == []
    assert len(slurm.called("reboot")) == 4 and slurm.peek("n1").drained


def test_remediations_43_hours_apart_never_make_five_within_seven_days(tmp_path, clock):
    slurm, w = link_node(tmp_path)
    flaps(w, slurm, clock, 6, hours=21.5)
    assert len(offenders.log(w).read()) == 4  # the older ones left the window
    assert not [r for r in w.audit.history() if r.get("held")]


def test_a_persons_resume_ends_the_hold_and_the_count_starts_afresh(tmp_path, clock):
    slurm, w = link_node(tmp_path)
    flaps(w, slurm, clock, 4)
    assert port(w, clock, "down").drained and slurm.peek("n1").reason == HELD
    sim.inject_ib(w.config.gpu.sim_dir, "n1", "mlx5_0:1", state="up")  # a person mends the cable ...
    slurm.resume("n1")  # ... and resumes the node
    clock[0] += HOUR
    check(w)
    [released] = [r for r in w.audit.history() if r.get("action") == "offender-release"]
    assert released["result"] == "ok" and len(released["history"]) == 5
    assert offenders.log(w).read() == []
    flaps(w, slurm, clock, 4)  # four more within the week, each drained [drain] and resumed as on any node


def test_a_persons_resume_with_the_link_still_down_drains_anew_as_the_first_of_a_fresh_count(tmp_path, clock):
    slurm, w = link_node(tmp_path)
    flaps(w, slurm, clock, 4)
    assert port(w, clock, "down").drained and slurm.peek("n1").reason == HELD
    slurm.resume("n1")  # resumed without mending it
    clock[0] += HOUR
    assert check(w)[1].drained
    assert slurm.peek("n1").reason == DOWN
    assert len(offenders.log(w).read()) == 1


def test_status_the_page_and_the_report_show_the_held_nodes_history(tmp_path, clock):
    slurm, w = link_node(tmp_path)
    flaps(w, slurm, clock, 4)
    port(w, clock, "down")
    records = list(w.audit.history())
    [held] = [r for r in records if r.get("held")]
    assert held["held"] == "5 remediations within 7d (limit 5)"
    assert [h["what"] for h in held["history"]] == ["IB mlx5_0 port 1 down"] * 5

    [inc] = [i for i in incidents.build(records) if i.open]
    table = status.rows(slurm.nodes(), {inc.node: inc}, [], time.time())
    [row] = table
    assert row["next"] == "a person" and row["why"] == "held for a person: 5 remediations within 7d (limit 5)"
    assert "slurm-hooks events --node n1" in row["todo"] and "scontrol update NodeName=n1 State=RESUME" in row["todo"]
    lines = status.render(table)
    assert [line.split(": ", 1)[1] for line in lines[1:]] == \
        [incidents.history_line(h) for h in held["history"]]
    assert all("IB mlx5_0 port 1 down" in line for line in lines[1:])
    # From Slurm alone (no audit log on this host), the reason still says a person acts.
    [bare] = status.rows(slurm.nodes(), {}, [], time.time())
    assert bare["next"] == "a person" and "State=RESUME" in bare["todo"]
    assert bare["why"] == "held for a person: 5 remediations in 7d"

    page = compose(inc, OPENED, inc.opened_at).text
    assert "Held for a person: 5 remediations within 7d (limit 5): " + incidents.history_text(held["history"]) in page
    assert "scontrol update NodeName=n1 State=RESUME" in page

    rep = fleet.build(records, time.time() - 8 * 86400, time.time())
    [off] = rep["held_offenders"]
    assert off["node"] == "n1" and off["open"] and len(off["history"]) == 5
    lines = text.render(rep)
    k = lines.index("REPEAT OFFENDERS: n1")
    assert lines[k + 1].startswith("  n1 held for a person at ")
    assert lines[k + 2:k + 7] == ["    " + incidents.history_line(h) for h in held["history"]]
    assert incidents.history_line(held["history"][0]) in html.render(rep)


def test_the_count_is_the_windows_remediations_and_the_limit_th_one_holds():
    week = 7 * 86400.0
    four = [offenders.Remediation(t, "XID 79 on GPU 0", "reboot") for t in (0.0, HOUR, 2 * HOUR, 3 * HOUR)]
    assert offenders.holds(four, 4 * HOUR, 5, week) == four
    assert offenders.holds(four[1:], 4 * HOUR, 5, week) == []
    assert offenders.holds(four, week + HOUR, 5, week) == []  # the first left the window
    assert offenders.holds(four, 4 * HOUR, 0, week) == []  # node_limit = 0: never held
    assert offenders.span(week) == "7d"


def test_the_log_is_private_and_forgets_past_the_window(tmp_path):
    log = offenders.Log(str(tmp_path / "state" / "remediations-n1.json"))
    week = 7 * 86400.0
    log.add(offenders.Remediation(1000.0, "XID 79 on GPU 0", "reboot", (0,), (), "watch"), week)
    log.add(offenders.Remediation(5000.0, "IB mlx5_0 port 1 down", "drain", (), ("mlx5_0/1",), "check"), week)
    assert [(e.t, e.gpus, e.subjects, e.context) for e in log.read()] == [
        (1000.0, (0,), (), "watch"), (5000.0, (), ("mlx5_0/1",), "check")]
    assert (tmp_path / "state" / "remediations-n1.json").stat().st_mode & 0o777 == 0o600
    log.add(offenders.Remediation(1000.0 + week + 1, "XID 79 on GPU 2", "reboot", (2,)), week)
    assert [e.what for e in log.read()] == ["IB mlx5_0 port 1 down", "XID 79 on GPU 2"]
    (tmp_path / "state" / "remediations-n1.json").write_text("{not json")
    assert log.read() == []  # a log that does not read starts afresh: the hold itself is in Slurm's reason
