"""Kernel log XID parsing: captured dmesg and /dev/kmsg output, following a growing log."""

from __future__ import annotations

import contextlib
import os
import threading
import time

import pytest
from paths import FIXTURES as TEST_FIXTURES

from slurm_hooks.errors import ProbeError
from slurm_hooks.models import XidEvent
from slurm_hooks.probes import kmsg

FIXTURES = os.path.join(TEST_FIXTURES, "kmsg")
DMESG_T = os.path.join(FIXTURES, "dmesg-with-xid-119.log")
DEV_KMSG = os.path.join(FIXTURES, "dev-kmsg-nvswitch.log")

XID79_RECORD = ("3,4123,3757433200,-;NVRM: Xid (PCI:0000:9b:00): 79, pid='<unknown>', name=<unknown>, "
                "GPU has fallen off the bus.")


def test_every_xid_in_the_dmesg_T_capture_is_found():
    events = kmsg.read_xids(DMESG_T)
    assert [e.code for e in events] == [119] * 5
    assert {e.pci_bus_id for e in events} == {"00000000:9B:00.0"}
    assert {e.source for e in events} == {"kmsg"}
    assert events[0].message.startswith("pid=2024380, name=nvidia-smi, Timeout after 6s of waiting for RPC")
    assert events[-1].message.startswith("pid=1240590, name=gpud,")


def test_dmesg_T_lines_carry_distinct_wall_clock_times():
    ts = [e.ts for e in kmsg.read_xids(DMESG_T)]
    assert ts == sorted(ts) and len(set(ts)) == 5
    assert ts[1] - ts[0] == 6.0
    assert ts[0] == time.mktime((2025, 2, 23, 16, 24, 18, 0, 0, -1))


def test_dmesg_T_events_have_distinct_keys():
    assert len({e.key for e in kmsg.read_xids(DMESG_T)}) == 5


def test_nvswitch_kmsg_capture_without_xids_gives_none():
    assert kmsg.read_xids(DEV_KMSG) == []


def test_kmsg_record_gives_seq_and_seconds_since_boot():
    event = kmsg.parse_line(XID79_RECORD)
    assert event == XidEvent(code=79, pci_bus_id="00000000:9B:00.0", ts=3757.4332,
                             message="pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
                             source="kmsg", seq=4123)


def test_kmsg_record_continuation_lines_are_ignored():
    event = kmsg.parse_line(XID79_RECORD + "\n SUBSYSTEM=pci\n DEVICE=+pci:0000:9b:00.0\n")
    assert event.code == 79 and event.message.endswith("bus.")


def test_kmsg_record_with_caller_field():
    event = kmsg.parse_line("4,881,9000000,-,caller=T42;NVRM: Xid (PCI:0000:18:00): 48, pid=7, name=python, DBE")
    assert (event.code, event.seq, event.ts, event.pci_bus_id) == (48, 881, 9.0, "00000000:18:00.0")


def test_plain_dmesg_line_gives_seconds_since_boot():
    event = kmsg.parse_line("[ 1234.567890] NVRM: Xid (PCI:0000:3b:00): 13, pid=99, name=python, Graphics Exception")
    assert (event.code, event.ts, event.seq) == (13, 1234.56789, None)


def test_syslog_line_without_a_time_still_parses():
    event = kmsg.parse_line("Feb 23 16:24:18 gpu7 kernel: NVRM: Xid (PCI:0000:9b:00): 94, Contained: SM (0x1)")
    assert (event.code, event.ts, event.message) == (94, None, "Contained: SM (0x1)")


def test_older_driver_format_without_pci_prefix():
    event = kmsg.parse_line("[  88.1] NVRM: Xid (0000:03:00): 31, Ch 00000010, engmask 00000101")
    assert (event.code, event.pci_bus_id) == (31, "00000000:03:00.0")


def test_nvswitch_sxid_is_not_a_gpu_xid():
    line = "6,5000,1000,-;nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 10 egress non-posted PRIV error"
    assert kmsg.parse_line(line) is None


@pytest.mark.parametrize("line", [
    "",
    "6,3964,206764307,-;nvidia-nvswitch2: open (major=510)",
    "[Sun Feb 23 16:24:18 2025] NVRM: GPU at PCI:0000:9b:00: GPU-509665ad-b600-ac93-3616-d754b23d636d",
    "[Sun Feb 23 16:24:36 2025] NVRM: Rate limiting GSP RPC error prints for GPU at PCI:0000:9b:00",
])
def test_lines_without_an_xid_give_none(line):
    assert kmsg.parse_line(line) is None


@pytest.mark.parametrize("raw, nvml", [
    ("0000:9b:00", "00000000:9B:00.0"),
    ("00000000:9B:00.0", "00000000:9B:00.0"),
    ("0000:9B:00.1", "00000000:9B:00.1"),
    ("18:00", "00000000:18:00.0"),
    (" 0001:3a:1f.0 ", "00000001:3A:1F.0"),
])
def test_pci_bus_ids_are_normalised_to_nvml_form(raw, nvml):
    assert kmsg.normalize_pci(raw) == nvml


def test_assign_gpus_by_pci_bus_id_either_form():
    events = kmsg.read_xids(DMESG_T) + [kmsg.parse_line(XID79_RECORD.replace("9b:00", "18:00"))]
    assigned = kmsg.assign_gpus(events, {"0000:9b:00.0": (4, "GPU-four"), "00000000:3B:00.0": (1, "GPU-one")})
    assert [(e.gpu, e.uuid) for e in assigned] == [(4, "GPU-four")] * 5 + [(None, "")]
    assert assigned[0].message == events[0].message
    assert [e.key for e in assigned] == [e.key for e in events]  # the GPU is looked up, the key is the line's


def test_assign_gpus_keeps_events_without_a_bus_id():
    event = XidEvent(code=79, source="kmsg", seq=1)
    assert kmsg.assign_gpus([event], {"00000000:9B:00.0": (4, "GPU-four")}) == [event]


def test_read_xids_stops_at_max_records(tmp_path):
    log = tmp_path / "kmsg.log"
    log.write_text("\n".join(XID79_RECORD.replace("4123,3757433200", f"{i},{3757433200 + i * 5_000_000}")
                              for i in range(10)) + "\n")
    assert [e.seq for e in kmsg.read_xids(str(log), max_records=3)] == [0, 1, 2]


def test_missing_path_raises_probe_error_with_one_line(tmp_path):
    missing = str(tmp_path / "no-such-kmsg")
    with pytest.raises(ProbeError, match="cannot read kernel log .*no-such-kmsg: No such file") as err:
        kmsg.read_xids(missing)
    assert "\n" not in str(err.value)
    with pytest.raises(ProbeError):
        kmsg.follow(missing, threading.Event(), lambda e: None)


def _wait_for(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def _follow_in_thread(path: str, events: list):
    stop = threading.Event()
    thread = threading.Thread(target=kmsg.follow, args=(path, stop, events.append, 0.02), daemon=True)
    thread.start()
    return stop, thread


@contextlib.contextmanager
def _following(log, settle: float):
    """kmsg.follow on ``log`` (its start read: ``settle`` s) for as long as the block runs; yields
    the events it reports and its thread, stopped and joined once the block is done."""
    events: list[XidEvent] = []
    stop, thread = _follow_in_thread(str(log), events)
    try:
        time.sleep(settle)
        yield events, thread
    finally:
        stop.set()
        thread.join(5)


def _append(log, data: str | bytes) -> None:
    with open(log, "ab") as fh:
        fh.write(data.encode() if isinstance(data, str) else data)


def test_follow_picks_up_an_xid_appended_to_a_file_and_not_older_ones(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text(XID79_RECORD + "\n")
    with _following(log, settle=0.2) as (events, thread):
        _append(log, "6,4124,3757500000,-;eth0: link becomes ready\n"
                     "3,4125,3757600000,-;NVRM: Xid (PCI:0000:9b:00): 48, pid=7, name=python, DBE\n")
        assert _wait_for(lambda: len(events) == 1)
    assert not thread.is_alive()
    assert (events[0].code, events[0].seq) == (48, 4125)


def test_follow_waits_for_the_end_of_a_partly_written_line(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text("")
    with _following(log, settle=0.1) as (events, _):
        _append(log, "3,7,1000000,-;NVRM: Xid (PCI:0000:9b:00): 4")
        time.sleep(0.2)
        assert events == []
        _append(log, "8, pid=7, name=python, DBE\n")
        assert _wait_for(lambda: len(events) == 1)
    assert events[0].code == 48


def _dev_kmsg_readable() -> bool:
    try:
        os.close(os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _dev_kmsg_readable(), reason="/dev/kmsg not readable here")
def test_real_dev_kmsg_reads_without_error_and_follow_stops():
    assert all(isinstance(e, XidEvent) for e in kmsg.read_xids("/dev/kmsg"))
    stop, thread = _follow_in_thread("/dev/kmsg", [])
    time.sleep(0.1)
    stop.set()
    thread.join(5)
    assert not thread.is_alive()


def test_events_read_from_the_kernel_carry_the_boot_id_in_their_key():
    from slurm_hooks.models import XidEvent

    a = XidEvent(79, gpu=3, ts=41.0, source="kmsg", seq=1234, boot="boot-a")
    b = XidEvent(79, gpu=3, ts=41.0, source="kmsg", seq=1234, boot="boot-b")
    assert a.key != b.key  # same record number and time, another boot: another event
    assert a.key == XidEvent(79, gpu=3, ts=41.0, source="kmsg", seq=1234, boot="boot-a").key


MIG_XID_RECORD = ("4,5120,812345678,-;NVRM: Xid (PCI:0000:01:00 GPU-I:05 GPU-CI:02): 109, pid=4242, "
                  "name=python3, Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x2c014")


def test_mig_xid_names_the_parent_gpu_and_keeps_the_instance_in_the_message():
    event = kmsg.parse_line(MIG_XID_RECORD)
    assert (event.code, event.pci_bus_id, event.seq) == (109, "00000000:01:00.0", 5120)
    assert event.message == "GPU-I:05 GPU-CI:02: pid=4242, name=python3, Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x2c014"


@pytest.mark.parametrize("line, code", [
    ("[ 901.5] NVRM: Xid (PCI:0000:01:00 GPU-I:05 GPU-CI:02): 109, pid=4242, name=python3, Ch 00000008", 109),
    ("[Sun Feb 23 16:24:18 2025] NVRM: Xid (PCI:0000:9b:00 GPU-I:01): 31, pid=7, name=python, MMU Fault", 31),
    ("Feb 23 16:24:18 gpu7 kernel: NVRM: Xid (PCI:0000:9b:00 GPU-I:13 GPU-CI:00): 43, pid=7, name=x, Ch 00000008", 43),
])
def test_mig_xids_in_every_log_format(line, code):
    event = kmsg.parse_line(line)
    assert event is not None and event.code == code


def test_mig_xid_read_from_a_log_file(tmp_path):
    log = tmp_path / "kmsg.log"
    log.write_text(XID79_RECORD + "\n" + MIG_XID_RECORD + "\n")
    assert [(e.code, e.pci_bus_id) for e in kmsg.read_xids(str(log))] == [
        (79, "00000000:9B:00.0"), (109, "00000000:01:00.0")]


def test_bytes_that_are_not_utf8_never_stop_the_reader(tmp_path):
    log = tmp_path / "kmsg.log"
    log.write_bytes(b"6,1,10,-;usb 1-1: bad \xff\xfe descriptor\n"
                    b"3,2,20,-;NVRM: Xid (PCI:0000:9b:00): 13, pid=7, name=\xffbad\x80name, Graphics Exception\n"
                    + XID79_RECORD.encode() + b"\n")
    events = kmsg.read_xids(str(log))
    assert [e.code for e in events] == [13, 79]
    assert events[0].message == "pid=7, name=\ufffdbad\ufffdname, Graphics Exception"


def test_follow_survives_bytes_that_are_not_utf8(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text("")
    with _following(log, settle=0.1) as (events, thread):
        _append(log, b"3,9,1000000,-;NVRM: Xid (PCI:0000:9b:00): 48, pid=7, name=\xff\xfe, DBE\n")
        assert _wait_for(lambda: len(events) == 1)
    assert thread.is_alive() is False and events[0].code == 48


def test_a_boot_id_file_with_garbage_bytes_does_not_raise(tmp_path):
    path = tmp_path / "boot_id"
    path.write_bytes(b"\xffabc\n")
    assert kmsg.boot_id(str(path)) == "\ufffdabc"


def test_mig_instance_of_a_real_contained_error_line_is_read_and_the_whole_gpus_is_none():
    # NVIDIA's A100 GPU memory error management guide (see tests/fixtures/README.md).
    with open(os.path.join(TEST_FIXTURES, "slurm", "kmsg-mig-xid94.log"), encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    one, whole = (kmsg.parse_line(line) for line in lines)
    assert (one.code, one.instance, one.pci_bus_id) == (94, 5, "00000000:01:00.0")
    assert (whole.code, whole.instance) == (94, None)


# --- mlx5 (ConnectX) kernel lines ---------------------------------------------------------------

MLX5 = os.path.join(FIXTURES, "mlx5-events.log")


def test_mlx5_capture_finds_power_module_temperature_and_access_reg_but_no_benign_line():
    events = kmsg.read_mlx5(MLX5)
    assert [rule for rule, *_ in events] == ["ib-power"] + ["ib-module-temperature"] * 3 + ["ib-access-reg"] * 3
    rule, pci, ts, seq, message = events[0]
    assert pci == "00000000:5C:00.0" and seq is None
    assert ts == time.mktime((2024, 12, 1, 14, 54, 40, 0, 0, -1))
    assert message.endswith("Detected insufficient power on the PCIe slot (27W).")
    assert events[1][1] == ""  # the module line names no PCI device
    assert {e[1] for e in events[-3:]} == {"00000000:D2:00.0", "00000000:5C:00.0"}


def test_a_cable_unplugged_module_event_is_not_high_temperature():
    line = "<6>[    2.962781] mlx5_core 0000:41:00.1: Port module event: module 1, Cable unplugged"
    assert kmsg.parse_mlx5_line(line) is None


def test_mlx5_dev_kmsg_record_carries_its_sequence_and_boot_time():
    record = ("3,5120,1234567890,-;mlx5_core 0000:d2:00.0: mlx5_cmd_out_err:838:(pid 268269): "
              "ACCESS_REG(0x805) op_mod(0x1) failed, status bad resource(0x5), syndrome (0x305684), err(-22)")
    assert kmsg.parse_mlx5_line(record)[:4] == ("ib-access-reg", "00000000:D2:00.0", 1234.56789, 5120)


def test_xid_lines_are_no_mlx5_events_and_mlx5_lines_no_xids():
    assert kmsg.parse_mlx5_line(XID79_RECORD) is None
    assert kmsg.read_xids(MLX5) == []
