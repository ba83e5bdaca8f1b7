"""The audit log: JSON lines from many writers at once, readable after a crash."""

from __future__ import annotations

import json
import multiprocessing
import os
import stat
from pathlib import Path

from slurm_hooks.observe.audit import AuditLog


def lines(path) -> list[str]:
    return Path(path).read_text().splitlines()


def test_each_record_is_one_json_line_with_ts_and_kind(tmp_path):
    log = AuditLog(str(tmp_path / "audit.jsonl"))
    first = log.write("alert", node="n1", gpu=3, check="xid", message="XID 79 (GPU has fallen off the bus)")
    second = log.write("action", node="n1", action="drain", result="ok")
    [a, b] = [json.loads(line) for line in lines(log.path)]
    assert a == first and b == second
    assert list(a)[:2] == ["ts", "kind"]
    assert (a["kind"], a["node"], a["gpu"], a["check"]) == ("alert", "n1", 3, "xid")
    assert isinstance(a["ts"], float) and a["ts"] <= b["ts"]
    assert list(log.read()) == [first, second]


def test_values_json_cannot_hold_are_written_as_text(tmp_path):
    log = AuditLog(str(tmp_path / "audit.jsonl"))
    log.write("action", where=Path("/var/lib/x"))
    [record] = log.read()
    assert record["where"] == "/var/lib/x"


def test_the_log_directory_is_created(tmp_path):
    log = AuditLog(str(tmp_path / "var" / "log" / "slurm-hooks" / "audit.jsonl"))
    log.write("alert", node="n1")
    assert len(lines(log.path)) == 1


def test_the_file_is_created_mode_0640(tmp_path):
    old = os.umask(0)
    try:
        AuditLog(str(tmp_path / "audit.jsonl")).write("alert")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "audit.jsonl").st_mode) == 0o640


def _write_many(args):
    path, proc, count = args
    log = AuditLog(path)
    payload = f"p{proc}-" + "x" * 3000  # bigger than a pipe buffer page: interleaving would show
    for i in range(count):
        log.write("alert", proc=proc, i=i, payload=payload)
    return proc


def test_eight_processes_writing_200_records_each_give_1600_whole_lines(tmp_path):
    path = str(tmp_path / "audit.jsonl")
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(8) as pool:
        pool.map(_write_many, [(path, proc, 200) for proc in range(8)])
    raw = lines(path)
    assert len(raw) == 1600
    records = [json.loads(line) for line in raw]  # raises on any interleaved line
    assert sorted((r["proc"], r["i"]) for r in records) == [(p, i) for p in range(8) for i in range(200)]
    assert all(r["payload"] == f"p{r['proc']}-" + "x" * 3000 for r in records)
    for proc in range(8):
        assert [r["i"] for r in records if r["proc"] == proc] == list(range(200))


def test_an_unwritable_path_prints_one_line_and_does_not_raise(tmp_path, capsys):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    log = AuditLog(str(blocker / "audit.jsonl"))
    record = log.write("action", node="n1", action="drain", result="ok")
    assert record["kind"] == "action"
    err = capsys.readouterr().err
    assert err.startswith(f"slurm-hooks: cannot write audit log {log.path}: ")
    assert err.count("\n") == 1


def test_read_skips_a_torn_last_line_and_blank_lines(tmp_path):
    log = AuditLog(str(tmp_path / "audit.jsonl"))
    a = log.write("alert", node="n1")
    b = log.write("action", node="n1")
    with open(log.path, "a") as fh:
        fh.write('\n{"ts": 1764412800.1, "kind": "act')
    assert list(log.read()) == [a, b]


def test_a_record_written_after_a_torn_line_is_still_read(tmp_path):
    log = AuditLog(str(tmp_path / "audit.jsonl"))
    a = log.write("alert", node="n1")
    with open(log.path, "a") as fh:
        fh.write('{"ts": 1764412800.1, "kind": "act')
    b = log.write("action", node="n1", action="drain", result="ok")
    assert list(log.read()) == [a, b]


def test_reading_a_log_that_does_not_exist_yields_nothing(tmp_path):
    assert list(AuditLog(str(tmp_path / "none.jsonl")).read()) == []


def test_a_lock_held_by_another_process_does_not_block_the_write(tmp_path, capsys):
    import subprocess
    import sys
    import time

    from slurm_hooks.observe import audit

    log = AuditLog(str(tmp_path / "audit.jsonl"))
    first = log.write("alert", node="n1")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time\n"
         f"fd = os.open({log.path!r}, os.O_RDWR)\nfcntl.flock(fd, fcntl.LOCK_EX)\n"
         "print('held', flush=True)\ntime.sleep(60)\n"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        started = time.monotonic()
        record = log.write("action", node="n1", action="drain", result="ok")
        took = time.monotonic() - started
    finally:
        holder.kill()
        holder.wait()
    assert took < audit.WRITE_BOUND_S + 0.5  # bounded: the drain goes on
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"slurm-hooks: cannot write audit log {log.path}: locked by another process")
    assert '"action":"drain"' in err  # the record is not lost: it is in slurmd's log
    assert list(log.read()) == [first]
    again = log.write("action", node="n1", action="resume", result="ok")  # the lock is free again
    assert list(log.read()) == [first, again] and record["action"] == "drain"


def test_a_hung_fsync_is_abandoned_within_the_bound(tmp_path, capsys, monkeypatch):
    import threading
    import time

    from slurm_hooks.observe import audit

    release = threading.Event()
    monkeypatch.setattr(audit.os, "fsync", lambda fd: release.wait(30))  # a log filesystem that stopped answering
    log = AuditLog(str(tmp_path / "audit.jsonl"))
    try:
        started = time.monotonic()
        log.write("action", node="n1", action="drain")
        log.write("action", node="n1", action="requeue")  # does not start a second hung writer
        took = time.monotonic() - started
        err = capsys.readouterr().err.splitlines()
    finally:
        release.set()
    assert took < 2 * audit.WRITE_BOUND_S
    assert len(err) == 2
    assert "no answer within 1s (hung filesystem?)" in err[0] and '"action":"drain"' in err[0]
    assert "an earlier write still hangs" in err[1] and '"action":"requeue"' in err[1]


def test_writers_do_not_wait_for_each_others_fsync_and_lose_no_record(tmp_path, capsys, monkeypatch):
    """Eight writers whose disk syncs slowly: each fsync waits until all eight have appended. A
    writer that synced under the lock made the others wait past LOCK_WAIT_S (records lost)."""
    import threading

    from slurm_hooks.observe import audit

    writers = 8
    all_appended = threading.Barrier(writers, timeout=20)
    monkeypatch.setattr(audit, "WRITE_BOUND_S", 30.0)
    monkeypatch.setattr(audit.os, "fsync", lambda fd: all_appended.wait())
    path = str(tmp_path / "audit.jsonl")
    threads = [threading.Thread(target=AuditLog(path).write, args=("alert",), kwargs={"writer": i})
               for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert capsys.readouterr().err == ""
    assert sorted(json.loads(line)["writer"] for line in lines(path)) == list(range(writers))


def test_the_same_alert_again_and_again_is_one_line_then_one_repeat_record_at_the_next_change(tmp_path):
    log = AuditLog(str(tmp_path / "audit.jsonl"))
    for _ in range(50):
        log.write("alert", node="n1", gpu=0, check="xid", message="XID 79", action="reboot")
        log.write("action", node="n1", action="drain", target="n1", result="already", duration_s=0.001)
    assert [r["kind"] for r in log.read()] == ["alert", "action"]
    log.write("action", node="n1", action="resume", target="n1", result="ok")
    written = list(log.read())
    assert [r["kind"] for r in written] == ["alert", "action", "repeat", "repeat", "action"]
    assert sorted((r["count"], r["of"]["kind"]) for r in written[2:4]) == [(49, "action"), (49, "alert")]
    assert all(r["first_ts"] <= r["last_ts"] <= written[-1]["ts"] for r in written[2:4])


def test_a_repeat_on_another_node_or_with_other_words_is_a_line_of_its_own(tmp_path):
    log = AuditLog(str(tmp_path / "audit.jsonl"))
    log.write("alert", node="n1", check="xid", message="XID 79")
    log.write("alert", node="n2", check="xid", message="XID 79")
    log.write("alert", node="n1", check="xid", message="XID 48")
    log.write("action", node="n1", action="drain", result="ok")
    log.write("action", node="n1", action="drain", result="ok")  # a change is never a repeat
    assert len(list(log.read())) == 5


def test_counts_not_yet_written_are_in_the_history(tmp_path):
    log = AuditLog(str(tmp_path / "audit.jsonl"))
    for _ in range(3):
        log.write("action", node="n1", action="resume", result="skipped", detail="drained for dcgm")
    [first, repeat] = list(log.history())
    assert first["result"] == "skipped" and repeat["kind"] == "repeat" and repeat["count"] == 2


def test_a_long_repeat_is_summed_up_every_few_hours_not_never(tmp_path, monkeypatch):
    from slurm_hooks.observe import audit

    clock = [1_764_000_000.0]
    monkeypatch.setattr(audit.time, "time", lambda: clock[0])
    log = AuditLog(str(tmp_path / "audit.jsonl"))
    for _ in range(14 * 24 * 6):  # two weeks of a check every 10 minutes
        log.write("alert", node="n1", check="xid", message="XID 79")
        clock[0] += 600
    written = list(log.read())
    summaries = int(14 * 24 * 3600 // audit.REPEAT_SUMMARY_S)
    # The first line, then every REPEAT_SUMMARY_S a repeat record and the record itself again.
    assert 2 * (summaries - 1) + 1 <= len(written) <= 2 * summaries + 1
    alerts = sum(1 for r in written if r["kind"] == "alert")
    assert alerts + sum(r["count"] for r in log.history() if r["kind"] == "repeat") == 14 * 24 * 6


def test_history_reads_rotated_and_gzipped_files_oldest_first(tmp_path):
    import gzip

    path = tmp_path / "audit.jsonl"
    with gzip.open(f"{path}.2.gz", "wt") as fh:
        fh.write('{"ts": 1, "kind": "alert", "n": 1}\n')
    Path(f"{path}.1").write_text('{"ts": 2, "kind": "alert", "n": 2}\n')
    Path(f"{path}.10.gz").write_bytes(gzip.compress(b'{"ts": 0, "kind": "alert", "n": 0}\n'))
    Path(f"{path}.repeats.json").write_text("{}")  # not a rotated log
    log = AuditLog(str(path))
    log.write("alert", n=3)
    assert [r["n"] for r in log.history()] == [0, 1, 2, 3]
    assert [r["n"] for r in log.read()] == [3]


def _repeat_many(args):
    path, count = args
    log = AuditLog(path)
    for _ in range(count):
        log.write("alert", node="n1", check="xid", message="XID 79")
    return count


def test_four_processes_repeating_one_alert_write_it_once_and_count_every_other(tmp_path):
    path = str(tmp_path / "audit.jsonl")
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        pool.map(_repeat_many, [(path, 100)] * 4)
    log = AuditLog(path)
    assert [r["kind"] for r in log.read()] == ["alert"]
    assert sum(r["count"] for r in log.history() if r["kind"] == "repeat") == 399
