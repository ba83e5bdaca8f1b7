"""The repair outside the hooks: attempt before action, services a dead worker left stopped,
budgets, and validation before return to service. Simulated GPUs (the sim's nvidia-smi,
systemctl and dcgmi stand-ins, run as the real programs would be) and the shared fake Slurm;
the detached worker under Slurm's own kill is in test_e2e_repair_worker.py."""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from types import SimpleNamespace

import pytest
from fakes.config import repair_config, sim_node

from slurm_hooks.hooks import healthcheck
from slurm_hooks.models import Context
from slurm_hooks.probes import sim
from slurm_hooks.probes.gpureset import SimReset
from slurm_hooks.remedy import drain, ownership, repair, repairs
from slurm_hooks.remedy.outcome import Outcome
from slurm_hooks.remedy.repair.state import Stopped, Validating
from slurm_hooks.remedy.wiring import Wiring

SERVICES = ["nvidia-fabricmanager", "nvidia-dcgm"]


def _bed(tmp_path, extra: str = "", dcgmi: bool = True, services=tuple(SERVICES)):
    cfg = repair_config(tmp_path, f"services = {json.dumps(list(services))}\n{extra}")
    if not dcgmi:
        os.unlink(cfg.dcgm.dcgmi)
    slurm, w = sim_node(cfg, "IDLE")
    sim.set_diag_seconds(cfg.gpu.sim_dir, "n1", 0.0)
    return SimpleNamespace(w=w, slurm=slurm, sim_dir=cfg.gpu.sim_dir, audit=w.audit)


@pytest.fixture
def t(tmp_path):
    return _bed(tmp_path)


def records(t, action):
    return [r for r in t.audit.read() if r.get("action") == action]


def services(t):
    state = sim.read(t.sim_dir, "n1")
    return {name: sim.service_state(state, name) for name in SERVICES}


def test_the_reset_attempt_is_on_disk_before_the_reset_acts(t):
    seen = {}

    class Watching:
        name = "watching"

        def reset(self, indexes):
            seen["attempts"] = [(a.rung, a.result) for a in repair.load(t.w).attempts]
            for i in indexes:
                sim.reset(t.sim_dir, "n1", i)

        def boot_id(self):
            return "boot-1"

    sim.inject(t.sim_dir, "n1", 3, row_remap_pending=True)
    report = healthcheck.judge(t.w, Context.CHECK)
    drain.drain(t.w, report, Outcome())
    repair.step(t.w, report, Outcome(), healthcheck.rejudge(t.w), resetter=Watching(), mode="inline")
    assert seen["attempts"] == [("reset", "started")]
    assert [(a.rung, a.result) for a in repair.load(t.w).attempts] == [("reset", "ok")]


def test_each_service_is_recorded_stopped_before_it_is_stopped_and_cleared_once_all_run_again(t):
    journal = []

    def record(names):
        state = sim.read(t.sim_dir, "n1")
        journal.append((list(names), {n: sim.service_state(state, n) for n in SERVICES}))

    sim.inject(t.sim_dir, "n1", 3, row_remap_pending=True)
    SimReset(t.sim_dir, "n1", SERVICES, 10.0, journal=record).reset([3])
    assert journal == [
        (["nvidia-fabricmanager"], {"nvidia-fabricmanager": "active", "nvidia-dcgm": "active"}),
        (SERVICES, {"nvidia-fabricmanager": "inactive", "nvidia-dcgm": "active"}),
        ([], {"nvidia-fabricmanager": "active", "nvidia-dcgm": "active"}),
    ]
    assert sim.gpu_entry(sim.read(t.sim_dir, "n1"), 3)["resets"] == 1


def test_a_reset_that_hangs_is_cut_at_its_timeout_counted_once_services_back_and_the_ladder_climbs(tmp_path):
    t = _bed(tmp_path, "reset_timeout = 1.0\n")
    sim.inject(t.sim_dir, "n1", 3, row_remap_pending=True, reset_hang=30)
    t0 = time.monotonic()
    _, outcome = healthcheck.run(t.w, follow="none", repair="inline")
    assert time.monotonic() - t0 < 20
    assert outcome.repairs == ["reset:failed", "reboot:start"]
    reset = [r for r in records(t, "repair-reset") if r["result"] == "failed"][0]
    assert "--gpu-reset -i 3" in reset["detail"] and "timed out" in reset["detail"]
    assert [a.rung for a in repair.load(t.w).attempts] == ["reset"]
    assert services(t) == {"nvidia-fabricmanager": "active", "nvidia-dcgm": "active"}


def test_every_call_is_bounded_by_the_workers_budget(tmp_path):
    t = _bed(tmp_path, "reset_timeout = 60.0\n")
    sim.inject(t.sim_dir, "n1", 3, row_remap_pending=True, reset_hang=30)
    t.w.start_deadline(2.0)  # what is left of the worker's budget
    t0 = time.monotonic()
    _, outcome = healthcheck.run(t.w, follow="none", repair="inline")
    assert time.monotonic() - t0 < 20, "the 60 s per-call timeout was cut to the budget"
    assert outcome.repairs[0] == "reset:failed"
    assert services(t) == {"nvidia-fabricmanager": "active", "nvidia-dcgm": "active"}, \
        "the restart gets its cleanup time even past the budget"


def test_services_a_dead_worker_left_stopped_are_started_by_the_next_hook_run(t):
    for name in SERVICES:
        sim.set_service(t.sim_dir, "n1", name, False)
    repair.save(t.w, replace(repair.load(t.w), stopped=Stopped(tuple(SERVICES), time.time(), 999999)))
    report, outcome = healthcheck.run(t.w, follow="none")  # a plain health check, the node healthy
    assert report.healthy and outcome.repairs == []
    assert services(t) == {"nvidia-fabricmanager": "active", "nvidia-dcgm": "active"}
    assert repair.load(t.w).stopped is None and "stopped" not in repair.load(t.w).to_json()
    rec = records(t, "repair-services")
    assert [(r["result"], r["services"]) for r in rec] == [("ok", SERVICES)]


def test_stopped_services_are_left_to_the_worker_that_still_holds_the_lock(t):
    import fcntl
    import os

    sim.set_service(t.sim_dir, "n1", "nvidia-dcgm", False)
    repair.save(t.w, replace(repair.load(t.w), stopped=Stopped(("nvidia-dcgm",), time.time(), os.getpid())))
    fd = os.open(t.w.state_path("repair-n1.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        healthcheck.run(t.w, follow="none")
    finally:
        os.close(fd)
    assert services(t)["nvidia-dcgm"] == "inactive"


def test_after_a_reset_the_node_returns_only_once_the_diagnostic_passed(t):
    sim.inject(t.sim_dir, "n1", 3, row_remap_pending=True)
    _, outcome = healthcheck.run(t.w, follow="none", repair="inline")
    assert outcome.repairs == ["reset:ok"] and outcome.resumed
    validate = records(t, "repair-validate")
    assert [(r["result"], r["level"]) for r in validate] == [("start", 2), ("ok", 2)]
    assert validate[1]["detail"] == "DCGM diag L2 passed"


def test_a_diagnostic_that_fails_after_the_reset_keeps_the_node_drained_and_climbs(t):
    sim.inject(t.sim_dir, "n1", 3, row_remap_pending=True)
    sim.inject(t.sim_dir, "n1", 3, diag_failure=2)  # latent: NVML sees only the row remap
    _, outcome = healthcheck.run(t.w, follow="none", repair="inline")
    assert outcome.repairs == ["reset:failed", "reboot:start"] and not outcome.resumed
    failed = [r for r in records(t, "repair-validate") if r["result"] == "failed"][0]
    assert failed["gpus"] == [3] and "memory" in failed["detail"]
    assert t.slurm.peek("n1").drained


@pytest.mark.parametrize("setup,why", [
    ("absent", "DCGM not installed"),
    ("hostengine", "nv-hostengine not reachable"),
    ("slow", "did not finish within our"),
])
def test_a_diagnostic_that_could_not_run_is_unverified_never_a_pass(tmp_path, setup, why):
    t = _bed(tmp_path, "validate_timeout = 1.0\n", dcgmi=setup != "absent",
             services=SERVICES[:1] if setup == "hostengine" else SERVICES)
    sim.inject(t.sim_dir, "n1", 3, row_remap_pending=True)
    if setup == "slow":
        sim.set_diag_seconds(t.sim_dir, "n1", 10.0)
    if setup == "hostengine":
        sim.set_service(t.sim_dir, "n1", "nvidia-dcgm", False)  # DCGM's host engine is down
    _, outcome = healthcheck.run(t.w, follow="none", repair="inline")
    assert outcome.repairs == ["reset:unverified"] and not outcome.resumed
    node = t.slurm.peek("n1")
    assert node.drained and node.reason == "slurm-hooks: row remap pending on GPU 3 [unverified]"
    detail = [r for r in records(t, "repair-validate") if r["result"] == "unverified"][0]["detail"]
    assert why in detail
    # Later health checks leave it for a person: no resume, no new reset.
    _, later = healthcheck.run(t.w, follow="none", repair="inline")
    assert later.repairs == [] and not later.resumed and t.slurm.peek("n1").drained
    assert sim.gpu_entry(sim.read(t.sim_dir, "n1"), 3)["resets"] == 1


def test_a_person_validates_a_node_and_it_returns_only_on_a_pass(t):
    assert repairs.validate_node(t.w, "alice", healthcheck.rejudge(t.w)) == "ok"
    assert ("drain", "n1", "slurm-hooks: validation asked by alice [validating]") in t.slurm.called("drain")
    assert t.slurm.peek("n1").state == "IDLE" and not t.slurm.peek("n1").reason
    sim.inject(t.sim_dir, "n1", 5, diag_failure=1)
    assert repairs.validate_node(t.w, "alice", healthcheck.rejudge(t.w)) == "failed"
    node = t.slurm.peek("n1")
    assert node.drained and node.reason == "slurm-hooks: DCGM diag L2 failed on GPU 5 [reset]"


def test_with_no_diagnostic_configured_the_nvml_check_alone_returns_the_node(tmp_path):
    t = _bed(tmp_path, "dcgm_level = 0\n", dcgmi=False)
    sim.inject(t.sim_dir, "n1", 3, row_remap_pending=True)
    _, outcome = healthcheck.run(t.w, follow="none", repair="inline")
    assert outcome.repairs == ["reset:ok"] and outcome.resumed and records(t, "repair-validate") == []


def test_the_hook_holds_a_node_whose_reboot_is_pending_without_starting_a_worker(t):
    sim.inject(t.sim_dir, "n1", 0, xid=79)
    _, outcome = healthcheck.run(t.w, follow="none", repair="inline")
    assert outcome.repairs == ["reboot:start"]
    _, again = healthcheck.run(t.w, follow="none")  # the hooks' own mode: a worker only when one is due
    assert again.repairs == [] and not again.failed and len(t.slurm.called("reboot")) == 1


def test_while_a_worker_holds_the_node_the_health_check_does_not_touch_the_gpus(t):
    import fcntl

    class Counting:
        name = "counting"
        calls = 0

        def snapshot(self):
            Counting.calls += 1
            raise AssertionError("probed during a repair")

    repair.save(t.w, repair.load(t.w))  # a repair ran on this node
    fd = os.open(t.w.state_path("repair-n1.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)  # the worker
    try:
        w = Wiring(t.w.config, "n1", t.audit, probe_override=Counting(), slurm_override=t.slurm)
        report, outcome = healthcheck.run(w, follow="none")
    finally:
        os.close(fd)
    assert Counting.calls == 0 and outcome.repairs == ["worker:busy"] and t.slurm.calls == []


@pytest.mark.parametrize("tries,result", [(1, "ok"), (2, "unverified")])
def test_a_validation_whose_worker_died_is_run_again_then_given_up_unverified(t, tries, result):
    reason = "slurm-hooks: row remap pending on GPU 3 [validating]"
    t.slurm.set_node("n1", state="IDLE+DRAIN", reason=reason)
    ownership.write_marker(t.w, reason, None)
    repair.save(t.w, replace(repair.load(t.w), validating=Validating(time.time(), "reset", tries,
                                                                     "row remap pending on GPU 3", "running", reason)))
    _, outcome = healthcheck.run(t.w, follow="none", repair="inline")
    assert outcome.repairs == [f"validate:{result}"]
    node = t.slurm.peek("n1")
    if result == "ok":
        assert outcome.resumed and node.state == "IDLE" and repair.load(t.w).validating is None
    else:
        assert node.drained and node.reason == "slurm-hooks: row remap pending on GPU 3 [unverified]"
