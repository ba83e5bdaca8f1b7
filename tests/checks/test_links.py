"""The link checks: pure functions of the gathered ports; rates and flaps replayed with a fake clock."""

from __future__ import annotations

import os

from paths import FIXTURES

from slurm_hooks import engine
from slurm_hooks.checks import links
from slurm_hooks.models import Action, CheckInput, Context, Expectations, IbPort, NodeSnapshot, Severity, Urgency
from slurm_hooks.probes import ib
from slurm_hooks.slurm import format_reason

H100_SYS = os.path.join(FIXTURES, "ib", "sys-class-infiniband-h100")
NDR = Expectations(ib_ports=8, ib_rate_gbps=400)


def judge(ports, expect=Expectations(), now=0.0):
    """The registry's link checks through the engine, as the health check runs them."""
    snap = NodeSnapshot("n1", "test", taken_at=now)
    request = engine.JudgeRequest(expect, Context.CHECK, deadline_s=30.0, links=lambda: tuple(ports),
                                  checks=tuple(c for c in engine.registry.REGISTRY if c.name in engine.LINK_CHECKS))
    return engine.judge(snap, request)


def port(state="ACTIVE", phys="LinkUp", rate=400.0, device="mlx5_0", **kw) -> IbPort:
    return IbPort(device, 1, state, phys, rate, "InfiniBand", **kw)


def captured() -> tuple[IbPort, ...]:
    ports, _ = ib.advance(ib.read_ports(H100_SYS), None, 0.0, "b")
    return ports


def test_captured_healthy_h100_passes_with_eight_ndr_ports_expected():
    report = judge(captured(), NDR)
    assert report.findings == () and report.healthy
    assert {"links", "link-errors", "link-flaps"} <= set(report.checks_run)


def test_port_down_drains_now_with_the_reason_the_issue_names():
    report = judge([port(state="DOWN", phys="Polling"), port(device="mlx5_1")])
    [f] = report.drain_findings()
    assert (f.rule, f.action, f.urgency, f.gpu) == ("ib-down", Action.DRAIN, Urgency.NOW, None)
    assert "state DOWN, physical state Polling (expected ACTIVE/LinkUp)" in f.message
    assert format_reason(engine.drain_summary(report), report.worst_action, at_job_end=not report.urgent()) == \
        "slurm-hooks: IB mlx5_0 port 1 down [drain]"
    assert report.requeue_gpus() == frozenset() and report.requeue_multi_node()  # the jobs that span nodes


def test_active_but_not_linkup_is_down():
    [f] = judge([port(phys="Polling")]).drain_findings()
    assert f.rule == "ib-down"


def test_a_spare_port_down_is_fine_when_enough_are_up():
    ports = [*(port(device=f"mlx5_{i}") for i in range(8)), port(device="mlx5_bond_0", state="DOWN", rate=200.0)]
    assert judge(ports, NDR).findings == ()


def test_missing_ports_and_slow_ports_drain_against_the_configured_values():
    ports = [*(port(device=f"mlx5_{i}") for i in range(6)), port(device="mlx5_6", rate=200.0)]
    found = {f.rule: f for f in judge(ports, NDR).drain_findings()}
    assert set(found) == {"ib-ports", "ib-rate"}
    assert found["ib-ports"].message == "7 InfiniBand/RoCE port(s) present, 8 expected"
    assert found["ib-rate"].message == "IB mlx5_6 port 1: rate 200 Gb/s, expected 400 Gb/s"
    assert found["ib-rate"].urgency is Urgency.JOB_END and found["ib-rate"].config_based


def test_the_captured_roce_bond_at_200_does_not_fail_an_expected_rate_when_eight_run_at_400():
    assert judge(captured(), NDR).findings == ()
    assert [f.rule for f in judge(captured(), Expectations(ib_rate_gbps=400)).findings] == ["ib-rate"]


def test_first_reading_judges_no_rates():
    assert judge([port(counters=(("symbol_error", 10**9),))]).findings == ()


def test_buffer_overrun_is_fatal():
    [f] = judge([port(deltas=(("excessive_buffer_overrun_errors", 1),), window_s=300.0)]).drain_findings()
    assert f.rule == "ib-errors" and "1 excessive buffer overrun error(s) in 5 min" in f.message


def test_receive_errors_above_10_per_second_are_degraded_a_warning():
    report = judge([port(deltas=(("port_rcv_errors", 3300),), window_s=300.0)])
    [f] = report.findings
    assert (f.rule, f.severity, f.urgency) == ("ib-degraded", Severity.WARN, Urgency.WATCH)
    assert report.healthy


def replay(rate_per_s: float, hours: float = 24.0, step_s: float = 300.0) -> list:
    """A port whose symbol_error grows at ``rate_per_s``, read every ``step_s`` for ``hours``;
    the worst action of each run's report."""
    memory, actions, count, now = None, [], 0.0, 0.0
    while now <= hours * 3600:
        raw = [{"device": "mlx5_0", "port": 1, "state": "ACTIVE", "phys_state": "LinkUp", "rate_gbps": 400.0,
                "link_layer": "InfiniBand", "counters": {"symbol_error": int(count)}}]
        ports, memory = ib.advance(raw, memory, now, "boot")
        actions.append(judge(ports, now=now).worst_action)
        now += step_s
        count += rate_per_s * step_s
    return actions


def test_24h_baseline_of_5_symbol_errors_an_hour_never_drains():
    assert set(replay(5 / 3600)) == {Action.NONE}


def test_200_symbol_errors_an_hour_drain():
    actions = replay(200 / 3600, hours=2)
    assert actions[0] is Action.NONE  # the first reading is the baseline
    assert all(a is Action.DRAIN for a in actions[1:])


def test_symbol_errors_above_10_per_second_are_also_degraded():
    report = judge([port(deltas=(("symbol_error", 3300),), window_s=300.0)])
    assert {f.rule for f in report.findings} == {"ib-errors", "ib-degraded"}


def test_one_flap_in_12h_is_a_warning_three_drain():
    now = 50000.0
    one = judge([port(flaps=(now - 3600,))], now=now)
    [f] = one.findings
    assert (f.rule, f.action) == ("ib-flap", Action.WARN) and one.healthy
    three = judge([port(flaps=(now - 40000, now - 3600, now - 60))], now=now)
    [f] = three.drain_findings()
    assert f.rule == "ib-flaps" and f.message == "IB mlx5_0 port 1: 3 flaps in 12 h (limit 3)"

def test_a_flap_older_than_12h_falls_out_of_the_window():
    raw = [{"device": "mlx5_0", "port": 1, "state": "ACTIVE", "phys_state": "LinkUp", "rate_gbps": 400.0,
            "link_layer": "InfiniBand", "counters": {}}]
    memory = {"boot": "b", "at": 50000.0, "ports": {"mlx5_0:1": {"counters": {}, "up": True,
                                                                  "flaps": [6000.0, 46400.0, 49940.0]}}}
    ports, _ = ib.advance(raw, memory, 50000.0, "b")
    assert [f.rule for f in judge(ports).findings] == ["ib-flap"]


def test_three_flaps_replayed_through_the_gather_step_drain():
    memory, now = None, 0.0
    report = None
    for _ in range(3):
        for state, dt in (("ACTIVE", 600.0), ("DOWN", 10.0), ("DOWN", 30.0), ("ACTIVE", 1.0)):
            now += dt
            raw = [{"device": "mlx5_0", "port": 1, "state": state, "phys_state": "LinkUp" if state == "ACTIVE"
                    else "Polling", "rate_gbps": 400.0, "link_layer": "InfiniBand", "counters": {}}]
            ports, memory = ib.advance(raw, memory, now, "boot")
        report = judge(ports, now=now)
    [f] = report.drain_findings()
    assert f.rule == "ib-flaps"


def test_a_gather_that_crashes_is_a_finding_not_a_crashed_run():
    def broken():
        raise OSError("sysfs went away")

    snap = NodeSnapshot("n1", "test")
    report = engine.judge(snap, engine.JudgeRequest(Expectations(), Context.CHECK, deadline_s=30.0, links=broken))
    [f] = [f for f in report.findings if f.check == "links"]
    assert "cannot read the links: OSError: sysfs went away" in f.message and f.action is Action.DRAIN


def test_links_are_not_gathered_for_the_prolog():
    called = []
    snap = NodeSnapshot("n1", "test")
    engine.judge(snap, engine.JudgeRequest(Expectations(), Context.PROLOG, deadline_s=30.0,
                                           links=lambda: called.append(1)))
    assert called == []


def test_check_functions_are_pure_on_inputs():
    inp = CheckInput(NodeSnapshot("n1", "t"), NDR, links=None)
    assert list(links.check_ports(inp)) == [] and list(links.check_counters(inp)) == []


def test_a_gather_that_hangs_is_a_finding_within_its_timeout():
    import threading

    release = threading.Event()
    snap = NodeSnapshot("n1", "test")
    try:
        report = engine.judge(snap, engine.JudgeRequest(Expectations(), Context.CHECK, deadline_s=0.6,
                                                        links=lambda: release.wait(60)))
    finally:
        release.set()
    [f] = [f for f in report.findings if f.message.startswith("cannot read the links")]
    assert "no answer within" in f.message and f.action is Action.DRAIN


def test_mlx5_overheating_module_drains_at_job_end_and_access_reg_only_warns():
    line = "mlx5_port_module_event:1131:(pid 0): Port module event[error]: module 0, Cable error, High Temperature"
    ports = [port(events=(("ib-module-temperature", line), ("ib-access-reg", "ACCESS_REG(0x805) failed"))),
             port(device="mlx5_1", events=(("ib-module-temperature", line),))]
    report = judge(ports)
    found = sorted((f.rule, f.summary, f.action.value, f.urgency.value) for f in report.findings)
    assert found == [("ib-access-reg", "IB mlx5_0 ACCESS_REG refused", "warn", "watch"),
                     ("ib-module-temperature", "IB mlx5_0 cable module overheating", "drain", "job-end"),
                     ("ib-module-temperature", "IB mlx5_1 cable module overheating", "drain", "job-end")]
    assert report.requeue_multi_node() is False  # at job end: nothing is requeued for it


def test_a_port_whose_state_cannot_be_read_is_a_warning_never_a_drain():
    """The port vanishing mid-read or a driver error: no reading, not a port down."""
    report = judge([port(state="", phys="", rate=None), port(device="mlx5_1")])
    assert not report.drain_findings()
    [f] = [f for f in report.findings if f.check == "links"]
    assert f.action is Action.WARN and "could not be read" in f.message


def test_a_counter_stuck_at_its_maximum_is_said_since_its_growth_cannot_be_seen():
    """IB PortCounters saturate: link_downed at 255 (as in the captured H100 tree) hides every later
    drop, symbol_error at 65535 every later error. A warning, never a drain."""
    stuck = port(counters=(("link_downed", 255), ("symbol_error", 65535)), deltas=(("link_downed", 0),),
                 window_s=300.0)
    report = judge([stuck])
    assert not report.drain_findings()
    [f] = [f for f in report.findings if f.check == "link-errors"]
    assert f.action is Action.WARN and "symbol_error at 65535, link_downed at 255" in f.message
    assert judge([port(counters=(("link_downed", 254),), window_s=300.0)]).findings == ()
