"""AMD's uncorrectable ECC counts outlive a GPU reset (the driver counts since it loaded): the count
the reset rung dealt with is acknowledged for this boot, so the validation after the reset passes a
GPU that is good again instead of climbing to a reboot, while any new error still fails it."""

from __future__ import annotations

from fakes.fake_amdsmi import FakeAmdSmi
from test_amd_wording import RVS_PASS, amd_node

from slurm_hooks.hooks import healthcheck
from slurm_hooks.models import Context
from slurm_hooks.probes.gpureset import AmdSmiReset
from slurm_hooks.probes.kmsg import boot_id
from slurm_hooks.remedy import drain, repair
from slurm_hooks.remedy.outcome import Outcome
from slurm_hooks.remedy.wiring import xid_history


class ResetThenMore(AmdSmiReset):
    """amdsmi's reset; ``more``: the UMC count GPU 2 shows after it (errors during or after the reset)."""

    def __init__(self, fake: FakeAmdSmi, cpuinfo: str, more: int | None = None):
        super().__init__(amdsmi=fake, cpuinfo=cpuinfo)
        self.fake, self.more = fake, more

    def reset(self, indexes):
        super().reset(indexes)
        if self.more is not None:
            self.fake.set(gpu=2, ecc={"UMC": (0, self.more, 0)})


def ladder(tmp_path, more: int | None):
    """An AMD node whose GPU 2 has 3 uncorrectable UMC errors, drained for them; the ladder's reset
    rung run once (inline), validating with RVS that passes."""
    fake = FakeAmdSmi.healthy(gpus=4).set(gpu=2, ecc={"UMC": (0, 3, 0)})
    slurm, w = amd_node(tmp_path, RVS_PASS, fake)
    (tmp_path / "cpuinfo").write_text("flags\t\t: fpu vme de pse\n")  # bare metal: the reset is tried
    report = healthcheck.judge(w, Context.CHECK)
    assert [f.summary for f in report.drain_findings()] == ["ECC uncorrectable 3 on GPU 2, block UMC"]
    drain.drain(w, report, Outcome())
    outcome = Outcome()
    repair.step(w, report, outcome, healthcheck.rejudge(w),
                resetter=ResetThenMore(fake, str(tmp_path / "cpuinfo"), more), mode="inline")
    return slurm, w, fake, outcome


def test_a_reset_gpu_whose_count_stands_still_returns_to_service_without_a_reboot(tmp_path):
    """A check that judged the standing count again would fail the validation and climb to a reboot
    of a GPU the reset mended, and this test fails."""
    slurm, w, fake, outcome = ladder(tmp_path, more=None)
    assert fake.resets == [2]
    assert outcome.repairs == ["reset:ok"] and not slurm.peek("n1").drained
    assert slurm.called("reboot") == []
    uuid = fake.gpus[2]["uuid"]
    assert xid_history(w).load().ecc_acked(boot_id()) == {uuid: {"UMC": 3}}
    assert xid_history(w).load().ecc_acked("another-boot") == {}  # the driver counts afresh after a reboot


def test_a_new_error_after_the_reset_still_fails_it(tmp_path):
    slurm, w, fake, outcome = ladder(tmp_path, more=4)
    assert outcome.repairs[0] == "reset:failed" and slurm.peek("n1").drained
    [record] = [r for r in w.audit.read() if r.get("action") == "repair-reset" and r.get("result") == "failed"]
    assert record["detail"] == "still ECC uncorrectable 1 on GPU 2, block UMC after the reset"
    report = healthcheck.judge(w, Context.CHECK, acknowledge=False)
    [f] = report.drain_findings()
    assert f.message == "1 uncorrectable ECC errors in block UMC 4 (3 dealt with by a repair this boot) (max 0)"
