"""``validate --learn``: a healthy node's GPUs and InfiniBand ports as TOML to paste, never a rewrite."""

from __future__ import annotations

import json
import os
import subprocess
import sys

try:
    import tomllib
except ImportError:  # Python 3.9, 3.10
    import tomli as tomllib

from fakes import ibtree

from slurm_hooks import config as config_mod
from slurm_hooks.preflight import learn
from slurm_hooks.probes import ib, sim

CONFIG = """[gpu]
backend = "sim"
sim_dir = "{root}/sim"

[state]
dir = "{root}/state"

[log]
audit = "{root}/audit.jsonl"
"""


def node_with_ports(tmp_path, ports: int = 8, extra: str = "") -> str:
    """A sim node ``n1`` as ``sim init --ib N`` lays it (0: no simulated ports); returns its config's path."""
    path = tmp_path / "config.toml"
    path.write_text(CONFIG.format(root=tmp_path) + extra)
    sim.init(str(tmp_path / "sim"), "n1", 8)
    if ports:
        sim.init_ib(str(tmp_path / "sim"), "n1", ports)
    return str(path)


def slurm_hooks(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "slurm_hooks", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "SLURMD_NODENAME": "n1"})


def test_learn_prints_the_ports_rate_and_gpus_of_a_healthy_node_and_leaves_the_config_alone(tmp_path):
    path = node_with_ports(tmp_path)
    before = (open(path, "rb").read(), os.stat(path).st_mtime_ns)
    res = slurm_hooks("validate", "--learn", "--config", path, "--node", "n1")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("# learned by `slurm-hooks validate --learn` on n1, ")
    learned = tomllib.loads(res.stdout)["expect"]
    assert learned == {"gpus": 8, "model": "NVIDIA H100 80GB HBM3", "pcie_gen": 5, "pcie_width": 16, "nvlinks": 18,
                       "ib_ports": 8, "ib_rate_gbps": 400}
    assert (open(path, "rb").read(), os.stat(path).st_mtime_ns) == before


def test_the_learned_lines_pasted_in_load_and_the_node_passes_them_until_a_port_trains_slower(tmp_path):
    path = node_with_ports(tmp_path)
    snippet = slurm_hooks("validate", "--learn", "--config", path, "--node", "n1").stdout
    with open(path, "a", encoding="utf-8") as fh:
        fh.write("\n" + snippet)
    expect = config_mod.load(path).expectations_for("n1")
    assert (expect.ib_ports, expect.ib_rate_gbps, expect.gpus) == (8, 400, 8)
    healthy = slurm_hooks("check", "--config", path, "--node", "n1", "--dry-run")
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    sim.inject_ib(str(tmp_path / "sim"), "n1", "mlx5_3:1", rate_gbps=200)  # judged only against a learned rate
    slow = slurm_hooks("check", "--config", path, "--node", "n1", "--dry-run")
    assert "IB mlx5_3 port 1: rate 200 Gb/s, expected 400 Gb/s" in slow.stdout, slow.stdout + slow.stderr


def test_a_node_in_a_group_learns_that_groups_table(tmp_path):
    path = node_with_ports(tmp_path, extra='\n[groups.h100]\nnodes = "n[1-4]"\ngpus = 8\n')
    res = slurm_hooks("validate", "--learn", "--config", path, "--node", "n1")
    assert res.returncode == 0, res.stderr
    assert tomllib.loads(res.stdout)["groups"]["h100"]["ib_ports"] == 8


def test_a_port_down_at_learning_is_not_expected_and_says_so(tmp_path):
    path = node_with_ports(tmp_path)
    sim.inject_ib(str(tmp_path / "sim"), "n1", "mlx5_7:1", state="down")
    res = slurm_hooks("validate", "--learn", "--config", path, "--node", "n1")
    assert tomllib.loads(res.stdout)["expect"]["ib_ports"] == 7
    assert "# note: IB mlx5_7 port 1 is DOWN/Polling: not counted; learn again once it is up" in res.stdout


def test_ports_at_different_rates_expect_the_slowest_and_say_so():
    ports = [{"device": f"mlx5_{i}", "port": 1, "state": "ACTIVE", "phys_state": "LinkUp", "rate_gbps": 400.0}
             for i in range(8)]
    ports.append({"device": "mlx5_8", "port": 1, "state": "ACTIVE", "phys_state": "LinkUp", "rate_gbps": 200.0})
    values, notes = learn.learn_ports(ports)
    assert values == {"ib_ports": 9, "ib_rate_gbps": 200}
    assert notes == ["IB ports run at 200, 400 Gb/s: the slowest is expected of every one"]


def test_a_node_without_ports_learns_no_port_keys():
    assert learn.learn_ports([]) == ({}, ["no InfiniBand/RoCE port under the [links] tree: ib_ports and "
                                          "ib_rate_gbps left unset"])


def test_the_captured_h100_ports_learn_eight_infiniband_at_400_and_the_roce_bond_apart():
    values, notes = learn.learn_ports(ib.read_ports(ibtree.H100_SYS))
    assert values == {"ib_ports": 8, "ib_rate_gbps": 400, "roce_ports": 1, "roce_rate_gbps": 200}
    assert notes == []


def test_on_the_h100_tree_the_learned_lines_drain_a_2x_port_and_name_a_port_down(tmp_path):
    root = ibtree.lay(str(tmp_path / "sys"))
    path = node_with_ports(tmp_path, 0, extra=f'\n[links]\nsysfs_root = "{root}"\n')
    res = slurm_hooks("validate", "--learn", "--config", path, "--node", "n1")
    assert res.returncode == 0, res.stderr
    learned = tomllib.loads(res.stdout)["expect"]
    assert {k: v for k, v in learned.items() if "ports" in k or "rate" in k} == \
        {"ib_ports": 8, "ib_rate_gbps": 400, "roce_ports": 1, "roce_rate_gbps": 200}
    with open(path, "a") as fh:
        fh.write("\n" + res.stdout)
    assert slurm_hooks("check", "--config", path, "--node", "n1", "--dry-run").returncode == 0
    ibtree.write(ibtree.port_file(root, "mlx5_6", "rate"), "200 Gb/sec (2X NDR)")
    slow = slurm_hooks("check", "--config", path, "--node", "n1", "--dry-run")
    assert slow.returncode != 0 and "IB mlx5_6 port 1: rate 200 Gb/s, expected 400 Gb/s" in slow.stdout, slow.stdout
    ibtree.set_state(root, "mlx5_0", "DOWN", "Polling")
    down = slurm_hooks("check", "--config", path, "--node", "n1", "--dry-run")
    assert "IB mlx5_0 port 1: state DOWN, physical state Polling (expected ACTIVE/LinkUp)" in down.stdout, down.stdout


def isolate_run(state_dir, faults: dict, seed: int = 1) -> str:
    """An isolate run over eight nodes of the project's Fabric model (busbw about 100 GB/s), its
    evidence written where isolate writes it (``[state] dir/isolate``); returns the file's path."""
    from slurm_hooks.hooks.isolate import Summary
    from slurm_hooks.remedy import culprit

    nodes = [f"n{i}" for i in range(1, 9)]
    fabric = culprit.Fabric(nodes, faults, seed=seed)
    summary = Summary(nodes, result=culprit.search(nodes, fabric.run_wave))
    out = os.path.join(str(state_dir), "isolate")
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, f"run-2026010{seed}T000000-1.json")
    with open(path, "w") as fh:
        json.dump(summary.to_dict(), fh)
    return path


def test_learn_proposes_the_isolate_floor_from_a_healthy_runs_lowest_busbw_and_names_it(tmp_path):
    path = node_with_ports(tmp_path)
    run = isolate_run(tmp_path / "state", {})
    tests = json.load(open(run))["tests"]
    low = min(t["bandwidth"] for t in tests)
    res = slurm_hooks("validate", "--learn", "--config", path, "--node", "n1")
    assert res.returncode == 0, res.stderr
    floor = tomllib.loads(res.stdout)["isolate"]["min_busbw_gbps"]
    assert 30 < low / 2 - 0.5 < floor < low / 2 + 0.5, (floor, low)
    assert f"of the {len(tests)} test(s) of the healthy isolate run {run}" in res.stdout
    assert f"lowest bus bandwidth ({low:g} GB/s" in res.stdout


def test_a_run_that_found_a_culprit_or_none_at_all_proposes_no_isolate_floor(tmp_path):
    path = node_with_ports(tmp_path)
    res = slurm_hooks("validate", "--learn", "--config", path, "--node", "n1")
    assert "isolate" not in tomllib.loads(res.stdout)
    assert "no isolate run that passed every test" in res.stdout and "min_busbw_gbps not proposed" in res.stdout
    isolate_run(tmp_path / "state", {"n5": "slow 10"})
    res = slurm_hooks("validate", "--learn", "--config", path, "--node", "n1")
    assert "isolate" not in tomllib.loads(res.stdout), res.stdout


def test_the_newest_healthy_run_is_learned_and_tests_that_could_not_run_are_no_figure():
    healthy = {"verdict": "ok", "tests": [
        {"nodes": ["n1", "n2"], "passed": True, "ran": True, "bandwidth": 40.0},
        {"nodes": ["n3", "n4"], "passed": True, "ran": False, "bandwidth": 2.0},
        {"nodes": ["n1", "n2", "n3", "n4"], "passed": True, "ran": True, "bandwidth": 44.0}]}
    older = {"verdict": "ok", "tests": [{"nodes": ["n1", "n2"], "passed": True, "ran": True, "bandwidth": 90.0}]}
    values, notes = learn.learn_isolate([("/x/run-new.json", healthy), ("/x/run-old.json", older)])
    assert values == {"min_busbw_gbps": 20.0}
    assert notes == ["[isolate] min_busbw_gbps 20: 50% of the lowest bus bandwidth (40 GB/s; median 44) of the 2 "
                     "test(s) of the healthy isolate run /x/run-new.json"]
