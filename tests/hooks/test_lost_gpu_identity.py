"""A GPU fallen off the bus is named by the identity last read for it: in the drain reason, the
alert, the page and the RMA list, and the XID 79 the kernel logs for its address is its own.

The node is read by the real NVML probe over the shared fake, whose ``nvmlDeviceGetHandleByIndex``
raises pynvml's own ``NVMLError_GpuIsLost`` for the lost GPU (as libnvidia-ml does for a GPU off
the bus); the XID is the driver's own kernel-log line for that GPU's PCI address.
"""

from __future__ import annotations

import pytest
from fakes import XID79_GPU2, FakeNvml
from fakes.config import nvml_wiring
from fakes.slurm import FakeSlurm

from slurm_hooks.hooks import healthcheck
from slurm_hooks.observe import incidents
from slurm_hooks.observe.notify import compose
from slurm_hooks.remedy import repair


@pytest.fixture
def t(tmp_path):
    log = tmp_path / "kmsg"
    log.write_text("6,4000,3757000000,-;eth0: link becomes ready\n")
    fake = FakeNvml.healthy(gpus=8)
    slurm = FakeSlurm()
    slurm.add_node("n1", "IDLE")
    return log, fake, slurm, nvml_wiring(tmp_path, slurm, fake, log)


def gpu2_falls_off_the_bus(log, fake) -> None:
    fake.lose(gpu=2)  # nvmlDeviceGetHandleByIndex(2) raises NVMLError_GpuIsLost from now on
    with open(log, "a", encoding="utf-8") as fh:
        fh.write(XID79_GPU2)


def alerts(w) -> list[dict]:
    return [r for r in w.audit.read() if r.get("kind") == "alert"]


def test_a_gpu_off_the_bus_is_drained_paged_and_listed_for_rma_under_the_identity_read_before(t):
    log, fake, slurm, w = t
    healthcheck.run(w)  # a run while GPU 2 still answered
    assert not slurm.peek("n1").drained
    for job, gres in ((71, 2), (72, 5)):
        slurm.add_job(job, "n1")
        slurm.set_job_gpus(job, (gres,))
    gpu2_falls_off_the_bus(log, fake)
    report, _ = healthcheck.run(w)
    board = fake.gpus[2]
    assert slurm.peek("n1").reason == "slurm-hooks: GPU 2 lost (XID 79) [replace]"
    # The XID is GPU 2's, not the node's: only the job on GPU 2 is requeued.
    assert [c[1] for c in slurm.called("requeue")] == [71]
    found = {(a["check"], a["gpu"], a.get("uuid"), a.get("serial"), a.get("pci_bus_id")) for a in alerts(w)}
    assert found == {(check, 2, board["uuid"], board["serial"], board["pci_bus_id"]) for check in ("gpu-lost", "xid")}
    [lost] = [f for f in report.findings if f.check == "gpu-lost"]
    assert "as last read" in lost.message
    [inc] = incidents.build(w.audit.read())
    page = compose(inc, "opened", inc.opened_at).text
    assert f"on GPU 2 ({board['uuid']}, serial {board['serial']})" in page and "on node" not in page
    plan = repair.plan(w, report)
    repair.add_to_rma(w, plan, report, repair.load(w))
    [entry] = repair.read_rma(repair.rma_path(w))
    assert (entry["gpu"], entry["uuid"], entry["serial"], entry["pci_bus_id"]) == (
        2, board["uuid"], board["serial"], board["pci_bus_id"])


def test_a_gpu_off_the_bus_before_any_run_read_it_is_drained_saying_its_identity_is_unknown(t):
    log, fake, slurm, w = t
    gpu2_falls_off_the_bus(log, fake)
    report, _ = healthcheck.run(w)  # the first run on this node
    assert slurm.peek("n1").reason == "slurm-hooks: GPU 2 lost; XID 79 on node [replace]"
    [lost] = [f for f in report.findings if f.check == "gpu-lost"]
    assert "identity is unknown" in lost.message
    [alert] = [a for a in alerts(w) if a["check"] == "gpu-lost"]
    assert not (alert.get("uuid") or alert.get("serial") or alert.get("pci_bus_id"))
