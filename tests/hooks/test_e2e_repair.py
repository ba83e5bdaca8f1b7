"""The repair ladder on the real testbed: GPU reset, reboot through Slurm, replace.

A cluster of its own (one module), with conftest's REPAIR_SETTINGS.
"""

from __future__ import annotations

import json
import os
import time

import pytest
from conftest import REPAIR_SETTINGS, audit_records, module_testbed, wait_for

from slurm_hooks.probes import sim

pytestmark = pytest.mark.slurm

bed, tb = module_testbed("repairbed", REPAIR_SETTINGS)


def _records(tb, action=None):
    return [r for r in audit_records(tb.audit_log) if action is None or r.get("action") == action]


RUNGS = ("repair-reset", "repair-reboot", "repair-replace")


def _repairs(tb):
    """The rungs taken, in order (the worker's and the validation's own records aside)."""
    return [(r["action"], r["result"]) for r in _records(tb) if r.get("action") in RUNGS]


def _sim(tb, node="n1"):
    return sim.read(tb.sim_dir, node)


def _wait(pred, timeout, what, tb=None):
    seen = (lambda: f"n1 {tb.slurm().node('n1')}; repairs {_repairs(tb)}") if tb is not None else None
    return wait_for(pred, timeout, what, interval=0.2, seen=seen)


def test_row_remap_pending_on_idle_node_is_reset_checked_and_back_idle_without_reboot(tb):
    t0 = time.monotonic()
    sim.inject(tb.sim_dir, "n1", 3, row_remap_pending=True)
    _wait(lambda: ("repair-reset", "ok") in _repairs(tb), 30, "a GPU reset that checked healthy")
    node = tb.wait_node("n1", lambda n: n.state.upper() == "IDLE" and (not n.reason or tb.keeps_reasons), timeout=30 - (time.monotonic() - t0))
    assert node.state.upper() == "IDLE"
    drains = [r for r in _records(tb, "drain") if r["result"] == "ok"]
    assert drains and drains[0]["reason"] == "slurm-hooks: row remap pending on GPU 3 [reset, at job end]"
    state = _sim(tb)
    assert sim.gpu_entry(state, 3)["resets"] == 1 and not sim.gpu_entry(state, 3)["row_remap_pending"]
    assert state.get("boots", 0) == 0, "no reboot"
    assert not any(a == "repair-reboot" for a, _ in _repairs(tb))


def test_xid79_on_idle_node_is_rebooted_through_slurm_checked_and_back_idle(tb):
    sim.inject(tb.sim_dir, "n1", 0, xid=79)
    _wait(lambda: ("repair-reboot", "start") in _repairs(tb), 20, "a reboot request", tb)
    assert "REBOOT" in tb.slurm().node("n1").state.upper() or _sim(tb).get("boots", 0) == 1
    _wait(lambda: ("repair-reboot", "ok") in _repairs(tb), 40, "the rebooted node checked healthy", tb)
    node = tb.wait_node("n1", lambda n: n.state.upper() == "IDLE" and (not n.reason or tb.keeps_reasons), timeout=10)
    assert node.state.upper() == "IDLE"
    assert _sim(tb)["boots"] == 1
    assert not any(a == "repair-reset" for a, _ in _repairs(tb)), "XID 79 starts at the reboot"
    reboot = next(r for r in _records(tb, "repair-reboot") if r["result"] == "start")
    assert reboot["reason"] == "slurm-hooks: XID 79 on GPU 0 [reboot 1/1]"


def test_dead_gpu_climbs_reset_then_reboot_then_replace_and_stops(tb):
    sim.inject(tb.sim_dir, "n1", 5, row_remap_pending=True, cleared_by="never")
    _wait(lambda: ("repair-replace", "ok") in _repairs(tb), 60, "the GPU given up on ([replace])", tb)
    assert _repairs(tb)[:4] == [("repair-reset", "start"), ("repair-reset", "failed"),
                                ("repair-reboot", "start"), ("repair-reboot", "failed")]
    node = tb.slurm().node("n1")
    assert node.drained and node.reason == "slurm-hooks: row remap pending on GPU 5 [replace]"
    with open(os.path.join(tb.hooks_state_dir, "rma.json"), encoding="utf-8") as fh:
        rma = json.load(fh)["gpus"]
    gpu = sim.gpu_entry(_sim(tb), 5)
    assert [(e["uuid"], e["serial"], e["pci_bus_id"]) for e in rma] == [(gpu["uuid"], gpu["serial"], gpu["pci_bus_id"])]
    assert [a["rung"] for a in rma[0]["history"]] == ["reset", "reboot", "replace"]
    time.sleep(8)  # four more health checks: no further reset or reboot
    assert _sim(tb)["boots"] == 1 and gpu["resets"] == 1
    assert tb.slurm().node("n1").reason == "slurm-hooks: row remap pending on GPU 5 [replace]"
    assert len(_repairs(tb)) == 5


def test_node_with_a_running_job_is_not_repaired_before_the_job_ends(tb):
    # --no-requeue: the job stays on the drained node until it ends (as a job-end drain keeps it).
    job = tb.sbatch("#!/bin/sh\necho started\nsleep 30\n", "-w", "n1", "--no-requeue", "--gres=gpu:1")
    tb.wait_job(job, ("RUNNING",), timeout=20)
    _wait(lambda: "started" in tb.job_output(job), 20, "the script runs (past the prolog, which would refuse it)")
    sim.inject(tb.sim_dir, "n1", 2, row_remap_pending=True)
    tb.wait_node("n1", lambda n: n.drained, timeout=10)
    time.sleep(5)  # health checks ran on the drained node with the job on it
    assert _repairs(tb) == []
    assert sim.gpu_entry(_sim(tb), 2).get("resets", 0) == 0
    from slurm_hooks.runner import run_command

    run_command(["/usr/bin/scancel", str(job)], 10, env=tb.env())
    _wait(lambda: ("repair-reset", "ok") in _repairs(tb), 30, "the reset once the job left", tb)
    tb.wait_node("n1", lambda n: n.state.upper() == "IDLE" and (not n.reason or tb.keeps_reasons), timeout=15)


def test_admin_drain_is_never_repaired(tb):
    tb.scontrol("update", "NodeName=n1", "State=DRAIN", "Reason=admin: bad fan")
    sim.inject(tb.sim_dir, "n1", 1, row_remap_pending=True)
    sim.inject(tb.sim_dir, "n1", 4, xid=79)
    time.sleep(6)
    assert _repairs(tb) == []
    state = _sim(tb)
    assert state.get("boots", 0) == 0 and sim.gpu_entry(state, 1).get("resets", 0) == 0
    node = tb.slurm().node("n1")
    assert node.drained and node.reason == "admin: bad fan"
