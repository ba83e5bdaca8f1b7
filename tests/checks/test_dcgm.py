"""DCGM diagnostics: a fake ``dcgmi`` executable prints DCGM-shaped JSON, the probe reads it, the check judges it."""

from __future__ import annotations

import json
import os
import stat
import time

import pytest
from fakes.config import sim_config, sim_node

from slurm_hooks import engine
from slurm_hooks.checks.dcgm import check_diag
from slurm_hooks.hooks import healthcheck, jobhooks
from slurm_hooks.models import (
    Action,
    CheckInput,
    Context,
    DcgmResult,
    Expectations,
    GpuSnapshot,
    NodeSnapshot,
    Severity,
)
from slurm_hooks.probes.dcgm import make_runner, parse, run_diag

# DCGM 3.x shape (as `dcgmi diag -r 1 -j` prints it: a banner line, nulls between tests). Row remap skipped,
# PCIe warned on GPU 1: not a pass (nvvs starts every entity at SKIP; only every test PASS is a pass).
SKIP_WARN_3X = """Successfully ran diagnostic for group.
{
  "DCGM GPU Diagnostic": {
    "test_categories": [
      {"category": "Deployment", "tests": [
        {"name": "Denylist", "results": [{"gpu_ids": "0,1,2,3,4,5,6,7", "status": "Pass"}]},
        null,
        {"name": "NVML Library", "results": [{"gpu_ids": "0,1,2,3,4,5,6,7", "status": "Pass"}]},
        null,
        {"name": "Persistence Mode", "results": [{"gpu_ids": "0,1,2,3,4,5,6,7", "status": "Pass"}]},
        {"name": "Page Retirement/Row Remap", "results": [{"gpu_ids": "0,1,2,3,4,5,6,7", "status": "Skip"}]}
      ]},
      {"category": "Integration", "tests": [
        {"name": "PCIe", "results": [{"gpu_ids": "0", "status": "Pass"}, {"gpu_ids": "1", "status": "Warn",
          "warnings": ["PCIe replay rate on GPU 1 is elevated"]}]}
      ]}
    ],
    "version": "3.3.9"
  }
}
"""

PASS_3X = SKIP_WARN_3X.replace('"Skip"', '"Pass"').replace('"Warn"', '"Pass"')

# DCGM 3.x, GPU 3 fails the memory test (dcgmi exits non-zero).
FAIL_3X = {
    "DCGM GPU Diagnostic": {
        "test_categories": [
            {"category": "Deployment", "tests": [
                {"name": "Denylist", "results": [{"gpu_ids": "0,1,2,3", "status": "Pass"}]},
            ]},
            {"category": "Hardware", "tests": [
                {"name": "GPU Memory", "results": [
                    {"gpu_ids": "0", "status": "Pass"},
                    {"gpu_ids": "3", "status": "Fail", "warnings": [
                        {"warning": "Pending page retirements together with a DBE were detected on GPU 3.\n"
                                    "Drain the GPU and reset it or reboot the node.",
                         "error_id": 83, "error_category": 2, "error_severity": 2}]},
                ]},
                {"name": "Diagnostic", "results": [{"gpu_ids": 3, "status": "FAIL"}]},
            ]},
        ],
        "version": "3.3.9",
    }
}

# DCGM 4.x shape: "DCGM Diagnostic", results named by entity.
FAIL_4X = {
    "DCGM Diagnostic": {
        "test_categories": [
            {"category": "Deployment", "tests": [
                {"name": "software", "results": [
                    {"entity_group": "GPU", "entity_group_id": 1, "entity_id": 0, "status": "Pass"},
                    {"entity_group": "GPU", "entity_group_id": 1, "entity_id": 1, "status": "Pass"}],
                 "test_summary": {"status": "Pass"}},
            ]},
            {"category": "Hardware", "tests": [
                {"name": "memory", "results": [
                    {"entity_group": "GPU", "entity_group_id": 1, "entity_id": 0, "status": "Pass"},
                    {"entity_group": "GPU", "entity_group_id": 1, "entity_id": 1, "status": "Fail",
                     "warnings": [{"warning": "Uncorrectable ECC error detected on GPU 1", "error_id": 9}]}],
                 "test_summary": {"status": "Fail"}},
            ]},
        ]
    },
    "entity_groups": [{"entity_group": "GPU", "entity_group_id": 1, "entities": [{"entity_id": 0}, {"entity_id": 1}]}],
    "metadata": {"Driver Version Detected": "570.124.06", "version": "4.2.3"},
}


def fake_dcgmi(tmp_path, stdout: str = "", exit_code: int = 0, sleep: float = 0, stderr: str = "") -> str:
    """A ``dcgmi`` that records its argv, maybe sleeps, prints ``stdout`` and exits ``exit_code``."""
    (tmp_path / "stdout").write_text(stdout)
    (tmp_path / "stderr").write_text(stderr)
    path = tmp_path / "dcgmi"
    path.write_text(
        "#!/bin/sh\n"
        f'echo "$@" > "{tmp_path}/argv"\n'
        + (f"sleep {sleep}\n" if sleep else "")
        + f'cat "{tmp_path}/stdout"\ncat "{tmp_path}/stderr" >&2\nexit {exit_code}\n'
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


# --- running dcgmi --------------------------------------------------------------------


def test_missing_dcgmi_is_not_available_with_the_path_as_reason(tmp_path):
    missing = str(tmp_path / "no" / "dcgmi")
    result = run_diag(1, 10.0, dcgmi=missing)
    assert result == DcgmResult(1, available=False, reason=f"dcgmi not installed at {missing}")


def test_passing_diag_runs_level_with_json_output(tmp_path):
    dcgmi = fake_dcgmi(tmp_path, PASS_3X)
    result = run_diag(1, 10.0, dcgmi=dcgmi)
    assert (tmp_path / "argv").read_text().split() == ["diag", "-r", "1", "-j"]
    assert result.available and result.passed is True and result.failures == ()


def test_failing_gpu_is_named_with_dcgms_first_warning(tmp_path):
    result = run_diag(2, 10.0, dcgmi=fake_dcgmi(tmp_path, json.dumps(FAIL_3X), exit_code=226))
    assert result.available and result.passed is False
    assert result.failures == (
        (3, "GPU Memory: Pending page retirements together with a DBE were detected on GPU 3. "
            "Drain the GPU and reset it or reboot the node."),
        (3, "Diagnostic"),
    )


def test_dcgm4_entity_results_are_read(tmp_path):
    result = run_diag(2, 10.0, dcgmi=fake_dcgmi(tmp_path, json.dumps(FAIL_4X, indent=2), exit_code=226))
    assert result.passed is False
    assert result.failures == ((1, "memory: Uncorrectable ECC error detected on GPU 1"),)


def test_a_run_cut_off_by_our_budget_is_unfinished_not_failed_and_dcgmi_is_killed(tmp_path):
    dcgmi = fake_dcgmi(tmp_path, PASS_3X, sleep=30)
    start = time.monotonic()
    result = run_diag(3, 0.5, dcgmi=dcgmi)
    assert time.monotonic() - start < 5
    assert result.available and result.passed is None and result.failures == ()
    assert result.reason.startswith("dcgmi diag -r 3 did not finish within our 0.5s budget")


def test_output_without_json_is_not_verified_with_one_line(tmp_path):
    dcgmi = fake_dcgmi(tmp_path, "", exit_code=1, stderr="Usage: dcgmi diag\nError: Invalid parameter -j\n")
    result = run_diag(1, 10.0, dcgmi=dcgmi)
    assert result.passed is None and result.failures == ()
    assert result.reason == "dcgmi diag -r 1 (exit 1) gave no JSON: Error: Invalid parameter -j"


def test_truncated_json_is_not_verified(tmp_path):
    result = run_diag(1, 10.0, dcgmi=fake_dcgmi(tmp_path, PASS_3X[: len(PASS_3X) // 2] + "}"))
    assert result.passed is None and "gave no JSON" in result.reason


def test_json_without_any_result_is_not_a_pass_nor_a_fault():
    result = parse(1, json.dumps({"DCGM GPU Diagnostic": {"version": "4.2.3"}}))
    assert result.passed is None and result.reason == "dcgmi diag -r 1 reported no test results"


@pytest.mark.parametrize("error", [
    "Couldn't start the diagnostic: \nnvvs failed",
    "Error: Another diagnostic is currently running (-29)",
    "The version of nvvs does not match the version of the host engine",
])
def test_runtime_error_is_the_tools_trouble_not_a_gpu_fault(error):
    result = parse(1, json.dumps({"DCGM GPU Diagnostic": {"runtime_error": error, "version": "3.3.9"}}))
    assert result.passed is None and result.failures == ()
    assert result.reason == f"DCGM runtime error: {error.splitlines()[-1]}"


def test_skipped_and_warned_tests_are_not_a_pass_and_name_test_gpu_and_status(tmp_path):
    result = run_diag(1, 10.0, dcgmi=fake_dcgmi(tmp_path, SKIP_WARN_3X))
    assert result.passed is None and result.failures == ()
    assert result.reason == ("2 of 6 result(s) did not pass: skip: Page Retirement/Row Remap on GPUs 0,1,2,3,4,5,6,7; "
                             "warn: PCIe on GPU 1: PCIe replay rate on GPU 1 is elevated")


def test_dcgm4_entities_left_at_skip_are_not_a_pass():
    doc = json.loads(json.dumps(FAIL_4X))
    doc["DCGM Diagnostic"]["test_categories"][1]["tests"][0]["results"][1]["status"] = "Skip"
    del doc["DCGM Diagnostic"]["test_categories"][1]["tests"][0]["results"][1]["warnings"]
    result = parse(2, json.dumps(doc))
    assert result.passed is None and result.reason == "1 of 4 result(s) did not pass: skip: memory on GPU 1"


def test_a_failure_over_several_gpus_names_them():
    doc = {"DCGM GPU Diagnostic": {"test_categories": [{"category": "Deployment", "tests": [
        {"name": "Denylist", "results": [{"gpu_ids": "0,1", "status": "Fail", "warnings": ["denylisted"]}]}]}]}}
    assert parse(1, json.dumps(doc)).failures == ((None, "Denylist on GPUs 0,1: denylisted"),)


def test_host_engine_down_means_not_run(tmp_path):
    dcgmi = fake_dcgmi(tmp_path, "Error: unable to establish a connection to the specified host: localhost\n"
                                 "Error: Unable to connect to host engine. Host engine connection invalid/disconnected.\n",
                       exit_code=255)
    result = run_diag(1, 10.0, dcgmi=dcgmi)
    assert result.available and result.passed is None
    assert result.reason.startswith("nv-hostengine not reachable: ")


def test_make_runner_gives_the_engine_a_level_and_timeout_callable(tmp_path):
    run = make_runner(fake_dcgmi(tmp_path, PASS_3X))
    result = run(2, 10.0)
    assert result.level == 2 and result.passed is True
    assert (tmp_path / "argv").read_text().split() == ["diag", "-r", "2", "-j"]


def test_make_runner_caps_the_engines_timeout_at_the_configured_one(tmp_path):
    run = make_runner(fake_dcgmi(tmp_path, PASS_3X, sleep=30), max_timeout=0.5)
    start = time.monotonic()
    result = run(1, 40.0)
    assert time.monotonic() - start < 5 and result.reason.startswith("dcgmi diag -r 1 did not finish within our 0.5s")


def test_non_executable_dcgmi_is_not_available(tmp_path):
    path = tmp_path / "dcgmi"
    path.write_text("not a program")
    os.chmod(path, 0o644)
    assert run_diag(1, 10.0, dcgmi=str(path)).available is False


# --- the check ------------------------------------------------------------------------------


def inp(dcgm: DcgmResult | None, gpus: tuple[int, ...] | None = None) -> CheckInput:
    snapshot = NodeSnapshot("n1", "sim", gpus=tuple(GpuSnapshot(i) for i in range(8)))
    return CheckInput(snapshot, Expectations(), Context.EPILOG, gpus=gpus, dcgm=dcgm)


def test_no_diag_run_means_no_finding():
    assert list(check_diag(inp(None))) == []


def test_absent_dcgm_is_a_reason_not_a_failure():
    (f,) = check_diag(inp(DcgmResult(1, available=False, reason="dcgmi not installed at /usr/bin/dcgmi")))
    assert (f.check, f.severity, f.action) == ("dcgm", Severity.OK, Action.NONE)
    assert f.message.startswith("DCGM not installed: diagnostics skipped")


def test_passing_diag_gives_no_finding():
    assert list(check_diag(inp(DcgmResult(1, True, True)))) == []


def test_each_failing_gpu_gets_one_reset_finding():
    result = DcgmResult(2, True, False, ((3, "GPU Memory: DBE"), (3, "Diagnostic"), (5, "PCIe: link down")))
    findings = list(check_diag(inp(result)))
    assert [(f.gpu, f.severity, f.action, f.summary) for f in findings] == [
        (3, Severity.FAIL, Action.RESET, "DCGM diag L2 failed on GPU 3"),
        (5, Severity.FAIL, Action.RESET, "DCGM diag L2 failed on GPU 5"),
    ]
    assert findings[0].message == "DCGM diag L2 failed: GPU Memory: DBE; Diagnostic"


def test_failure_on_a_gpu_outside_the_job_is_not_the_jobs_finding():
    result = DcgmResult(2, True, False, ((3, "GPU Memory: DBE"), (5, "PCIe: link down")))
    assert [f.gpu for f in check_diag(inp(result, gpus=(4, 5)))] == [5]


def test_failure_without_a_gpu_drains_the_node():
    (f,) = check_diag(inp(DcgmResult(1, True, False, ((None, "Denylist: a denylisted GPU is present"),))))
    assert (f.gpu, f.severity, f.action) == (None, Severity.FAIL, Action.DRAIN)


def test_a_run_that_failed_as_a_whole_names_no_gpu_and_drains_nothing():
    (f,) = check_diag(inp(DcgmResult(3, True, False, reason="dcgmi diag -r 3 timed out after 900s")))
    assert (f.severity, f.action, f.gpu) == (Severity.WARN, Action.WARN, None)
    assert f.message == "DCGM diag L3 not verified: dcgmi diag -r 3 timed out after 900s"


def test_diag_that_did_not_run_warns():
    (f,) = check_diag(inp(DcgmResult(1, True, None, reason="nv-hostengine not reachable: connection refused")))
    assert (f.severity, f.action) == (Severity.WARN, Action.WARN)
    assert f.summary == "DCGM diag L1 not verified"


@pytest.mark.parametrize("stdout, stderr, exit_code", [
    ("", "sim: no simulated node 'n1' in /var/lib/slurm-hooks/sim\n", 1),  # the stand-in cannot find its node
    (json.dumps({"DCGM GPU Diagnostic": {"runtime_error": "Another diagnostic is currently running"}}), "", 226),
    (SKIP_WARN_3X, "", 0),
])
def test_a_diag_that_could_not_run_or_pass_in_full_is_a_warning_never_a_gpu_fault(tmp_path, stdout, stderr, exit_code):
    result = run_diag(2, 10.0, dcgmi=fake_dcgmi(tmp_path, stdout, exit_code=exit_code, stderr=stderr))
    (f,) = check_diag(inp(result))
    assert (f.severity, f.action, f.gpu) == (Severity.WARN, Action.WARN, None)


# --- through the engine -----------------------------------------------------------------------


class OneGpuProbe:
    name = "test"

    def snapshot(self) -> NodeSnapshot:
        return NodeSnapshot("n1", self.name, gpus=(GpuSnapshot(0, uuid="GPU-0", temperature_c=30),))


@pytest.mark.parametrize(("exit_code", "healthy"), [(0, True), (226, False)])
def test_engine_runs_the_diag_at_the_contexts_level(tmp_path, exit_code, healthy):
    doc = PASS_3X if healthy else json.dumps(FAIL_4X)
    runner = make_runner(fake_dcgmi(tmp_path, doc, exit_code=exit_code))
    report = engine.run(OneGpuProbe(), "n1", engine.JudgeRequest(Expectations(dcgm_level_epilog=2), Context.EPILOG,
                                                              deadline_s=20, dcgm=runner))
    assert (tmp_path / "argv").read_text().split() == ["diag", "-r", "2", "-j"]
    assert report.healthy is healthy
    assert [f.check for f in report.findings if f.severity is Severity.FAIL] == ([] if healthy else ["dcgm"])


def test_dcgm_goes_deeper_in_the_epilog_of_a_failed_job_only():
    from slurm_hooks.engine import dcgm_level
    from slurm_hooks.models import Context, Expectations

    expect = Expectations(dcgm_level_prolog=1, dcgm_level_epilog=1, dcgm_level_after_failure=2)
    assert dcgm_level(Context.PROLOG, expect, job_failed=True) == 1
    assert dcgm_level(Context.EPILOG, expect) == 1
    assert dcgm_level(Context.EPILOG, expect, job_failed=True) == 2
    assert dcgm_level(Context.CHECK, expect, job_failed=True) == 0


# --- what the hooks make of a diag: drains it keeps, budgets it keeps (from the review) ---------

DCGM_FAIL_GPU3 = {"DCGM GPU Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [
    {"name": "GPU Memory", "results": [{"gpu_ids": "0", "status": "Pass"},
                                       {"gpu_ids": "3", "status": "Fail",
                                        "warnings": [{"warning": "DBE detected on GPU 3"}]}]}]}]}}
DCGM_PASS = {"DCGM GPU Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [
    {"name": "GPU Memory", "results": [{"gpu_ids": "0,1,2,3", "status": "Pass"}]}]}]}}

def test_node_drained_by_epilog_dcgm_diag_is_not_resumed_by_a_check_that_runs_no_diag(tmp_path):
    dcgmi = fake_dcgmi(tmp_path, json.dumps(DCGM_FAIL_GPU3), exit_code=226)
    cfg = sim_config(tmp_path, f'[dcgm]\ndcgmi = "{dcgmi}"\n[expect]\ngpus = 8\ndcgm_level_after_failure = 2\n')
    slurm, w = sim_node(cfg, "IDLE")
    jobhooks.epilog(w, {"SLURM_JOB_ID": "5", "SLURM_JOB_GPUS": "0,1,2,3", "SLURM_JOB_EXIT_CODE": "256"})
    assert slurm.peek("n1").reason == "slurm-hooks: DCGM diag L2 failed on GPU 3 [reset]"
    healthcheck.run(w, follow="none")  # HealthCheckInterval later; dcgm_level_check = 0 (the default)
    assert slurm.peek("n1").drained


def test_node_drained_for_a_dcgm_fault_is_not_resumed_by_a_check_whose_diag_could_not_run(tmp_path):
    dcgmi = fake_dcgmi(tmp_path, json.dumps(DCGM_FAIL_GPU3), exit_code=226)
    cfg = sim_config(tmp_path, f'[dcgm]\ndcgmi = "{dcgmi}"\n[expect]\ngpus = 8\ndcgm_level_after_failure = 2\n'
                               'dcgm_level_check = 1\n')
    slurm, w = sim_node(cfg, "IDLE")
    jobhooks.epilog(w, {"SLURM_JOB_ID": "5", "SLURM_JOB_GPUS": "0,1,2,3", "SLURM_JOB_EXIT_CODE": "256"})
    assert slurm.peek("n1").reason == "slurm-hooks: DCGM diag L2 failed on GPU 3 [reset]"
    (tmp_path / "stdout").write_text("")  # the next diag cannot run: no JSON
    (tmp_path / "stderr").write_text("Error: Another diagnostic is currently running\n")
    healthcheck.run(w, follow="none")
    assert slurm.peek("n1").drained and slurm.called("resume") == []


# --- 8. a DCGM diag cut short by our own time budget drains a healthy node ----------------------------


def test_dcgm_diag_cut_off_by_our_own_budget_does_not_drain_a_healthy_node(tmp_path):
    # Scaled down: a passing diag that needs 3 s against a 1 s budget, as L2 (~120 s) against the default 30 s.
    dcgmi = fake_dcgmi(tmp_path, json.dumps(DCGM_PASS), sleep=3)
    cfg = sim_config(tmp_path, f'[dcgm]\ndcgmi = "{dcgmi}"\ntimeout = 1.0\n'
                                '[expect]\ngpus = 8\ndcgm_level_after_failure = 2\n')
    slurm, w = sim_node(cfg, "IDLE")
    # The user's script exited 1: nothing to do with the GPUs.
    jobhooks.epilog(w, {"SLURM_JOB_ID": "6", "SLURM_JOB_GPUS": "0", "SLURM_JOB_EXIT_CODE": "256"})
    assert slurm.called("drain") == []


# --- what repair --validate and the sweep make of a diag that could not run ----------------------


def _repair_bed(tmp_path, stdout: str, stderr: str = "", exit_code: int = 1):
    from fakes.config import repair_config

    from slurm_hooks.probes import sim

    cfg = repair_config(tmp_path, 'services = ["nvidia-fabricmanager", "nvidia-dcgm"]\n')
    fake = tmp_path / "fake"
    fake.mkdir()
    os.replace(fake_dcgmi(fake, stdout, exit_code=exit_code, stderr=stderr), cfg.dcgm.dcgmi)
    slurm, w = sim_node(cfg, "IDLE")
    sim.set_diag_seconds(cfg.gpu.sim_dir, "n1", 0.0)
    return slurm, w, cfg.gpu.sim_dir


STAND_IN_LOST = ("", "sim: no simulated node 'n1' in /var/lib/slurm-hooks/sim\n")


@pytest.mark.parametrize("stdout, stderr", [
    STAND_IN_LOST,
    (json.dumps({"DCGM GPU Diagnostic": {"runtime_error": "Another diagnostic is currently running"}}), ""),
])
def test_repair_validation_whose_diag_could_not_run_is_unverified_not_a_drain_for_the_diag(tmp_path, stdout, stderr):
    from slurm_hooks.probes import sim

    slurm, w, sim_dir = _repair_bed(tmp_path, stdout, stderr)
    sim.inject(sim_dir, "n1", 3, row_remap_pending=True)
    _, outcome = healthcheck.run(w, follow="none", repair="inline")
    assert outcome.repairs == ["reset:unverified"] and not outcome.resumed
    reason = slurm.peek("n1").reason
    assert reason == "slurm-hooks: row remap pending on GPU 3 [unverified]", reason  # was "DCGM diag L2 failed [drain]"
    assert not any("DCGM diag" in r for _, _, r in slurm.called("drain"))


def test_repair_validation_that_finds_a_failing_gpu_names_it_and_keeps_its_reset(tmp_path):
    from slurm_hooks.probes import sim

    slurm, w, sim_dir = _repair_bed(tmp_path, json.dumps(DCGM_FAIL_GPU3), exit_code=226)
    sim.inject(sim_dir, "n1", 3, row_remap_pending=True)
    _, outcome = healthcheck.run(w, follow="none", repair="inline")
    assert outcome.repairs[0] == "reset:failed" and not outcome.resumed
    assert slurm.peek("n1").drained


@pytest.mark.parametrize("stdout, stderr", [STAND_IN_LOST, (SKIP_WARN_3X, "")])
def test_sweep_validation_whose_diag_could_not_run_or_pass_in_full_is_unverified_and_drains_nothing(
        tmp_path, stdout, stderr):
    from slurm_hooks.hooks import sweep

    slurm, w, _ = _repair_bed(tmp_path, stdout, stderr, exit_code=1 if stderr else 0)
    verdict, detail = sweep.validate_here(w, 2, 30.0)
    assert verdict == "unverified" and "DCGM diag L2 not verified" in detail, detail
    assert slurm.called("drain") == [] and not slurm.peek("n1").drained
