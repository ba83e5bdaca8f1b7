"""``slurm-hooks isolate`` on the real testbed: 8 nodes, each on its own address, a GPU each, and
faults the kernel makes on one node's traffic (``testbed fault``: nftables rules on that address
only), or a hung rank (a test-side wrapper; no kernel fault hangs a process).

The test jobs are the built-in TCP ring all-reduce (no torch import per rank on a 2-core
machine), each rank bound to its node's address, set as ``[isolate] command`` in a copy of the
testbed's config; one test runs the default command, the PyTorch all-reduce, where torch is installed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
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
HANG_OR_RUN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fakes", "hang_or_run.py")


@pytest.fixture(scope="module")
def bed8(tmp_path_factory):
    from conftest import TESTBED_SETTINGS, SlurmTestbed, own_testbed

    settings = dataclasses.replace(TESTBED_SETTINGS, nodes=8, gpus=1, own_addresses=True, hooks=False)
    with own_testbed(tmp_path_factory, "testbed-isolate", settings) as tb:
        yield SlurmTestbed(tb)


@pytest.fixture
def tb(bed8):
    bed8.reset(timeout=60.0)
    return bed8


def ring(timeout: float = 25.0) -> list[str]:
    """160 MiB through each link: nftables' rate limit lets about a second's worth through at once."""
    return [sys.executable, HANG_OR_RUN, sys.executable, collective.__file__, "--backend", "tcp", "--timeout",
            f"{timeout:g}", "--size-mb", "8", "--iters", "20"]


def config(tb, tmp_path, command: list[str] | None = None, floor: float = 0.0) -> str:
    """The testbed's config with an [isolate] table: short limits, the TCP ring by default."""
    with open(tb.config_path, encoding="utf-8") as fh:
        text = fh.read()
    path = tmp_path / "config.toml"
    path.write_text(text + "\n[isolate]\n" + f"command = {json.dumps(command or ring())}\n"
                    f"test_timeout = 40.0\nbudget = 400.0\nmin_busbw_gbps = {floor:g}\n")
    return str(path)


def healthy_busbw(tb) -> float:
    """A healthy pair's bus bandwidth (GB/s), from the same ring: what a tenth of is set below."""
    job = tb.sbatch("#!/bin/sh\nexec srun " + " ".join(ring()[2:]) + "\n", "-N2", "-w", "n1,n2", "--gres=gpu:1")
    tb.wait_job(job, ["COMPLETED"], timeout=60)
    return float(re.search(r"busbw=([0-9.]+)", tb.job_output(job)).group(1))


def isolate(tb, cfg: str, *args: str, timeout: float = 240) -> tuple[int, dict]:
    done = subprocess.run([sys.executable, "-m", "slurm_hooks", "isolate", "--config", cfg, "--json", *args],
                          env=tb.env, capture_output=True, text=True, timeout=timeout)
    lines = [x for x in done.stdout.splitlines() if x.startswith("{")]
    assert lines, (done.returncode, done.stdout, done.stderr)
    return done.returncode, json.loads(lines[-1])


def story(out: dict) -> str:
    """The run as a reader of a failed assertion needs it: the verdict line, then each test's nodes and why."""
    lines = [f"{out.get('verdict')}: culprits={out.get('culprits')} unconfirmed={out.get('unconfirmed')} "
             f"stopped={out.get('stopped')!r} unexplained={out.get('unexplained')} seconds={out.get('seconds')}"]
    lines += [f"  wave {t['wave']} {t['purpose']} job {t['job']} {','.join(t['nodes'])}: "
              f"{'passed' if t['passed'] else 'FAILED'} ({t['why']})" for t in out.get("tests", [])]
    return "\n".join(lines)


def drained(tb) -> dict[str, str]:
    return {n.name: n.reason for n in tb.slurm.nodes() if n.drained}


def reservations(tb) -> list[str]:
    return [r for r in tb.slurm.reservations() if r.startswith(PREFIX)]


def test_8_nodes_one_rate_limited_by_the_kernel_to_a_tenth_is_drained_alone(tb, tmp_path):
    peers = healthy_busbw(tb)
    tb.set_fault("n5", f"net-slow {max(1, int(peers * 1e6 / 10))}")
    rc, out = isolate(tb, config(tb, tmp_path, floor=peers / 5), "--nodes", "n[1-8]")
    assert (rc, out["verdict"], list(out["culprits"])) == (1, "found", ["n5"]), story(out)
    assert drained(tb) == {"n5": f"slurm-hooks: collective test failed on n5 ({out['culprits']['n5']}) [isolate]"}
    assert reservations(tb) == []
    with open(out["evidence"], encoding="utf-8") as fh:
        tests = json.load(fh)["tests"]
    confirms = [t for t in tests if t["purpose"] == "confirm" and t["nodes"][-1] == "n5"]
    assert len({t["nodes"][0] for t in confirms if not t["passed"]}) == 3, confirms
    [record] = [r for r in tb.audit_events() if r.get("action") == "drain"]
    assert (record["node"], record["result"], record["why"]) == ("n5", "ok", "isolate")
    # Our drain opens an incident as any finding's does: what the notifications tell.
    [incident] = [i for i in incidents.build(tb.audit_events()) if i.node == "n5"]
    assert incident.open and incident.reason == drained(tb)["n5"]


def test_8_nodes_two_dropped_by_the_kernel_are_both_drained_and_no_other(tb, tmp_path):
    tb.set_fault("n5", "net-drop")
    tb.set_fault("n6", "net-drop")
    rc, out = isolate(tb, config(tb, tmp_path), "--nodes", "n[1-8]")
    assert (rc, sorted(out["culprits"])) == (1, ["n5", "n6"]), story(out)
    assert sorted(drained(tb)) == ["n5", "n6"]
    assert reservations(tb) == []


def test_8_nodes_a_hung_rank_is_drained_and_a_busy_node_is_skipped(tb, tmp_path):
    tb.set_fault("n3", "hang")
    busy = tb.sbatch("#!/bin/sh\nsleep 300\n", "-w", "n8")
    tb.wait_job(busy, ["RUNNING"])
    rc, out = isolate(tb, config(tb, tmp_path), "--nodes", "n[1-8]")
    assert (rc, list(out["culprits"])) == (1, ["n3"]), story(out)
    assert out["culprits"]["n3"].startswith("did not complete")
    assert list(drained(tb)) == ["n3"]
    assert out["skipped"] == {"n8": f"running job(s) {busy}"}
    assert reservations(tb) == []


def test_isolate_of_a_jobs_nodes_on_a_healthy_fabric_drains_nothing_and_exits_0(tb, tmp_path):
    job = tb.sbatch("#!/bin/sh\nsrun true\n", "-N8")
    tb.wait_job(job, ["COMPLETED"], timeout=60)
    rc, out = isolate(tb, config(tb, tmp_path), "--job", str(job))
    # a screen and the rank-0 nodes' test on a quiet machine; a loaded one can make a group look
    # slow: then the run may end inconclusive (exit 5), never with a node named or drained
    assert out["culprits"] == {} and (rc, out["verdict"]) in ((0, "ok"), (5, "inconclusive")), story(out)
    assert out["nodes"] == hostlist.expand(tb.slurm.job(job).nodes) and len(out["nodes"]) == 8
    assert drained(tb) == {} and reservations(tb) == []


def test_a_killed_isolate_leaves_its_reservation_and_the_next_run_deletes_it(tb, tmp_path):
    tb.set_fault("n2", "hang")  # its first wave runs until the collective's own timeout
    cfg = config(tb, tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "slurm_hooks", "isolate", "--config", cfg, "--nodes", "n[1-8]"],
                            env=tb.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: reservations(tb) and any(j.name.startswith(PREFIX) for j in tb.slurm.jobs_on_node("n1")), 60,
                 "isolate reserved its nodes and started a test job")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    left = reservations(tb)
    assert left  # SIGKILL: nothing could clean up
    tb.set_fault("n2", "")
    rc, out = isolate(tb, cfg, "--nodes", "n[1-4]")
    assert reservations(tb) == [] and out["culprits"] == {} and rc in (0, 5), story(out)


def test_a_sigterm_cancels_the_test_jobs_and_deletes_the_reservation_at_once(tb, tmp_path):
    tb.set_fault("n2", "hang")
    proc = subprocess.Popen([sys.executable, "-m", "slurm_hooks", "isolate", "--config", config(tb, tmp_path),
                             "--nodes", "n[1-8]"], env=tb.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: reservations(tb) and any(j.name.startswith(PREFIX) for j in tb.slurm.jobs_on_node("n1")), 60,
                 "isolate reserved its nodes and started a test job")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130 and "its reservation deleted" in err, err
    assert reservations(tb) == []
    wait_for(lambda: not any(j.name.startswith(PREFIX) for n in tb.nodes for j in tb.slurm.jobs_on_node(n)), 30,
             "its test jobs gone")
    assert drained(tb) == {}


@pytest.fixture
def torch_here():
    """Skips without torch, asked when the test runs (not at import: collecting starts no torch), before ``tb``."""
    why = ddp_train.torch_missing()
    if why:
        pytest.skip(why)


def test_the_pytorch_all_reduce_finds_a_hung_node(torch_here, tb, tmp_path):
    """A rank waits 45 s for its peers (a hung one's partner fails then), and the job may run 90 s: each
    rank imports torch first, which on two loaded cores can take long enough that a healthy pair cut
    at 40 s, as the ring's tests are, leaves no partner that passed to confirm the hung node with."""
    command = [sys.executable, HANG_OR_RUN, "/usr/bin/python3", collective.__file__, "--backend", "torch",
               "--timeout", "45", "--iters", "5"]
    with open(tb.config_path, encoding="utf-8") as fh:
        text = fh.read()
    cfg = tmp_path / "config.toml"
    cfg.write_text(text + f"\n[isolate]\ncommand = {json.dumps(command)}\ntest_timeout = 90.0\nbudget = 400.0\n")
    tb.set_fault("n2", "hang")
    rc, out = isolate(tb, str(cfg), "--nodes", "n[1-4]", timeout=600)
    assert (rc, list(out["culprits"])) == (1, ["n2"]), story(out)
    confirms = [t for t in out["tests"] if t["purpose"] == "confirm" and "n2" in t["nodes"]]
    # the suspect is never rank 0, whatever Slurm's node order: each partner held rank 0 and gave up
    # on n2 on its own clock, well inside the job's limit
    assert len(confirms) >= 2 and all(t["nodes"][-1] == "n2" and f"failed on {t['nodes'][0]} rank=0:" in t["why"]
                                      for t in confirms), story(out)
    passed = [t for t in out["tests"] if t["completed"]]
    assert passed, story(out)
    with open(os.path.join(tb.state_dir, "state", "isolate", f"{PREFIX}-{passed[0]['job']}.out"),
              encoding="utf-8") as fh:
        # gloo bound n1's own address (the testbed's 127.1.B.K), not what the host's name resolves to
        assert re.search(r"backend=gloo@127\.1\.\d+\.\d+ ", fh.read())
    assert list(drained(tb)) == ["n2"]
