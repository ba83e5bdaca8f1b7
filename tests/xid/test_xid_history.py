"""The per-node XID history: escalation counts, "act once per event", a file that survives abuse."""

from __future__ import annotations

import json
import os
import stat

import pytest
from fakes import FakeNvml
from fakes.config import nvml_wiring
from fakes.slurm import FakeSlurm

from slurm_hooks.errors import PermanentError
from slurm_hooks.hooks import healthcheck
from slurm_hooks.models import XidEvent
from slurm_hooks.xid import history as xid_history
from slurm_hooks.xid.history import XidHistory

NOW = 1_750_000_000.0
DAY = 86400.0


def ev(code: int, seq: int, gpu: int | None = 3) -> XidEvent:
    return XidEvent(code=code, gpu=gpu, source="kmsg", seq=seq)


def occurrences(hist: XidHistory, now: float, window_s: float, gpu: str | None = None) -> dict:
    """Code -> times recorded in the window, oldest first (what escalation counts)."""
    out: dict = {}
    for ident, code, t in hist.recorded().values():
        if now - window_s <= t <= now and (gpu is None or ident == gpu):
            out.setdefault(code, []).append(t)
    return {code: tuple(sorted(ts)) for code, ts in sorted(out.items())}


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "state" / "xid-history.json")


def test_missing_file_means_no_history(path):
    hist = XidHistory(path)
    assert occurrences(hist, NOW, DAY) == {}
    assert not hist.seen("kmsg:1:3:79")
    assert not os.path.exists(path)


def test_record_returns_only_events_not_recorded_before(path):
    hist = XidHistory(path)
    assert hist.record([ev(119, 1), ev(119, 2)], now=NOW - 100) == [ev(119, 1), ev(119, 2)]
    assert hist.record([ev(119, 2), ev(119, 3), ev(119, 3)], now=NOW) == [ev(119, 3)]
    assert occurrences(hist, NOW, DAY) == {119: (NOW - 100, NOW - 100, NOW)}


def test_occurrences_group_by_code_and_respect_the_window(path):
    hist = XidHistory(path)
    hist.record([ev(48, 1)], now=NOW - 2 * DAY)
    hist.record([ev(48, 2), ev(79, 3)], now=NOW - 3600)
    hist.record([ev(13, 4)], now=NOW)
    assert occurrences(hist, NOW, DAY) == {13: (NOW,), 48: (NOW - 3600,), 79: (NOW - 3600,)}
    assert occurrences(hist, NOW, 3 * DAY)[48] == (NOW - 2 * DAY, NOW - 3600)


def test_occurrences_for_one_gpu(path):
    hist = XidHistory(path)
    hist.record([ev(119, 1, gpu=3), ev(119, 2, gpu=5), ev(119, 3, gpu=None)], now=NOW)
    assert occurrences(hist, NOW, DAY, gpu="gpu3") == {119: (NOW,)}
    assert occurrences(hist, NOW, DAY) == {119: (NOW, NOW, NOW)}


def test_recorded_gives_each_event_with_its_gpu_and_when_it_was_recorded(path):
    hist = XidHistory(path)
    on_gpu = XidEvent(119, gpu=2, uuid="GPU-aaaa", source="kmsg", seq=6, ts=1.5, pci_bus_id="00000000:38:00.0")
    unmapped = XidEvent(79, source="kmsg", seq=7, ts=2.5, pci_bus_id="00000000:99:00.0")
    hist.record([on_gpu, unmapped], now=NOW)
    assert hist.recorded() == {on_gpu.key: ("GPU-aaaa", 119, NOW), unmapped.key: ("pci:00000000:99:00.0", 79, NOW)}


def test_a_version_1_file_keeps_its_acknowledgements_under_the_new_keys(path):
    """Version 1 kernel-log keys held the GPU index; an event acked before the upgrade stays acked."""
    os.makedirs(os.path.dirname(path))
    event = XidEvent(79, gpu=2, source="kmsg", seq=4123, ts=3757.4332, boot="b00t")
    with open(path, "w") as fh:
        json.dump({"version": 1, "events": [{"key": "kmsg:b00t:4123@3757.4332:2:79", "code": 79, "gpu": 2, "t": NOW}],
                   "seen": {"kmsg:b00t:4123@3757.4332:None:79": NOW, "sim:5:3:48": NOW},
                   "acked": {"kmsg:b00t:4123@3757.4332:2:79": NOW}}, fh)
    hist = XidHistory(path)
    assert event.key == "kmsg:b00t:4123@3757.4332:79"
    assert hist.acked() == {event.key} and hist.seen(event.key) and hist.seen("sim:5:3:48")
    assert hist.recorded() == {event.key: ("gpu2", 79, NOW)}


def test_history_persists_across_instances(path):
    XidHistory(path).record([ev(79, 1)], now=NOW)
    XidHistory(path).mark_seen([ev(79, 1).key], now=NOW)
    again = XidHistory(path)
    assert occurrences(again, NOW, DAY) == {79: (NOW,)}
    assert again.seen(ev(79, 1).key)
    assert not again.seen(ev(79, 2).key)


def test_entries_older_than_seven_days_are_pruned(path):
    hist = XidHistory(path)
    hist.record([ev(48, 1)], now=NOW - 8 * DAY)
    hist.mark_seen(["old"], now=NOW - 8 * DAY)
    hist.record([ev(48, 2)], now=NOW)
    assert occurrences(hist, NOW, 30 * DAY) == {48: (NOW,)}
    assert not hist.seen("old")


def test_size_is_capped_keeping_the_newest(path, monkeypatch):
    monkeypatch.setattr(xid_history, "MAX_EVENTS", 3)
    monkeypatch.setattr(xid_history, "MAX_SEEN", 2)
    hist = XidHistory(path)
    for seq in range(6):
        hist.record([ev(119, seq)], now=NOW - 60 + seq)
        hist.mark_seen([f"k{seq}"], now=NOW - 60 + seq)
    assert occurrences(hist, NOW, DAY) == {119: (NOW - 57, NOW - 56, NOW - 55)}
    assert [hist.seen(f"k{i}") for i in range(6)] == [False] * 4 + [True] * 2


def test_file_is_private_json(path):
    XidHistory(path).record([ev(79, 1)], now=NOW)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    with open(path) as fh:
        data = json.load(fh)
    assert data["events"] == [{"key": "kmsg:1:79", "code": 79, "gpu": 3, "id": "gpu3", "t": NOW}]


@pytest.mark.parametrize("garbage", ["{not json", "[]", '{"events": [{"code": "x"}], "seen": {}}', ""])
def test_corrupt_file_is_moved_aside_and_started_fresh(path, garbage):
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as fh:
        fh.write(garbage)
    hist = XidHistory(path)
    assert occurrences(hist, NOW, DAY) == {}
    with open(path + ".corrupt") as fh:
        assert fh.read() == garbage
    hist.record([ev(79, 1)], now=NOW)
    assert occurrences(hist, NOW, DAY) == {79: (NOW,)}


def test_history_file_with_bytes_that_are_not_utf8_is_set_aside_not_raised(path):
    os.makedirs(os.path.dirname(path))
    with open(path, "wb") as fh:
        fh.write(b'{"version":1,"events":[],"seen":{"\xff\xfe":1.0},"acked":{}')
    hist = XidHistory(path)
    assert occurrences(hist, NOW, DAY) == {}
    hist.record([ev(79, 1)], now=NOW)
    assert occurrences(hist, NOW, DAY) == {79: (NOW,)}


def test_corrupt_file_found_while_recording_is_moved_aside(path):
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as fh:
        fh.write("\x00\x00")
    XidHistory(path).record([ev(48, 1)], now=NOW)
    assert os.path.exists(path + ".corrupt")
    assert occurrences(XidHistory(path), NOW, DAY) == {48: (NOW,)}


def test_unwritable_location_raises_a_one_line_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    hist = XidHistory(str(blocker / "xid-history.json"))
    with pytest.raises(PermanentError, match="cannot write XID history"):
        hist.record([ev(79, 1)], now=NOW)


def test_recording_only_known_events_does_not_rewrite_the_file(tmp_path):
    from slurm_hooks.models import XidEvent
    from slurm_hooks.xid.history import XidHistory

    h = XidHistory(str(tmp_path / "h.json"))
    event = XidEvent(79, gpu=3, ts=41.0, source="kmsg", seq=7)
    assert h.record([event], now=1000.0) == [event]
    before = (tmp_path / "h.json").stat().st_mtime_ns
    assert h.record([event], now=2000.0) == []
    assert (tmp_path / "h.json").stat().st_mtime_ns == before


def test_a_loaded_history_answers_from_memory_and_saves_its_changes_once(path):
    XidHistory(path).record([ev(31, 1)], now=NOW)
    reads = []

    def opener(name, *args, **kwargs):
        reads.append(name)
        return open(name, *args, **kwargs)

    state = XidHistory(path, opener=opener).load()
    assert state.record([ev(31, 1), ev(79, 2)], now=NOW) == [ev(79, 2)]
    state.mark_seen([ev(79, 2).key], now=NOW)
    state.ack([ev(31, 1).key], now=NOW)
    assert state.seen(ev(79, 2).key) and state.acked() == {ev(31, 1).key}
    assert set(state.recorded()) == {ev(31, 1).key, ev(79, 2).key}
    assert not XidHistory(path).seen(ev(79, 2).key)  # nothing written yet
    written = os.stat(path).st_ino
    state.save()
    assert os.stat(path).st_ino != written  # one write...
    assert reads == [path]  # ...and the file, unchanged since it was read, is not read again
    again = XidHistory(path).load()
    assert again.seen(ev(79, 2).key) and again.acked() == {ev(31, 1).key}
    assert set(again.recorded()) == {ev(31, 1).key, ev(79, 2).key}
    written = os.stat(path).st_ino
    again.save()  # nothing changed: no write
    assert os.stat(path).st_ino == written


def test_saving_keeps_what_another_process_wrote_since_the_load(path):
    mine, theirs = XidHistory(path).load(), XidHistory(path).load()
    mine.record([ev(79, 1)], now=NOW)
    mine.mark_seen([ev(79, 1).key], now=NOW)
    theirs.record([ev(48, 2)], now=NOW)
    theirs.ack(["sim:5:3:48"], now=NOW)
    theirs.save()
    mine.save()
    merged = XidHistory(path).load()
    assert set(merged.recorded()) == {ev(79, 1).key, ev(48, 2).key}
    assert merged.seen(ev(79, 1).key) and merged.acked() == {"sim:5:3:48"}


def test_an_unreadable_history_loads_empty_and_says_why(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    state = XidHistory(str(blocker / "xid-history.json")).load()
    assert state.error and "cannot read XID history" in state.error
    assert state.recorded() == {} and not state.seen("k") and state.acked() == frozenset()
    state.mark_seen(["k"])
    with pytest.raises(PermanentError):
        state.save()


def kmsg_xid(seq: int, usec: int, code: int = 119, bus: str = "0000:48:00") -> str:
    return f"4,{seq},{usec},-;NVRM: Xid (PCI:{bus}): {code}, pid=2024, name=python, Timeout waiting for GSP\n"


def test_an_xid_after_a_reboot_is_not_hidden_by_an_acknowledged_one_from_the_previous_boot(tmp_path):
    slurm = FakeSlurm()
    slurm.add_node("n1", "IDLE")
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(kmsg_xid(1234, 41_000_000))  # boot 1: XID 119 on GPU 3 (PCI 48)
    w = nvml_wiring(tmp_path, slurm, FakeNvml.healthy(8), kmsg)
    healthcheck.run(w, follow="none")
    assert slurm.peek("n1").drained
    slurm.resume("n1")  # the admin reset the GPU and resumed the node
    healthcheck.run(w, follow="none")  # acknowledges the event
    assert not slurm.peek("n1").drained
    kmsg.write_text(kmsg_xid(1234, 39_500_000))  # boot 2: the same fault at driver load, same record number
    healthcheck.run(w, follow="none")
    assert slurm.peek("n1").drained


# --- repeat offenders ---------------------------------------------------------------------------


def remediations(ident: str, times: list[float], rung: str = "reset", result: str = "ok") -> list[dict]:
    return [{"rung": rung, "t": t, "gpus": [ident], "result": result} for t in times]


def test_fifth_remediation_of_one_gpu_in_7_days_goes_to_a_person_with_its_history():
    done = remediations("GPU-aaa", [NOW - 6 * DAY, NOW - 4 * DAY, NOW - 2 * DAY, NOW - DAY])
    told = xid_history.repeat_offender(done, ["GPU-aaa"], NOW)
    assert told.startswith("repeat offender: GPU-aaa would have its remediation 5 within 7 days (limit 5; before: "
                           "reset 2025-06-09")
    assert told.count("reset 2025-06-") == 4 and told.endswith("a person must look")


def test_fourth_remediation_or_an_old_one_or_another_gpu_goes_ahead():
    four = remediations("GPU-aaa", [NOW - 3 * DAY, NOW - 2 * DAY, NOW - DAY])
    assert xid_history.repeat_offender(four, ["GPU-aaa"], NOW) == ""
    old = remediations("GPU-aaa", [NOW - 9 * DAY, NOW - 3 * DAY, NOW - 2 * DAY, NOW - DAY])
    assert xid_history.repeat_offender(old, ["GPU-aaa"], NOW) == ""
    spread = remediations("GPU-aaa", [NOW - 3 * DAY, NOW - 2 * DAY]) + remediations("GPU-bbb", [NOW - DAY] * 2)
    assert xid_history.repeat_offender(spread, ["GPU-aaa"], NOW) == ""
    refused = remediations("GPU-aaa", [NOW - 4 * DAY, NOW - 3 * DAY, NOW - 2 * DAY]) + \
        remediations("GPU-aaa", [NOW - DAY], rung="reboot", result="refused")
    assert xid_history.repeat_offender(refused, ["GPU-aaa"], NOW) == ""  # a refused reboot mended nothing


def test_repair_plan_sends_the_fifth_remediation_in_7_days_to_replace(tmp_path):
    from fakes.config import repair_config, sim_node

    from slurm_hooks.models import Action, Finding, Report, Severity
    from slurm_hooks.remedy import repair
    from slurm_hooks.remedy.repair.state import Attempt, RepairState

    cfg = repair_config(tmp_path)
    _, w = sim_node(cfg, "IDLE")
    finding = Finding("row-remap", Severity.FAIL, Action.RESET, "row remapping pending", 3,
                      "row remap pending on GPU 3")
    report = Report("n1", healthcheck.Context.CHECK, (finding,), 0.0)
    state = RepairState.from_json({"attempts": remediations("gpu3", [NOW - 6 * DAY, NOW - 5 * DAY, NOW - 3 * DAY])})
    assert repair.plan(w, report, state, now=NOW).rung == "reset"
    state = state.with_attempt(Attempt.from_json(remediations("gpu3", [NOW - 2 * DAY], rung="reboot")[0]))
    p = repair.plan(w, report, state, now=NOW)
    assert p.rung == "replace"
    assert "repeat offender: gpu3 would have its remediation 5 within 7 days" in p.why
    assert "reboot 2025-06-13" in p.why


def recorded(*events: tuple[str, int, float]) -> dict:
    return {f"k{i}": e for i, e in enumerate(events)}


def test_xid_13_again_on_the_same_gpu_after_its_burst_is_hardware():
    v = xid_history.app_or_hardware(recorded(("GPU-a", 13, NOW - 600), ("GPU-a", 13, NOW - 60)), "GPU-a", 13, NOW)
    assert (v.bursts, v.hardware, v.application) == (2, True, False)


def test_xid_13_spread_across_gpus_is_the_application():
    v = xid_history.app_or_hardware(recorded(("GPU-a", 13, NOW - 600), ("GPU-b", 13, NOW - 590),
                                             ("GPU-c", 13, NOW - 580)), "GPU-a", 13, NOW)
    assert (v.hardware, v.application, v.others) == (False, True, ("GPU-b", "GPU-c"))


def test_one_xid_13_or_old_ones_or_another_code_tell_nothing():
    v = xid_history.app_or_hardware(recorded(("GPU-a", 13, NOW - 60)), "GPU-a", 13, NOW)
    assert not (v.hardware or v.application)
    v = xid_history.app_or_hardware(recorded(("GPU-a", 13, NOW - 2 * DAY), ("GPU-a", 13, NOW - 60),
                                             ("GPU-b", 79, NOW - 30), ("GPU-a", 31, NOW - 900)), "GPU-a", 13, NOW)
    assert not (v.hardware or v.application)


def test_bursts_split_where_the_gap_passes_the_window():
    assert xid_history.bursts([], 15.0) == 0
    assert xid_history.bursts([0, 10, 20, 30], 15.0) == 1  # each within 15 s of the one before
    assert xid_history.bursts([32, 0, 16], 15.0) == 3


def test_an_event_that_says_when_it_happened_is_recorded_at_that_time(tmp_path):
    from slurm_hooks.models import XidEvent

    h = xid_history.XidHistory(str(tmp_path / "xids.json"))
    dated = XidEvent(code=31, gpu=0, ts=5.0, source="kmsg", seq=1, boot="b", at=NOW - 250)
    undated = XidEvent(code=31, gpu=0, ts=6.0, source="kmsg", seq=2)
    ancient = XidEvent(code=31, gpu=0, ts=7.0, source="kmsg", seq=3, boot="b", at=NOW - 30 * DAY)
    h.record([dated, undated, ancient], now=NOW)
    assert sorted(t for _, _, t in h.recorded().values()) == [NOW - 250, NOW, NOW]
