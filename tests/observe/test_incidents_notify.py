"""The lifecycle as notify reads it: the ladder's [replace] is paged (naming GPU, UUID and serial), a
person's resume is told once as theirs. The receiver is the shared fake webhook (a real HTTP server)."""

from __future__ import annotations

import pytest
from fakes.config import notify_settings

from slurm_hooks.observe import incidents
from slurm_hooks.observe.audit import AuditLog
from slurm_hooks.observe.notify import Notifier

pytest_plugins = ["fakes.webhook"]

GPU0 = {"index": 0, "uuid": "GPU-8f2c", "serial": "1650923012345", "pci_bus_id": "00000000:17:00.0"}


@pytest.fixture
def told(tmp_path, receiver):
    log = AuditLog(str(tmp_path / "audit.jsonl"))
    settings = notify_settings(audit=log.path, dir=str(tmp_path / "notify"), settle=0.0, timeout=2.0, retry_max=5.0,
                        webhook=({"url": receiver.url(), "format": "json", "name": "test"},))

    def flush():
        Notifier(settings, log=lambda m: None).flush(5)
        return receiver.bodies()

    return log, flush


def test_the_ladders_replace_is_paged_naming_the_gpu_its_uuid_and_serial(told):
    log, flush = told
    log.write("alert", node="n1", context="check", gpu=0, check="xid", severity="fail", action="reboot",
              message="XID 79 (GPU has fallen off the bus)")
    log.write("action", node="n1", action="drain", target="n1", result="ok",
              reason="slurm-hooks: XID 79 on GPU 0 [reboot]")
    log.write("action", node="n1", action="repair-reboot", target="n1", result="start", gpu_ids=[GPU0],
              reason="slurm-hooks: XID 79 on GPU 0 [reboot 1/1]")
    assert [m["kind"] for m in flush()] == ["opened"]
    log.write("action", node="n1", action="repair-replace", target="n1", result="ok", gpu_ids=[GPU0],
              reason="slurm-hooks: XID 79 on GPU 0 [replace]", why="still XID 79 after the reboot")
    bodies = flush()
    assert [m["kind"] for m in bodies] == ["opened", "escalated"]
    page = bodies[1]
    assert page["action"] == "replace" and "[replace]" in page["text"]
    assert "GPU 0" in page["text"] and "GPU-8f2c" in page["text"] and "1650923012345" in page["text"]
    assert page["gpus"] == [{"index": 0, "uuid": "GPU-8f2c", "serial": "1650923012345"}]
    assert page["waiting_for"] == "a person" and "1650923012345" in page["todo"]


def test_a_persons_resume_is_told_once_as_back_in_service(told):
    log, flush = told
    log.write("action", node="n2", action="drain", target="n2", result="ok",
              reason="slurm-hooks: DCGM diag L2 failed on GPU 5 [reset]")
    flush()
    incidents.record_person_resume(log, "n2", state="IDLE")
    flush()
    bodies = flush()
    assert [m["kind"] for m in bodies] == ["opened", "resolved"]
    assert bodies[1]["resolved_by"] == "a person" and bodies[1]["closed_by"] == "person"
