"""The repair ladder's decisions, with simulated GPUs and the shared fake Slurm.

What Slurm itself does (the reboot, the node coming back) is in test_e2e_repair.py.
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest
from fakes.config import repair_config, sim_node

from slurm_hooks import config
from slurm_hooks.hooks import healthcheck
from slurm_hooks.models import Action, Finding, Severity
from slurm_hooks.probes import sim
from slurm_hooks.probes.gpureset import NvidiaSmiReset, ResetFailed
from slurm_hooks.remedy import repair
from slurm_hooks.remedy.wiring import Wiring


@pytest.fixture
def t(tmp_path):
    """Node n1 with 8 simulated GPUs, the fake Slurm, and the sim's dcgmi (a fast diagnostic):
    the ladder validates each repair before the node returns to service ([repair] dcgm_level 2)."""
    cfg = repair_config(tmp_path)
    slurm, w = sim_node(cfg, "IDLE")
    sim.set_diag_seconds(cfg.gpu.sim_dir, "n1", 0.0)
    return SimpleNamespace(w=w, slurm=slurm, sim_dir=cfg.gpu.sim_dir, audit=w.audit)


def rungs(t):
    return [(r["action"], r["result"]) for r in t.audit.read() if str(r.get("action", "")).startswith("repair-")]


@pytest.mark.parametrize("finding,rung", [
    (Finding("row-remap", Severity.FAIL, Action.RESET, "row remapping pending", 2), "reset"),
    (Finding("xid", Severity.FAIL, Action.REPLACE, "XID 79 (GPU has fallen off the bus)", 0, rule="xid.79"), "reboot"),
    (Finding("xid", Severity.FAIL, Action.REPLACE, "XID 79 (x), 3rd time in 24h -> hardware", 0,
             rule="xid.79"), "replace"),
    (Finding("gpu-lost", Severity.FAIL, Action.REPLACE, "GPU is lost", 0), "reboot"),
    (Finding("gpu-count", Severity.FAIL, Action.REBOOT, "7 GPUs visible, 8 expected"), "reboot"),
    (Finding("row-remap", Severity.FAIL, Action.REPLACE, "row remapping failed", 1), "replace"),
    (Finding("gpu-model", Severity.FAIL, Action.DRAIN, "model 'A100', expected 'H100'", 1), None),
])
def test_each_finding_starts_at_the_rung_of_its_action(finding, rung):
    assert repair.start_rung(finding) == rung


def test_row_remap_pending_on_an_idle_node_is_reset_and_resumed_in_one_run(t):
    sim.inject(t.sim_dir, "n1", 3, row_remap_pending=True)
    report, outcome = healthcheck.run(t.w, follow="none", repair="inline")
    assert outcome.drained and outcome.resumed and outcome.repairs == ["reset:ok"]
    assert t.slurm.peek("n1").state == "IDLE" and t.slurm.called("reboot") == []
    assert rungs(t) == [("repair-reset", "start"), ("repair-validate", "start"), ("repair-validate", "ok"),
                        ("repair-reset", "ok")]
    # Between the reset and the return to service the node was drained [validating].
    assert ("drain", "n1", "slurm-hooks: row remap pending on GPU 3 [validating]") in t.slurm.called("drain")
    assert sim.gpu_entry(sim.read(t.sim_dir, "n1"), 3)["resets"] == 1


def test_a_failed_reset_climbs_to_a_reboot_through_slurm_with_nextstate_down(t):
    sim.inject(t.sim_dir, "n1", 3, row_remap_pending=True, cleared_by="reboot")
    _, outcome = healthcheck.run(t.w, follow="none", repair="inline")
    assert outcome.repairs == ["reset:failed", "reboot:start"]
    assert t.slurm.called("reboot") == [("reboot", "n1", "slurm-hooks: row remap pending on GPU 3 [reboot 1/1]", "DOWN")]
    # While the reboot is pending, later checks leave the node to Slurm: no drain, no resume, no second reboot.
    _, again = healthcheck.run(t.w, follow="none", repair="inline")
    assert again.repairs == [] and len(t.slurm.called("reboot")) == 1 and not again.resumed
    assert t.slurm.peek("n1").reason == "slurm-hooks: row remap pending on GPU 3 [reboot 1/1]"


def test_after_the_reboot_a_healthy_check_resumes_the_node_that_came_back_down(t):
    sim.inject(t.sim_dir, "n1", 0, xid=79)
    healthcheck.run(t.w, follow="none", repair="inline")
    assert len(t.slurm.called("reboot")) == 1
    sim.reboot(t.sim_dir, "n1")
    t.slurm.set_node("n1", state="DOWN", reason="slurm-hooks: XID 79 on GPU 0 [reboot 1/1] : reboot issued : reboot complete")
    _, outcome = healthcheck.run(t.w, follow="none", repair="inline")
    assert outcome.repairs == ["reboot:ok"] and outcome.resumed
    assert t.slurm.peek("n1").state == "IDLE" and not t.slurm.peek("n1").reason


def test_a_fault_that_survives_the_reboot_is_tagged_replace_and_put_on_the_rma_list_once(t):
    sim.inject(t.sim_dir, "n1", 0, xid=79, cleared_by="never")
    healthcheck.run(t.w, follow="none", repair="inline")
    sim.reboot(t.sim_dir, "n1")
    t.slurm.set_node("n1", state="DOWN", reason="slurm-hooks: XID 79 on GPU 0 [reboot 1/1] : reboot issued : reboot complete")
    _, outcome = healthcheck.run(t.w, follow="none", repair="inline")
    assert outcome.repairs == ["reboot:failed", "replace:ok"]
    assert t.slurm.peek("n1").reason == "slurm-hooks: XID 79 on GPU 0 [replace]"
    entries = repair.read_rma(os.path.join(t.w.config.state.dir, "rma.json"))
    gpu = sim.gpu_entry(sim.read(t.sim_dir, "n1"), 0)
    assert [(e["uuid"], e["serial"], e["pci_bus_id"]) for e in entries] == [(gpu["uuid"], gpu["serial"], gpu["pci_bus_id"])]
    for _ in range(3):  # no reboot loop
        _, later = healthcheck.run(t.w, follow="none", repair="inline")
        assert later.repairs == []
    assert len(t.slurm.called("reboot")) == 1
    assert t.slurm.peek("n1").reason == "slurm-hooks: XID 79 on GPU 0 [replace]"


def test_a_fault_back_on_the_same_gpu_within_the_window_starts_one_rung_higher(t):
    sim.inject(t.sim_dir, "n1", 3, row_remap_pending=True)
    healthcheck.run(t.w, follow="none", repair="inline")
    assert t.slurm.peek("n1").state == "IDLE"
    sim.inject(t.sim_dir, "n1", 3, row_remap_pending=True)
    _, outcome = healthcheck.run(t.w, follow="none", repair="inline")
    assert outcome.repairs == ["reboot:start"]  # no second reset within the window


def test_turning_the_reset_rung_off_starts_a_reset_class_fault_at_the_reboot(t, tmp_path):
    cfg = config.parse(f'[gpu]\nbackend = "sim"\nsim_dir = "{t.sim_dir}"\n[state]\ndir = "{tmp_path}/s"\n'
                       '[repair]\nreset = false\n')
    w = Wiring(cfg, "n1", t.audit, slurm_override=t.slurm)
    sim.inject(t.sim_dir, "n1", 3, row_remap_pending=True)
    _, outcome = healthcheck.run(w, follow="none", repair="inline")
    assert outcome.repairs == ["reboot:start"]


def test_a_node_with_a_running_job_is_drained_but_not_repaired(t):
    t.slurm.add_job(7, "n1")
    sim.inject(t.sim_dir, "n1", 3, row_remap_pending=True)
    _, outcome = healthcheck.run(t.w, follow="none", repair="inline")
    assert outcome.drained and outcome.repairs == []


def test_someone_elses_drain_is_never_repaired(t):
    t.slurm.set_node("n1", state="IDLE+DRAIN", reason="admin: swap fan")
    sim.inject(t.sim_dir, "n1", 3, row_remap_pending=True)
    _, outcome = healthcheck.run(t.w, follow="none", repair="inline")
    assert outcome.repairs == [] and t.slurm.called("reboot") == []
    assert sim.gpu_entry(sim.read(t.sim_dir, "n1"), 3).get("resets", 0) == 0


def test_a_repair_under_way_elsewhere_holds_the_node(t):
    import fcntl

    sim.inject(t.sim_dir, "n1", 3, row_remap_pending=True)
    os.makedirs(t.w.config.state.dir, exist_ok=True)
    fd = os.open(t.w.state_path("repair-n1.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        _, outcome = healthcheck.run(t.w, follow="none", repair="inline")
    finally:
        os.close(fd)
    assert outcome.drained and outcome.repairs == []


def test_dry_run_says_what_the_ladder_would_do(t, capsys):
    from click.testing import CliRunner

    from slurm_hooks.commands.check import check

    sim.inject(t.sim_dir, "n1", 3, row_remap_pending=True)
    res = CliRunner().invoke(check, ["--config", t.w.config.path, "--node", "n1", "--dry-run"])
    assert "n1: repair would reset GPU(s) 3 (row remap pending on GPU 3: starts at reset)" in res.output


def test_nvidia_smi_reset_turns_persistence_off_and_restores_services_even_when_the_reset_fails():
    from slurm_hooks.errors import CommandError
    from slurm_hooks.runner import Completed

    calls = []

    def runner(argv, timeout):
        calls.append(list(argv))
        if "--gpu-reset" in argv:
            raise CommandError(list(argv), 1, "", "GPU 00000000:18:00.0 is in use")
        return Completed(tuple(argv), 0, "", "")

    backend = NvidiaSmiReset("/usr/bin/nvidia-smi", "/usr/bin/systemctl", ["nvidia-dcgm"], 30, runner=runner)
    with pytest.raises(ResetFailed, match="GPU 2"):
        backend.reset([2])
    assert calls == backend.argv_plan([2]) == [
        ["/usr/bin/systemctl", "stop", "nvidia-dcgm"], ["/usr/bin/nvidia-smi", "-i", "2", "-pm", "0"],
        ["/usr/bin/nvidia-smi", "--gpu-reset", "-i", "2"], ["/usr/bin/nvidia-smi", "-i", "2", "-pm", "1"],
        ["/usr/bin/systemctl", "start", "nvidia-dcgm"]]


def test_repair_config_errors_name_file_line_and_key(tmp_path):
    from slurm_hooks.errors import ConfigError

    path = tmp_path / "c.toml"
    path.write_text("[repair]\nattempts = 0\n")
    with pytest.raises(ConfigError, match="attempts"):
        config.load(str(path))
    path.write_text("[repair]\nservices = [\"-rf\"]\n")
    with pytest.raises(ConfigError, match=r"c.toml:2.*services"):
        config.load(str(path))


def test_sim_state_round_trips_json(t):
    sim.inject(t.sim_dir, "n1", 1, lost=True)
    with pytest.raises(sim.ResetFailed):
        sim.reset(t.sim_dir, "n1", 1)
    state = sim.reboot(t.sim_dir, "n1")
    assert not sim.gpu_entry(state, 1)["lost"] and json.dumps(state)


def test_evidence_before_a_repair_is_bounded_in_size_and_count_and_named_by_the_rma_entry(tmp_path):
    from fakes.config import sim_config

    kernel_log = tmp_path / "kern.log"
    kernel_log.write_text("NVRM: Xid (PCI:0000:17:00): 79, GPU has fallen off the bus\n" * 20000)  # ~1.2 MB
    cfg = sim_config(tmp_path, f'[watch]\nkmsg = "{kernel_log}"\n')
    _, w = sim_node(cfg, "IDLE")
    sim.inject(cfg.gpu.sim_dir, "n1", 0, xid=79)
    report = healthcheck.judge(w, healthcheck.Context.CHECK, acknowledge=False)
    paths = [repair.keep_evidence(w, report, "reboot") for _ in range(repair.EVIDENCE_KEEP + 3)]
    kept = sorted(os.listdir(repair.evidence_dir(w)))
    assert len(kept) <= repair.EVIDENCE_KEEP and os.path.basename(paths[-1]) in kept
    with open(os.path.join(paths[-1], "manifest.json")) as fh:
        manifest = json.load(fh)
    assert manifest["files"]["kernel-log.txt"] == repair.EVIDENCE_FILE_MAX
    assert manifest["files"]["snapshot.json"] > 0 and "nvidia-smi-q.txt" in manifest["skipped"]
    with open(os.path.join(paths[-1], "kernel-log.txt")) as fh:
        assert fh.read().rstrip().endswith("GPU has fallen off the bus")  # the tail, not the head
    assert oct(os.stat(os.path.join(paths[-1], "snapshot.json")).st_mode & 0o777) == "0o600"


def test_evidence_never_takes_the_time_a_rung_needs(tmp_path):
    from fakes.config import sim_config

    cfg = sim_config(tmp_path)
    _, w = sim_node(cfg, "IDLE")
    w.start_deadline(0.2)  # almost nothing left of the run: the rung comes first
    path = repair.keep_evidence(w, None, "replace")
    with open(os.path.join(path, "manifest.json")) as fh:
        manifest = json.load(fh)
    assert manifest["files"] == {} and set(manifest["skipped"].values()) == {"out of time"}


def test_an_unreadable_repair_state_is_said_once_and_the_ladder_does_nothing_nor_forgets(t, capsys):
    """A state file cut short (a full disk, a hand edit): the attempts on it are not forgotten (the
    ladder would start from its foot again), the file stays as it is, the run says so in one line
    and repairs nothing; the fault still takes the node out."""
    path = repair.state_path(t.w)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write('{"version": 1, "attempts": [{"rung": "reset", "t": 1')
    sim.inject(t.sim_dir, "n1", 3, row_remap_pending=True)
    _, outcome = healthcheck.run(t.w, follow="none", repair="inline")
    assert outcome.drained and outcome.repairs == [] and not outcome.resumed
    assert t.slurm.peek("n1").reason.startswith("slurm-hooks: row remap pending on GPU 3 [reset")
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "unreadable repair state" in ln]
    assert len(lines) == 1 and path in lines[0]
    with open(path, encoding="utf-8") as fh:
        assert fh.read() == '{"version": 1, "attempts": [{"rung": "reset", "t": 1'
    with pytest.raises(repair.RepairStateUnreadable):
        repair.load(t.w)


@pytest.fixture
def amd(t):
    """``t``'s node n1 with eight simulated MI300X instead."""
    sim.init(t.sim_dir, "n1", 8, vendor="amd")
    sim.set_diag_seconds(t.sim_dir, "n1", 0.0)
    return t


def test_an_amd_nodes_umc_error_is_reset_with_amd_smi_validated_by_rvs_and_resumed_with_no_nvidia_tool(amd, monkeypatch,
                                                                                                    tmp_path):
    from slurm_hooks import runner

    ran = []
    real = runner.run_command
    monkeypatch.setattr(runner, "run_command", lambda argv, *a, **kw: ran.append(list(argv)) or real(argv, *a, **kw))
    rvs = amd.w.config.dcgm.rvs  # the sim's stand-in, told to say when it runs
    with open(rvs) as fh:
        script = fh.read()
    with open(rvs, "w") as fh:
        fh.write(script.replace("\nexec ", f'\necho "$@" >> {tmp_path}/rvs.log\nexec ', 1))
    sim.inject(amd.sim_dir, "n1", 5, ras_ue="umc")
    report, outcome = healthcheck.run(amd.w, follow="none", repair="inline")
    assert outcome.drained and outcome.resumed and outcome.repairs == ["reset:ok"], outcome
    assert [reason for _, _, reason in amd.slurm.called("drain")] == [
        "slurm-hooks: uncorrectable ECC in UMC block on GPU 5 [reset]",
        "slurm-hooks: uncorrectable ECC in UMC block on GPU 5 [validating]"]
    assert [argv[-4:] for argv in ran if "amd-smi" in argv] == [["reset", "-G", "-g", "5"]]
    assert not [argv for argv in ran if {"nvidia-smi", "systemctl", "dcgmi"} & {os.path.basename(a) for a in argv}]
    with open(tmp_path / "rvs.log") as fh:
        assert fh.read() == "-r 2\n"
    assert sim.gpu_entry(sim.read(amd.sim_dir, "n1"), 5)["resets"] == 1
