"""The amdgpu driver's events judged by their rows of the severity table, in the driver's words."""

from __future__ import annotations

import dataclasses

from test_checks import load

from slurm_hooks import engine
from slurm_hooks.checks.amdgpu import ROWS
from slurm_hooks.models import Action, Context, Expectations, Scope, Urgency, XidEvent
from slurm_hooks.remedy.drain import drain_reason
from slurm_hooks.severity import CHECK_RULES

EXPECT = Expectations(gpus=8)


def event(rule: str, seq: int, subject: str = "", message: str = "", bus: str = "0000:46:00.0") -> XidEvent:
    return XidEvent(0, pci_bus_id=bus, ts=8000.0 + seq, message=message or f"{rule} line", source="kmsg", seq=seq,
                    boot="b1", rule=rule, subject=subject)


def snapshot(gpu: int, *events: XidEvent, node_events: tuple = ()):
    snap = load("h100-healthy.json")
    gpus = tuple(dataclasses.replace(g, xids=events) if g.index == gpu else g for g in snap.gpus)
    return dataclasses.replace(snap, gpus=gpus, node_xids=node_events)


def judge(snap, context=Context.CHECK, baseline=None, acked=frozenset()):
    return engine.judge(snap, engine.JudgeRequest(EXPECT, context, deadline_s=5, baseline=baseline,
                                                  acked_xids=acked))


UE = event("amdgpu-ue-umc", 1, "umc", "socket: 0, die: 0, 1 new uncorrectable hardware errors detected in umc block")


def test_uncorrectable_umc_error_resets_its_gpu_now_with_a_reason_naming_gpu_and_block():
    report = judge(snapshot(2, UE))
    [f] = report.drain_findings()
    assert (f.check, f.action, f.scope, f.urgency, f.gpu) == ("amdgpu", Action.RESET, Scope.GPU, Urgency.NOW, 2)
    assert drain_reason(report) == "slurm-hooks: uncorrectable ECC in UMC block on GPU 2 [reset]"
    assert report.requeue_gpus() == frozenset({2})


def test_no_nvidia_word_in_any_amdgpu_reason():
    for rule, (_, words) in ROWS.items():
        found = judge(snapshot(3, event(rule, 7, "gfx" if "{block}" in words else "gfx_0.0.0"))).findings
        text = " ".join(f"{f.summary} {f.message}" for f in found)
        assert found and "XID" not in text and "NVML" not in text and "NVIDIA" not in text, rule


def test_a_failed_driver_reset_reboots_and_says_so():
    report = judge(snapshot(6, event("amdgpu-reset", 1), event("amdgpu-reset-failed", 2, message="GPU reset(3) failed")))
    assert drain_reason(report) == "slurm-hooks: GPU 6 reset failed [reboot]"
    assert [f.rule for f in report.findings] == ["amdgpu-reset", "amdgpu-reset-failed"]


def test_the_drivers_own_reset_vram_lost_and_a_ring_timeout_drain_nothing():
    """A reset that came back, what it wiped, a hung ring (an application, as a rule), a deferred
    error: recorded, the node stays in service."""
    report = judge(snapshot(1, event("amdgpu-reset", 1), event("amdgpu-vram-lost", 2),
                            event("amdgpu-ring-timeout", 3, "gfx_0.0.0"), event("amdgpu-deferred", 4, "umc")))
    assert report.findings and not report.drain_findings() and report.healthy


def test_an_xgmi_error_touches_every_job_on_the_node():
    report = judge(snapshot(4, event("amdgpu-ue-xgmi", 1, "xgmi_wafl")))
    [f] = report.drain_findings()
    assert f.summary == "uncorrectable error in XGMI_WAFL block on GPU 4" and report.requeue_gpus() is None


def test_bad_pages_at_threshold_replace_the_gpu_when_its_jobs_end():
    report = judge(snapshot(5, event("amdgpu-bad-pages", 1, message="Saved bad pages 176 reaches threshold value 128")))
    [f] = report.drain_findings()
    assert (f.action, f.urgency) == (Action.REPLACE, Urgency.JOB_END) and "176" in f.message
    assert not report.urgent()


def test_an_event_tied_to_no_gpu_is_the_nodes():
    report = judge(snapshot(0, node_events=(event("amdgpu-ue-umc", 1, "umc", bus="0000:99:00.0"),)))
    [f] = report.drain_findings()
    assert f.gpu is None and f.summary == "uncorrectable ECC in UMC block on PCI 0000:99:00.0"
    assert report.requeue_gpus() is None


def test_in_the_epilog_lines_the_prolog_saw_are_not_the_jobs():
    base = snapshot(2, UE)
    later = event("amdgpu-ue-umc", 2, "umc")
    assert not judge(snapshot(2, UE), Context.EPILOG, baseline=base).drain_findings()
    assert judge(snapshot(2, UE, later), Context.EPILOG, baseline=base).drain_findings()


def test_an_acknowledged_event_is_no_reason_to_act_again():
    assert not judge(snapshot(2, UE), acked=frozenset({UE.key})).drain_findings()


def test_the_xid_check_leaves_amdgpu_events_alone():
    report = judge(snapshot(2, UE))
    assert [f.check for f in report.findings] == ["amdgpu"]


def test_each_amdgpu_row_names_the_action_its_check_gives():
    for rule, (action, _) in ROWS.items():
        assert CHECK_RULES[rule].action is action, rule
    assert {r for r in CHECK_RULES if r.startswith("amdgpu-")} == set(ROWS)


# --- a fault that comes back after resets is the hardware ------------------------------------------


def _history(tmp_path, *earlier: tuple[XidEvent, float]):
    """This node's XID history holding ``earlier`` events, each recorded that many seconds ago and
    acknowledged (the ladder acknowledges what it drained for once its reset worked)."""
    import time

    from slurm_hooks.xid.history import XidHistory

    history = XidHistory(str(tmp_path / "xids.json"))
    for e, ago in earlier:
        history.record([e], now=time.time() - ago)
    history.ack([e.key for e, _ in earlier])
    return history.load()


def _ue(seq: int, block: str = "umc", uuid: str = "GPU-2") -> XidEvent:
    rule = "amdgpu-ue-umc" if block == "umc" else "amdgpu-ue"
    return dataclasses.replace(event(rule, seq, block, f"1 new uncorrectable hardware errors detected in {block} block"),
                               gpu=2, uuid=uuid)


def judge_with(snap, state):
    return engine.judge(snap, engine.JudgeRequest(EXPECT, Context.CHECK, deadline_s=5, xid_history=state.recorded(),
                                                  acked_xids=state.acked()))


def test_uncorrectable_umc_errors_back_after_two_resets_replace_the_gpu(tmp_path):
    """The third UMC error on one GPU within a day: the resets did not mend it. A history that kept
    amdgpu lines under one code (0) for all rows could not tell them apart, and this test fails."""
    snap = snapshot(2, _ue(1), _ue(2), _ue(3))
    uuid = next(g.uuid for g in snap.gpus if g.index == 2)
    state = _history(tmp_path, (_ue(1, uuid=uuid), 7200), (_ue(2, uuid=uuid), 3600))
    [f] = judge_with(snap, state).findings
    assert (f.action, f.gpu) == (Action.REPLACE, 2)
    assert f.message.endswith(", 3rd time in 24h -> hardware")
    assert drain_reason(judge_with(snap, state)) == "slurm-hooks: uncorrectable ECC in UMC block on GPU 2 [replace]"


def test_other_blocks_other_gpus_and_old_errors_do_not_count_toward_a_repeat(tmp_path):
    snap = snapshot(2, _ue(2), _ue(3))
    uuid = next(g.uuid for g in snap.gpus if g.index == 2)
    state = _history(tmp_path, (_ue(1, "gfx", uuid=uuid), 3600),  # a GFX error: not the UMC's repeat
                     (dataclasses.replace(_ue(2), uuid="GPU-other"), 3600),  # another GPU's
                     (_ue(4, uuid=uuid), 2 * 86400))  # older than the window
    [f] = judge_with(snap, state).findings
    assert f.action is Action.RESET and "-> hardware" not in f.message


def test_a_ring_that_keeps_hanging_stays_a_record(tmp_path):
    hang = [event("amdgpu-ring-timeout", i, "gfx_0.0.0") for i in range(1, 6)]
    state = _history(tmp_path, *((dataclasses.replace(h, gpu=2), 600) for h in hang[:4]))
    report = judge_with(snapshot(2, *hang), state)
    assert report.drain_findings() == () and [f.action for f in report.findings] == [Action.WARN]
