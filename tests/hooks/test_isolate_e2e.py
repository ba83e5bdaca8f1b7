"""``slurm-hooks isolate`` on the real testbed: 16 nodes, each on its own address, a fault on one
or two nodes' traffic (the testbed's fault files, which the collective test honours by node).

The test jobs are the lab's all-reduce over TCP (no torch import per rank: 16 ranks at once on
a 2-core machine), set as ``[isolate] command`` in a copy of the testbed's config; one test runs
the default command, the PyTorch all-reduce, where torch is installed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys

import pytest
from conftest import wait_for

from slurm_hooks.hooks import collective
from slurm_hooks.hooks.isolate import PREFIX
from slurm_hooks.lab import ddp_train
from slurm_hooks.observe import incidents
from slurm_hooks.slurm import hostlist

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def bed16(tmp_path_factory):
    from conftest import TESTBED_SETTINGS, SlurmTestbed, own_testbed

    settings = dataclasses.replace(TESTBED_SETTINGS, nodes=16, own_addresses=True, hooks=False)
    with own_testbed(tmp_path_factory, "testbed-isolate", settings) as tb:
        yield SlurmTestbed(tb)


@pytest.fixture
def tb(bed16):
    bed16.reset(timeout=60.0)
    return bed16


def config(tb, tmp_path, command: list[str] | None = None) -> str:
    """The testbed's config with an [isolate] table: short limits, the TCP all-reduce by default."""
    if command is None:
        command = [sys.executable, collective.__file__, "--backend", "tcp", "--timeout", "8", "--size-mb", "2"]
    with open(tb.config_path, encoding="utf-8") as fh:
        text = fh.read()
    path = tmp_path / "config.toml"
    path.write_text(text + "\n[isolate]\n" + f"command = {json.dumps(command)}\n"
                    "test_timeout = 15.0\nbudget = 240.0\n")
    return str(path)


def isolate(tb, cfg: str, *args: str, timeout: float = 240) -> tuple[int, dict]:
    done = subprocess.run([sys.executable, "-m", "slurm_hooks", "isolate", "--config", cfg, "--json", *args],
                          env=tb.env, capture_output=True, text=True, timeout=timeout)
    lines = [x for x in done.stdout.splitlines() if x.startswith("{")]
    assert lines, (done.returncode, done.stdout, done.stderr)
    return done.returncode, json.loads(lines[-1])


def drained(tb) -> dict[str, str]:
    return {n.name: n.reason for n in tb.slurm.nodes() if n.drained}


def reservations(tb) -> list[str]:
    return [r for r in tb.slurm.reservations() if r.startswith(PREFIX)]


def test_16_nodes_one_slow_node_is_named_and_drained_and_nothing_else_in_at_most_10_test_jobs(tb, tmp_path):
    tb.set_fault("n11", "slow 8")
    rc, out = isolate(tb, config(tb, tmp_path), "--nodes", "n[1-16]")
    assert rc == 1, out
    assert list(out["culprits"]) == ["n11"] and out["jobs"] <= 10, out
    assert drained(tb) == {"n11": f"slurm-hooks: collective test failed on n11 ({out['culprits']['n11']}) [isolate]"}
    assert out["culprits"]["n11"].startswith("bandwidth ") and out["culprits"]["n11"].endswith("% of peers")
    assert reservations(tb) == []
    with open(out["evidence"], encoding="utf-8") as fh:
        assert any("n11" in t["nodes"] and not t["passed"] for t in json.load(fh)["tests"])
    [record] = [r for r in tb.audit_events() if r.get("action") == "drain"]
    assert (record["node"], record["result"], record["why"]) == ("n11", "ok", "isolate")
    # Our drain opens an incident as any finding's does: what the notifications tell.
    [incident] = [i for i in incidents.build(tb.audit_events()) if i.node == "n11"]
    assert incident.open and incident.reason == drained(tb)["n11"]


def test_16_nodes_a_hung_node_and_a_dropping_one_are_both_drained_and_a_busy_node_is_skipped(tb, tmp_path):
    tb.set_fault("n3", "hang")
    tb.set_fault("n14", "drop")
    busy = tb.sbatch("#!/bin/sh\nsleep 300\n", "-w", "n16")
    tb.wait_job(busy, ["RUNNING"])
    rc, out = isolate(tb, config(tb, tmp_path), "--nodes", "n[1-16]")
    assert rc == 1, out
    assert sorted(out["culprits"]) == ["n14", "n3"], out
    assert out["culprits"]["n3"].startswith("did not complete") and out["culprits"]["n14"].startswith("did not complete")
    assert sorted(drained(tb)) == ["n14", "n3"]
    assert out["skipped"] == {"n16": f"running job(s) {busy}"}
    assert reservations(tb) == []


def test_isolate_of_a_jobs_nodes_on_a_healthy_fabric_drains_nothing_and_exits_0(tb, tmp_path):
    job = tb.sbatch("#!/bin/sh\nsrun true\n", "-N8")
    tb.wait_job(job, ["COMPLETED"], timeout=60)
    rc, out = isolate(tb, config(tb, tmp_path), "--job", str(job))
    # one wave on a quiet machine; a loaded one can make a group look slow and cost a confirming
    # wave (seen on a CI leg): what matters is that nothing is named or drained
    assert (rc, out["culprits"]) == (0, {}) and 1 <= out["waves"] <= 2, out
    assert out["nodes"] == hostlist.expand(tb.slurm.job(job).nodes) and len(out["nodes"]) == 8
    assert drained(tb) == {} and reservations(tb) == []


def test_a_killed_isolate_leaves_its_reservation_and_the_next_run_deletes_it(tb, tmp_path):
    tb.set_fault("n2", "hang")  # its first wave runs until the collective's own timeout
    cfg = config(tb, tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "slurm_hooks", "isolate", "--config", cfg, "--nodes", "n[1-8]"],
                            env=tb.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: reservations(tb) and any(j.name == PREFIX for j in tb.slurm.jobs_on_node("n1")), 60,
                 "isolate reserved its nodes and started a test job")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    left = reservations(tb)
    assert left  # SIGKILL: nothing could clean up
    tb.set_fault("n2", "")
    rc, out = isolate(tb, cfg, "--nodes", "n[1-4]")
    assert reservations(tb) == [] and rc == 0, out


def test_a_sigterm_cancels_the_test_jobs_and_deletes_the_reservation_at_once(tb, tmp_path):
    tb.set_fault("n2", "hang")
    proc = subprocess.Popen([sys.executable, "-m", "slurm_hooks", "isolate", "--config", config(tb, tmp_path),
                             "--nodes", "n[1-8]"], env=tb.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: reservations(tb) and any(j.name == PREFIX for j in tb.slurm.jobs_on_node("n1")), 60,
                 "isolate reserved its nodes and started a test job")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130 and "its reservation deleted" in err, err
    assert reservations(tb) == []
    wait_for(lambda: not any(j.name == PREFIX for n in tb.nodes for j in tb.slurm.jobs_on_node(n)), 30,
             "its test jobs gone")
    assert drained(tb) == {}


@pytest.fixture
def torch_here():
    """Skips without torch, asked when the test runs (not at import: collecting starts no torch), before ``tb``."""
    why = ddp_train.torch_missing()
    if why:
        pytest.skip(why)


def test_the_default_command_is_the_pytorch_all_reduce_and_finds_a_dropping_node(torch_here, tb, tmp_path):
    with open(tb.config_path, encoding="utf-8") as fh:
        text = fh.read()
    cfg = tmp_path / "config.toml"
    cfg.write_text(text + "\n[isolate]\ntest_timeout = 40.0\nbudget = 240.0\n")
    tb.set_fault("n2", "drop")
    rc, out = isolate(tb, str(cfg), "--nodes", "n[1-4]")
    assert (rc, list(out["culprits"])) == (1, ["n2"]), out
    passed = [t for t in out["tests"] if t["completed"]]
    assert passed, out
    with open(os.path.join(tb.state_dir, "state", "isolate", f"{PREFIX}-{passed[0]['job']}.out"),
              encoding="utf-8") as fh:
        assert "backend=gloo" in fh.read()
    assert list(drained(tb)) == ["n2"]
