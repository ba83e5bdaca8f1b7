"""The repair ladder's reset rung and validation on AMD GPUs: ``amdsmi_reset_gpu`` (once per
board; refused in a VM guest or where unsupported, so the ladder climbs), and RVS at DCGM's levels
(absent: not run, never a pass)."""

from __future__ import annotations

import pytest
from fakes.config import sim_config
from fakes.fake_amdsmi import STATUS, FakeAmdSmi

from slurm_hooks import probes
from slurm_hooks.models import Context, Expectations, Severity
from slurm_hooks.probes import gpureset, rvs
from slurm_hooks.probes.gpureset import AmdSmiReset, ResetFailed
from slurm_hooks.remedy.repair.ladder import Rung
from slurm_hooks.remedy.repair.rungs import CLIMBS_ON
from slurm_hooks.values import replace


def bare_metal(tmp_path) -> str:
    path = tmp_path / "cpuinfo"
    path.write_text("processor\t: 0\nflags\t\t: fpu vme de pse tsc msr pae mce\n")
    return str(path)


def test_reset_resets_each_faulty_board_once_through_its_first_partition(tmp_path):
    fake = FakeAmdSmi.healthy(gpus=2, partitions=4)
    AmdSmiReset(amdsmi=fake, cpuinfo=bare_metal(tmp_path)).reset([5, 6])
    assert fake.resets == [4] and not fake.initialised


def test_reset_of_two_mi250x_dies_resets_each_die(tmp_path):
    fake = FakeAmdSmi.healthy(gpus=2, model="AMD Instinct MI250X")
    AmdSmiReset(amdsmi=fake, cpuinfo=bare_metal(tmp_path)).reset([0, 1])
    assert fake.resets == [0, 1]


def test_unsupported_reset_fails_so_the_ladder_climbs(tmp_path):
    fake = FakeAmdSmi.healthy(gpus=8).fail("amdsmi_reset_gpu", code=STATUS["NOT_SUPPORTED"])
    with pytest.raises(ResetFailed) as err:
        AmdSmiReset(amdsmi=fake, cpuinfo=bare_metal(tmp_path)).reset([3])
    assert str(err.value) == ("GPU 3: amdsmi_reset_gpu not supported "
                              "(AMDSMI_STATUS_NOT_SUPPORTED - Feature not supported)")
    assert "failed" in CLIMBS_ON[Rung.RESET]  # the rung reports a ResetFailed as "failed"


def test_a_vm_guest_never_tries_the_reset(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu vme de pse tsc msr pae mce hypervisor lahf_lm\n")
    fake = FakeAmdSmi.healthy(gpus=8)
    with pytest.raises(ResetFailed, match="refused: a VM guest cannot reset its GPU"):
        AmdSmiReset(amdsmi=fake, cpuinfo=str(cpuinfo)).reset([0])
    assert fake.called("amdsmi_reset_gpu") == 0


def test_amdsmi_backend_picks_the_amdsmi_reset_and_rvs(tmp_path):
    cfg = sim_config(tmp_path, '[dcgm]\nrvs = "/nonexistent/rvs"')
    cfg = replace(cfg, gpu=replace(cfg.gpu, backend="amdsmi"))
    assert isinstance(gpureset.from_config(cfg, "n1"), AmdSmiReset)
    result = probes.diag_runner(cfg)(2, 10.0)
    assert (result.available, result.passed, result.reason) == (False, None, "rvs not installed at /nonexistent/rvs")


def script(tmp_path, body: str) -> str:
    path = tmp_path / "rvs"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def test_rvs_that_passes_is_a_pass(tmp_path):
    fake = script(tmp_path, 'echo "[RESULT] [ 1234.5] Action name :gst-1 Module name :gst pass: TRUE"\nexit 0\n')
    assert rvs.run_diag(2, 30, rvs=fake).passed is True


def test_rvs_that_fails_names_its_failing_tests_and_fails_the_gpus(tmp_path):
    fake = script(tmp_path, 'echo "[RESULT] [ 99.1] Action name :mem-1 Module name :mem FAIL"\nexit 1\n')
    result = rvs.run_diag(2, 30, rvs=fake)
    assert result.passed is False and result.failures == ((None, "[RESULT] [ 99.1] Action name :mem-1 Module name :mem FAIL"),)
    from slurm_hooks import engine
    from slurm_hooks.probes.amdsmi import AmdSmiProbe

    snap = AmdSmiProbe("n", amdsmi=FakeAmdSmi.healthy(gpus=2), drm_root="/nonexistent").snapshot()
    report = engine.judge(snap, engine.JudgeRequest(Expectations(dcgm_level_check=2), Context.CHECK, deadline_s=60,
                                                    dcgm=lambda level, t: result))
    assert any(f.check == "dcgm" and f.severity is Severity.FAIL and f.action.takes_node_out for f in report.findings)


def test_rvs_cut_short_is_not_a_pass(tmp_path):
    fake = script(tmp_path, "sleep 5\n")
    result = rvs.run_diag(1, 0.5, rvs=fake)
    assert result.passed is None and "did not finish" in result.reason
