"""``slurm-hooks sweep`` on the real testbed: maintenance reservations, the validation as a root
job, a latent fault only DCGM finds, busy nodes skipped, no reservation left behind, one sweep
at a time. The sim's dcgmi stand-in reads the simulated GPUs (levels, durations scaled down).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import own_testbed

from slurm_hooks.lab.testbed import BIN, LabSettings
from slurm_hooks.probes import sim
from slurm_hooks.runner import run_command

pytestmark = pytest.mark.slurm

#: With accounting (slurmdbd on a private MariaDB): the sweep's jobs show in sacct like any job.
SETTINGS = LabSettings(nodes=3, gpus=8, hooks=True, kill_wait=2, health_check_interval=30, requeue_grace=3.0,
                    accounting=True)


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    with own_testbed(tmp_path_factory, "sweepbed", SETTINGS) as tb:
        yield tb


@pytest.fixture
def tb(bed):
    bed.reset()
    for name in bed.node_names:
        sim.set_diag_seconds(bed.sim_dir, name, 1.0)
    return bed


def sweep_argv(*args):
    return [sys.executable, "-m", "slurm_hooks", "sweep", *args]


def sweep(tb, *args, timeout=120):
    t0 = time.monotonic()
    done = subprocess.run(sweep_argv(*args), capture_output=True, text=True, env=tb.env(), timeout=timeout)
    return done, time.monotonic() - t0


def reservations(tb):
    out = run_command([os.path.join(BIN, "scontrol"), "show", "reservation", "-o"], 10, env=tb.env()).stdout
    return [line for line in out.splitlines() if "ReservationName=" in line]


def test_a_latent_fault_only_dcgm_finds_drains_its_node_naming_the_gpu_and_the_rest_return(tb):
    sim.inject(tb.sim_dir, "n1", 3, diag_failure=2)
    assert tb.slurm().node("n1").state.upper() == "IDLE", "NVML does not show it: the node is in service"
    job = tb.sbatch("#!/bin/sh\nsleep 120\n", "-w", "n3")
    tb.wait_job(job, ("RUNNING",), timeout=20)
    done, took = sweep(tb, "--nodes", "n[1-3]", "--level", "2", "--max-parallel", "2")
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    summary = lines[-1]
    assert summary.startswith("sweep L2: 3 node(s): 1 passed (n2), 1 failed (n1: drained: slurm-hooks: DCGM diag L2 "
                              f"failed on GPU 3 [reset]), 0 unverified, 1 skipped (n3: running job(s) {job}) in "), summary
    print("\n".join(lines))
    node = tb.slurm().node("n1")
    assert node.drained and node.reason.startswith("slurm-hooks: DCGM diag L2 failed on GPU 3 [reset")
    assert tb.slurm().node("n2").state.upper() == "IDLE" and (not tb.slurm().node("n2").reason or tb.keeps_reasons)
    assert reservations(tb) == []
    assert tb.slurm().job(job).base_state == "RUNNING", "the busy node's job was left alone"
    # Each result recorded: the node's audit log, and the job's AdminComment (accounting keeps it).
    with open(tb.audit_log, encoding="utf-8") as fh:
        tests = [json.loads(x) for x in fh if '"sweep-test"' in x]
    dcgm = [r for r in tests if r["test"].startswith("dcgmi diag")]
    assert sorted((r["node"], r["result"]) for r in dcgm) == [("n1", "failed"), ("n2", "passed")]
    # The per-node fabric tests' tools are not installed here: not run, neither a pass nor a failure.
    assert {r["result"] for r in tests if r not in dcgm} == {"not-run"}
    failed_job = next(r["jobs"][0] for r in dcgm if r["node"] == "n1")
    assert tb.slurm().admin_comment(failed_job) == ("slurm-hooks: sweep L2 failed: drained: slurm-hooks: DCGM diag L2 "
                                                    "failed on GPU 3 [reset]")
    assert took < 60, f"the sweep took {took:.1f}s"
    # Accounting shows the sweep's jobs like any job: root's, named, FAILED (exit 1) with the verdict.
    deadline = time.monotonic() + 30
    while True:
        rows = run_command([os.path.join(BIN, "sacct"), "-n", "-P", "-X", "-j", failed_job, "-o",
                            "JobName,User,State,AdminComment%300"], 10, env=tb.env()).stdout.strip()
        if "failed on GPU 3" in rows or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert rows.startswith("slurm-hooks-sweep|root|FAILED|slurm-hooks: sweep L2 failed: drained: slurm-hooks: "
                           "DCGM diag L2 failed on GPU 3 [reset]"), rows


def test_json_output_and_a_passing_partition(tb):
    done, _ = sweep(tb, "--partition", "gpu", "--level", "1", "--max-parallel", "100%", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads(done.stdout)
    assert data["counts"] == {"passed": 3, "failed": 0, "unverified": 0, "skipped": 0}
    assert {n["node"] for n in data["nodes"]} == {"n1", "n2", "n3"} and all(n["job"] for n in data["nodes"])
    assert reservations(tb) == []


def scontrol(tb, *args):
    return run_command([os.path.join(BIN, "scontrol"), *args], 10, env=tb.env())


@contextlib.contextmanager
def default_partition_without_nodes(tb):
    """Slurm's default partition is ``cpu``, which has no nodes (sbatch's default then), for the block."""
    scontrol(tb, "create", "PartitionName=cpu", "Default=YES", "State=UP")
    try:
        yield
    finally:
        scontrol(tb, "update", "PartitionName=gpu", "Default=YES")
        scontrol(tb, "delete", "PartitionName=cpu")


def test_sweep_partition_submits_its_jobs_there_when_the_default_partition_holds_no_gpu_node(tb):
    with default_partition_without_nodes(tb):
        done, _ = sweep(tb, "--partition", "gpu", "--level", "1", "--max-parallel", "100%", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["counts"] == {"passed": 3, "failed": 0, "unverified": 0, "skipped": 0}
    assert reservations(tb) == []


def test_sweep_nodes_submits_to_the_nodes_own_partition_when_the_default_one_holds_none_of_them(tb):
    # Without --partition the jobs went to Slurm's default partition: "Requested node configuration is not
    # available", every node unverified (a cron line `sweep --nodes gpu[01-64]` on such a cluster).
    with default_partition_without_nodes(tb):
        done, _ = sweep(tb, "--nodes", "n[1-2]", "--level", "1", "--max-parallel", "100%", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["counts"] == {"passed": 2, "failed": 0, "unverified": 0, "skipped": 0}
    assert reservations(tb) == []


def test_a_sweep_of_a_node_slurm_does_not_know_validated_nothing_and_exits_non_zero(tb):
    done, _ = sweep(tb, "--nodes", "n9", "--level", "1")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "0 passed" in done.stdout and "n9: cannot read the node" in done.stdout, done.stdout
    assert "no node was validated" in done.stderr


def test_two_sweeps_at_once_do_not_overlap_and_an_interrupted_one_leaves_no_reservation(tb):
    sim.set_diag_seconds(tb.sim_dir, "n2", 60.0)
    first = subprocess.Popen(sweep_argv("--nodes", "n2", "--level", "1"), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=tb.env())
    try:
        deadline = time.monotonic() + 30
        while not reservations(tb) and time.monotonic() < deadline:
            time.sleep(0.3)
        assert reservations(tb), "the first sweep reserved n2"
        second, _ = sweep(tb, "--nodes", "n1", "--level", "1")
        assert second.returncode == 3 and "another sweep is running" in second.stderr
        assert len(reservations(tb)) == 1, "the second sweep took nothing"
        first.send_signal(signal.SIGTERM)
        out, err = first.communicate(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
    assert reservations(tb) == [], out + err
    assert first.returncode == 130 and "interrupted: its jobs cancelled, its reservations deleted" in err
    tb.wait_node("n2", lambda n: n.state.upper() == "IDLE" and (not n.reason or tb.keeps_reasons), timeout=20)  # its job cancelled


def test_a_diagnostic_past_the_jobs_limit_is_unverified_never_a_pass_and_leaves_no_reservation(tb):
    sim.set_diag_seconds(tb.sim_dir, "n2", 60.0)
    done, took = sweep(tb, "--nodes", "n2", "--level", "1", "--timeout", "5")
    assert done.returncode == 1, done.stdout + done.stderr
    summary = done.stdout.splitlines()[-1]
    assert summary.startswith("sweep L1: 1 node(s): 0 passed, 0 failed, 1 unverified (n2), 0 skipped"), summary
    assert "did not finish within our" in done.stdout
    assert reservations(tb) == [] and took < 40
    node = tb.slurm().node("n2")
    assert not node.drained and (not node.reason or tb.keeps_reasons), "a test that did not run drains nothing, and passes nothing"


def test_a_killed_sweeps_leftover_reservation_is_deleted_by_the_next_sweep(tb):
    # What a SIGKILLed sweep leaves: its maintenance reservation on an idle node.
    tb.scontrol("create", "reservation", "ReservationName=slurm-hooks-sweep-n3-1", "Nodes=n3", "StartTime=now",
                "Duration=60", "Users=root", "Flags=MAINT")
    assert len(reservations(tb)) == 1
    done, _ = sweep(tb, "--nodes", "n1", "--level", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "deleted slurm-hooks-sweep-n3-1, left by an earlier sweep" in done.stdout
    assert reservations(tb) == []
