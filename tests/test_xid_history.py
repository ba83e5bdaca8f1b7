"""The per-node XID history: escalation counts, "act once per event", a file that survives abuse."""

from __future__ import annotations

import json
import os
import stat

import pytest

from slurm_hooks import xid_history
from slurm_hooks.errors import PermanentError
from slurm_hooks.models import XidEvent
from slurm_hooks.xid_history import XidHistory

NOW = 1_750_000_000.0
DAY = 86400.0


def ev(code: int, seq: int, gpu: int | None = 3) -> XidEvent:
    return XidEvent(code=code, gpu=gpu, source="kmsg", seq=seq)


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "state" / "xid-history.json")


def test_missing_file_means_no_history(path):
    hist = XidHistory(path)
    assert hist.occurrences(NOW, DAY) == {}
    assert not hist.seen("kmsg:1:3:79")
    assert not os.path.exists(path)


def test_record_returns_only_events_not_recorded_before(path):
    hist = XidHistory(path)
    assert hist.record([ev(119, 1), ev(119, 2)], now=NOW - 100) == [ev(119, 1), ev(119, 2)]
    assert hist.record([ev(119, 2), ev(119, 3), ev(119, 3)], now=NOW) == [ev(119, 3)]
    assert hist.occurrences(NOW, DAY) == {119: (NOW - 100, NOW - 100, NOW)}


def test_occurrences_group_by_code_and_respect_the_window(path):
    hist = XidHistory(path)
    hist.record([ev(48, 1)], now=NOW - 2 * DAY)
    hist.record([ev(48, 2), ev(79, 3)], now=NOW - 3600)
    hist.record([ev(13, 4)], now=NOW)
    assert hist.occurrences(NOW, DAY) == {13: (NOW,), 48: (NOW - 3600,), 79: (NOW - 3600,)}
    assert hist.occurrences(NOW, 3 * DAY)[48] == (NOW - 2 * DAY, NOW - 3600)


def test_occurrences_for_one_gpu(path):
    hist = XidHistory(path)
    hist.record([ev(119, 1, gpu=3), ev(119, 2, gpu=5), ev(119, 3, gpu=None)], now=NOW)
    assert hist.occurrences(NOW, DAY, gpu=3) == {119: (NOW,)}
    assert hist.occurrences(NOW, DAY) == {119: (NOW, NOW, NOW)}


def test_occurrences_can_exclude_the_events_being_checked(path):
    hist = XidHistory(path)
    current = [ev(119, 7)]
    hist.record([ev(119, 6)] + current, now=NOW)
    assert hist.occurrences(NOW, DAY, exclude=[e.key for e in current]) == {119: (NOW,)}


def test_history_persists_across_instances(path):
    XidHistory(path).record([ev(79, 1)], now=NOW)
    XidHistory(path).mark_seen([ev(79, 1).key], now=NOW)
    again = XidHistory(path)
    assert again.occurrences(NOW, DAY) == {79: (NOW,)}
    assert again.seen(ev(79, 1).key)
    assert not again.seen(ev(79, 2).key)


def test_entries_older_than_seven_days_are_pruned(path):
    hist = XidHistory(path)
    hist.record([ev(48, 1)], now=NOW - 8 * DAY)
    hist.mark_seen(["old"], now=NOW - 8 * DAY)
    hist.record([ev(48, 2)], now=NOW)
    assert hist.occurrences(NOW, 30 * DAY) == {48: (NOW,)}
    assert not hist.seen("old")


def test_size_is_capped_keeping_the_newest(path, monkeypatch):
    monkeypatch.setattr(xid_history, "MAX_EVENTS", 3)
    monkeypatch.setattr(xid_history, "MAX_SEEN", 2)
    hist = XidHistory(path)
    for seq in range(6):
        hist.record([ev(119, seq)], now=NOW - 60 + seq)
        hist.mark_seen([f"k{seq}"], now=NOW - 60 + seq)
    assert hist.occurrences(NOW, DAY) == {119: (NOW - 57, NOW - 56, NOW - 55)}
    assert [hist.seen(f"k{i}") for i in range(6)] == [False] * 4 + [True] * 2


def test_file_is_private_json(path):
    XidHistory(path).record([ev(79, 1)], now=NOW)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    with open(path) as fh:
        data = json.load(fh)
    assert data["events"] == [{"key": "kmsg:1:3:79", "code": 79, "gpu": 3, "t": NOW}]


@pytest.mark.parametrize("garbage", ["{not json", "[]", '{"events": [{"code": "x"}], "seen": {}}', ""])
def test_corrupt_file_is_moved_aside_and_started_fresh(path, garbage):
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as fh:
        fh.write(garbage)
    hist = XidHistory(path)
    assert hist.occurrences(NOW, DAY) == {}
    with open(path + ".corrupt") as fh:
        assert fh.read() == garbage
    hist.record([ev(79, 1)], now=NOW)
    assert hist.occurrences(NOW, DAY) == {79: (NOW,)}


def test_history_file_with_bytes_that_are_not_utf8_is_set_aside_not_raised(path):
    os.makedirs(os.path.dirname(path))
    with open(path, "wb") as fh:
        fh.write(b'{"version":1,"events":[],"seen":{"\xff\xfe":1.0},"acked":{}')
    hist = XidHistory(path)
    assert hist.occurrences(NOW, DAY) == {}
    hist.record([ev(79, 1)], now=NOW)
    assert hist.occurrences(NOW, DAY) == {79: (NOW,)}


def test_corrupt_file_found_while_recording_is_moved_aside(path):
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as fh:
        fh.write("\x00\x00")
    XidHistory(path).record([ev(48, 1)], now=NOW)
    assert os.path.exists(path + ".corrupt")
    assert XidHistory(path).occurrences(NOW, DAY) == {48: (NOW,)}


def test_unwritable_location_raises_a_one_line_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    hist = XidHistory(str(blocker / "xid-history.json"))
    with pytest.raises(PermanentError, match="cannot write XID history"):
        hist.record([ev(79, 1)], now=NOW)


def test_recording_only_known_events_does_not_rewrite_the_file(tmp_path):
    from slurm_hooks.models import XidEvent
    from slurm_hooks.xid_history import XidHistory

    h = XidHistory(str(tmp_path / "h.json"))
    event = XidEvent(79, gpu=3, ts=41.0, source="kmsg", seq=7)
    assert h.record([event], now=1000.0) == [event]
    before = (tmp_path / "h.json").stat().st_mtime_ns
    assert h.record([event], now=2000.0) == []
    assert (tmp_path / "h.json").stat().st_mtime_ns == before
