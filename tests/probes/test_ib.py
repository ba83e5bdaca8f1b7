"""The InfiniBand/RoCE gather step on the captured H100 /sys tree (tests/fixtures/ib) and trees laid from it."""

from __future__ import annotations

import json
import os
import shutil

from fakes import ibtree
from paths import FIXTURES

from slurm_hooks.models import IbPort
from slurm_hooks.probes import ib

IB = os.path.join(FIXTURES, "ib")
H100_SYS = os.path.join(IB, "sys-class-infiniband-h100")


def test_captured_h100_tree_reads_eight_ndr_ports_and_the_roce_bond():
    ports = ib.read_ports(H100_SYS)
    names = [f"{p['device']}:{p['port']}" for p in ports]
    assert names == ["mlx5_0:1", "mlx5_1:1", "mlx5_4:1", "mlx5_5:1", "mlx5_6:1", "mlx5_7:1", "mlx5_8:1",
                     "mlx5_9:1", "mlx5_bond_0:1"]
    first = ports[0]
    assert (first["state"], first["phys_state"], first["rate_gbps"], first["link_layer"]) == \
        ("ACTIVE", "LinkUp", 400.0, "InfiniBand")
    assert first["counters"]["symbol_error"] == 0 and first["counters"]["port_rcv_errors"] == 14
    assert set(first["counters"]) == set(ib.COUNTERS)
    assert ports[1]["counters"]["link_downed"] == 255
    assert (ports[-1]["rate_gbps"], ports[-1]["link_layer"]) == (200.0, "Ethernet")


def test_no_infiniband_tree_reads_no_ports(tmp_path):
    assert ib.read_ports(str(tmp_path / "absent")) == []
    gather = ib.LinkGatherer(str(tmp_path / "absent"), str(tmp_path), "n1", boot=lambda: "b1")
    assert gather() is None


def test_sysfs_values_parse_as_the_kernel_writes_them():
    assert ib.state_word("4: ACTIVE") == "ACTIVE"
    assert ib.state_word("3: Disabled") == "Disabled"
    assert ib.parse_rate("400 Gb/sec (4X NDR)") == 400.0
    assert ib.parse_rate("2.5 Gb/sec (1X SDR)") == 2.5
    assert ib.parse_rate("") is None


def raw(symbols: int = 0, state: str = "ACTIVE", phys: str = "LinkUp", downed: int = 0) -> list[dict]:
    return [{"device": "mlx5_0", "port": 1, "state": state, "phys_state": phys, "rate_gbps": 400.0,
             "link_layer": "InfiniBand", "counters": {"symbol_error": symbols, "link_downed": downed}}]


def test_first_reading_has_no_rate_then_the_growth_over_the_real_window():
    ports, memory = ib.advance(raw(symbols=100), None, 1000.0, "boot-a")
    assert ports[0].window_s == 0 and ports[0].deltas == ()
    ports, memory = ib.advance(raw(symbols=160), memory, 1300.0, "boot-a")
    assert ports[0].window_s == 300.0 and ports[0].delta("symbol_error") == 60


def test_a_new_boot_id_starts_the_counters_afresh():
    _, memory = ib.advance(raw(symbols=5000), None, 1000.0, "boot-a")
    ports, memory = ib.advance(raw(symbols=3), memory, 1300.0, "boot-b")
    assert ports[0].window_s == 0 and ports[0].delta("symbol_error") is None
    ports, _ = ib.advance(raw(symbols=13), memory, 1600.0, "boot-b")
    assert ports[0].delta("symbol_error") == 10


def test_a_drop_of_25_s_that_comes_back_is_a_flap_a_shorter_one_is_not():
    _, m = ib.advance(raw(), None, 0.0, "b")
    ports, m = ib.advance(raw(state="DOWN", phys="Polling"), m, 10.0, "b")
    assert ports[0].down_s == 0.0 and not ports[0].up
    ports, m = ib.advance(raw(state="DOWN", phys="Polling"), m, 30.0, "b")
    assert ports[0].down_s == 20.0
    ports, m = ib.advance(raw(downed=1), m, 40.0, "b")
    assert ports[0].flaps == (40.0,)
    ports, m = ib.advance(raw(state="DOWN", phys="Polling", downed=1), m, 50.0, "b")
    ports, m = ib.advance(raw(downed=2), m, 60.0, "b")
    assert ports[0].flaps == (40.0,)  # down 10 s: no flap


def test_link_downed_grown_between_two_up_readings_is_an_unseen_flap():
    _, m = ib.advance(raw(downed=0), None, 0.0, "b")
    ports, _ = ib.advance(raw(downed=1), m, 300.0, "b")
    assert ports[0].flaps == (300.0,)


def test_link_downed_rising_by_three_between_two_up_readings_is_three_flaps():
    _, m = ib.advance(raw(downed=0), None, 0.0, "b")
    ports, _ = ib.advance(raw(downed=3), m, 300.0, "b")
    assert ports[0].flaps == (300.0, 300.0, 300.0)


def test_memory_survives_a_restart_of_the_gatherer(tmp_path):
    root = tmp_path / "sys"
    shutil.copytree(H100_SYS, root)
    clock = iter([1000.0, 4600.0])
    first = ib.LinkGatherer(str(root), str(tmp_path), "n1", boot=lambda: "b1", clock=lambda: next(clock))
    assert all(p.window_s == 0 for p in first())
    (root / "mlx5_0" / "ports" / "1" / "counters" / "symbol_error").write_text("500\n")
    second = ib.LinkGatherer(str(root), str(tmp_path), "n1", boot=lambda: "b1", clock=lambda: next(clock))
    ports = {p.name: p for p in second()}
    assert ports["mlx5_0 port 1"].window_s == 3600.0
    assert ports["mlx5_0 port 1"].delta("symbol_error") == 500
    assert oct(os.stat(tmp_path / "ib-n1.json").st_mode & 0o777) == "0o600"


def test_root_names_the_node_with_percent_n(tmp_path):
    gather = ib.LinkGatherer(str(tmp_path / "ib-%n"), str(tmp_path), "n7", boot=lambda: "b")
    assert gather.root == str(tmp_path / "ib-n7")


MLX5_LINES = os.path.join(FIXTURES, "kmsg", "mlx5-events.log")


def test_mlx5_lines_go_with_the_rdma_device_whose_pci_function_they_name(tmp_path):
    root = ibtree.lay(str(tmp_path / "sys"))
    gather = ib.LinkGatherer(root, str(tmp_path), "n1", boot=lambda: "b", clock=lambda: 1000.0, kmsg=MLX5_LINES)
    ports = {p.device: p for p in gather()}
    assert {rule for rule, _ in ports["mlx5_0"].events} == {"ib-power", "ib-access-reg"}
    assert {rule for rule, _ in ports["mlx5_1"].events} == {"ib-access-reg"}
    # The High Temperature lines name no adapter: no device's (they used to go with every port).
    assert all(p.events == () for d, p in ports.items() if d not in ("mlx5_0", "mlx5_1"))


def test_an_overheating_module_of_an_adapter_that_is_no_rdma_device_is_no_ports(tmp_path):
    """The node's Ethernet-only ConnectX (0000:41:00.1 of the captured boot log) overheats: its
    line, as the kernel prints it, names that function, which no RDMA device here has."""
    root = ibtree.lay(str(tmp_path / "sys"))
    log = tmp_path / "kmsg.log"
    log.write_text("<3>[ 8812.104421] mlx5_core 0000:41:00.1: mlx5_port_module_event:1131:(pid 0): "
                   "Port module event[error]: module 1, Cable error, High Temperature\n")
    gather = ib.LinkGatherer(root, str(tmp_path), "n1", boot=lambda: "b", clock=lambda: 1000.0, kmsg=str(log))
    assert all(p.events == () for p in gather())
    log.write_text(log.read_text().replace("0000:41:00.1", "0000:ba:00.0"))  # mlx5_7's own function
    gather = ib.LinkGatherer(root, str(tmp_path / "s2"), "n1", boot=lambda: "b", clock=lambda: 1000.0, kmsg=str(log))
    assert {p.device for p in gather() if p.events} == {"mlx5_7"}


def test_an_mlx5_line_counts_for_an_hour_after_we_first_saw_it():
    lines = [("ib-power", "00000000:5C:00.0", 12.5, 7, "Detected insufficient power on the PCIe slot (27W).")]
    events, seen = ib.fresh_events(lines, None, 1000.0, "b")
    assert events == [("ib-power", "00000000:5C:00.0", "Detected insufficient power on the PCIe slot (27W).")]
    later, seen = ib.fresh_events(lines, {"boot": "b", "events": seen}, 1000.0 + 3599, "b")
    assert len(later) == 1
    gone, seen = ib.fresh_events(lines, {"boot": "b", "events": seen}, 1000.0 + 3601, "b")
    assert gone == [] and seen == {"7:Detected insufficient power on the PCIe slot (27W).": 1000.0}
    # The line is still in the ring buffer: an hour later it is the same old line, not a new one.
    still, _ = ib.fresh_events(lines, {"boot": "b", "events": seen}, 1000.0 + 7300, "b")
    assert still == []
    again, _ = ib.fresh_events(lines, {"boot": "b", "events": {}}, 1000.0 + 3700, "b2")
    assert len(again) == 1  # after a reboot: a new line


def test_an_unreadable_kernel_log_adds_no_events(tmp_path):
    gather = ib.LinkGatherer(H100_SYS, str(tmp_path), "n1", boot=lambda: "b", kmsg=str(tmp_path / "no-kmsg"))
    assert all(p.events == () for p in gather())


def test_an_mlx5_line_past_its_hour_does_not_come_back_at_the_next_runs(tmp_path):
    """Each run reads the whole ring buffer: a line forgotten after its hour would drain again."""
    clock = [1000.0]
    gather = ib.LinkGatherer(ibtree.lay(str(tmp_path / "sys")), str(tmp_path), "n1", boot=lambda: "b", clock=lambda: clock[0],
                             kmsg=MLX5_LINES)
    assert any(p.events for p in gather())
    counted = []
    for hours in (1.1, 1.2, 2.5, 5.0):
        clock[0] = 1000.0 + hours * 3600
        counted.append(any(p.events for p in gather()))
    assert counted == [False, False, False, False]


def test_a_memory_that_makes_no_sense_is_a_fresh_baseline_not_a_failed_gather(tmp_path):
    """Our own state file, edited or torn: never a crashed gather (the engine would drain on it)."""
    memory = tmp_path / "ib-n1.json"
    for garbage in ({"boot": "b", "at": "noon"}, {"boot": "b", "at": 1, "ports": {"mlx5_0:1": {"flaps": 3}}},
                    {"boot": "b", "at": 1, "ports": {"mlx5_0:1": {"counters": {"symbol_error": "x"}}}},
                    {"boot": "b", "at": 1, "ports": {"mlx5_0:1": {"down_since": "x"}}},
                    {"boot": "b", "at": 1, "ports": {}, "events": {"7:x": "y"}}):
        memory.write_text(json.dumps(garbage))
        gather = ib.LinkGatherer(H100_SYS, str(tmp_path), "n1", boot=lambda: "b", clock=lambda: 5000.0,
                                 kmsg=MLX5_LINES)
        ports = gather()
        assert ports and all(p.window_s == 0 and p.deltas == () for p in ports), garbage
        assert json.loads(memory.read_text())["at"] == 5000.0  # a clean memory for the next run


def test_a_port_gone_between_the_listing_and_the_read_is_not_read_as_a_port_down(tmp_path):
    root = tmp_path / "sys"
    shutil.copytree(H100_SYS, root)
    gone = root / "mlx5_1" / "ports" / "1"
    shutil.rmtree(gone)
    os.symlink(str(tmp_path / "nothing"), gone)  # listed, then nothing there to read
    names = [f"{p['device']}:{p['port']}" for p in ib.read_ports(str(root))]
    assert "mlx5_1:1" not in names and "mlx5_0:1" in names


def test_a_port_whose_state_cannot_be_read_neither_starts_nor_ends_a_drop():
    _, m = ib.advance(raw(), None, 0.0, "b")
    for t in (10.0, 40.0):
        ports, m = ib.advance(raw(state="", phys=""), m, t, "b")
        assert ports[0].down_s == 0.0
    ports, m = ib.advance(raw(), m, 50.0, "b")
    assert ports[0].flaps == ()  # 40 s unreadable is no 40 s drop
    _, m = ib.advance(raw(state="DOWN", phys="Polling"), m, 60.0, "b")
    _, m = ib.advance(raw(state="", phys=""), m, 70.0, "b")
    ports, m = ib.advance(raw(), m, 90.0, "b")
    assert ports[0].flaps == (90.0,)  # the drop it was in, 30 s long, still counts


def gather_on(root: str, state: str, clock: list[float], boot: str = "b", **kw) -> ib.LinkGatherer:
    return ib.LinkGatherer(root, state, "n1", boot=lambda: boot, clock=lambda: clock[0], **kw)


def by_name(ports) -> dict[str, IbPort]:
    return {p.device: p for p in ports}


def test_an_ethernet_port_reads_its_own_signals_not_the_infiniband_counters(tmp_path):
    """The RoCE bond: mlx5's hw_counters (as captured) and its interface's carrier; an InfiniBand
    port: the PMA counters, no hw_counters (each read can cost a firmware command)."""
    root = ibtree.lay(str(tmp_path / "sys"), roce=2)
    raw = {p["device"]: p for p in ib.read_ports(root)}
    bond = raw["mlx5_bond_0"]
    assert bond["link_layer"] == "Ethernet" and bond["netdev"] == ibtree.BOND_IF
    assert bond["counters"]["carrier_down_count"] == 1 and bond["counters"]["local_ack_timeout_err"] == 0
    assert not set(bond["counters"]) & set(ib.COUNTERS)
    assert raw["mlx5_bond_1"]["netdev"] == "bond1" and raw["mlx5_bond_1"]["counters"]["carrier_down_count"] == 1
    assert set(raw["mlx5_0"]["counters"]) == set(ib.COUNTERS)


def test_a_roce_carrier_that_dropped_twice_between_two_up_readings_is_two_flaps(tmp_path):
    root = ibtree.lay(str(tmp_path / "sys"))
    clock = [1000.0]
    gather_on(root, str(tmp_path), clock)()
    netdev = os.path.join(str(tmp_path / "sys"), "devices", "pci0000:00", ibtree.PCI["mlx5_bond_0"], "net",
                          ibtree.BOND_IF)
    ibtree.carrier(netdev, downs=3)
    clock[0] = 1300.0
    assert by_name(gather_on(root, str(tmp_path), clock)())["mlx5_bond_0"].flaps == (1300.0, 1300.0)


def test_carrier_changes_alone_count_a_drop_and_its_return_as_one_flap():
    def roce(changes: int) -> list[dict]:
        return [{"device": "mlx5_bond_0", "port": 1, "state": "ACTIVE", "phys_state": "LinkUp", "rate_gbps": 200.0,
                 "link_layer": "Ethernet", "counters": {"carrier_changes": changes}}]
    _, m = ib.advance(roce(3), None, 0.0, "b")
    ports, _ = ib.advance(roce(7), m, 300.0, "b")
    assert ports[0].flaps == (300.0, 300.0)


def test_rates_span_the_rate_window_kept_across_runs_never_a_few_seconds():
    """+1 symbol error 3 s after the last run is growth over the 3 s since the first reading of the
    boot (a short window, said as such), then over at least the rate window once runs span it."""
    _, m = ib.advance(raw(symbols=0), None, 1000.0, "b")
    ports, m = ib.advance(raw(symbols=1), m, 1003.0, "b")
    assert (ports[0].window_s, ports[0].rate_window_s, ports[0].delta("symbol_error")) == (3.0, 600.0, 1)
    now, windows = 1003.0, []
    for _ in range(600):  # a watcher gathering every 5 s for 50 minutes
        now += 5.0
        ports, m = ib.advance(raw(symbols=1), m, now, "b")
        windows.append(ports[0].window_s)
    assert windows[-1] >= 600.0 and all(600.0 <= w <= 600.0 + 600.0 / 8 + 5.0 for w in windows[200:])
    assert len(m["ports"]["mlx5_0:1"]["readings"]) <= 10  # thinned: the memory stays small
    assert ports[0].delta("symbol_error") == 0  # the error is older than the window now


def test_a_counter_that_goes_down_was_cleared_and_grew_by_its_new_value():
    _, m = ib.advance(raw(symbols=60000), None, 0.0, "b")
    ports, m = ib.advance(raw(symbols=5000), m, 700.0, "b")  # perfquery -R, then 5,000 more
    assert ports[0].delta("symbol_error") == 5000


def test_a_saturated_counter_cannot_be_judged_and_is_said_once_per_boot(tmp_path):
    clock = [1000.0]
    first = by_name(gather_on(H100_SYS, str(tmp_path), clock)())
    assert first["mlx5_0"].unjudged == ("excessive_buffer_overrun_errors at 15, its maximum",)
    assert first["mlx5_1"].unjudged == ("excessive_buffer_overrun_errors at 15, its maximum",
                                        "link_downed at 255, its maximum")
    assert all(p.unjudged_new for p in first.values() if p.unjudged)
    assert first["mlx5_bond_0"].unjudged == ()  # a RoCE port's drops are its carrier's, which does not saturate
    clock[0] = 1300.0
    again = by_name(gather_on(H100_SYS, str(tmp_path), clock)())
    assert again["mlx5_1"].unjudged and not any(p.unjudged_new for p in again.values())
    clock[0] = 1600.0
    rebooted = by_name(gather_on(H100_SYS, str(tmp_path), clock, boot="b2")())
    assert rebooted["mlx5_1"].unjudged_new


def test_a_port_seen_since_boot_that_disappears_is_kept_as_gone(tmp_path):
    root = ibtree.lay(str(tmp_path / "sys"))
    clock = [1000.0]
    gather_on(root, str(tmp_path), clock)()
    shutil.rmtree(os.path.join(root, "mlx5_4"))  # the HCA fell off the bus: its device is unregistered
    clock[0] = 1030.0
    gone = by_name(gather_on(root, str(tmp_path), clock)())["mlx5_4"]
    assert (gone.present, gone.up, gone.link_layer) == (False, False, "InfiniBand")
    clock[0] = 1090.0
    assert by_name(gather_on(root, str(tmp_path), clock)())["mlx5_4"].down_s == 60.0
    assert "mlx5_4" not in by_name(gather_on(root, str(tmp_path), clock, boot="b2")())  # a new boot: not seen


def einval_file() -> str:
    """A sysfs attribute the kernel refuses to read with EINVAL (the loopback's link speed)."""
    import pytest

    path = "/sys/class/net/lo/speed"
    try:
        with open(path) as fh:
            fh.read()
    except OSError as exc:
        if exc.errno == 22:
            return path
    pytest.skip(f"{path} does not refuse reads with EINVAL here")


def test_a_counter_the_kernel_refuses_is_not_read_again_on_this_boot(tmp_path):
    refused = einval_file()
    root = ibtree.lay(str(tmp_path / "sys"))
    counter = ibtree.port_file(root, "mlx5_0", "counters/symbol_error")
    os.remove(counter)
    os.symlink(refused, counter)
    clock = [1000.0]
    first = by_name(gather_on(root, str(tmp_path), clock)())["mlx5_0"]
    assert "symbol_error" not in dict(first.counters)
    assert "symbol_error refused by the kernel" in first.unjudged and first.unjudged_new
    os.remove(counter)
    ibtree.write(counter, "5")  # readable now: had it been read, 5 would show
    clock[0] = 1300.0
    second = by_name(gather_on(root, str(tmp_path), clock)())["mlx5_0"]
    assert "symbol_error" not in dict(second.counters) and not second.unjudged_new
    rebooted = by_name(gather_on(root, str(tmp_path), clock, boot="b2")())["mlx5_0"]
    assert dict(rebooted.counters)["symbol_error"] == 5


def test_a_memory_that_cannot_be_written_is_said_with_its_error(tmp_path):
    state = tmp_path / "state"
    state.write_text("")  # the state dir's path is a file: no memory can be written under it
    ports = gather_on(H100_SYS, str(state), [1000.0])()
    assert len(ports) == 9
    assert ports.memory_error == f"{state / 'ib-n1.json'}: File exists"
    assert gather_on(H100_SYS, str(tmp_path), [1000.0])().memory_error == ""
