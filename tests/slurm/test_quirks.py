"""One test per version quirk in slurm/quirks.py (sources: DESIGN.md, "Where the field differs")."""

from __future__ import annotations

import pytest

from slurm_hooks.slurm import quirks


@pytest.mark.parametrize(("version", "accounting", "kept"), [
    ((22, 5), False, False), ((23, 2), False, False), ((23, 11), False, True), ((24, 11), False, True),
    ((24, 11), True, False), ((25, 11), False, True), ((26, 5), False, False), ((26, 11), False, False),
    (None, False, True)])
def test_23_11_keeps_the_reason_after_resume_without_accounting_until_26_05_clears_it_again(version, accounting, kept):
    assert quirks.reason_kept_after_resume(version, accounting) is kept


@pytest.mark.parametrize(("version", "shown"), [((22, 5), False), ((25, 5), False), ((25, 11), True), ((26, 5), True),
                                                (None, False)])
def test_25_11_shows_the_submit_line_in_scontrol_show_job(version, shown):
    assert quirks.submit_line_in_show_job(version) is shown


@pytest.mark.parametrize("version", [(22, 5), (24, 11), (26, 5), None])
def test_our_reboot_is_asap_with_an_explicit_nextstate_on_every_version(version):
    # 24.11 made UNDRAIN the default next state; 26.05 added FORCE (kills jobs): neither is ours.
    args = quirks.reboot_args(version, "n1", "slurm-hooks: XID 79 on GPU 0 [reboot 1/1]", "DOWN")
    assert args == ["reboot", "ASAP", "nextstate=DOWN", "reason=slurm-hooks: XID 79 on GPU 0 [reboot 1/1]", "n1"]
    assert "FORCE" not in args
    assert quirks.REBOOT_ASAP_UNDRAIN_SINCE == (24, 11) and quirks.REBOOT_FORCE_SINCE == (26, 5)


@pytest.mark.parametrize(("reason", "is_it"), [
    ("Kill task failed", True), ("Kill task failed (JobId=12 StepId=0)", True),
    ("Kill task failed on purpose", False), ("slurm-hooks: Kill task failed [reset]", False)])
def test_25_05_kill_task_failed_carries_the_step(reason, is_it):
    assert quirks.is_kill_task_failed(reason) is is_it
    assert quirks.KILL_TASK_JOBID_SINCE == (25, 5)


@pytest.mark.parametrize(("version", "flags", "ok"), [
    ((24, 11), frozenset({"DOWN", "DRAIN", "REBOOT_ISSUED"}), True),
    ((25, 11), frozenset({"DOWN", "DRAIN", "REBOOT_ISSUED"}), False),
    ((25, 11), frozenset({"IDLE", "DRAIN"}), True),
    (None, frozenset({"REBOOT_ISSUED"}), False)])
def test_25_11_refuses_idle_while_reboot_issued(version, flags, ok):
    assert quirks.may_set_idle(version, flags) is ok


@pytest.mark.parametrize(("version", "setting", "kill_s"), [
    ((24, 11), "120", 60.0), ((26, 5), "120", 120.0), ((26, 5), None, 60.0), ((26, 5), "x", 60.0),
    ((26, 5), "0", 60.0), (None, "120", 60.0)])
def test_26_05_health_check_timeout_is_read_not_assumed(version, setting, kill_s):
    assert quirks.health_check_kill_s(version, setting) == kill_s


@pytest.mark.parametrize(("env", "said"), [
    ({"SLURM_NODE_IS_HEALTHY": "yes"}, "yes"), ({"SLURM_NODE_IS_HEALTHY": "NO"}, "no"),
    ({"SLURM_NODE_IS_HEALTHY": "maybe"}, ""), ({}, ""), (None, "")])
def test_26_05_node_is_healthy_from_the_environment(env, said):
    assert quirks.node_is_healthy(env) == said


def test_25_11_our_resume_is_not_sent_while_the_reboot_is_issued():
    import json
    from types import SimpleNamespace

    from slurm_hooks.slurm.scontrol import ScontrolSlurm, SlurmCommandFailed

    sent = []
    node = {"name": "n1", "state": ["DOWN", "DRAIN", "REBOOT_ISSUED"], "reason": "slurm-hooks: XID 79 on GPU 0 "
            "[reboot 1/1] : reboot issued", "reason_changed_at": 1, "reason_set_by_user": "root"}

    def run(argv, timeout, **kw):
        sent.append(argv[1:])
        out = "slurm 25.11.0" if "--version" in argv else json.dumps({"nodes": [node]})
        return SimpleNamespace(stdout=out, stderr="", returncode=0)

    slurm = ScontrolSlurm(timeout=5, runner=run, bin_dir="/opt/slurm-25.11/bin")
    with pytest.raises(SlurmCommandFailed, match="REBOOT_ISSUED"):
        slurm.resume("n1")
    assert not [a for a in sent if "update" in a]
