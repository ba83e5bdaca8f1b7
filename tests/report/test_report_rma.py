"""The RMA list by serial and UUID: from the repair ladder's records and rma.json; the report's
other truths (made eligible is not running again; rotated logs read)."""

from __future__ import annotations

import gzip
import json
import time

from slurm_hooks import report
from slurm_hooks.report import text

NOW = time.time()
DAY = 86400.0
GPU0 = {"index": 0, "uuid": "GPU-8f2c", "serial": "1650923012345", "pci_bus_id": "00000000:17:00.0"}


def replaced(t: float) -> list[dict]:
    return [
        {"ts": t, "kind": "alert", "node": "n1", "gpu": 0, "check": "xid", "action": "reboot", "message": "XID 79"},
        {"ts": t + 1, "kind": "action", "node": "n1", "action": "drain", "result": "ok",
         "reason": "slurm-hooks: XID 79 on GPU 0 [reboot]"},
        {"ts": t + 2, "kind": "action", "node": "n1", "action": "repair-reboot", "result": "start", "gpu_ids": [GPU0]},
        {"ts": t + 300, "kind": "action", "node": "n1", "action": "repair-replace", "result": "ok",
         "reason": "slurm-hooks: XID 79 on GPU 0 [replace]", "why": "still XID 79 after the reboot",
         "gpu_ids": [GPU0], "evidence": "/state/evidence/n1/x-replace"},
    ]


def test_a_replace_from_the_ladder_is_an_rma_candidate_named_by_serial_and_uuid_with_its_evidence():
    rep = report.build(replaced(NOW - DAY), NOW - 30 * DAY, NOW)
    [c] = rep["rma_candidates"]
    assert (c["gpu"], c["serial"], c["uuid"], c["pci_bus_id"], c["node"], c["index"]) == (
        "1650923012345", "1650923012345", "GPU-8f2c", "00000000:17:00.0", "n1", 0)
    assert c["why"][0].startswith("[replace]: still XID 79 after the reboot")
    assert c["evidence"] == ["/state/evidence/n1/x-replace"]
    lines = text.render(rep)
    assert "  n1 GPU 0 (GPU-8f2c, serial 1650923012345): 1 incidents; [replace]: still XID 79" in "\n".join(lines)


def test_the_rma_list_file_is_read_where_no_log_here_saw_the_replace():
    entry = {"uuid": "GPU-1", "serial": "S-9", "pci_bus_id": "0:3b", "node": "n7", "gpu": 2,
             "reason": "survived a reboot", "evidence": "/e"}
    rep = report.build([], NOW - 30 * DAY, NOW, rma_list=[entry])
    [c] = rep["rma_candidates"]
    assert (c["gpu"], c["node"], c["index"], c["evidence"]) == ("S-9", "n7", 2, ["/e"])
    assert "RMA list" in c["why"][0]


def test_the_same_gpu_from_records_and_the_rma_list_is_one_entry():
    entry = {"uuid": "GPU-8f2c", "serial": "1650923012345", "node": "n1", "gpu": 0, "reason": "x"}
    rep = report.build(replaced(NOW - DAY), NOW - 30 * DAY, NOW, rma_list=[entry])
    assert [c["gpu"] for c in rep["rma_candidates"]] == ["1650923012345"]


def test_a_replaced_board_starts_a_clean_history_in_its_slot():
    def once(t, serial, back):
        return [{"ts": t, "kind": "alert", "node": "n1", "gpu": 3, "check": "xid", "action": "reset",
                 "message": "XID 48", "serial": serial},
                {"ts": t + 1, "kind": "action", "node": "n1", "action": "drain", "result": "ok",
                 "reason": "slurm-hooks: XID 48 on GPU 3 [reset]"},
                {"ts": t + back, "kind": "action", "node": "n1", "action": "resume", "result": "ok"}]
    recs = once(NOW - 9 * DAY, "OLD", 60) + once(NOW - 8 * DAY, "OLD", 60) + once(NOW - 2 * DAY, "NEW", 60)
    rep = report.build(recs, NOW - 30 * DAY, NOW)
    assert [c["gpu"] for c in rep["rma_candidates"]] == ["OLD"]


def test_without_slurmdbd_a_job_made_eligible_counts_as_running_only_once_a_look_saw_it_run():
    recs = [{"ts": NOW - 100, "kind": "action", "node": "n1", "action": "drain", "result": "ok",
             "reason": "slurm-hooks: XID 79 on GPU 0 [reboot]"},
            {"ts": NOW - 99, "kind": "action", "node": "n1", "action": "requeue", "result": "ok", "jobs": [5]},
            {"ts": NOW - 98, "kind": "action", "node": "n1", "action": "start_now", "result": "ok", "jobs": [5]}]
    s = report.build(recs, NOW - DAY, NOW)["summary"]
    assert (s["time_to_job_eligible"]["median_s"], s["time_to_job_running"]["count"]) == (2.0, 0)
    recs.append({"ts": NOW - 88.5, "kind": "action", "node": "n1", "action": "running", "result": "ok", "jobs": [5],
                 "nodes": "n2"})
    rep = report.build(recs, NOW - DAY, NOW)
    assert rep["summary"]["time_to_job_running"]["median_s"] == 11.5
    assert rep["incidents"][0]["time_to_job_eligible_s"] == 2.0 and rep["incidents"][0]["time_to_job_running_s"] == 11.5
    out = "\n".join(text.render(rep))
    assert "job made eligible" in out and "job running again" in out


def test_rotated_and_gzipped_logs_are_read(tmp_path):
    log = tmp_path / "audit.jsonl"
    recs = replaced(NOW - DAY)
    with gzip.open(f"{log}.2.gz", "wt") as fh:
        fh.write("".join(json.dumps(r) + "\n" for r in recs[:2]))
    (tmp_path / "audit.jsonl.1").write_text(json.dumps(recs[2]) + "\n")
    log.write_text(json.dumps(recs[3]) + "\n")
    files = report.audit_files(str(log))
    assert files == [f"{log}.2.gz", f"{log}.1", str(log)]
    assert len(report.read_audit(files)) == 4
    assert report.audit_files(str(tmp_path)) == files
    assert [c["serial"] for c in report.build(report.read_audit(files), NOW - 30 * DAY, NOW)["rma_candidates"]] == [
        "1650923012345"]


def test_a_node_waiting_for_a_person_is_listed_with_what_to_do():
    rep = report.build(replaced(NOW - DAY), NOW - 30 * DAY, NOW)
    [w] = rep["waiting_for_a_person"]
    assert (w["node"], w["action"]) == ("n1", "replace") and "serial 1650923012345" in w["todo"]
    assert 86000 < w["waited_s"] < 86500
    out = "\n".join(text.render(rep))
    assert ("WAITING FOR A PERSON\n  n1 [replace] for 23h 55m: a person must replace GPU 0 (GPU-8f2c, serial "
            "1650923012345) on n1 and send it back for RMA") in out
