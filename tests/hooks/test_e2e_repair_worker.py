"""The repair worker on the real testbed: the HealthCheckProgram hands the repair over and
returns, the worker outlives the hook's limit, services come back, validation decides.

A cluster of its own (one module). slurmd runs no periodic health check here
(HealthCheckInterval=0): each test runs the HealthCheckProgram itself, exactly as slurmd
does (the testbed's wrapper, SLURMD_NODENAME, slurmd's environment), so that its time can
be measured and the runs counted. The GPUs' reset, services and DCGM diagnostic are the
sim's stand-ins for nvidia-smi, systemctl and dcgmi (``slurm-hooks sim tools``).
"""

from __future__ import annotations

import json
import os
import time

import pytest
from conftest import audit_records, own_testbed, wait_for

from slurm_hooks.lab.testbed import MARKER, LabSettings
from slurm_hooks.probes import sim
from slurm_hooks.runner import run_command

pytestmark = pytest.mark.slurm

SERVICES = ("nvidia-fabricmanager", "nvidia-dcgm")
#: Past slurmd's 60 s kill of the HealthCheckProgram (and our 45 s [check] deadline).
HANG_S = 62.0
SETTINGS = LabSettings(nodes=2, gpus=8, hooks=True, kill_wait=2, health_check_interval=0, requeue_grace=3.0,
                    repair=True, reset_timeout=HANG_S + 40)


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    with own_testbed(tmp_path_factory, "workerbed", SETTINGS) as tb:
        try:
            yield tb
        finally:
            tb.stop_repair_workers()


@pytest.fixture
def tb(bed):
    bed.reset()
    return bed


def health_check(tb, node="n1") -> float:
    """Run the HealthCheckProgram as slurmd does; returns how long it took."""
    env = {**tb.env(), "SLURMD_NODENAME": node, MARKER: tb.state_dir}
    t0 = time.monotonic()
    run_command([tb.path("bin", "healthcheck")], 70, env=env, check=False)
    return time.monotonic() - t0


def records(tb, action):
    return [r for r in audit_records(tb.audit_log) if action is None or r.get("action") == action]


def results(tb, action):
    return [r["result"] for r in records(tb, action)]


def services(tb, node="n1"):
    state = sim.read(tb.sim_dir, node)
    return {s: sim.service_state(state, s) for s in SERVICES}


def attempts(tb, node="n1"):
    try:
        with open(os.path.join(tb.hooks_state_dir, f"repair-{node}.json"), encoding="utf-8") as fh:
            return [(a["rung"], a["result"]) for a in json.load(fh)["attempts"]]
    except FileNotFoundError:
        return []


def wait(pred, timeout, what, tb=None):
    seen = (lambda: f"n1 {tb.slurm().node('n1')}; audit {[(r['action'], r['result']) for r in records(tb, None)]}") \
        if tb is not None else None
    return wait_for(pred, timeout, what, interval=0.3, seen=seen)


def test_a_reset_hanging_past_the_hooks_limit_runs_in_the_worker_and_the_node_returns_validated(tb):
    sim.inject(tb.sim_dir, "n1", 3, row_remap_pending=True, reset_hang=HANG_S)
    took = health_check(tb)
    assert took < 15, f"the health check took {took:.1f}s: it must hand the reset over and return"
    assert results(tb, "repair-worker") == ["start"]
    wait(lambda: set(services(tb).values()) == {"inactive"}, 20, "the services stopped around the reset")
    again = health_check(tb)  # while the worker hangs in nvidia-smi --gpu-reset
    assert again < 15 and results(tb, "repair-worker") == ["start"], "one worker per node"
    assert attempts(tb) == [("reset", "started")], "counted before the reset acts"
    wait(lambda: "ok" in results(tb, "repair-reset"), HANG_S + 60, "the reset done by the worker", tb)
    node = tb.wait_node("n1", lambda n: n.state.upper() == "IDLE" and (not n.reason or tb.keeps_reasons), timeout=15)
    assert node.state.upper() == "IDLE"
    assert services(tb) == {s: "active" for s in SERVICES}
    assert attempts(tb) == [("reset", "ok")], "the attempt counted once"
    validate = records(tb, "repair-validate")
    assert [r["result"] for r in validate] == ["start", "ok"]
    assert validate[0]["reason"] == "slurm-hooks: row remap pending on GPU 3 [validating]"
    worker = records(tb, "repair-worker")
    assert [r["result"] for r in worker] == ["start", "done"] and worker[1]["duration_s"] > HANG_S


def test_a_killed_workers_services_are_restarted_by_the_next_run_and_its_attempt_counted(tb):
    sim.inject(tb.sim_dir, "n1", 3, row_remap_pending=True, reset_hang=600)
    health_check(tb)
    wait(lambda: set(services(tb).values()) == {"inactive"}, 20, "the services stopped around the reset", tb)
    assert tb.stop_repair_workers(), "the worker was running"
    time.sleep(1)
    assert set(services(tb).values()) == {"inactive"}, "nobody restarted them yet"
    took = health_check(tb)
    assert took < 15
    assert services(tb) == {s: "active" for s in SERVICES}
    restored = records(tb, "repair-services")
    assert [(r["result"], r["services"]) for r in restored] == [("ok", list(SERVICES))]
    assert attempts(tb)[0] == ("reset", "started")
    # The killed reset counted: the ladder climbs to the reboot instead of resetting again.
    wait(lambda: "start" in results(tb, "repair-reboot"), 30, "the next rung", tb)
    assert results(tb, "repair-reset") == ["start"]
    assert sim.gpu_entry(sim.read(tb.sim_dir, "n1"), 3).get("resets", 0) == 0
    _let_the_reboot_finish(tb)


def _let_the_reboot_finish(tb):
    """The ladder's reboot goes through Slurm: let it end, so that the next test starts clean."""
    wait(lambda: sim.read(tb.sim_dir, "n1").get("boots", 0) == 1, 40, "the node rebooted", tb)
    tb.wait_node("n1", lambda n: not any(f.startswith("REBOOT") for f in n.flags), timeout=40)


def test_the_node_stays_validating_until_the_diagnostic_passes(tb):
    sim.inject(tb.sim_dir, "n1", 3, row_remap_pending=True)
    sim.set_diag_seconds(tb.sim_dir, "n1", 6.0)
    health_check(tb)
    node = tb.wait_node("n1", lambda n: n.reason.endswith("[validating]"), timeout=20)
    assert node.drained and node.reason == "slurm-hooks: row remap pending on GPU 3 [validating]"
    assert health_check(tb) < 15
    assert tb.slurm().node("n1").reason.endswith("[validating]"), "a health check meanwhile does not resume it"
    tb.wait_node("n1", lambda n: n.state.upper() == "IDLE" and (not n.reason or tb.keeps_reasons), timeout=30)
    assert results(tb, "repair-validate") == ["start", "ok"]


def test_with_the_diagnostic_failing_the_node_stays_out(tb):
    sim.inject(tb.sim_dir, "n1", 3, row_remap_pending=True)
    sim.inject(tb.sim_dir, "n1", 3, diag_failure=2)
    health_check(tb)
    wait(lambda: "failed" in results(tb, "repair-validate"), 30, "the diagnostic's verdict", tb)
    failed = [r for r in records(tb, "repair-validate") if r["result"] == "failed"][0]
    assert failed["gpus"] == [3]
    node = tb.slurm().node("n1")
    assert node.reason.startswith("slurm-hooks: ") and (node.drained or "DOWN" in node.state.upper())
    # The ladder climbs: the reboot comes through Slurm.
    wait(lambda: "start" in results(tb, "repair-reboot"), 30, "the reboot requested", tb)
    _let_the_reboot_finish(tb)
    assert not tb.slurm().node("n1").state.upper().startswith("IDLE") or tb.slurm().node("n1").drained


def test_with_dcgmi_absent_the_node_stays_drained_unverified(tb):
    dcgmi = tb.path("bin", "dcgmi")
    os.rename(dcgmi, dcgmi + ".away")
    try:
        sim.inject(tb.sim_dir, "n1", 3, row_remap_pending=True)
        health_check(tb)
        node = wait(lambda: (lambda n: n if n.reason.endswith("[unverified]") else None)(tb.slurm().node("n1")),
                    30, "the node drained [unverified]", tb)
        assert node.drained and node.reason == "slurm-hooks: row remap pending on GPU 3 [unverified]"
        detail = [r for r in records(tb, "repair-validate") if r["result"] == "unverified"][0]["detail"]
        assert "DCGM not installed" in detail
        health_check(tb)
        assert tb.slurm().node("n1").reason.endswith("[unverified]"), "no pass without a diagnostic"
    finally:
        os.rename(dcgmi + ".away", dcgmi)


def test_a_person_validates_a_node_on_it_and_it_returns_only_on_a_pass(tb):
    import subprocess
    import sys

    def validate():
        return subprocess.run([sys.executable, "-m", "slurm_hooks", "repair", "--validate", "--node", "n1"],
                              capture_output=True, text=True, env={**tb.env(), "SLURMD_NODENAME": "n1"}, timeout=120)

    done = validate()
    assert done.returncode == 0 and "validated" in done.stdout, done.stdout + done.stderr
    assert [(r["result"], r["after"]) for r in records(tb, "repair-validate")] == [("start", "request"), ("ok", "request")]
    node = tb.slurm().node("n1")
    assert node.base_state == "IDLE" and not node.drained and (not node.reason or tb.keeps_reasons)  # 24.11 keeps it
    sim.inject(tb.sim_dir, "n1", 5, diag_failure=2)
    done = validate()
    assert done.returncode == 1, done.stdout + done.stderr
    node = tb.slurm().node("n1")
    assert node.drained and node.reason.startswith("slurm-hooks: DCGM diag L2 failed on GPU 5 [reset")
