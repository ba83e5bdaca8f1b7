"""On an AMD node the GPU diagnostic is RVS, and every word about it says so: the drain reason, the
validation's audit lines and the page name RVS, never DCGM, NVML, XID or NVLink."""

from __future__ import annotations

import json
import re

import pytest
from fakes.config import sim_config
from fakes.fake_amdsmi import FakeAmdSmi
from fakes.slurm import FakeSlurm

from slurm_hooks.hooks import healthcheck
from slurm_hooks.observe import incidents, notify
from slurm_hooks.observe.audit import AuditLog
from slurm_hooks.probes.amdsmi import AmdSmiProbe
from slurm_hooks.probes.identity import store_path
from slurm_hooks.remedy import repairs
from slurm_hooks.remedy.wiring import Wiring
from slurm_hooks.values import replace

NVIDIA_WORDS = re.compile(r"DCGM|dcgmi|NVML|XID|NVLink|NVIDIA|nvidia-smi")
RVS_FAIL = 'echo "[RESULT] [ 99.1] Action name :mem-1 Module name :mem FAIL"\nexit 1\n'
RVS_PASS = 'echo "[RESULT] [ 1234.5] Action name :gst-1 Module name :gst pass: TRUE"\nexit 0\n'


def amd_node(tmp_path, rvs_body: str | None, fake: FakeAmdSmi | None = None):
    """Node n1: four MI300X through the AMD probe (over ``fake``), the repair ladder validating at
    level 2 with RVS (a script printing RVS's result lines; ``None``: RVS not installed)."""
    (tmp_path / "gres.conf").write_text("Name=gpu File=/dev/dri/renderD[128-131]\n")
    rvs = tmp_path / "rvs"
    if rvs_body is not None:
        rvs.write_text("#!/bin/sh\n" + rvs_body)
        rvs.chmod(0o755)
    cfg = sim_config(tmp_path, f'[expect]\ngpus = 4\n[repair]\nenabled = true\ndcgm_level = 2\n'
                               f'[dcgm]\nrvs = "{rvs}"\n')
    cfg = replace(cfg, gpu=replace(cfg.gpu, backend="amdsmi"))
    (tmp_path / "kmsg").write_text("")
    probe = AmdSmiProbe("n1", amdsmi=fake or FakeAmdSmi.healthy(gpus=4), drm_root="/nonexistent",
                        kmsg_path=str(tmp_path / "kmsg"), gpu_map_path=store_path(cfg.state.dir, "n1"))
    slurm = FakeSlurm()
    slurm.add_node("n1", "IDLE")
    return slurm, Wiring(cfg, "n1", AuditLog(cfg.log.audit), probe_override=probe, slurm_override=slurm)


def everything_said(slurm: FakeSlurm, w: Wiring) -> str:
    """Every drain reason, every audit record's values, and the page each incident sends."""
    records = list(AuditLog(w.config.log.audit).read())
    tracker = incidents.Tracker()
    tracker.feed(records)
    pages = [notify.compose(inc, notify.OPENED, now=inc.opened_at + 1).text
             for inc in [*tracker.open.values(), *tracker.closed]]
    values = [json.dumps({k: v for k, v in r.items() if k not in ("checks",)}) for r in records]
    return "\n".join([*(reason for *_, reason in slurm.called("drain")), *values, *pages])


@pytest.mark.parametrize("rvs_body, result, words", [
    (RVS_FAIL, "failed", "RVS diagnostic L2 failed"),
    (RVS_PASS, "ok", "RVS diagnostic L2 passed"),
    (None, "unverified", "RVS not installed"),
])
def test_the_repair_validation_on_an_amd_node_speaks_of_rvs_only(tmp_path, rvs_body, result, words):
    slurm, w = amd_node(tmp_path, rvs_body)
    assert repairs.validate_node(w, "alice", healthcheck.rejudge(w)) == result
    said = everything_said(slurm, w)
    assert words in said
    assert not NVIDIA_WORDS.search(said), NVIDIA_WORDS.search(said).group(0) + " in:\n" + said
    if result == "failed":
        assert slurm.peek("n1").reason == "slurm-hooks: RVS diagnostic L2 failed [drain]"


def test_the_diag_check_of_an_amd_node_names_rvs_in_its_reason(tmp_path):
    from slurm_hooks.models import Context

    slurm, w = amd_node(tmp_path, RVS_FAIL)
    report = healthcheck.judge(w, Context.CHECK, acknowledge=False, dcgm_level=2)
    [found] = [f for f in report.findings if f.check == "dcgm"]
    assert found.summary == "RVS diagnostic L2 failed" and not NVIDIA_WORDS.search(found.message)


def test_a_drain_reason_of_either_diagnostic_is_known_as_the_diagnostics():
    """With its marker lost, a node drained for the diagnostic waits for one (a periodic check runs
    none): an RVS reason not known as the diagnostic's would let the next check resume a bad GPU."""
    from slurm_hooks.checks.dcgm import said_by_diagnostic

    assert said_by_diagnostic("RVS diagnostic L2 failed on GPU 3") and said_by_diagnostic("DCGM diag L2 failed")
    assert not said_by_diagnostic("uncorrectable ECC in UMC block on GPU 2")
