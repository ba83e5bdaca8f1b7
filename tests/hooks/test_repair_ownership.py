"""The repair ladder where the field differs from the testbed: no RebootProgram, a lost state dir,
[replace] that ends, and a person's decision in the reboot window. Simulated GPUs and the
shared fake Slurm; the real-Slurm versions are in test_e2e_ownership.py."""

from __future__ import annotations

import dataclasses
import os
import shutil
from types import SimpleNamespace

import pytest
from fakes.config import repair_config, sim_node

from slurm_hooks.errors import PermanentError
from slurm_hooks.hooks import healthcheck
from slurm_hooks.probes import sim
from slurm_hooks.remedy import repair

REFUSED = PermanentError("scontrol_reboot_nodes error: Unspecified error")


@pytest.fixture
def t(tmp_path):
    """With the sim's dcgmi: each repair is validated before the node returns ([repair] dcgm_level 2)."""
    cfg = repair_config(tmp_path)
    slurm, w = sim_node(cfg, "IDLE")
    sim.set_diag_seconds(cfg.gpu.sim_dir, "n1", 0.0)
    return SimpleNamespace(w=w, cfg=cfg, slurm=slurm, sim_dir=cfg.gpu.sim_dir, audit=w.audit)


def check(t):
    return healthcheck.run(t.w, follow="none", repair="inline")


def rungs(t):
    return [(r["action"], r["result"]) for r in t.audit.read() if str(r.get("action", "")).startswith("repair-")]


def back_down_after_reboot(t):
    """What Slurm does with our reboot: the node comes back DOWN, its reason suffixed."""
    sim.reboot(t.sim_dir, "n1")
    reason = t.slurm.peek("n1").reason
    t.slurm.set_node("n1", state="DOWN", reason=reason + " : reboot issued : reboot complete")


def wipe_state(t):
    shutil.rmtree(t.cfg.state.dir)
    os.makedirs(t.cfg.state.dir)


# --- no RebootProgram -------------------------------------------------------------------


def test_a_refused_reboot_counts_once_and_the_node_waits_for_a_person(t):
    t.slurm.fail("reboot", REFUSED)
    sim.inject(t.sim_dir, "n1", 0, xid=79)
    _, out = check(t)
    assert out.repairs == ["reboot:refused", "replace:ok"]
    for _ in range(3):  # never again at every check
        _, later = check(t)
        assert later.repairs == [] and not later.resumed
    assert len(t.slurm.called("reboot")) == 1
    node = t.slurm.peek("n1")
    assert node.drained and node.reason == "slurm-hooks: XID 79 on GPU 0 [replace]"
    refused = next(r for r in t.audit.read() if r.get("action") == "repair-reboot")
    assert refused["result"] == "refused" and "RebootProgram" in refused["detail"]
    replaced = next(r for r in t.audit.read() if r.get("action") == "repair-replace")
    assert "reboot refused by Slurm" in replaced["why"] and "a person must act" in replaced["why"]


# --- a lost state dir -------------------------------------------------------------------


def test_state_dir_lost_after_our_reboot_a_healthy_node_comes_back(t):
    sim.inject(t.sim_dir, "n1", 0, xid=79)
    check(t)
    assert t.slurm.peek("n1").reason == "slurm-hooks: XID 79 on GPU 0 [reboot 1/1]"
    back_down_after_reboot(t)
    wipe_state(t)  # a diskless node: the marker and the ladder's state are gone with the boot
    _, out = check(t)
    assert out.resumed and t.slurm.peek("n1").state == "IDLE"


def test_state_dir_lost_after_our_reboot_a_persisting_fault_reaches_replace_without_a_loop(t):
    sim.inject(t.sim_dir, "n1", 0, xid=79, cleared_by="never")
    check(t)
    back_down_after_reboot(t)
    wipe_state(t)
    _, out = check(t)
    assert out.repairs == ["replace:ok"]
    assert t.slurm.peek("n1").reason == "slurm-hooks: XID 79 on GPU 0 [replace]"
    assert ("repair-reboot", "recalled") in rungs(t)
    for _ in range(2):
        back_down_after_reboot(t)  # even rebooted by hand, and with the state dir lost again
        wipe_state(t)
        _, later = check(t)
        assert later.repairs == [] and not later.resumed
    assert len(t.slurm.called("reboot")) == 1


# --- [replace] ends ---------------------------------------------------------------------


def replaced(t, gpu=3):
    sim.inject(t.sim_dir, "n1", gpu, row_remap_failure=True)
    _, out = check(t)
    assert out.repairs == ["replace:ok"] and t.slurm.peek("n1").reason.endswith("[replace]")


@pytest.mark.parametrize("kept", [False, True], ids=["reason-cleared", "reason-kept-24.11"])
def test_replace_then_a_persons_resume_and_clear_then_a_new_fault_gets_the_ladder_again(t, kept):
    replaced(t)
    sim.clear(t.sim_dir, "n1", 3)
    t.slurm.keeps_reason = kept
    t.slurm.resume("n1")  # a person: scontrol update State=RESUME (24.11 keeps our [replace] text)
    assert repair.clear_mark(t.w, 3, "alice")  # and `slurm-hooks rma clear --node n1 --gpu 3`: mended
    sim.inject(t.sim_dir, "n1", 3, row_remap_pending=True)  # no check in between
    _, out = check(t)
    assert out.repairs == ["reset:ok"] and out.resumed and t.slurm.peek("n1").state == "IDLE"


@pytest.mark.parametrize("kept", [False, True], ids=["reason-cleared", "reason-kept-24.11"])
def test_a_new_fault_on_a_gpu_a_person_resumed_still_marked_is_left_for_replacement_again(t, kept):
    replaced(t)
    sim.clear(t.sim_dir, "n1", 3)
    t.slurm.keeps_reason = kept
    t.slurm.resume("n1")  # no `rma clear`: the GPU stays marked for replacement
    check(t)
    assert ("repair-replace", "resumed") in rungs(t) and ("repair-replace", "ended") not in rungs(t)
    sim.inject(t.sim_dir, "n1", 3, row_remap_pending=True)
    _, out = check(t)
    assert out.repairs == ["replace:ok"] and not out.resumed and t.slurm.peek("n1").reason.endswith("[replace]")
    assert repair.read_rma(repair.rma_path(t.w))  # the RMA entry stays


def test_replace_stays_when_the_same_gpu_passes_again(t):
    replaced(t)
    sim.clear(t.sim_dir, "n1", 3)  # flaky hardware passes now and then
    for _ in range(2):
        _, out = check(t)
        assert not out.resumed
    assert t.slurm.peek("n1").drained and not t.slurm.called("resume")


def test_replace_ends_when_the_faulty_gpu_is_gone_new_hardware(t):
    replaced(t)
    sim.replace(t.sim_dir, "n1", 3)
    _, out = check(t)
    assert out.resumed and t.slurm.peek("n1").state == "IDLE"
    ended = [r for r in t.audit.read() if r.get("action") == "repair-replace" and r.get("result") == "ended"]
    assert ended and "hardware was replaced" in ended[0]["detail"]
    # The new hardware proved itself first: drained [validating] until its diagnostic passed.
    assert out.repairs == ["validate:ok"]
    assert [r["after"] for r in t.audit.read() if r.get("action") == "repair-validate"] == ["replacement"] * 2


def test_new_hardware_that_fails_its_validation_stays_out(t):
    replaced(t)
    sim.replace(t.sim_dir, "n1", 3)
    sim.inject(t.sim_dir, "n1", 3, diag_failure=1)  # the replacement GPU is bad too
    _, out = check(t)
    assert not out.resumed and t.slurm.peek("n1").drained
    assert "validate:failed" in out.repairs
    assert repair.read_rma(repair.rma_path(t.w))


# --- the reboot window ------------------------------------------------------------------


def test_an_admin_cancel_reboot_ends_our_tracking_without_replace(t, monkeypatch):
    sim.inject(t.sim_dir, "n1", 0, xid=79, cleared_by="never")
    check(t)
    # `scontrol cancel_reboot n1`: the reboot request and its drain are gone, no reboot happened.
    t.slurm.set_node("n1", state="IDLE", reason="")
    # long past: still no [replace]
    monkeypatch.setattr(t.w, "config", dataclasses.replace(t.cfg, repair=dataclasses.replace(t.cfg.repair,
                                                                                            reboot_timeout=0.0)))
    _, out = check(t)
    assert "reboot:cancelled" in out.repairs and ("repair-replace", "ok") not in rungs(t)
    assert not any(c[2].endswith("[replace]") for c in t.slurm.called("drain"))


def test_an_urgent_new_fault_while_our_reboot_is_pending_still_requeues_what_it_touches(t):
    sim.inject(t.sim_dir, "n1", 0, xid=79)
    _, out = check(t)
    assert out.repairs == ["reboot:start"] and "REBOOT_REQUESTED" in t.slurm.peek("n1").state
    # A job that raced in before the drain landed runs on GPU 5 while the reboot waits for it.
    t.slurm.add_job(102, "n1")
    t.slurm.set_job_gpus(102, (5,))
    _, quiet = check(t)
    assert quiet.requeued == []  # the pending reboot's own fault requeues nothing
    sim.inject(t.sim_dir, "n1", 5, xid=79)  # a new urgent fault under job 102
    _, out = check(t)
    assert out.requeued == ["102"] and out.repairs == []
    assert len(t.slurm.called("reboot")) == 1
