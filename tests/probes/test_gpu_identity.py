"""A GPU that stops saying who it is keeps the identity last read for it (probes.identity).

A GPU fallen off the bus commonly fails at the handle lookup itself: libnvidia-ml answers
GPU_IS_LOST to ``nvmlDeviceGetHandleByIndex`` (the shared fake raises pynvml's own
``NVMLError_GpuIsLost`` there), so nothing about it can be asked. Its UUID, serial and PCI bus
id then come from what an earlier run read, so that the XID 79 the kernel logs for its address
is its own, and the page and the RMA list name the board.
"""

from __future__ import annotations

import json
import os

import pynvml
import pytest
from fakes import XID79_GPU2, FakeNvml

from slurm_hooks.probes.identity import bus_map, store_path
from slurm_hooks.probes.kmsg import boot_id
from slurm_hooks.probes.nvml import NvmlProbe


@pytest.fixture
def node(tmp_path):
    """Node n1's state dir and kernel log (empty until a test writes a line), and its probe."""
    log = tmp_path / "kmsg"
    log.write_text("")
    store = store_path(str(tmp_path / "state"), "n1")

    def probe(fake: FakeNvml) -> NvmlProbe:
        return NvmlProbe("n1", kmsg_path=str(log), nvml=fake, gpu_map_path=store)

    return log, store, probe


def fell_off_the_bus(fake: FakeNvml, gpu: int) -> FakeNvml:
    fake.lose(gpu=gpu)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        fake.nvmlDeviceGetHandleByIndex(gpu)  # as libnvidia-ml answers for a GPU off the bus
    return fake


def test_a_gpu_lost_at_its_handle_lookup_keeps_the_identity_read_earlier_this_boot_and_its_xid(node):
    log, store, probe = node
    fake = FakeNvml.healthy(gpus=4)
    probe(fake).snapshot()  # a run while GPU 2 still answered
    fell_off_the_bus(fake, 2)
    log.write_text(XID79_GPU2)
    snap = probe(fake).snapshot()
    lost = snap.gpus[2]
    was = fake.gpus[2]
    assert lost.lost and lost.remembered
    assert (lost.uuid, lost.serial, lost.pci_bus_id, lost.minor, lost.model) == (
        was["uuid"], was["serial"], was["pci_bus_id"], was["minor"], was["name"])
    assert lost.temperature_c is None  # nothing else about it is made up
    [xid] = lost.xids
    assert (xid.code, xid.gpu, xid.uuid) == (79, 2, was["uuid"]) and snap.node_xids == ()
    # The record still holds it, for the next run and the watcher's kernel-log lines.
    assert bus_map(store)[was["pci_bus_id"]] == (2, was["uuid"])
    again = probe(fake).snapshot().gpus[2]
    assert again.uuid == was["uuid"] and again.xids == lost.xids
    assert [g.remembered for g in snap.gpus] == [False, False, True, False]


def test_a_gpu_lost_before_any_run_read_it_has_no_identity_and_its_xid_stays_the_nodes(node):
    log, store, probe = node
    log.write_text(XID79_GPU2)
    snap = probe(fell_off_the_bus(FakeNvml.healthy(gpus=4), 2)).snapshot()  # the first run on this node
    lost = snap.gpus[2]
    assert lost.lost and not lost.remembered
    assert (lost.uuid, lost.serial, lost.pci_bus_id) == ("", "", "")
    assert [(x.code, x.gpu, x.pci_bus_id) for x in snap.node_xids] == [(79, None, "00000000:38:00.0")]
    assert "00000000:38:00.0" not in bus_map(store)  # nothing is recorded for it either


def test_after_a_reboot_the_record_names_a_silent_gpu_only_while_the_gpus_are_numbered_as_before(node):
    log, store, probe = node
    fake = FakeNvml.healthy(gpus=4)
    probe(fake).snapshot()
    with open(store, encoding="utf-8") as fh:
        record = json.load(fh)
    record["boot"] = "an-earlier-boot"  # the record as the boot before this one left it
    with open(store, "w", encoding="utf-8") as fh:
        json.dump(record, fh)
    fell_off_the_bus(fake, 2)
    lost = probe(fake).snapshot().gpus[2]
    assert lost.uuid == fake.gpus[2]["uuid"] and lost.remembered
    with open(store, encoding="utf-8") as fh:
        assert json.load(fh)["boot"] == boot_id()  # kept for this boot from now on

    # A board swapped in at GPU 1 during the reboot: the numbering is not shown unchanged.
    record["boot"] = "an-earlier-boot"
    with open(store, "w", encoding="utf-8") as fh:
        json.dump(record, fh)
    fake.set(gpu=1, uuid="GPU-new-board-in-slot-1", serial="1650999990001")
    lost = probe(fake).snapshot().gpus[2]
    assert (lost.uuid, lost.serial, lost.pci_bus_id, lost.remembered) == ("", "", "", False)


def test_the_record_is_not_written_again_while_nothing_changed(node):
    _, store, probe = node
    fake = FakeNvml.healthy(gpus=2)
    probe(fake).snapshot()
    before = os.stat(store).st_mtime_ns - 10**9
    os.utime(store, ns=(before, before))
    probe(fake).snapshot()
    assert os.stat(store).st_mtime_ns == before
