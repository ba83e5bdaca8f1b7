"""Simulated AMD Instinct GPUs: amdsmi's identity (partitions, dies, board serials), the amdgpu
driver's kernel lines and RAS files that ``sim inject`` writes, read back as a node's would be."""

from __future__ import annotations

import os

import pytest
from test_sim import cli

from slurm_hooks import engine
from slurm_hooks.errors import SimStateError
from slurm_hooks.hooks.watch import SimSource
from slurm_hooks.models import Action, Context, Expectations, Severity
from slurm_hooks.probes import sim
from slurm_hooks.remedy.drain import drain_reason


@pytest.fixture
def sim_dir(tmp_path):
    return str(tmp_path / "sim")


def judge(sim_dir, node="n2", gpus=8):
    return engine.run(sim.SimProbe(sim_dir, node), node,
                      engine.JudgeRequest(Expectations(gpus=gpus), Context.CHECK, deadline_s=10))


def test_an_mi300x_in_cpx_mode_is_eight_logical_gpus_per_board_each_with_its_render_node(sim_dir):
    sim.init(sim_dir, "n2", 8, vendor="amd", partition="cpx")
    snap = sim.SimProbe(sim_dir, "n2").snapshot()
    assert len(snap.gpus) == 64 and {g.model for g in snap.gpus} == {"AMD Instinct MI300X"}
    board = [g for g in snap.gpus if g.pci_bus_id == snap.gpus[8].pci_bus_id]
    assert [g.index for g in board] == list(range(8, 16)) and [g.partition for g in board] == list(range(8))
    assert len({g.serial for g in board}) == 1 and len({g.uuid for g in board}) == 8
    assert [g.minor for g in board] == list(range(136, 144))  # /dev/dri/renderD136..143
    assert [g.temperature_c is not None for g in board] == [True] + [False] * 7  # physical sensors: partition 0
    assert len({g.serial for g in snap.gpus}) == 8 and not any(g.uuid.startswith("GPU-") for g in snap.gpus)
    assert not [f for f in judge(sim_dir, gpus=64).findings if f.severity is not Severity.OK]


def test_an_mi250x_is_two_dies_on_one_board(sim_dir):
    sim.init(sim_dir, "n3", 4, "MI250X", vendor="amd")
    snap = sim.SimProbe(sim_dir, "n3").snapshot()
    assert len(snap.gpus) == 8 and len({g.pci_bus_id for g in snap.gpus}) == 8
    assert snap.gpus[0].serial == snap.gpus[1].serial != snap.gpus[2].serial
    assert [g.partition for g in snap.gpus[:2]] == [0, 1]


def test_an_uncorrectable_umc_error_is_the_drivers_line_and_drains_every_partition_of_its_board(sim_dir):
    sim.init(sim_dir, "n2", 8, vendor="amd", partition="cpx")
    sim.inject(sim_dir, "n2", 9, ras_ue="umc")
    with open(sim.kernel_log(sim_dir, "n2")) as fh:
        lines = fh.read().splitlines()
    assert lines[0].split("] ", 1)[1].startswith("amdgpu 0000:26:00.0: amdgpu: {")
    assert lines[0].endswith("socket: 0, die: 0, 1 new uncorrectable hardware errors detected in umc block")
    report = judge(sim_dir, gpus=64)
    assert drain_reason(report) == "slurm-hooks: uncorrectable ECC in UMC block on GPU 8-15 [reset]"
    assert report.requeue_gpus() == frozenset(range(8, 16))
    with open(os.path.join(sim_dir, "drm", "n2", "card8", "device", "ras", "umc_err_count")) as fh:
        assert fh.read() == "ue: 1\nce: 0\n"


@pytest.mark.parametrize("fault, rule, action", [
    (dict(ras_ue="gfx"), "amdgpu-ue", Action.RESET),
    (dict(ras_ue="xgmi_wafl"), "amdgpu-ue-xgmi", Action.RESET),
    (dict(ras_deferred="umc"), "amdgpu-deferred", Action.WARN),
    (dict(poison=True), "amdgpu-poison", Action.RESET),
    (dict(ring_timeout="gfx_0.0.0"), "amdgpu-ring-timeout", Action.WARN),
    (dict(driver_reset="succeeded"), "amdgpu-reset", Action.WARN),
    (dict(driver_reset="failed"), "amdgpu-reset-failed", Action.REBOOT),
    (dict(bad_pages=128), "amdgpu-bad-pages", Action.REPLACE),
])
def test_every_amd_fault_kind_is_judged_by_its_row(sim_dir, fault, rule, action):
    sim.init(sim_dir, "n2", 8, vendor="amd")
    sim.inject(sim_dir, "n2", 2, **fault)
    found = {f.rule: f for f in judge(sim_dir).findings}
    assert found[rule].action is action and found[rule].gpu == 2, found


def test_bad_pages_below_the_threshold_are_no_event(sim_dir):
    sim.init(sim_dir, "n2", 8, vendor="amd")
    sim.inject(sim_dir, "n2", 2, bad_pages=127)
    assert not judge(sim_dir).findings
    with open(os.path.join(sim_dir, "drm", "n2", "card2", "device", "ras", "gpu_vram_bad_pages")) as fh:
        assert len(fh.read().splitlines()) == 127


def test_a_reset_is_said_by_the_driver_and_only_recorded_and_a_reboot_starts_a_new_log(sim_dir):
    sim.init(sim_dir, "n2", 8, vendor="amd")
    sim.reset(sim_dir, "n2", 3)
    report = judge(sim_dir)
    assert [f.rule for f in report.findings] == ["amdgpu-reset", "amdgpu-vram-lost"] and report.healthy
    sim.reboot(sim_dir, "n2")
    assert not judge(sim_dir).findings


def test_each_vendors_faults_are_refused_on_the_other(sim_dir):
    sim.init(sim_dir, "n2", 8, vendor="amd")
    sim.init(sim_dir, "n1", 8)
    with pytest.raises(SimStateError, match="--xid"):
        sim.inject(sim_dir, "n2", 0, xid=79)
    with pytest.raises(SimStateError, match="--ras-ue"):
        sim.inject(sim_dir, "n1", 0, ras_ue="umc")


def test_the_watcher_gets_a_kernel_line_once_however_many_partitions_share_it(sim_dir):
    sim.init(sim_dir, "n2", 2, vendor="amd", partition="cpx")
    sim.inject(sim_dir, "n2", 12, ras_ue="umc")
    [event] = SimSource(sim_dir, "n2", 0.01).backlog()
    assert (event.rule, event.gpu, event.boot) == ("amdgpu-ue-umc", 8, sim.boot_id(sim_dir, "n2"))


def test_sim_cli_makes_an_amd_node_and_injects_its_faults(sim_dir):
    done = cli("init", "--node", "n2", "--vendor", "amd", "--partition", "cpx", "--sim-dir", sim_dir)
    assert done.returncode == 0 and "64 logical GPUs" in done.stdout, done.stderr
    done = cli("inject", "--node", "n2", "--gpu", "9", "--ras-ue", "umc", "--sim-dir", sim_dir)
    assert done.returncode == 0 and "ras-ue=umc" in done.stdout, done.stderr
    done = cli("inject", "--node", "n2", "--gpu", "9", "--xid", "79", "--sim-dir", sim_dir)
    assert done.returncode != 0 and "other vendor" in done.stderr
    done = cli("show", "--node", "n2", "--sim-dir", sim_dir)
    assert "64 x MI300X (CPX)" in done.stdout and "umc ue 1" in done.stdout


def run_tool(tmp_path, sim_dir, tool, *args):
    from slurm_hooks.probes import simtools
    from slurm_hooks.runner import run_command

    path = simtools.install(str(tmp_path / "bin"), sim_dir)[tool]
    return run_command([path, "--node", "n2", *args], 30, check=False)


def test_the_sims_amd_smi_resets_the_gpu_as_the_driver_says_and_nvidia_smi_finds_no_driver_there(sim_dir, tmp_path):
    sim.init(sim_dir, "n2", 8, vendor="amd")
    sim.inject(sim_dir, "n2", 3, ras_ue="umc")
    done = run_tool(tmp_path, sim_dir, "amd-smi", "reset", "-G", "-g", "3")
    assert done.returncode == 0 and "Successfully reset GPU 3" in done.stdout, done.stderr
    assert sim.gpu_entry(sim.read(sim_dir, "n2"), 3)["resets"] == 1
    with open(sim.kernel_log(sim_dir, "n2")) as fh:
        assert fh.read().splitlines()[-1].endswith("amdgpu 0000:65:00.0: amdgpu: GPU reset(1) succeeded!")
    refused = run_tool(tmp_path, sim_dir, "nvidia-smi", "--gpu-reset", "-i", "3")
    assert refused.returncode == 9 and "couldn't communicate with the NVIDIA driver" in refused.stderr
    sim.init(sim_dir, "n2", 8)
    assert run_tool(tmp_path, sim_dir, "amd-smi", "reset", "-G", "-g", "3").returncode == 1
    assert sim.gpu_entry(sim.read(sim_dir, "n2"), 3).get("resets", 0) == 0


def test_the_sims_rvs_passes_a_healthy_node_and_fails_a_latent_fault_at_its_level(sim_dir, tmp_path):
    from slurm_hooks.probes import rvs

    sim.init(sim_dir, "n2", 2, vendor="amd")
    sim.set_diag_seconds(sim_dir, "n2", 0.0)
    path = os.path.join(str(tmp_path), "bin", "rvs")
    run_tool(tmp_path, sim_dir, "rvs", "-r", "1")
    assert rvs.run_diag(2, 30, rvs=path).passed is True  # (the stand-in finds its node alone: one in the sim dir)
    sim.inject(sim_dir, "n2", 1, diag_failure=2)
    assert rvs.run_diag(1, 30, rvs=path).passed is True
    failed = rvs.run_diag(2, 30, rvs=path)
    uuid = sim.gpu_entry(sim.read(sim_dir, "n2"), 1)["uuid"]
    assert failed.passed is False and len(failed.failures) == 1 and f"GPU ID :{uuid} FAIL" in failed.failures[0][1]


def test_an_amd_sim_node_is_reset_with_amd_smi_stopping_no_service_and_validated_by_rvs(sim_dir, tmp_path,
                                                                                        monkeypatch):
    from fakes.config import repair_config

    from slurm_hooks import probes
    from slurm_hooks.probes import gpureset

    cfg = repair_config(tmp_path, 'services = ["nvidia-dcgm", "nvidia-fabricmanager"]')
    sim.init(cfg.gpu.sim_dir, "n1", 8)
    sim.init(cfg.gpu.sim_dir, "n2", 8, vendor="amd")
    nvidia, amd = gpureset.from_config(cfg, "n1"), gpureset.from_config(cfg, "n2")
    assert [argv[-4:] for argv in amd.argv_plan([2, 5])] == [["reset", "-G", "-g", "2"], ["reset", "-G", "-g", "5"]]
    assert not any("nvidia" in word or "systemctl" in word for argv in amd.argv_plan([2]) for word in argv)
    assert any(argv[-2:] == ["stop", "nvidia-dcgm"] for argv in nvidia.argv_plan([2]))
    for node in ("n1", "n2"):
        sim.set_diag_seconds(cfg.gpu.sim_dir, node, 0.0)
        sim.set_service(cfg.gpu.sim_dir, node, "nvidia-dcgm", False)  # dcgmi cannot run; rvs needs no DCGM
    monkeypatch.setenv("SLURMD_NODENAME", "n2")  # as slurmd runs the hooks
    assert probes.diag_runner(cfg, node="n2")(1, 30).passed is True
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    assert probes.diag_runner(cfg, node="n1")(1, 30).reason.startswith("nv-hostengine not reachable")
