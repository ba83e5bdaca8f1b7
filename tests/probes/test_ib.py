"""The InfiniBand gather step on captured /sys trees and ibstat output (tests/fixtures/ib)."""

from __future__ import annotations

import json
import os
import shutil

from paths import FIXTURES

from slurm_hooks.probes import ib

IB = os.path.join(FIXTURES, "ib")
H100_SYS = os.path.join(IB, "sys-class-infiniband-h100")


def read(name: str) -> str:
    with open(os.path.join(IB, name)) as fh:
        return fh.read()


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


def test_ibstat_all_active_gives_the_ports_and_rates():
    ports = ib.parse_ibstat(read("ibstat.47.0.h100.all.active.0"))
    assert len(ports) == 12
    assert all(p["state"] == "ACTIVE" and p["phys_state"] == "LinkUp" for p in ports)
    assert sorted({p["rate_gbps"] for p in ports}) == [100.0, 400.0]


def test_ibstat_some_down_names_the_disabled_ports():
    ports = ib.parse_ibstat(read("ibstat.47.0.h100.some.down.0"))
    down = [(p["device"], p["phys_state"]) for p in ports if p["state"] != "ACTIVE"]
    assert len(down) == 3 and all(phys == "Disabled" for _, phys in down)
    assert ("mlx5_2", "Disabled") in down


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


def test_a_second_reading_within_a_second_keeps_the_window_of_the_first():
    _, memory = ib.advance(raw(symbols=0), None, 1000.0, "b")
    ports, memory = ib.advance(raw(symbols=600), memory, 1060.0, "b")
    again, memory2 = ib.advance(raw(symbols=600), memory, 1060.4, "b")
    assert again[0].delta("symbol_error") == 600 and again[0].window_s == 60.0
    later, _ = ib.advance(raw(symbols=660), memory2, 1120.0, "b")
    assert later[0].delta("symbol_error") == 60 and later[0].window_s == 60.0


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


def test_mlx5_lines_go_with_their_adapter_and_lines_naming_none_with_every_port(tmp_path):
    root = tmp_path / "sys"
    shutil.copytree(H100_SYS, root)
    os.symlink("../../devices/pci0000:00/0000:5c:00.0", root / "mlx5_0" / "device")
    os.symlink("../../devices/pci0000:00/0000:d2:00.0", root / "mlx5_1" / "device")
    gather = ib.LinkGatherer(str(root), str(tmp_path), "n1", boot=lambda: "b", clock=lambda: 1000.0,
                             kmsg=MLX5_LINES)
    ports = {p.device: p for p in gather()}
    assert {rule for rule, _ in ports["mlx5_0"].events} == {"ib-power", "ib-module-temperature", "ib-access-reg"}
    assert {rule for rule, _ in ports["mlx5_1"].events} == {"ib-module-temperature", "ib-access-reg"}
    assert {rule for rule, _ in ports["mlx5_4"].events} == {"ib-module-temperature"}  # the lines naming no adapter


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
    gather = ib.LinkGatherer(H100_SYS, str(tmp_path), "n1", boot=lambda: "b", clock=lambda: clock[0],
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
