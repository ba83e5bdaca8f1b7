"""AMD Instinct snapshots (from the AMD probe over the shared fake amdsmi) judged by the same checks
and engine as NVIDIA's: generic faults in generic words, AMD's own (RAS blocks, XGMI, bad pages)
in AMD's, and no NVIDIA word in an AMD node's reasons."""

from __future__ import annotations

import pytest
from fakes.fake_amdsmi import AmdSmiMemoryPageStatus, FakeAmdSmi

from slurm_hooks import engine
from slurm_hooks.models import Action, Context, Expectations, Scope, Severity, Urgency
from slurm_hooks.probes.amdsmi import AmdSmiProbe

MI300X = Expectations(gpus=8, model="MI300X", pcie_gen=5, pcie_width=16, persistence_mode=True)
NVIDIA_WORDS = ("XID", "NVLink", "NVML", "nvidia", "CUDA", "persistence")


def judge(fake: FakeAmdSmi, context: Context = Context.CHECK, expect: Expectations = MI300X, **kw):
    snap = AmdSmiProbe("mi300-1", amdsmi=fake, drm_root="/nonexistent").snapshot()
    return engine.judge(snap, engine.JudgeRequest(expect, context, deadline_s=30.0, **kw))


def words(report) -> str:
    return " ".join(f"{f.message} {f.summary}" for f in report.findings) + " " + engine.drain_summary(report)


@pytest.mark.parametrize("context", [Context.CHECK, Context.PROLOG, Context.EPILOG])
def test_healthy_mi300x_node_passes_every_check_with_nvidia_expectations_left_unjudged(context):
    report = judge(FakeAmdSmi.healthy(gpus=8), context)
    assert report.healthy and report.findings == (), [f.line() for f in report.findings]


def test_uncorrectable_umc_error_drains_naming_the_gpu_and_block_and_touches_that_gpu_now():
    report = judge(FakeAmdSmi.healthy(gpus=8).set(gpu=5, ecc={"UMC": (12, 3, 0)}))
    (f,) = report.drain_findings()
    assert (f.check, f.gpu, f.action, f.scope, f.urgency) == ("ecc", 5, Action.RESET, Scope.GPU, Urgency.NOW)
    assert f.summary == "ECC uncorrectable 3 on GPU 5, block UMC"
    assert "3 uncorrectable ECC errors in block UMC 3 (max 0)" == f.message
    assert report.requeue_gpus() == frozenset({5})
    assert not any(w in words(report) for w in NVIDIA_WORDS)


def test_correctable_errors_alone_are_no_fault():
    report = judge(FakeAmdSmi.healthy(gpus=8).set(gpu=1, ecc={"UMC": (250, 0, 0), "GFX": (3, 0, 0)}))
    assert report.findings == ()


def test_epilog_says_how_many_uncorrectable_errors_came_during_the_job():
    fake = FakeAmdSmi.healthy(gpus=8).set(gpu=2, ecc={"UMC": (0, 1, 0)})
    before = AmdSmiProbe("mi300-1", amdsmi=fake, drm_root="/nonexistent").snapshot()
    fake.set(gpu=2, ecc={"UMC": (0, 4, 0), "GFX": (0, 2, 0)})
    report = judge(fake, Context.EPILOG, baseline=before, expect=Expectations(ecc_uncorrectable_volatile_max=0))
    (f,) = report.drain_findings()
    assert f.message == "6 uncorrectable ECC errors in blocks UMC 4 (+3 during the job), GFX 2 (+2 during the job) (max 0)"
    assert f.summary == "ECC uncorrectable 6 on GPU 2, blocks UMC, GFX"


def test_deferred_errors_alone_warn_and_take_nothing_out():
    report = judge(FakeAmdSmi.healthy(gpus=8).set(gpu=0, ecc={"UMC": (0, 0, 2)}))
    (f,) = report.findings
    assert (f.rule_key, f.severity, f.urgency) == ("ecc-deferred", Severity.WARN, Urgency.WATCH)
    assert report.healthy and not report.drain_findings()


def test_pending_bad_pages_ask_for_a_reset_when_the_jobs_end():
    pages = [(0x100, int(AmdSmiMemoryPageStatus.RESERVED)), (0x200, int(AmdSmiMemoryPageStatus.PENDING))]
    report = judge(FakeAmdSmi.healthy(gpus=8).set(gpu=3, bad_pages=pages))
    (f,) = report.drain_findings()
    assert (f.rule_key, f.action, f.urgency, f.gpu) == ("bad-pages-pending", Action.RESET, Urgency.JOB_END, 3)
    assert report.requeue_gpus() == frozenset()


def test_retired_pages_below_the_threshold_are_no_fault_and_at_it_an_rma():
    fake = FakeAmdSmi.healthy(gpus=8).set(gpu=4, bad_page_threshold=8,
                                          bad_pages=[(i, int(AmdSmiMemoryPageStatus.RESERVED)) for i in range(7)])
    assert judge(fake).findings == ()
    fake.set(gpu=4, bad_pages=[(i, int(AmdSmiMemoryPageStatus.RESERVED)) for i in range(8)])
    (f,) = judge(fake).drain_findings()
    assert (f.rule_key, f.action) == ("bad-pages-threshold", Action.REPLACE)
    assert f.message == "8 retired memory pages, the threshold is 8 (RMA candidate)"


def test_a_page_that_could_not_be_retired_is_an_rma():
    fake = FakeAmdSmi.healthy(gpus=8).set(gpu=6, bad_pages=[(0x9, int(AmdSmiMemoryPageStatus.UNRESERVABLE))])
    (f,) = judge(fake).drain_findings()
    assert (f.rule_key, f.action, f.gpu) == ("bad-pages-unreservable", Action.REPLACE, 6)


def test_xgmi_errors_drain_for_a_reset_in_amds_words():
    (f,) = judge(FakeAmdSmi.healthy(gpus=8).set(gpu=7, xgmi=2)).drain_findings()
    assert (f.check, f.action, f.gpu, f.urgency) == ("xgmi", Action.RESET, 7, Urgency.JOB_END)
    assert f.summary == "XGMI errors on GPU 7"


def test_pcie_link_trained_narrow_drains_in_generic_words():
    (f,) = judge(FakeAmdSmi.healthy(gpus=8).set(gpu=1, pcie_width=8)).drain_findings()
    assert f.summary == "PCIe x8 on GPU 1"


def test_hot_hbm_warns_and_thermal_violation_is_a_hardware_slowdown():
    fake = FakeAmdSmi.healthy(gpus=8).set(gpu=0, temps={"HOTSPOT": 70, "HBM_0": 96},
                                          violations={"active_hbm_thrm": True})
    report = judge(fake)
    assert {(f.rule_key, f.severity) for f in report.findings} == {("memory-thermal", Severity.WARN),
                                                                   ("throttle", Severity.WARN)}
    assert report.healthy


def test_a_die_over_its_temperature_limit_drains():
    (f,) = judge(FakeAmdSmi.healthy(gpus=8).set(gpu=2, temps={"HOTSPOT": 99})).drain_findings()
    assert f.summary == "GPU 2 at 99 C"


def test_a_fault_of_a_partitioned_gpu_touches_every_partition_of_it_and_no_other():
    fake = FakeAmdSmi.healthy(gpus=2, partitions=4).set(gpu=4, ecc={"UMC": (0, 1, 0)})
    report = judge(fake, expect=Expectations(gpus=8))
    assert report.requeue_gpus() == frozenset({4, 5, 6, 7})


def test_a_job_on_one_partition_is_judged_on_its_physical_gpus_fault():
    fake = FakeAmdSmi.healthy(gpus=2, partitions=4).set(gpu=4, ecc={"UMC": (0, 1, 0)})
    report = judge(fake, Context.PROLOG, gpus=(6,), expect=Expectations(gpus=8))
    assert [f.gpu for f in report.drain_findings()] == [6]
    assert judge(fake, Context.PROLOG, gpus=(1,), expect=Expectations(gpus=8)).healthy


def test_no_nvidia_word_in_any_finding_of_a_faulty_amd_node():
    fake = FakeAmdSmi.healthy(gpus=8)
    fake.set(gpu=0, ecc={"UMC": (0, 2, 0), "SDMA": (0, 0, 1)}, xgmi=1, pcie_width=4, temps={"HOTSPOT": 100})
    fake.set(gpu=1, bad_pages=[(1, int(AmdSmiMemoryPageStatus.UNRESERVABLE))], violations={"active_socket_thrm": True})
    fake.set(gpu=2, market_name="AMD Instinct MI210")
    fake.fail("amdsmi_get_gpu_vram_usage", gpu=3, code=10)
    report = judge(fake)
    assert len(report.findings) >= 7
    assert not any(w.lower() in words(report).lower() for w in NVIDIA_WORDS), words(report)


def test_amdsmi_that_cannot_start_fails_the_node_in_amds_words():
    report = judge(FakeAmdSmi.healthy(gpus=8).fail("amdsmi_init", code=34))
    (f,) = report.findings
    assert f.check == "gpu-probe"
    assert f.message == ("cannot read GPUs: amdsmi: driver not loaded "
                         "(AMDSMI_STATUS_DRIVER_NOT_LOADED - Driver not loaded)")
