"""The [replace] page when a check on the new boot finds the fault again: it says a person replaces the
GPU (never "Slurm reboots" a node whose reboot is over), and it waits the settle time for the ladder's
[replace] record, so that it names that record's evidence. Real AuditLog, real HTTP receiver."""

from __future__ import annotations

import time

import pytest
from fakes.config import notify_settings

from slurm_hooks.observe import incidents
from slurm_hooks.observe.audit import AuditLog
from slurm_hooks.observe.notify import Notifier

pytest_plugins = ["fakes.webhook"]

GPU1 = {"index": 1, "uuid": "GPU-2a6e", "serial": "1650923012345", "pci_bus_id": "00000000:28:00.0"}
XID48 = "XID 48 (Double Bit ECC Error)"


def rebooted_for_xid48(log: AuditLog) -> None:
    """XID 48 on n2's GPU 1: drained [reset], the reset did not mend it, rebooted through Slurm."""
    log.write("alert", node="n2", context="check", gpu=1, check="xid", severity="fail", action="reset", message=XID48,
              uuid=GPU1["uuid"], serial=GPU1["serial"])
    log.write("action", node="n2", action="drain", target="n2", result="ok", reason="slurm-hooks: XID 48 on GPU 1 [reset]")
    log.write("action", node="n2", action="repair-reset", target="n2", result="failed", gpu_ids=[GPU1])
    log.write("action", node="n2", action="repair-reboot", target="n2", result="start", gpu_ids=[GPU1],
              reason="slurm-hooks: XID 48 on GPU 1 [reboot 1/1]", evidence="/var/lib/slurm-hooks/evidence/n2/1-reboot")


def found_again_on_the_new_boot(log: AuditLog) -> None:
    log.write("alert", node="n2", context="check", gpu=1, check="xid", severity="fail", action="replace",
              message=f"{XID48}, 3rd time in 24h -> hardware", uuid=GPU1["uuid"], serial=GPU1["serial"])
    log.write("action", node="n2", action="drain", target="n2", result="ok",
              reason="slurm-hooks: XID 48 on GPU 1 [replace]")


def test_a_replace_drain_after_the_reboot_waits_for_a_person_to_replace_the_gpu_by_serial(tmp_path):
    log = AuditLog(str(tmp_path / "audit.jsonl"))
    rebooted_for_xid48(log)
    found_again_on_the_new_boot(log)  # the ladder's own [replace] record is not written yet
    [inc] = incidents.build(log.read())
    who, what = incidents.next_step(inc)
    assert inc.waits_for_person and inc.step == "replace"
    assert who == "a person" and what.startswith(
        f"replace GPU 1 ({GPU1['uuid']}, serial {GPU1['serial']}) on n2 and send it back for RMA"), what


@pytest.fixture
def told(tmp_path, receiver):
    log = AuditLog(str(tmp_path / "audit.jsonl"))
    settings = notify_settings(audit=log.path, dir=str(tmp_path / "notify"), settle=2.0, timeout=2.0, retry_max=5.0,
                               webhook=({"url": receiver.url(), "format": "json", "name": "test"},))
    clock = [time.time()]

    def flush(at: float):
        clock[0] = at
        Notifier(settings, log=lambda m: None, clock=lambda: clock[0]).flush(5)
        return [b for b in receiver.bodies() if b["kind"] == "escalated"]

    return log, flush


def test_the_replace_page_waits_the_settle_time_for_the_ladders_record_and_names_its_evidence(told):
    log, flush = told
    rebooted_for_xid48(log)
    flush(time.time() + 3)  # the opening, past its settle
    found_again_on_the_new_boot(log)
    assert flush(time.time() + 0.5) == []  # within the settle: the ladder writes its [replace] next
    log.write("action", node="n2", action="repair-replace", target="n2", result="ok", gpu_ids=[GPU1],
              reason="slurm-hooks: XID 48 on GPU 1 [replace]", evidence="/var/lib/slurm-hooks/evidence/n2/2-replace")
    [page] = flush(time.time() + 2.5)
    assert page["action"] == "replace" and "Evidence: " in page["text"]
    assert "/var/lib/slurm-hooks/evidence/n2/2-replace" in page["text"].split("Evidence: ", 1)[1]
    assert f"Next: a person must replace GPU 1 ({GPU1['uuid']}, serial {GPU1['serial']}) on n2" in page["text"]
