"""The sweep's per-node fabric tests (slurm_hooks.hooks.nodefabric): all_reduce_perf through the
NICs and ib_write_bw GPU-direct loopback per HCA, read from the tools' own output formats (captured
real outputs, and fake tools printing them), each against its floor. A tool missing, a run that
fails, or output that is not the tool's format is "not-run": never a pass."""

from __future__ import annotations

import json
import os
import sys

import pytest
from paths import FIXTURES

from slurm_hooks.hooks import nodefabric
from slurm_hooks.hooks.nodefabric import ib_loopback, nccl_nics, parse_all_reduce, parse_ib_write_bw

FAKES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fakes")
NCCL_CAPTURE = open(os.path.join(FIXTURES, "nccl_tests", "all_reduce_perf_1node_8gpu.txt")).read()
IB_CAPTURE = open(os.path.join(FIXTURES, "perftest", "ib_write_bw_use_cuda_client.txt")).read()


def test_the_captured_outputs_give_their_figures():
    assert parse_all_reduce(NCCL_CAPTURE) == (68.6248, "")
    assert parse_ib_write_bw(IB_CAPTURE) == (181.46, "")


@pytest.mark.parametrize(("text", "why"), [
    ("", "no all_reduce_perf result table"),
    ("# Avg bus bandwidth : 180.5\n", "no all_reduce_perf result table"),
    (NCCL_CAPTURE.split("# Avg bus")[0], "no '# Avg bus bandwidth' line"),
    (NCCL_CAPTURE.split("  34359738368")[0], "its result table has no row"),
    (NCCL_CAPTURE.replace("68.66       0", "68.66       3"), "reported wrong elements"),
    (NCCL_CAPTURE + NCCL_CAPTURE, "more than one run"),
    (NCCL_CAPTURE.replace("68.6248", "68.6x48"), "no '# Avg bus bandwidth' line"),
    (NCCL_CAPTURE.replace("39.24", "39.2x"), "cut short or garbled"),
])
def test_garbled_all_reduce_perf_output_is_no_figure(text, why):
    figure, said = parse_all_reduce(text)
    assert figure is None and why in said


@pytest.mark.parametrize(("text", "why"), [
    ("", "no 'RDMA_Write BW Test'"),
    (IB_CAPTURE.split(" #bytes")[0], "no result table"),
    (IB_CAPTURE.split(" 65536      10384867")[0], "no complete row"),
    (IB_CAPTURE.replace("181.46 \t\t     0.346100", "181.46"), "no complete row"),
    (IB_CAPTURE.replace("[Gb/sec]", "[MB/sec]"), "in MB/sec, not Gb/sec"),
    (IB_CAPTURE.replace("181.46", "18x.46"), "no complete row"),
])
def test_garbled_ib_write_bw_output_is_no_figure(text, why):
    figure, said = parse_ib_write_bw(text)
    assert figure is None and why in said


def fake(tmp_path, name, script, state) -> str:
    """An executable ``name`` that runs the fake ``script`` with the node's ``state`` (the fabric it measures)."""
    state_path = tmp_path / f"{name}.json"
    state_path.write_text(json.dumps(state))
    path = tmp_path / name
    path.write_text(f'#!/bin/sh\nexec {sys.executable} {os.path.join(FAKES, script)} --state {state_path} "$@"\n')
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize(("state", "floor", "result", "detail"), [
    ({"nics": 380.0, "nvlink": 460.0}, 300.0, "passed", "380 GB/s >= floor 300"),
    ({"nics": 120.5, "nvlink": 460.0}, 300.0, "failed", "120.5 GB/s < floor 300"),
    ({"nics": 120.5, "nvlink": 460.0}, 0.0, "measured", "120.5 GB/s; no floor set"),
    ({"nics": 380.0, "nvlink": 460.0, "exit": 1}, 300.0, "not-run", "could not run: exit 1: # Collective test"),
    ({"nics": 380.0, "nvlink": 460.0, "cut": 1060}, 300.0, "not-run", "could not run: a row of its result table is cut short"),
])
def test_the_nccl_test_through_the_nics_is_judged_against_its_floor(tmp_path, state, floor, result, detail):
    """The fake prints the NVLink figure unless NVLink and shared memory are off: a test that left
    them on would pass a node whose NICs are slow."""
    test = nccl_nics(fake(tmp_path, "all_reduce_perf", "nccl_tests.py", state), 8, floor, 60.0)
    assert (test.name, test.result) == ("nccl-nics", result)
    assert test.detail.startswith(detail), test.detail


def test_a_missing_tool_is_not_run(tmp_path):
    assert nccl_nics(str(tmp_path / "none"), 8, 300.0, 60.0).result == "not-run"
    test = ib_loopback(str(tmp_path / "none"), "mlx5_0", 0, 18600, 300.0, 60.0)
    assert (test.result, test.detail) == ("not-run", f"{tmp_path}/none is not installed")


def test_each_hcas_loopback_is_judged_against_the_floor(tmp_path):
    tool = fake(tmp_path, "ib_write_bw", "perftest.py", {"mlx5_0": 391.2, "mlx5_1": 97.0})
    good = ib_loopback(tool, "mlx5_0", 0, 18611, 380.0, 60.0)
    slow = ib_loopback(tool, "mlx5_1", 1, 18612, 380.0, 60.0)
    assert (good.name, good.result, good.figure) == ("ib_write_bw mlx5_0", "passed", 391.2)
    assert (slow.result, slow.detail) == ("failed", "97 Gb/s < floor 380")


def test_an_hca_the_tool_cannot_open_is_not_run_and_says_why(tmp_path):
    tool = fake(tmp_path, "ib_write_bw", "perftest.py", {"mlx5_0": 391.2})
    test = ib_loopback(tool, "mlx5_9", 0, 18613, 380.0, 30.0)
    assert test.result == "not-run"
    assert "Unable to find the Infiniband/RoCE device" in test.detail


def test_the_sweep_runs_every_hca_of_the_config_and_a_floor_it_could_not_test_is_no_pass(tmp_path):
    from fakes.config import repair_config, sim_node

    from slurm_hooks.hooks import sweep
    from slurm_hooks.probes import sim

    perf = fake(tmp_path, "all_reduce_perf", "nccl_tests.py", {"nics": 400.0, "nvlink": 460.0})
    ib = fake(tmp_path, "ib_write_bw", "perftest.py", {"mlx5_0": 391.2, "mlx5_1": 392.0})
    cfg = repair_config(tmp_path, f'[sweep]\nnvbandwidth = "{tmp_path}/none"\nall_reduce_perf = "{perf}"\n'
                                  f'ib_write_bw = "{ib}"\nib_hcas = ["mlx5_0", "mlx5_1", "mlx5_2"]\n'
                                  'nccl_nics_busbw_gbps = 300.0\nib_write_bw_gbps = 380.0\n')
    slurm, w = sim_node(cfg, "ALLOCATED", 9)
    sim.set_diag_seconds(cfg.gpu.sim_dir, "n1", 0.0)
    verdict, detail = sweep.validate_here(w, 2, 120.0, job="9")
    tests = [(r["test"], r["result"], r.get("figure")) for r in w.audit.read() if r.get("action") == "sweep-test"]
    assert tests[-4:] == [("nccl-nics", "passed", 400.0), ("ib_write_bw mlx5_0", "passed", 391.2),
                          ("ib_write_bw mlx5_1", "passed", 392.0), ("ib_write_bw mlx5_2", "not-run", None)]
    assert verdict == "unverified" and detail.startswith("ib_write_bw mlx5_2 not run: could not run"), detail
    assert not slurm.peek("n1").drained


def test_a_slow_hca_fails_the_sweep_and_drains_the_node(tmp_path):
    from fakes.config import repair_config, sim_node

    from slurm_hooks.hooks import sweep
    from slurm_hooks.probes import sim

    ib = fake(tmp_path, "ib_write_bw", "perftest.py", {"mlx5_0": 391.2, "mlx5_1": 97.0})
    cfg = repair_config(tmp_path, f'[sweep]\nnvbandwidth = "{tmp_path}/none"\nall_reduce_perf = "{tmp_path}/none"\n'
                                  f'ib_write_bw = "{ib}"\nib_hcas = ["mlx5_0", "mlx5_1"]\nib_write_bw_gbps = 380.0\n')
    slurm, w = sim_node(cfg, "ALLOCATED", 9)
    sim.set_diag_seconds(cfg.gpu.sim_dir, "n1", 0.0)
    verdict, _ = sweep.validate_here(w, 2, 120.0, job="9")
    assert verdict == "failed"
    node = slurm.peek("n1")
    assert node.drained and "ib_write_bw mlx5_1 below its floor" in node.reason, node.reason


def test_without_ib_hcas_the_active_infiniband_ports_of_the_links_tree_are_tested(tmp_path):
    from fakes.config import sim_config

    from slurm_hooks.probes import sim
    from slurm_hooks.remedy.wiring import Wiring

    cfg = sim_config(tmp_path)
    sim.init(cfg.gpu.sim_dir, "n1", 8)
    sim.init_ib(cfg.gpu.sim_dir, "n1", 3)
    sim.inject_ib(cfg.gpu.sim_dir, "n1", "mlx5_1:1", state="down")
    w = Wiring(cfg, "n1", None)
    assert nodefabric.hcas(w) == ["mlx5_0", "mlx5_2"]


def test_validate_learn_proposes_the_floors_from_this_nodes_healthy_sweep_and_none_from_a_failed_one(tmp_path):
    from fakes.config import repair_config, sim_node

    from slurm_hooks.hooks import sweep
    from slurm_hooks.preflight import learn
    from slurm_hooks.probes import sim

    perf = fake(tmp_path, "all_reduce_perf", "nccl_tests.py", {"nics": 412.0, "nvlink": 460.0})
    ib = fake(tmp_path, "ib_write_bw", "perftest.py", {"mlx5_0": 391.2, "mlx5_1": 377.0})
    cfg = repair_config(tmp_path, f'[sweep]\nnvbandwidth = "{tmp_path}/none"\nall_reduce_perf = "{perf}"\n'
                                  f'ib_write_bw = "{ib}"\nib_hcas = ["mlx5_0", "mlx5_1", "mlx5_7"]\n')
    _, w = sim_node(cfg, "ALLOCATED", 9)
    sim.set_diag_seconds(cfg.gpu.sim_dir, "n1", 0.0)
    assert sweep.validate_here(w, 2, 120.0, job="9")[0] == "passed"  # no floor set: measured, and mlx5_7 not run
    values, notes = learn.learn_sweep(list(w.audit.history()))
    assert values == {"nccl_nics_busbw_gbps": 206.0, "ib_write_bw_gbps": 188.0}
    assert "the slowest of 2 HCA(s)' GPU-direct loopback (mlx5_1, 377 Gb/s)" in notes[1]
    assert learn.learn_sweep([{"action": "sweep-test", "test": "nccl-nics", "result": "failed", "figure": 90.0}]) \
        == ({}, ["no healthy all_reduce_perf through the NICs in this node's sweep records: [sweep] "
                 "nccl_nics_busbw_gbps not proposed",
                 "no healthy ib_write_bw loopback in this node's sweep records: [sweep] ib_write_bw_gbps not proposed"])


def repaired(tmp_path, perf_state=None, floor=300.0, ib_floor=0.0):
    """n1 with a pending row remap on GPU 3, repaired inline (a reset, then the validation with the
    fabric tests on: [repair] fabric_tests); ``perf_state``: what the fake all_reduce_perf
    measures (None: not installed)."""
    from fakes.config import repair_config, sim_node

    from slurm_hooks.hooks import healthcheck
    from slurm_hooks.probes import sim

    perf = fake(tmp_path, "all_reduce_perf", "nccl_tests.py", perf_state) if perf_state else f"{tmp_path}/none"
    cfg = repair_config(tmp_path, f'fabric_tests = true\n[sweep]\nall_reduce_perf = "{perf}"\n'
                                  f'ib_write_bw = "{tmp_path}/none"\nnccl_nics_busbw_gbps = {floor}\n'
                                  f'ib_write_bw_gbps = {ib_floor}\n')
    slurm, w = sim_node(cfg, "IDLE")
    sim.set_diag_seconds(cfg.gpu.sim_dir, "n1", 0.0)
    sim.inject(cfg.gpu.sim_dir, "n1", 3, row_remap_pending=True)
    _, outcome = healthcheck.run(w, follow="none", repair="inline")
    validated = [r for r in w.audit.read() if r.get("action") == "repair-validate" and r.get("result") != "start"]
    tests = [(r["test"], r["result"]) for r in w.audit.read() if r.get("action") == "repair-validate-test"]
    return slurm, outcome, validated, tests


def test_a_repair_validation_with_the_nics_under_their_floor_fails_and_the_node_stays_out(tmp_path):
    slurm, outcome, validated, tests = repaired(tmp_path, {"nics": 120.5, "nvlink": 460.0})
    assert ("nccl-nics", "failed") in tests
    assert validated[0]["result"] == "failed" and "nccl-nics below its floor: 120.5 GB/s < floor 300" \
        in validated[0]["detail"]
    assert not outcome.resumed and slurm.peek("n1").drained
    assert "reset:failed" in outcome.repairs


def test_a_repair_validation_whose_fabric_test_could_not_run_is_unverified_never_a_pass(tmp_path):
    slurm, outcome, validated, tests = repaired(tmp_path, None)
    assert tests[0] == ("nccl-nics", "not-run")
    assert validated[0]["result"] == "unverified"
    assert validated[0]["detail"].startswith(f"nccl-nics not run: {tmp_path}/none is not installed")
    assert not outcome.resumed and slurm.peek("n1").reason.endswith("[unverified]")


def test_a_repair_validation_with_the_nics_at_their_floor_resumes_and_a_test_with_no_floor_decides_nothing(tmp_path):
    slurm, outcome, validated, tests = repaired(tmp_path, {"nics": 380.0, "nvlink": 460.0})
    assert tests == [("nccl-nics", "passed"), ("ib_write_bw", "not-run")]  # no HCA, and no ib floor set
    assert validated[0]["result"] == "ok" and validated[0]["detail"] == "DCGM diag L2 and the fabric tests passed"
    assert outcome.resumed and not slurm.peek("n1").drained
