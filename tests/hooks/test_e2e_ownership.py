"""Whose drain is it, on real Slurm: kept reasons (23.11+ without accounting: Debian 13's 24.11),
Slurm's suffixes, a lost state dir, [replace] that ends, and a cluster without RebootProgram.

The health check is run by hand (`slurm-hooks check` as slurmd runs it), so each step is one
check at a known moment; slurmd's own periodic check is off (HealthCheckInterval=0) and the
wrapper it would run at start does nothing, so no check runs behind the test's back. A rung
runs in the detached repair worker the check starts: the tests wait for its audit records.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from conftest import audit_records, wait_for

from slurm_hooks.lab.testbed import LabSettings, Testbed, hook_interpreter
from slurm_hooks.probes import sim

pytestmark = pytest.mark.slurm

BASE = LabSettings(nodes=2, gpus=4, hooks=True, kill_wait=2, health_check_interval=0, repair=True,
                requeue_grace=2.0, resume_timeout=60, slurmd_timeout=10)


def _bed(tmp_path_factory, name, **changes):
    if os.geteuid() != 0:
        pytest.skip("the Slurm testbed needs root")
    tb = Testbed(str(tmp_path_factory.mktemp(name)), dataclasses.replace(BASE, **changes))
    try:
        tb.up()
        with open(tb.path("bin", "healthcheck"), "w", encoding="utf-8") as fh:
            fh.write("#!/bin/sh\nexit 0\n")  # slurmd's own runs (at start): none; the test runs each check
    except BaseException:
        tb.down()
        raise
    return tb


@pytest.fixture(scope="module", params=[False, True], ids=["no-accounting", "accounting"])
def bed(request, tmp_path_factory):
    tb = _bed(tmp_path_factory, "ownbed-acct" if request.param else "ownbed", accounting=request.param)
    try:
        yield tb
    finally:
        tb.down()


@pytest.fixture
def tb(bed):
    bed.reset()
    with open(bed.path("bin", "healthcheck"), "w", encoding="utf-8") as fh:
        fh.write("#!/bin/sh\nexit 0\n")
    return bed


def hook_env(tb, node: str) -> dict[str, str]:
    """The environment slurmd gives a hook on ``node``, with this checkout on the path."""
    return {"SLURMD_NODENAME": node, "SLURM_CONF": tb.slurm_conf, "SLURM_HOOKS_CONFIG": tb.config_path,
            "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(sim.__file__)))}


def check(tb, node="n1") -> subprocess.CompletedProcess:
    """`slurm-hooks check` exactly as the testbed's wrapper runs it for slurmd, and then the repair
    worker it handed a due rung to (detached), to its end: one step of the ladder per call."""
    done = subprocess.run([hook_interpreter(), "-m", "slurm_hooks", "check", "--config", tb.config_path],
                          env=hook_env(tb, node), capture_output=True, text=True, timeout=60)
    wait(lambda: _workers_done(tb), 60, "the repair worker's end")
    return done


def _workers_done(tb) -> bool:
    worker = results(tb, "repair-worker")
    return worker.count("start") <= worker.count("done") + worker.count("failed")


def records(tb, action=None):
    return [r for r in audit_records(tb.audit_log)
            if r.get("kind") == "action" and (action is None or r.get("action") == action)]


def results(tb, action):
    return [r["result"] for r in records(tb, action)]


def node(tb, name="n1"):
    return tb.slurm().node(name)


def wait(pred, timeout, what):
    return wait_for(pred, timeout, what, interval=0.2)


def wait_rebooted(tb, boots, name="n1"):
    """Our RebootProgram ran (the sim booted) and Slurm has the node back (no reboot pending)."""
    wait(lambda: sim.read(tb.sim_dir, name).get("boots", 0) >= boots, 40, f"{name} rebooted")
    return wait(lambda: (lambda n: n if not n.reboot_pending and "NOT_RESPONDING" not in n.flags
                         and not n.state.endswith("*") else None)(node(tb, name)), 60, f"{name} back from its reboot")


def replaced(tb, gpu=3):
    """A failed row remap: drained [replace] by the check, the rung recorded by its worker."""
    sim.inject(tb.sim_dir, "n1", gpu, row_remap_failure=True)
    check(tb)
    wait(lambda: "ok" in results(tb, "repair-replace") and "done" in results(tb, "repair-worker"), 60,
         "the worker's [replace]")
    assert node(tb).drained and node(tb).reason.endswith("[replace]"), node(tb)


def wipe_state(tb):
    shutil.rmtree(tb.hooks_state_dir, ignore_errors=True)
    os.makedirs(tb.hooks_state_dir, mode=0o700)


@contextlib.contextmanager
def failing_prolog(tb):
    path = tb.path("bin", "prolog")
    with open(path, encoding="utf-8") as fh:
        real = fh.read()
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("#!/bin/sh\nexit 1\n")
    try:
        yield
    finally:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(real)


# --- kept reasons -------------------------------------------------------------------------


def test_prolog_error_and_an_admin_reboot_over_our_old_text_are_neither_resumed_nor_cancelled(tb):
    # Our drain, the fault cleared (by the ladder's GPU reset), our resume.
    sim.inject(tb.sim_dir, "n1", 2, row_remap_pending=True)
    check(tb)
    wait(lambda: results(tb, "resume") == ["ok"], 60, "n1 reset, validated and resumed by the worker")
    ours = records(tb, "resume")[0]["reason"]  # the last text of ours: what 23.11+ keeps after a resume
    after = node(tb)
    assert not after.drained and after.reason == (ours if tb.keeps_reasons else ""), after
    # Slurm drains the node itself: a prolog fails.
    with failing_prolog(tb):
        job = tb.sbatch("#!/bin/sh\nsleep 1\n", "-w", "n1")
        wait(lambda: node(tb).drained, 30, "n1 drained by Slurm for the prolog error")
    tb.scontrol("update", f"JobId={job}", "Priority=0")  # keep it from landing on n1 again
    drained = node(tb)
    assert "Prolog error" in drained.reason or drained.reason == ours, drained
    for _ in range(2):
        check(tb)
    assert node(tb).drained and results(tb, "resume") == ["ok"], records(tb, "resume")
    # A person resumes it, then asks for a reboot without a reason: our old text may be kept again.
    tb.scontrol("update", "NodeName=n1", "State=RESUME")
    wait(lambda: not node(tb).drained, 10, "n1 resumed by the admin")
    boots = sim.read(tb.sim_dir, "n1").get("boots", 0)
    tb.scontrol("reboot", "ASAP", "n1")
    check(tb)  # at once, while the reboot is pending
    assert results(tb, "resume") == ["ok"], records(tb, "resume")
    wait_rebooted(tb, boots + 1)  # not cancelled: it happened
    assert not any(r.get("result") == "ok" for r in records(tb, "resume")[1:])


# --- Slurm's suffixes on our drain ----------------------------------------------------------


def test_our_drain_gets_not_responding_while_slurmd_hangs_and_is_resumed_once_healthy(tb):
    replaced(tb, 1)  # starts at [replace]: no repair to run
    pid = tb._pid("slurmd n1")
    os.kill(pid, signal.SIGSTOP)  # unresponsive, not dead
    try:
        seen = wait(lambda: (lambda n: n if "Not responding" in n.reason or n.base_state == "DOWN" else None)(
            node(tb)), 60, "n1 marked not responding")
    finally:
        os.kill(pid, signal.SIGCONT)
    assert seen.reason.startswith(records(tb, "drain")[0]["reason"]), seen
    wait(lambda: "NOT_RESPONDING" not in node(tb).flags and not node(tb).state.endswith("*"), 60, "n1 answers")
    sim.replace(tb.sim_dir, "n1", 1)  # new hardware ends our [replace]
    check(tb)
    back = wait(lambda: (lambda n: n if not n.drained and n.base_state == "IDLE" else None)(node(tb)), 60,
                "n1 back in service")
    assert back and "ok" in results(tb, "resume")


# --- a lost state dir -----------------------------------------------------------------------


def test_state_dir_wiped_after_our_reboot_healthy_node_comes_back(tb):
    sim.inject(tb.sim_dir, "n1", 0, xid=79)
    check(tb)
    wait_rebooted(tb, 1)
    assert "slurm-hooks: XID 79 on GPU 0 [reboot 1/1]" in [r.get("reason") for r in records(tb, "repair-reboot")]
    wipe_state(tb)  # a diskless node: marker and ladder state gone with the boot
    check(tb)
    back = wait(lambda: (lambda n: n if not n.drained and n.base_state == "IDLE" else None)(node(tb)), 20,
                "n1 back in service")
    assert back


def test_state_dir_wiped_after_our_reboot_a_persisting_fault_reaches_replace_without_a_loop(tb):
    sim.inject(tb.sim_dir, "n1", 0, xid=79, cleared_by="never")
    check(tb)
    wait_rebooted(tb, 1)
    wipe_state(tb)
    check(tb)
    wait(lambda: node(tb).reason == "slurm-hooks: XID 79 on GPU 0 [replace]", 60, "n1 tagged [replace]")
    for _ in range(2):
        wipe_state(tb)
        check(tb)
        time.sleep(1)
    assert sim.read(tb.sim_dir, "n1")["boots"] == 1 and not node(tb).reboot_pending
    assert node(tb).drained


# --- [replace] ends ---------------------------------------------------------------------


def rma_clear(tb, gpu: int, node_name: str = "n1") -> None:
    """A person's `slurm-hooks rma clear` on the node: the GPU is known good, its mark ends."""
    done = subprocess.run([hook_interpreter(), "-m", "slurm_hooks", "rma", "clear", "--config", tb.config_path,
                           "--node", node_name, "--gpu", str(gpu)], env=hook_env(tb, node_name),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, (done.stdout, done.stderr)


def test_replace_then_a_persons_resume_and_clear_then_a_new_remap_pending_is_reset_and_back_idle(tb):
    replaced(tb)
    sim.clear(tb.sim_dir, "n1", 3)
    tb.scontrol("update", "NodeName=n1", "State=RESUME")  # a person mended it
    wait(lambda: not node(tb).drained, 10, "n1 resumed by a person")
    rma_clear(tb, 3)  # and says the GPU is good: the ladder starts afresh on its next fault
    sim.inject(tb.sim_dir, "n1", 3, row_remap_pending=True)
    check(tb)
    wait(lambda: "ok" in results(tb, "repair-reset"), 60, "the worker's reset")
    back = wait(lambda: (lambda n: n if not n.drained and n.base_state == "IDLE" else None)(node(tb)), 60,
                "n1 back IDLE after the reset")
    assert back


def test_replace_then_a_persons_resume_without_clearing_then_a_new_fault_is_replace_again(tb):
    """The GPU stays marked for replacement through a person's resume: a new fault on it goes back
    to [replace] at once, with no reset or reboot of a GPU already judged for replacement."""
    replaced(tb)
    sim.clear(tb.sim_dir, "n1", 3)
    tb.scontrol("update", "NodeName=n1", "State=RESUME")
    wait(lambda: not node(tb).drained, 10, "n1 resumed by a person")
    sim.inject(tb.sim_dir, "n1", 3, row_remap_pending=True)
    check(tb)
    wait(lambda: node(tb).drained and node(tb).reason.endswith("[replace]"), 60, "n1 [replace] again")
    assert "ok" not in results(tb, "repair-reset")


def test_replace_stays_while_the_same_gpu_passes_and_ends_with_new_hardware(tb):
    replaced(tb)
    sim.clear(tb.sim_dir, "n1", 3)  # the same GPU passes now
    for _ in range(2):
        check(tb)
    assert node(tb).drained and "ok" not in results(tb, "resume")
    sim.replace(tb.sim_dir, "n1", 3)
    check(tb)
    back = wait(lambda: (lambda n: n if not n.drained and n.base_state == "IDLE" else None)(node(tb)), 60,
                "n1 back in service with new hardware")
    assert back and "ended" in results(tb, "repair-replace")


# --- no RebootProgram ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def noreboot(tmp_path_factory):
    tb = _bed(tmp_path_factory, "noreboot", reboot_program=False)
    try:
        yield tb
    finally:
        tb.down()


def test_without_reboot_program_xid79_leaves_one_reboot_attempt_and_validate_names_the_line(noreboot):
    tb = noreboot
    tb.reset()
    sim.inject(tb.sim_dir, "n1", 0, xid=79)
    check(tb)
    wait(lambda: "ok" in results(tb, "repair-replace"), 60, "the refused reboot counted, then [replace]")
    for _ in range(2):
        check(tb)
        time.sleep(1)
    assert results(tb, "repair-reboot") == ["refused"], records(tb)
    n1 = node(tb)
    assert n1.drained and n1.reason == "slurm-hooks: XID 79 on GPU 0 [replace]", n1
    why = next(r for r in records(tb, "repair-replace") if r["result"] == "ok")["why"]
    assert "a person must act" in why and "RebootProgram" in why
    done = subprocess.run([sys.executable, "-m", "slurm_hooks", "validate", "--config", tb.config_path,
                           "--slurm-conf", tb.slurm_conf], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **tb.env()})
    assert done.returncode == 1
    line = next(ln for ln in done.stdout.splitlines() if "reboot-program" in ln)
    assert line.startswith("FAIL") and f"{tb.config_path}:" in line and "RebootProgram is not set" in line
