"""Beside NHC on the real testbed: LBNL NHC is the HealthCheckProgram (every 5 s, from its
tarball, run from its unpacked tree) and calls ``check_slurm_hooks`` first; our prolog and
epilog as usual; NHC's own site check (``check_file_test``) second.

Nothing here calls the health check by hand: every drain, requeue and resume below was done
inside one of NHC's runs, as slurmd started them.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from dataclasses import replace
from types import SimpleNamespace

import pytest
from conftest import audit_records, own_testbed, wait_for
from hooks.test_e2e_slurm import TRAP_JOB, wait_running_elsewhere, wait_started
from paths import ROOT

from slurm_hooks.lab import nhc
from slurm_hooks.lab.testbed import LabSettings, Testbed
from slurm_hooks.probes import sim

pytestmark = pytest.mark.slurm

INTERVAL = 5


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    tarball = nhc.find_source(ROOT)
    if tarball is None:
        pytest.skip(f"NHC's source is neither named by ${nhc.SOURCE_ENV} (a mej/nhc checkout or tarball) nor "
                    "beside the project (../shared/third_party/lbnl-nhc-*.tar.gz)")
    settings = LabSettings(nodes=2, gpus=8, hooks=True, kill_wait=2, health_check_interval=INTERVAL,
                        requeue_grace=3.0, nhc=tarball)
    with own_testbed(tmp_path_factory, "nhcbed", settings) as tb:
        yield tb


@pytest.fixture
def tb(bed):
    bed.set_nhc_check(nhc.CHECK)
    bed.reset()
    return bed


def nhc_runs(tb, node: str) -> int:
    """NHC runs on ``node`` that reached our check, from NHC's own log (VERBOSE)."""
    try:
        with open(tb.path("log", f"nhc-{node}.log"), encoding="utf-8", errors="replace") as fh:
            return fh.read().count('Running check:  "check_slurm_hooks')
    except FileNotFoundError:
        return 0


def wait_runs(tb, node: str, count: int, timeout: float = 4 * INTERVAL + 10) -> None:
    """Until NHC has run our check ``count`` more times on ``node``, and the last of those runs has ended."""
    target = nhc_runs(tb, node) + count
    deadline = time.monotonic() + timeout
    while nhc_runs(tb, node) < target:
        assert time.monotonic() < deadline, f"NHC ran our check {nhc_runs(tb, node)} of {target} times on {node}"
        time.sleep(0.2)
    # the run that reached our check finishes with NHC's own marking (a second at most here)
    deadline = time.monotonic() + 15
    while tb._hook_runs() and time.monotonic() < deadline:
        time.sleep(0.1)


def syslog(tb, tag: str) -> list[str]:
    try:
        with open(tb.syslog, encoding="utf-8") as fh:
            return [line for line in fh.read().splitlines() if line.split(" ", 2)[1].startswith(tag)]
    except FileNotFoundError:
        return []


def records(tb, action: str) -> list[dict]:
    return [r for r in audit_records(tb.audit_log) if r.get("kind") == "action" and r.get("action") == action]


def reason_of(tb, node: str) -> tuple[bool, str]:
    info = tb.slurm().node(node)
    return info.drained, info.reason


def idle_without_reason(tb, node: str) -> bool:
    """Back in service: IDLE and not drained; without a reason where Slurm clears it on resume
    (23.11+ without accounting keeps it: ``Testbed.keeps_reasons``)."""
    info = tb.slurm().node(node)
    return info.state.upper() == "IDLE" and (tb.keeps_reasons or not info.reason)


def test_healthy_nodes_stay_idle_with_nhc_running_our_check(tb):
    for node in tb.node_names:
        wait_runs(tb, node, 2)
    for info in tb.slurm().nodes():
        assert info.state.upper() == "IDLE" and not info.reason, info
    assert records(tb, "drain") == [] and syslog(tb, "slurm-hooks:") == [] and syslog(tb, "nhc[") == []


def test_xid79_under_a_job_on_n1_is_drained_by_us_requeued_and_resumed_by_us_inside_nhc(tb):
    bed = SimpleNamespace(slurm=tb.slurm(), job_output=tb.job_output)  # what test_e2e_slurm's helpers read
    job = tb.sbatch(TRAP_JOB, "--gres=gpu:1", "--requeue", "--open-mode=append")
    bad, gpu = wait_started(bed, job)
    assert bad == "n1"  # Slurm's first choice on an idle testbed
    sim.inject(tb.sim_dir, "n1", gpu, xid=79)
    injected = time.monotonic()
    moved = wait_running_elsewhere(bed, job, "n1", timeout=20)
    took = time.monotonic() - injected
    assert moved.nodes == "n2" and took < 20, (moved, took)
    drained, reason = reason_of(tb, "n1")
    assert drained and reason == f"slurm-hooks: XID 79 on GPU {gpu} [reboot]", reason
    assert [r["result"] for r in records(tb, "requeue")] == ["ok"]
    wait_runs(tb, "n1", 2)  # NHC runs on with our drain in place, and never drains n1 itself
    assert reason_of(tb, "n1") == (True, reason)
    assert syslog(tb, "nhc[") == [] and syslog(tb, "slurm-hooks:") == []

    sim.clear(tb.sim_dir, "n1")
    cleared = time.monotonic()
    wait_for(lambda: idle_without_reason(tb, "n1"), 3 * INTERVAL + 10, "n1 not resumed after the fault cleared")
    print(f"XID 79 -> job running on n2: {took:.1f}s; fault cleared -> n1 IDLE: {time.monotonic() - cleared:.1f}s")
    assert [r["result"] for r in records(tb, "resume")] == ["ok"]


def test_nhcs_own_failing_site_check_drains_n2_with_nhc_which_we_never_resume(tb):
    tb.nhc_site_fault("n2", True)
    drained = wait_for(lambda: reason_of(tb, "n2")[0] and reason_of(tb, "n2")[1], 3 * INTERVAL + 10,
                       "NHC did not drain n2")
    assert re.fullmatch(r"NHC: check_file_test: +-e \S+/n2\.ok returned 1\.", drained), drained
    wait_runs(tb, "n2", 3)  # our check runs first in each of them, on a node with healthy GPUs
    assert reason_of(tb, "n2") == (True, drained)
    assert records(tb, "resume") == [] and records(tb, "drain") == []
    assert idle_without_reason(tb, "n1")

    tb.nhc_site_fault("n2", False)
    wait_for(lambda: idle_without_reason(tb, "n2"), 3 * INTERVAL + 10, "NHC did not resume n2")
    assert records(tb, "resume") == []  # NHC did, not us


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> str:
    """An interpreter without slurm-hooks: a venv the package was removed from."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    return str(venv / "bin" / "python")


@pytest.mark.parametrize("mode", [nhc.CHECK, f"{nhc.CHECK} -r"])
def test_a_broken_install_of_ours_drains_nothing_and_says_so_in_syslog(tb, mode, bare_python):
    tb.set_nhc_check(mode)
    sim.inject(tb.sim_dir, "n1", 3, xid=79)  # what a working report mode would drain at once
    tb.install(bare_python)  # `slurm-hooks install` from a venv that lacks the package: a bad push
    wait_runs(tb, "n1", 2)
    for info in tb.slurm().nodes():
        assert not info.drained and not info.reason, info
    lines = syslog(tb, "slurm-hooks:")
    assert lines, syslog(tb, "")
    assert len(lines) <= nhc_runs(tb, "n1") + nhc_runs(tb, "n2")  # one line per run at most
    assert all("slurm-hooks check could not run (exit 1): the node stays in service" in line for line in lines), lines
    assert syslog(tb, "nhc[") == []


def test_report_mode_lets_nhc_drain_with_our_reason_and_resume_once_clear(tb):
    tb.set_nhc_check(f"{nhc.CHECK} -r")
    sim.inject(tb.sim_dir, "n1", 3, xid=79)
    wait_for(lambda: reason_of(tb, "n1")[0], 3 * INTERVAL + 10, "NHC did not drain n1")
    assert reason_of(tb, "n1") == (True, "NHC: slurm-hooks: XID 79 on GPU 3")
    assert records(tb, "drain") == [] and records(tb, "requeue") == []  # we act on nothing
    sim.clear(tb.sim_dir, "n1")
    wait_for(lambda: idle_without_reason(tb, "n1"), 3 * INTERVAL + 10, "NHC did not resume n1")
    assert records(tb, "resume") == []


def test_a_gpu_fault_and_a_site_fault_on_one_node_each_owner_resumes_only_its_own(tb):
    """NHC's offline helper keeps a reason it did not write: with both faults our drain stands;
    our resume lifts it once the GPU is mended, then NHC drains for its own check and resumes
    the node once that passes."""
    if tb.keeps_reasons:
        pytest.skip("this Slurm keeps a resumed node's reason, which NHC's offline helper then keeps as its own "
                    "drain's (README, Beside NHC)")
    sim.inject(tb.sim_dir, "n1", 3, xid=79)
    tb.nhc_site_fault("n1", True)
    wait_for(lambda: reason_of(tb, "n1")[0], 3 * INTERVAL + 10, "n1 not drained")
    ours = reason_of(tb, "n1")[1]
    assert ours == "slurm-hooks: XID 79 on GPU 3 [reboot]"
    wait_runs(tb, "n1", 2)  # NHC's check fails in each of them too
    assert reason_of(tb, "n1") == (True, ours)
    sim.clear(tb.sim_dir, "n1")
    nhcs = wait_for(lambda: reason_of(tb, "n1")[1].startswith("NHC:") and reason_of(tb, "n1")[1],
                    3 * INTERVAL + 10, "n1 not handed over to NHC's drain")
    assert reason_of(tb, "n1") == (True, nhcs)
    assert [r["result"] for r in records(tb, "resume")] == ["ok"]  # ours, then NHC's own drain
    tb.nhc_site_fault("n1", False)
    wait_for(lambda: idle_without_reason(tb, "n1"), 3 * INTERVAL + 10, "NHC did not resume n1")
    assert [r["result"] for r in records(tb, "resume")] == ["ok"]


def test_testbed_up_switches_a_running_testbed_between_nhc_and_slurm_hooks_itself(tb):
    program = tb.path("bin", "healthcheck")
    try:
        Testbed(tb.state_dir, replace(tb.settings, nhc="")).up()
        with open(program, encoding="utf-8") as fh:
            text = fh.read()
        assert "-m slurm_hooks check" in text and tb.nhc.driver not in text
    finally:
        Testbed(tb.state_dir, tb.settings).up()
    with open(program, encoding="utf-8") as fh:
        assert tb.nhc.driver in fh.read()
    wait_runs(tb, "n1", 1)


def test_validate_on_the_nhc_testbed_recognises_nhc_and_our_check(tb):
    from slurm_hooks import preflight

    results = {r.check: r for r in preflight.run(tb.config_path, tb.slurm_conf, "n1")
               if r.check in ("health-check-program", "nhc-conf", "nhc-script", "nhc-timing")}
    for check in ("health-check-program", "nhc-conf", "nhc-script"):
        assert results[check].status is preflight.Status.PASS, results[check].line()
    assert "runs LBNL NHC" in results["health-check-program"].message
    assert "runs first, on 2 GPU node(s)" in results["nhc-conf"].message
    assert f"runs {tb.install_prefix}/bin/slurm-hooks-healthcheck" in results["nhc-script"].message
    # NHC's 30 s leave our check 25 s: less than a hung probe (20 s) + a Slurm call (10 s) + 3 s to start
    timing = results["nhc-timing"]
    assert timing.status is preflight.Status.WARN and "TIMEOUT=30 s" in timing.message, timing.line()
