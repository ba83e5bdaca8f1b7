"""Simulated GPUs: the state file API, the ``sim`` CLI, atomic writes and concurrent injects."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import threading

import pytest

from slurm_hooks import engine
from slurm_hooks.errors import SimStateError
from slurm_hooks.models import Action, Context, Expectations, Severity
from slurm_hooks.probes import sim

H100 = Expectations(gpus=8, model="H100", pcie_gen=5, pcie_width=16, nvlinks=18, fabric_manager=True)


@pytest.fixture
def sim_dir(tmp_path):
    return str(tmp_path / "sim")


def snapshot(sim_dir, node="n1"):
    return sim.SimProbe(sim_dir, node).snapshot()


def findings(sim_dir, node="n1", context=Context.CHECK, expect=H100):
    report = engine.run(sim.SimProbe(sim_dir, node), node, engine.JudgeRequest(expect, context, deadline_s=10))
    return [f for f in report.findings if f.severity is not Severity.OK]


def cli(*args, env=None, **kw):
    full_env = {k: v for k, v in os.environ.items() if k not in ("SLURM_HOOKS_CONFIG", "SLURMD_NODENAME")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "slurm_hooks", "sim", *args], capture_output=True, text=True,
                          env=full_env, timeout=60, **kw)


# --- API ---------------------------------------------------------------------------


def test_init_makes_a_healthy_node_that_passes_every_check(sim_dir):
    state = sim.init(sim_dir, "n1", 8, "H100")
    assert (state["version"], state["node"], len(state["gpus"])) == (1, "n1", 8)
    snap = snapshot(sim_dir)
    assert snap.error is None
    assert [g.index for g in snap.gpus] == list(range(8))
    assert len({g.uuid for g in snap.gpus}) == 8 and all(g.uuid.startswith("GPU-") for g in snap.gpus)
    assert {g.model for g in snap.gpus} == {"NVIDIA H100 80GB HBM3"}
    for context in Context:
        assert findings(sim_dir, context=context) == [], context


def test_init_is_deterministic_per_node_and_gpu(sim_dir):
    a = sim.init(sim_dir, "n1")["gpus"]
    b = sim.init(sim_dir, "n1")["gpus"]
    other = sim.init(sim_dir, "n2")["gpus"]
    assert [g["uuid"] for g in a] == [g["uuid"] for g in b]
    assert not {g["uuid"] for g in a} & {g["uuid"] for g in other}


def test_reinit_never_reuses_an_event_number(sim_dir):
    sim.init(sim_dir, "n1")
    sim.inject(sim_dir, "n1", 3, xid=79)
    old = snapshot(sim_dir).gpu(3).xids[0]
    sim.init(sim_dir, "n1")
    sim.inject(sim_dir, "n1", 3, xid=79)
    new = snapshot(sim_dir).gpu(3).xids[0]
    assert new.seq > old.seq and new.key != old.key


def test_init_replaces_earlier_state(sim_dir):
    sim.init(sim_dir, "n1", 8)
    sim.inject(sim_dir, "n1", 3, xid=79)
    sim.init(sim_dir, "n1", 4, "A100")
    state = sim.read(sim_dir, "n1")
    assert (state["model"], len(state["gpus"]), state["gpus"][3]["xids"]) == ("A100", 4, [])


@pytest.mark.parametrize("kwargs, message", [
    ({"model": "GTX1080"}, "unknown model 'GTX1080'"),
    ({"gpus": 0}, "--gpus must be 1..64, got 0"),
    ({"gpus": 65}, "--gpus must be 1..64, got 65"),
])
def test_init_refuses_bad_arguments(sim_dir, kwargs, message):
    with pytest.raises(SimStateError, match=message):
        sim.init(sim_dir, "n1", **kwargs)


@pytest.mark.parametrize("node", ["", "../etc", ".hidden", "a/b"])
def test_invalid_node_names_are_refused(sim_dir, node):
    with pytest.raises(SimStateError, match="invalid node name"):
        sim.init(sim_dir, node)


def test_inject_xid_records_an_event_with_a_rising_sequence(sim_dir):
    base = sim.init(sim_dir, "n1")["seq"]
    sim.inject(sim_dir, "n1", 3, xid=79)
    sim.inject(sim_dir, "n1", 3, xid=79)
    xids = snapshot(sim_dir).gpu(3).xids
    assert [(x.code, x.gpu, x.source, x.seq) for x in xids] == [(79, 3, "sim", base + 1), (79, 3, "sim", base + 2)]
    assert xids[0].pci_bus_id == snapshot(sim_dir).gpu(3).pci_bus_id
    assert xids[0].key != xids[1].key
    [f] = findings(sim_dir)
    assert f.line() == "gpu3 xid: XID 79 (GPU has fallen off the bus), 2 times -> reboot"


@pytest.mark.parametrize("fault, context, check, action, gpu", [
    ({"xid": 48}, Context.CHECK, "xid", Action.RESET, 2),
    ({"ecc_uncorrectable": 2}, Context.CHECK, "ecc", Action.RESET, 2),
    ({"row_remap_pending": True}, Context.CHECK, "row-remap", Action.RESET, 2),
    ({"row_remap_failure": True}, Context.CHECK, "row-remap", Action.REPLACE, 2),
    ({"lost": True}, Context.CHECK, "gpu-lost", Action.REPLACE, 2),
    ({"pcie_width": 8}, Context.CHECK, "pcie", Action.DRAIN, 2),
    ({"temp": 97}, Context.CHECK, "thermal", Action.DRAIN, 2),
    ({"process": 4242}, Context.EPILOG, "leftover", Action.DRAIN, 2),
    ({"nvlink_down": 5}, Context.CHECK, "nvlink", Action.RESET, 2),
])
def test_each_injected_fault_is_found_by_its_check(sim_dir, fault, context, check, action, gpu):
    sim.init(sim_dir, "n1")
    sim.inject(sim_dir, "n1", gpu, **fault)
    [f] = findings(sim_dir, context=context)
    assert (f.check, f.action, f.gpu) == (check, action, gpu)


def test_a_lost_gpu_answers_nothing_but_its_identity(sim_dir):
    sim.init(sim_dir, "n1")
    before = snapshot(sim_dir).gpu(5)
    sim.inject(sim_dir, "n1", 5, lost=True)
    lost = snapshot(sim_dir).gpu(5)
    assert (lost.lost, lost.uuid, lost.pci_bus_id) == (True, before.uuid, before.pci_bus_id)
    assert (lost.temperature_c, lost.nvlinks, lost.ecc_volatile_uncorrectable) == (None, None, None)


def test_ecc_injections_add_up(sim_dir):
    sim.init(sim_dir, "n1")
    sim.inject(sim_dir, "n1", 1, ecc_uncorrectable=2)
    sim.inject(sim_dir, "n1", 1, ecc_uncorrectable=3)
    gpu = snapshot(sim_dir).gpu(1)
    assert (gpu.ecc_volatile_uncorrectable, gpu.ecc_aggregate_uncorrectable) == (5, 5)


def test_clear_one_gpu_keeps_the_others_faults_identity_and_event_counter(sim_dir):
    base = sim.init(sim_dir, "n1")["seq"]
    uuid3 = snapshot(sim_dir).gpu(3).uuid
    sim.inject(sim_dir, "n1", 3, xid=79)
    sim.inject(sim_dir, "n1", 4, pcie_width=8)
    sim.clear(sim_dir, "n1", 3)
    assert [(f.check, f.gpu) for f in findings(sim_dir)] == [("pcie", 4)]
    assert snapshot(sim_dir).gpu(3).uuid == uuid3
    sim.inject(sim_dir, "n1", 3, xid=79)
    assert [x.seq for x in snapshot(sim_dir).gpu(3).xids] == [base + 2]  # a new event, not the old one again


def test_reinit_never_reuses_an_event_key(sim_dir):
    sim.init(sim_dir, "n1")
    sim.inject(sim_dir, "n1", 3, xid=79)
    first = snapshot(sim_dir).gpu(3).xids[0].key
    sim.init(sim_dir, "n1")
    sim.inject(sim_dir, "n1", 3, xid=79)
    assert snapshot(sim_dir).gpu(3).xids[0].key != first


def test_clear_all_makes_the_node_healthy(sim_dir):
    sim.init(sim_dir, "n1")
    for gpu in range(8):
        sim.inject(sim_dir, "n1", gpu, temp=99, lost=gpu == 7)
    sim.clear(sim_dir, "n1")
    assert findings(sim_dir) == []


def test_unknown_gpu_is_a_clear_error_and_changes_nothing(sim_dir):
    sim.init(sim_dir, "n1", 8)
    before = open(os.path.join(sim_dir, "n1.json")).read()
    with pytest.raises(SimStateError, match=r"^node 'n1' has no GPU 9 \(has 8\)$"):
        sim.inject(sim_dir, "n1", 9, xid=79)
    with pytest.raises(SimStateError, match="has no GPU 9"):
        sim.clear(sim_dir, "n1", 9)
    assert open(os.path.join(sim_dir, "n1.json")).read() == before


def test_a_node_never_initialised_says_how_to_fix_it(sim_dir):
    with pytest.raises(SimStateError, match=r"no simulated GPUs for node 'n2' \(run: slurm-hooks sim init --node n2\)"):
        sim.read(sim_dir, "n2")
    snap = snapshot(sim_dir, "n2")
    assert "no simulated GPUs" in snap.error and snap.gpus == ()


@pytest.mark.parametrize("content", ["{not json", "[]", '{"version": 99, "gpus": []}', '{"version": 1}', ""])
def test_corrupt_state_is_a_sim_state_error_and_a_probe_error(sim_dir, content):
    os.makedirs(sim_dir)
    with open(os.path.join(sim_dir, "n1.json"), "w") as fh:
        fh.write(content)
    with pytest.raises(SimStateError, match="corrupt sim state"):
        sim.read(sim_dir, "n1")
    with pytest.raises(SimStateError, match="corrupt sim state"):
        sim.inject(sim_dir, "n1", 0, xid=79)
    snap = snapshot(sim_dir)
    assert "corrupt sim state" in snap.error
    [f] = findings(sim_dir)
    assert (f.check, f.severity, f.action) == ("gpu-probe", Severity.FAIL, Action.DRAIN)


def test_a_gpu_entry_with_a_wrong_field_is_a_probe_error_not_a_crash(sim_dir):
    sim.init(sim_dir, "n1")
    sim.update(sim_dir, "n1", lambda s: s["gpus"][2].update(temprature_c=30))
    snap = snapshot(sim_dir)
    assert "corrupt sim state" in snap.error and "temprature_c" in snap.error


def test_taking_down_a_link_the_gpu_does_not_have_is_an_error(sim_dir):
    sim.init(sim_dir, "n1", 8, "H100")  # 18 links: 0..17
    with pytest.raises(SimStateError):
        sim.inject(sim_dir, "n1", 1, nvlink_down=18)


# --- atomic and concurrent writes ---------------------------------------------------------


def test_a_reader_never_sees_a_half_written_state_file(sim_dir):
    sim.init(sim_dir, "n1")
    path = os.path.join(sim_dir, "n1.json")
    stop = threading.Event()
    bad: list[str] = []
    reads = [0]

    def reader():
        while not stop.is_set():
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
            try:
                json.loads(text)
            except ValueError:
                bad.append(text[:80])
            reads[0] += 1

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in range(200):
            sim.inject(sim_dir, "n1", i % 8, xid=13)
    finally:
        stop.set()
        thread.join()
    assert bad == []
    assert reads[0] > 20  # the reader really ran alongside the writer
    assert sum(len(g["xids"]) for g in sim.read(sim_dir, "n1")["gpus"]) == 200
    assert not [name for name in os.listdir(sim_dir) if name.endswith(".tmp")]


def _inject_many(args):
    sim_dir, gpu, count = args
    for _ in range(count):
        sim.inject(sim_dir, "n1", gpu, xid=13)
    return gpu


def test_concurrent_injects_from_several_processes_lose_no_xid(sim_dir):
    base = sim.init(sim_dir, "n1")["seq"]
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(6) as pool:
        assert sorted(pool.map(_inject_many, [(sim_dir, gpu, 25) for gpu in range(6)])) == list(range(6))
    state = sim.read(sim_dir, "n1")
    assert [len(g["xids"]) for g in state["gpus"]] == [25] * 6 + [0, 0]
    seqs = sorted(x["seq"] for g in state["gpus"] for x in g["xids"])
    assert seqs == list(range(base + 1, base + 151))
    assert state["seq"] == base + 150


# --- CLI -------------------------------------------------------------------------------------


def test_cli_init_inject_show_clear(sim_dir):
    r = cli("init", "--node", "n1", "--gpus", "4", "--model", "A100", "--sim-dir", sim_dir)
    assert (r.returncode, r.stdout, r.stderr) == (0, "n1: 4 simulated A100 GPUs\n", "")

    r = cli("inject", "--node", "n1", "--gpu", "3", "--xid", "79", "--sim-dir", sim_dir)
    assert (r.returncode, r.stdout) == (0, "n1 gpu3: injected xid=79 (cleared by: reboot)\n")
    r = cli("inject", "--node", "n1", "--gpu", "1", "--row-remap-pending", "--temp", "91", "--sim-dir", sim_dir)
    assert (r.returncode, r.stdout) == (0, "n1 gpu1: injected row-remap-pending, temp=91 (cleared by: reset)\n")

    r = cli("show", "--node", "n1", "--sim-dir", sim_dir)
    assert r.returncode == 0
    lines = r.stdout.splitlines()
    assert lines[0] == "n1: 4 x A100"
    assert lines[1].startswith("  gpu0 GPU-") and lines[1].endswith(" healthy")
    assert lines[2].endswith(" 91C row-remap-pending")
    assert lines[4].endswith(" XID 79")

    r = cli("show", "--node", "n1", "--json", "--sim-dir", sim_dir)
    state = json.loads(r.stdout)
    assert [x["code"] for x in state["gpus"][3]["xids"]] == [79]

    r = cli("clear", "--node", "n1", "--gpu", "3", "--sim-dir", sim_dir)
    assert (r.returncode, r.stdout) == (0, "n1: gpu3 healthy\n")
    r = cli("clear", "--node", "n1", "--sim-dir", sim_dir)
    assert (r.returncode, r.stdout) == (0, "n1: all GPUs healthy\n")
    assert sim.read(sim_dir, "n1")["gpus"][1]["row_remap_pending"] is False


def test_cli_takes_the_node_from_slurmd_nodename(sim_dir):
    assert cli("init", "--sim-dir", sim_dir, env={"SLURMD_NODENAME": "gpu042"}).returncode == 0
    assert sim.read(sim_dir, "gpu042")["node"] == "gpu042"


def test_cli_takes_sim_dir_from_the_config(tmp_path, sim_dir):
    conf = tmp_path / "config.toml"
    conf.write_text(f'[gpu]\nbackend = "sim"\nsim_dir = "{sim_dir}"\n')
    assert cli("init", "--node", "n1", "--gpus", "2", "--config", str(conf)).returncode == 0
    r = cli("inject", "--node", "n1", "--gpu", "1", "--lost", env={"SLURM_HOOKS_CONFIG": str(conf)})
    assert r.returncode == 0
    assert sim.read(sim_dir, "n1")["gpus"][1]["lost"] is True


def test_cli_inject_without_a_fault_is_a_usage_error(sim_dir):
    sim.init(sim_dir, "n1")
    r = cli("inject", "--node", "n1", "--gpu", "1", "--sim-dir", sim_dir)
    assert r.returncode == 2
    assert "name a fault" in r.stderr


def test_cli_can_take_down_nvlink_0(sim_dir):
    sim.init(sim_dir, "n1")
    r = cli("inject", "--node", "n1", "--gpu", "1", "--nvlink-down", "0", "--sim-dir", sim_dir)
    assert (r.returncode, r.stdout) == (0, "n1 gpu1: injected nvlink-down=0 (cleared by: reset)\n")
    assert sim.read(sim_dir, "n1")["gpus"][1]["nvlinks"][0]["active"] is False


def test_cli_corrupt_state_file_is_one_line_and_exit_2(sim_dir):
    os.makedirs(sim_dir)
    path = os.path.join(sim_dir, "n1.json")
    with open(path, "w") as fh:
        fh.write('{"version": 1, "gpus": [')
    for args in (["show"], ["inject", "--gpu", "0", "--xid", "79"], ["clear"]):
        r = cli(*args, "--node", "n1", "--sim-dir", sim_dir)
        assert r.returncode == 2, args
        assert r.stderr.startswith(f"slurm-hooks: {path}: corrupt sim state: "), args
        assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, args


def test_cli_unknown_gpu_is_a_clear_error(sim_dir):
    sim.init(sim_dir, "n1", 8)
    r = cli("inject", "--node", "n1", "--gpu", "9", "--xid", "79", "--sim-dir", sim_dir)
    assert (r.returncode, r.stderr) == (2, "slurm-hooks: node 'n1' has no GPU 9 (has 8)\n")


def test_cli_gpu_index_out_of_range_is_a_usage_error(sim_dir):
    sim.init(sim_dir, "n1")
    r = cli("inject", "--node", "n1", "--gpu", "64", "--xid", "79", "--sim-dir", sim_dir)
    assert r.returncode == 2
    assert "--gpu" in r.stderr and "Traceback" not in r.stderr


def test_cli_show_of_an_unknown_node_says_how_to_create_it(sim_dir):
    r = cli("show", "--node", "n9", "--sim-dir", sim_dir)
    assert r.returncode == 2
    assert r.stderr.endswith("no simulated GPUs for node 'n9' (run: slurm-hooks sim init --node n9)\n")


def test_injected_xids_name_their_gpu_by_uuid_even_in_a_state_file_from_before_uuids(tmp_path):
    from slurm_hooks.probes.sim import SimProbe

    sim.init(str(tmp_path), "n1", gpus=4)
    sim.inject(str(tmp_path), "n1", 2, xid=79)
    sim.update(str(tmp_path), "n1", lambda state: state["gpus"][2]["xids"][0].pop("uuid"))  # as older versions wrote
    gpu = SimProbe(str(tmp_path), "n1").snapshot().gpus[2]
    [event] = gpu.xids
    assert event.uuid == gpu.uuid and event.gpu_id == gpu.uuid
    sim.inject(str(tmp_path), "n1", 2, xid=48)
    assert [x.uuid for x in SimProbe(str(tmp_path), "n1").snapshot().gpus[2].xids] == [gpu.uuid, gpu.uuid]


def test_replace_puts_new_hardware_in_the_slot_new_uuid_and_serial_same_bus_id(sim_dir):
    sim.init(sim_dir, "n1", 8)
    before = sim.read(sim_dir, "n1")
    sim.inject(sim_dir, "n1", 3, row_remap_failure=True)
    sim.replace(sim_dir, "n1", 3)
    after = sim.read(sim_dir, "n1")
    old, new = sim.gpu_entry(before, 3), sim.gpu_entry(after, 3)
    assert new["uuid"] != old["uuid"] and new["serial"] != old["serial"]
    assert (new["index"], new["pci_bus_id"]) == (old["index"], old["pci_bus_id"])
    assert not new["row_remap_failure"] and not findings(sim_dir)
    assert [g["uuid"] for g in after["gpus"] if g["index"] != 3] == [g["uuid"] for g in before["gpus"] if g["index"] != 3]
    # The new board keeps its identity through a clear; a second replacement is new again.
    sim.clear(sim_dir, "n1", 3)
    assert sim.gpu_entry(sim.read(sim_dir, "n1"), 3)["uuid"] == new["uuid"]
    sim.replace(sim_dir, "n1", 3)
    assert sim.gpu_entry(sim.read(sim_dir, "n1"), 3)["uuid"] not in (old["uuid"], new["uuid"])


def test_sim_replace_command_names_the_new_uuid_and_refuses_an_unknown_gpu(sim_dir):
    assert cli("init", "--node", "n1", "--gpus", "4", "--sim-dir", sim_dir).returncode == 0
    done = cli("replace", "--node", "n1", "--gpu", "2", "--sim-dir", sim_dir)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (f"n1 gpu2: replaced, now {sim.gpu_entry(sim.read(sim_dir, 'n1'), 2)['uuid']} "
                                   f"(serial {sim.gpu_entry(sim.read(sim_dir, 'n1'), 2)['serial']})")
    bad = cli("replace", "--node", "n1", "--gpu", "9", "--sim-dir", sim_dir)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr and "9" in bad.stderr


# --- InfiniBand ports ---------------------------------------------------------------------------


def ib_ports(sim_dir, node="n1", clock=None, boot=None):
    """One gather of the simulated node's ports, as the health check does it."""
    from slurm_hooks.probes import ib

    gather = ib.LinkGatherer(sim.ib_root(sim_dir, node), os.path.join(sim_dir, "state"), node,
                             boot=boot or (lambda: sim.boot_id(sim_dir, node)), clock=clock or (lambda: 1000.0))
    return {p.name: p for p in gather()}


def test_sim_init_ib_lays_healthy_ndr_ports_the_sysfs_reader_reads(sim_dir):
    sim.init(sim_dir, "n1", 8)
    assert sim.init_ib(sim_dir, "n1", 8) == [f"mlx5_{i}:1" for i in range(8)]
    ports = ib_ports(sim_dir)
    assert len(ports) == 8
    assert all(p.up and p.rate_gbps == 400.0 and p.link_layer == "InfiniBand" for p in ports.values())


def test_sim_inject_port_down_and_up_counts_the_drop(sim_dir):
    sim.init(sim_dir, "n1", 8)
    sim.init_ib(sim_dir, "n1", 2)
    assert sim.inject_ib(sim_dir, "n1", "mlx5_0:1", state="down") == "state down"
    p = ib_ports(sim_dir)["mlx5_0 port 1"]
    assert (p.state, p.phys_state, dict(p.counters)["link_downed"]) == ("DOWN", "Polling", 1)
    sim.inject_ib(sim_dir, "n1", "mlx5_0:1", state="up")
    assert ib_ports(sim_dir)["mlx5_0 port 1"].up


def test_sim_inject_counter_and_flap(sim_dir):
    sim.init(sim_dir, "n1", 8)
    sim.init_ib(sim_dir, "n1", 1)
    assert sim.inject_ib(sim_dir, "n1", "mlx5_0:1", counter=sim.parse_counter("symbol_error+=200")) == \
        "symbol_error=200"
    assert sim.inject_ib(sim_dir, "n1", "mlx5_0:1", flap=True) == "flap (link_downed=1)"


def test_sim_reboot_starts_the_counters_at_zero_with_a_new_boot_id(sim_dir):
    sim.init(sim_dir, "n1", 8)
    sim.init_ib(sim_dir, "n1", 1)
    sim.inject_ib(sim_dir, "n1", "mlx5_0:1", counter=("symbol_error", 50))
    before = sim.boot_id(sim_dir, "n1")
    sim.reboot(sim_dir, "n1")
    assert sim.boot_id(sim_dir, "n1") != before
    assert dict(ib_ports(sim_dir)["mlx5_0 port 1"].counters)["symbol_error"] == 0


def test_sim_reboot_clears_the_mlx5_lines_of_the_last_boot(sim_dir):
    """The kernel's ring buffer starts empty at boot: the last boot's overheating module is no new
    event of this one (it drained the node again, for another hour, after every reboot)."""
    from slurm_hooks.probes import ib

    sim.init(sim_dir, "n1", 8)
    sim.init_ib(sim_dir, "n1", 2)

    def events() -> list:
        gather = ib.LinkGatherer(sim.ib_root(sim_dir, "n1"), os.path.join(sim_dir, "state"), "n1",
                                 boot=lambda: sim.boot_id(sim_dir, "n1"), kmsg=sim.ib_kmsg(sim_dir, "n1"))
        return [rule for p in gather() for rule, _ in p.events]

    sim.inject_ib(sim_dir, "n1", "mlx5_1:1", event="module-temperature")
    assert events() == ["ib-module-temperature"]
    sim.reboot(sim_dir, "n1")
    assert events() == []


@pytest.mark.parametrize("target", ["mlx5_9:1", "../x:1", "mlx5_0:a", ":1"])
def test_sim_inject_names_a_port_that_is_not_there(sim_dir, target):
    sim.init(sim_dir, "n1", 8)
    sim.init_ib(sim_dir, "n1", 1)
    with pytest.raises(SimStateError, match="has no IB port"):
        sim.inject_ib(sim_dir, "n1", target, state="down")


def test_sim_counter_must_be_name_plus_equals_n():
    with pytest.raises(SimStateError, match="NAME\\+=N"):
        sim.parse_counter("symbol_error=5")


def test_sim_cli_init_ib_and_inject_port(sim_dir):
    r = cli("init", "--node", "n1", "--ib", "8", "--sim-dir", sim_dir)
    assert r.returncode == 0 and "8 InfiniBand ports" in r.stdout, r.stderr
    r = cli("inject", "--node", "n1", "--ib", "mlx5_0:1", "--state", "down", "--sim-dir", sim_dir)
    assert r.returncode == 0 and r.stdout.strip() == "n1 mlx5_0:1: state down", r.stderr
    r = cli("inject", "--node", "n1", "--ib", "mlx5_0:1", "--counter", "symbol_error+=7", "--sim-dir", sim_dir)
    assert r.stdout.strip() == "n1 mlx5_0:1: symbol_error=7"
    assert not ib_ports(sim_dir)["mlx5_0 port 1"].up


def test_sim_cli_port_options_without_ib_are_a_usage_error(sim_dir):
    cli("init", "--node", "n1", "--sim-dir", sim_dir)
    r = cli("inject", "--node", "n1", "--gpu", "0", "--state", "down", "--sim-dir", sim_dir)
    assert r.returncode != 0 and "go with --ib" in r.stderr and "Traceback" not in r.stderr
    r = cli("inject", "--node", "n1", "--sim-dir", sim_dir)
    assert r.returncode != 0 and "--gpu" in r.stderr
    r = cli("inject", "--node", "n1", "--ib", "mlx5_7:1", "--flap", "--sim-dir", sim_dir)
    assert r.returncode != 0 and "has no IB port" in r.stderr and "Traceback" not in r.stderr


def test_sim_init_without_ib_removes_the_ports_of_an_earlier_init(sim_dir):
    sim.init(sim_dir, "n1", 8)
    sim.init_ib(sim_dir, "n1", 2)
    sim.init(sim_dir, "n1", 8)  # what the testbed's reset does: no port of the last test's stays down
    assert not os.path.exists(sim.ib_root(sim_dir, "n1"))


def test_sim_inject_event_writes_the_mlx5_line_of_the_ports_adapter(sim_dir):
    from slurm_hooks.probes import kmsg

    sim.init(sim_dir, "n1", 8)
    sim.init_ib(sim_dir, "n1", 2)
    assert sim.inject_ib(sim_dir, "n1", "mlx5_1:1", event="power") == "kernel line power"
    [(rule, pci, ts, seq, text)] = kmsg.read_mlx5(sim.ib_kmsg(sim_dir, "n1"))
    assert (rule, pci) == ("ib-power", "00000000:2A:00.0") and ts is not None
    assert [p.events for p in ib_ports(sim_dir).values() if p.events] == []  # ib_ports reads no kernel log
    sim.init(sim_dir, "n1", 8)
    assert not os.path.exists(sim.ib_kmsg(sim_dir, "n1"))


@pytest.mark.parametrize(("status", "says"), [("warn", "warn: memory on GPU 3: GPU 3: memory test warned"),
                                               ("skip", "skip: memory on GPU 3: GPU 3: memory test was skipped")])
def test_the_sims_dcgmi_answers_warn_or_skip_and_the_judge_calls_it_not_verified(sim_dir, tmp_path, status, says):
    """Admins rehearse a DCGM answer that vouches for nothing: the sim's dcgmi gives it, in DCGM's own
    JSON, and our judge calls it a warning (not verified), never a GPU fault to drain for."""
    from slurm_hooks.checks.dcgm import check_diag
    from slurm_hooks.models import CheckInput, Expectations, GpuSnapshot, NodeSnapshot, Severity
    from slurm_hooks.probes import simtools
    from slurm_hooks.probes.dcgm import run_diag

    sim.init(sim_dir, "n1", 4)
    r = cli("inject", "--node", "n1", "--gpu", "3", "--diag-failure", "2", "--diag-status", status, "--sim-dir", sim_dir)
    assert (r.returncode, r.stdout) == (0, f"n1 gpu3: injected diag-failure=2, diag-status={status} (cleared by: never)\n")
    assert cli("show", "--node", "n1", "--sim-dir", sim_dir).stdout.splitlines()[4].endswith(
        f"latent: {'warns in' if status == 'warn' else 'skips'} DCGM L2 memory")
    sim.set_diag_seconds(sim_dir, "n1", 0.0)
    dcgmi = simtools.install(str(tmp_path / "bin"), sim_dir)["dcgmi"]
    result = run_diag(2, 30.0, dcgmi=dcgmi)
    assert result.available and result.passed is None and result.failures == ()
    assert result.reason == f"1 of 12 result(s) did not pass: {says} (slurm-hooks sim, latent fault found at level 2)"
    snapshot = NodeSnapshot("n1", "sim", gpus=tuple(GpuSnapshot(i) for i in range(4)))
    [finding] = check_diag(CheckInput(snapshot, Expectations(), dcgm=result))
    assert finding.severity is Severity.WARN and finding.message.startswith("DCGM diag L2 not verified: 1 of 12 result(s) did not pass: ")


def test_diag_status_goes_with_a_diag_failure(sim_dir):
    sim.init(sim_dir, "n1", 2)
    r = cli("inject", "--node", "n1", "--gpu", "1", "--diag-status", "warn", "--sim-dir", sim_dir)
    assert r.returncode == 2 and "--diag-status goes with --diag-failure LEVEL" in r.stderr


def test_sim_init_does_not_replace_another_users_node_in_a_shared_sim_dir(tmp_path):
    """Two people rehearsing in the default (shared) sim_dir: one's `sim init` must not wipe the
    other's node; the refusal says whose it is and how to use a directory of one's own."""
    shared = tmp_path / "sim"
    sim.init(str(shared), "n1", gpus=4)
    sim.inject(str(shared), "n1", 2, xid=79)
    path = shared / "n1.json"
    os.chown(path, 4242, 4242)  # as `sim init` by uid 4242 leaves it
    before = path.read_bytes()
    run = subprocess.run([sys.executable, "-m", "slurm_hooks", "sim", "init", "--node", "n1", "--sim-dir", str(shared)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode != 0
    assert "belong to uid 4242, not to you: not replaced" in run.stderr and "--sim-dir" in run.stderr
    assert path.read_bytes() == before
    mine = subprocess.run([sys.executable, "-m", "slurm_hooks", "sim", "init", "--node", "n2", "--sim-dir", str(shared)],
                          capture_output=True, text=True, timeout=60)
    assert mine.returncode == 0, mine.stderr
