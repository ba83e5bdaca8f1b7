"""The link checks: pure functions of the gathered ports; rates and flaps replayed with a fake clock."""

from __future__ import annotations

import os
import shutil

from fakes import ibtree
from paths import FIXTURES

from slurm_hooks import engine
from slurm_hooks.checks import links
from slurm_hooks.models import (
    Action,
    CheckInput,
    Context,
    Expectations,
    IbPort,
    LinkPorts,
    NodeSnapshot,
    Severity,
    Urgency,
)
from slurm_hooks.probes import ib
from slurm_hooks.slurm import format_reason

H100_SYS = os.path.join(FIXTURES, "ib", "sys-class-infiniband-h100")
NDR = Expectations(ib_ports=8, ib_rate_gbps=400)


def judge(ports, expect=Expectations(), now=0.0):
    """The registry's link checks through the engine, as the health check runs them."""
    snap = NodeSnapshot("n1", "test", taken_at=now)
    request = engine.JudgeRequest(expect, Context.CHECK, deadline_s=30.0, links=lambda: ports if isinstance(ports, LinkPorts) else tuple(ports),
                                  checks=tuple(c for c in engine.registry.REGISTRY if c.name in engine.LINK_CHECKS))
    return engine.judge(snap, request)


def port(state="ACTIVE", phys="LinkUp", rate=400.0, device="mlx5_0", **kw) -> IbPort:
    return IbPort(device, 1, state, phys, rate, "InfiniBand", **kw)


def captured() -> tuple[IbPort, ...]:
    ports, _ = ib.advance(ib.read_ports(H100_SYS), None, 0.0, "b")
    return ports


def test_captured_healthy_h100_passes_with_eight_ndr_ports_expected():
    report = judge(captured(), NDR)
    assert report.healthy and not report.drain_findings()
    assert {f.rule for f in report.findings} == {"ib-unjudged"}  # the saturated counters, said on the first run
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
    assert found["ib-ports"].message == "7 InfiniBand port(s) present, 8 expected"
    assert found["ib-rate"].message == "IB mlx5_6 port 1: rate 200 Gb/s, expected 400 Gb/s"
    assert found["ib-rate"].urgency is Urgency.JOB_END and found["ib-rate"].config_based


def test_the_captured_roce_bond_at_200_is_no_infiniband_port_too_slow():
    """Judged apart: the bond fails neither the InfiniBand rate nor, unless one is set, any."""
    assert not judge(captured(), Expectations(ib_rate_gbps=400)).drain_findings()
    [f] = judge(captured(), Expectations(roce_rate_gbps=400)).drain_findings()
    assert (f.rule, f.message) == ("roce-rate", "RoCE mlx5_bond_0 port 1: rate 200 Gb/s, expected 400 Gb/s")


def test_first_reading_judges_no_rates():
    assert judge([port(counters=(("symbol_error", 10**9),))]).findings == ()


def test_buffer_overrun_is_fatal_at_any_growth_in_any_window():
    [f] = judge([port(deltas=(("excessive_buffer_overrun_errors", 1),), window_s=300.0,
                      rate_window_s=600.0)]).drain_findings()
    assert f.rule == "ib-errors" and "1 excessive buffer overrun error(s) in 5 min" in f.message


def test_receive_errors_above_10_per_second_are_degraded_a_warning():
    report = judge([port(deltas=(("port_rcv_errors", 6600),), window_s=600.0, rate_window_s=600.0)])
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


def test_1000_symbol_errors_an_hour_on_ndr_are_below_its_ber_limit_and_never_drain():
    """1e-12 of 400 Gb/s is 1,440 symbol errors an hour; 120/h was 1e-12 of a ~33 Gb/s QDR link."""
    assert set(replay(1000 / 3600)) == {Action.NONE}


def test_2000_symbol_errors_an_hour_on_ndr_drain_once_the_window_confirms_them():
    actions = replay(2000 / 3600, hours=2)
    assert actions[:2] == [Action.NONE, Action.NONE]  # the baseline, then 5 min: short of the 10-min window
    assert all(a is Action.DRAIN for a in actions[2:])


def test_the_symbol_error_limit_scales_with_the_port_rate():
    assert links.symbol_limit_per_hour(400.0) == 1440.0
    assert round(links.symbol_limit_per_hour(32.0)) == 115  # QDR 4x after 8b/10b: the old 120/h
    assert links.symbol_limit_per_hour(None) == 120.0


def test_symbol_errors_above_10_per_second_are_also_degraded():
    report = judge([port(deltas=(("symbol_error", 6600),), window_s=600.0, rate_window_s=600.0)])
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




# -- on the captured tree laid as a node's sysfs (tests/fakes/ibtree.py), gathered run after run


class Node:
    """The captured H100 node, its ports gathered and judged as the health check does, on a clock."""

    def __init__(self, tmp_path, expect=Expectations(), roce=1, kmsg=""):
        self.sys = str(tmp_path / "sys")
        self.root = ibtree.lay(self.sys, roce=roce)
        self.state = str(tmp_path / "state")
        self.expect, self.kmsg, self.now, self.boot = expect, kmsg, 1000.0, "b"

    def run(self, after: float = 300.0):
        self.now += after
        gather = ib.LinkGatherer(self.root, self.state, "n1", boot=lambda: self.boot, clock=lambda: self.now,
                                 kmsg=self.kmsg)
        return judge(gather(), self.expect, now=self.now)


LEARNED = Expectations(ib_ports=8, ib_rate_gbps=400, roce_ports=1, roce_rate_gbps=200)


def test_an_infiniband_port_down_is_named_though_the_roce_bond_is_up(tmp_path):
    node = Node(tmp_path, NDR)
    ibtree.set_state(node.root, "mlx5_0", "DOWN", "Polling")
    [f] = node.run().drain_findings()
    assert (f.rule, f.summary) == ("ib-down", "IB mlx5_0 port 1 down")
    assert f.message == "IB mlx5_0 port 1: state DOWN, physical state Polling (expected ACTIVE/LinkUp)"


def test_with_the_learned_lines_an_ndr_port_trained_to_2x_drains_and_the_bond_passes(tmp_path):
    node = Node(tmp_path, LEARNED)
    assert not node.run().drain_findings()
    ibtree.write(ibtree.port_file(node.root, "mlx5_6", "rate"), "200 Gb/sec (2X NDR)")
    [f] = node.run().drain_findings()
    assert (f.rule, f.message) == ("ib-rate", "IB mlx5_6 port 1: rate 200 Gb/s, expected 400 Gb/s")


def test_the_roce_bond_down_is_a_roce_finding_of_its_own(tmp_path):
    node = Node(tmp_path, LEARNED)
    ibtree.set_state(node.root, "mlx5_bond_0", "DOWN", "Disabled")
    [f] = node.run().drain_findings()
    assert (f.rule, f.summary) == ("roce-down", "RoCE mlx5_bond_0 port 1 down")


def test_roce_carrier_drops_are_flaps_and_its_transport_counters_only_warn(tmp_path):
    node = Node(tmp_path, LEARNED)
    node.run()
    netdev = os.path.join(node.sys, "devices", "pci0000:00", ibtree.PCI["mlx5_bond_0"], "net", ibtree.BOND_IF)
    ibtree.carrier(netdev, downs=4)  # three drops since the last run, each back before it looked
    ibtree.set_counter(node.root, "mlx5_bond_0", "local_ack_timeout_err", 90000, folder="hw_counters")
    report = node.run(600.0)
    found = {f.rule: f for f in report.findings}
    assert found["roce-flaps"].message == "RoCE mlx5_bond_0 port 1: 3 flaps in 12 h (limit 3)"
    assert found["roce-degraded"].action is Action.WARN
    assert "90,000 local_ack_timeout_err in 10 min (150.0/s" in found["roce-degraded"].message
    assert [f.rule for f in report.drain_findings()] == ["roce-flaps"]


def test_one_symbol_error_three_seconds_after_the_last_run_does_not_drain(tmp_path):
    node = Node(tmp_path, NDR)
    node.run()
    ibtree.set_counter(node.root, "mlx5_0", "symbol_error", 1)
    assert not node.run(3.0).findings


def test_a_burst_in_a_short_window_warns_until_the_window_confirms_it(tmp_path):
    node = Node(tmp_path, NDR)
    node.run()
    ibtree.set_counter(node.root, "mlx5_0", "symbol_error", 1000)
    burst = node.run(3.0)
    [f] = burst.findings
    assert (f.rule, f.action) == ("ib-degraded", Action.WARN)
    assert f.message.startswith("IB mlx5_0 port 1: burst of 1,000 symbol errors in 3 s (1,440/h, a BER of 1e-12")
    assert f.message.endswith("judged once 10 min of readings confirm it")
    confirmed = node.run(600.0)
    [f] = confirmed.drain_findings()
    assert f.rule == "ib-errors" and "1,000 symbol errors in 10 min" in f.message


def test_saturated_counters_are_said_once_per_boot_not_warned_every_run(tmp_path):
    """Every captured port has excessive_buffer_overrun_errors at 15, its 4-bit maximum."""
    node = Node(tmp_path, NDR)
    first = node.run()
    assert {f.summary for f in first.findings} == {f"IB {d} port 1 counters cannot be judged" for d in
                                                  ("mlx5_0", "mlx5_1", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7",
                                                   "mlx5_8", "mlx5_9")}
    assert all(f.action is Action.WARN and "perfquery -R" in f.message for f in first.findings)
    assert all(not node.run().findings for _ in range(5))
    node.boot = "b2"
    assert len(node.run().findings) == 8


def test_after_perfquery_reset_the_errors_since_count(tmp_path):
    node = Node(tmp_path, NDR)
    ibtree.set_counter(node.root, "mlx5_0", "symbol_error", 60000)
    node.run()
    ibtree.set_counter(node.root, "mlx5_0", "symbol_error", 5000)  # cleared, then 5,000 in 10 minutes
    [f] = node.run(600.0).drain_findings()
    assert f.rule == "ib-errors" and "5,000 symbol errors in 10 min" in f.message


def test_three_drops_between_two_runs_are_three_flaps_and_drain(tmp_path):
    node = Node(tmp_path, NDR)
    node.run()
    ibtree.set_counter(node.root, "mlx5_0", "link_downed", 3)
    [f] = node.run().drain_findings()
    assert f.message == "IB mlx5_0 port 1: 3 flaps in 12 h (limit 3)"


def test_a_vanished_hca_is_named_with_no_port_count_configured(tmp_path):
    node = Node(tmp_path)
    node.run()
    shutil.rmtree(os.path.join(node.root, "mlx5_4"))
    [f] = node.run(10.0).findings
    assert (f.rule, f.action) == ("ib-degraded", Action.WARN)
    assert f.message == "IB mlx5_4 port 1: seen on this boot, gone for 0 s; drains if still gone after 25 s"
    [f] = node.run(30.0).drain_findings()
    assert (f.rule, f.summary) == ("ib-gone", "IB mlx5_4 port 1 gone")


def test_a_vanished_hca_under_a_port_count_is_named_in_the_count(tmp_path):
    node = Node(tmp_path, NDR)
    node.run()
    shutil.rmtree(os.path.join(node.root, "mlx5_4"))
    [f] = node.run(10.0).drain_findings()
    assert f.message == "7 InfiniBand port(s) present, 8 expected (mlx5_4 port 1 gone since boot)"


def test_an_overheating_module_of_a_non_rdma_adapter_drains_no_port(tmp_path):
    log = tmp_path / "kmsg.log"
    log.write_text("<3>[ 8812.104421] mlx5_core 0000:41:00.1: mlx5_port_module_event:1131:(pid 0): "
                   "Port module event[error]: module 1, Cable error, High Temperature\n")
    node = Node(tmp_path, NDR, kmsg=str(log))
    assert not node.run().drain_findings()


def test_a_counter_memory_that_cannot_be_written_is_a_warning_of_its_own(tmp_path):
    node = Node(tmp_path, NDR)
    with open(node.state, "w"):
        pass  # the state dir is a file: nothing can be written under it
    report = node.run()
    [f] = [f for f in report.findings if f.rule == "links-memory"]
    assert f.action is Action.WARN and not report.drain_findings()
    assert f.message.startswith(f"cannot remember link counters: {node.state}/ib-n1.json: File exists;")


def test_two_ports_down_on_the_captured_tree_are_each_held_by_their_own_memory(tmp_path):
    """Each port's finding names its port as its subject, so hysteresis keeps one memory per port:
    two ports down are both named, and one port's good readings never release the other."""
    from slurm_hooks.checks.hysteresis import fold

    node = Node(tmp_path, NDR)
    ibtree.set_state(node.root, "mlx5_0", "DOWN", "Polling")
    ibtree.set_state(node.root, "mlx5_4", "DOWN", "Polling")
    found = node.run().findings
    assert sorted(f.subject for f in found if f.rule == "ib-down") == ["mlx5_0 port 1", "mlx5_4 port 1"]
    out, memory = fold(found, {}, 0.0, confirm=(2, 3), resume_after=3)
    assert sorted(f.subject for f in out if f.action.takes_node_out) == ["mlx5_0 port 1", "mlx5_4 port 1"]
