"""The XID check: catalogue actions, repeat escalation, epilog baseline."""

from __future__ import annotations

import pytest

from slurm_hooks.checks.xid import check_xids
from slurm_hooks.models import (
    Action,
    CheckInput,
    Context,
    Expectations,
    GpuSnapshot,
    NodeSnapshot,
    Severity,
    XidEvent,
)

NOW = 1_750_000_000.0
HOUR = 3600.0


def xid(code: int, gpu: int | None = 3, seq: int = 1) -> XidEvent:
    return XidEvent(code=code, gpu=gpu, ts=NOW - 10 + seq, source="nvml", seq=seq)


def node(*gpus: GpuSnapshot, node_xids: tuple[XidEvent, ...] = ()) -> NodeSnapshot:
    return NodeSnapshot(node="n1", backend="sim", gpus=gpus, taken_at=NOW, node_xids=node_xids)


def gpu(index: int, *xids: XidEvent) -> GpuSnapshot:
    return GpuSnapshot(index=index, pci_bus_id=f"00000000:{0x18 + index * 0x10:02X}:00.0", xids=xids)


def earlier(code: int, *times: float, on: str = "gpu3") -> dict:
    """XID history as ``XidHistory.recorded`` gives it: events of ``code`` recorded at ``times`` on GPU ``on``."""
    return {f"kmsg:boot-0:{code}-{i}@{t}:{code}": (on, code, t) for i, t in enumerate(times)}


def run(snapshot: NodeSnapshot, **kw) -> list:
    kw.setdefault("expect", Expectations())
    return list(check_xids(CheckInput(snapshot=snapshot, now=NOW, **kw)))


def test_healthy_gpus_give_no_findings():
    assert run(node(gpu(0), gpu(1))) == []


def test_xid79_suggests_a_reboot_and_names_the_gpu():
    [f] = run(node(gpu(0), gpu(3, xid(79))))
    assert f.line() == "gpu3 xid: XID 79 (GPU has fallen off the bus) -> reboot"
    assert f.summary == "XID 79 on GPU 3"
    assert (f.check, f.severity, f.gpu) == ("xid", Severity.FAIL, 3)


def test_xid48_double_bit_ecc_suggests_reset():
    [f] = run(node(gpu(3, xid(48))))
    assert (f.action, f.severity) == (Action.RESET, Severity.FAIL)


def test_app_xid13_tells_the_user_and_does_not_drain():
    [f] = run(node(gpu(3, xid(13))))
    assert (f.action, f.severity) == (Action.NONE, Severity.WARN)
    assert not f.action.takes_node_out
    assert f.message == "XID 13 (Graphics Engine Exception)"


def test_a_gpu_with_five_xid31_is_the_gpus_though_another_gpu_had_one_too():
    """NVSentinel's same-GPU and other-GPU rules are judged apart: GPU 3's XID 31 in bursts hours apart
    is the GPU's (reset), whatever a job did on GPU 5; the spread is said beside it."""
    history = {**earlier(31, NOW - 2 * HOUR), **earlier(31, NOW - HOUR, on="gpu5")}
    [f] = run(node(gpu(3, xid(31))), xid_history=history)
    assert (f.action, f.severity) == (Action.RESET, Severity.FAIL)
    assert f.message == ("XID 31 (GPU memory page fault), 2 bursts on this GPU within 24h (a burst: lines less "
                         "than 3min apart) -> hardware; also on 1 other GPU(s) within 24h -> the application")
    history = {**earlier(31, *(NOW - h * HOUR for h in (5, 4, 3, 2))), **earlier(31, NOW - HOUR, on="gpu5")}
    [f] = run(node(gpu(3, xid(31))), xid_history=history)  # five: past [expect] xid_repeat_count
    assert (f.action, f.severity) == (Action.REPLACE, Severity.FAIL)
    assert f.message == ("XID 31 (GPU memory page fault), 5th time in 24h -> hardware; also on 1 other GPU(s) "
                         "within 24h -> the application")


def test_xid31_on_another_gpu_and_once_here_is_the_application_and_does_not_drain():
    [f] = run(node(gpu(3, xid(31))), xid_history=earlier(31, NOW - HOUR, on="gpu5"))
    assert (f.action, f.severity) == (Action.NONE, Severity.WARN)
    assert f.message.endswith(", on 1 other GPU(s) within 24h -> the application, not this GPU")


def test_xid13_again_on_the_same_gpu_and_no_other_is_reset_as_hardware():
    [f] = run(node(gpu(0), gpu(3, xid(13))), xid_history=earlier(13, NOW - HOUR))
    assert (f.action, f.severity, f.gpu) == (Action.RESET, Severity.FAIL, 3)
    assert f.action.takes_node_out
    assert f.message == ("XID 13 (Graphics Engine Exception), 2 bursts on this GPU within 24h "
                         "(a burst: lines less than 15s apart) -> hardware")


def test_xid31_then_xid13_on_one_gpu_are_two_codes_each_once():
    """Each code has its own rule (NVSentinel's are per code): one 31 and one 13 are no repeat."""
    [f] = run(node(gpu(3, xid(13))), xid_history=earlier(31, NOW - HOUR))
    assert (f.action, f.message) == (Action.NONE, "XID 13 (Graphics Engine Exception)")


def test_xid13_on_several_gpus_at_once_is_the_application_on_each():
    findings = run(node(gpu(0, xid(13, gpu=0)), gpu(3, xid(13))))
    assert [(f.gpu, f.action, f.severity) for f in findings] == [(0, Action.NONE, Severity.WARN),
                                                                  (3, Action.NONE, Severity.WARN)]
    assert all("-> the application, not this GPU" in f.message for f in findings)


def test_in_the_prolog_another_gpus_xid13_still_tells_the_application():
    """Only the job's GPU is judged, but the spread is read off the whole node."""
    [f] = run(node(gpu(0, xid(13, gpu=0, seq=2)), gpu(3, xid(13))), gpus=(3,), context=Context.PROLOG)
    assert f.gpu == 3 and f.action is Action.NONE and "the application" in f.message


# NVSentinel's XID 13/31 rules (health-events-analyzer values.yaml), one row each: the events on GPU 3 and
# GPU 5, as seconds before now (the last of GPU 3's is this run's, not yet recorded); what GPU 3's finding does.
RULES = [
    # RepeatedXID31OnSameGPU: a burst is lines less than 180 s apart; 2 bursts in 24 h -> the GPU.
    ("31: two lines 5 s apart from one process are one burst", 31, [5, 0], [], Action.NONE),
    ("31: lines 2 min apart, then 2 min more, are still one burst", 31, [240, 120, 0], [], Action.NONE),
    ("31: two bursts 10 min apart are the GPU's", 31, [600, 0], [], Action.RESET),
    ("31: an earlier burst more than 24 h ago does not count", 31, [25 * HOUR, 0], [], Action.NONE),
    # RepeatedXID31OnDifferentGPU: on 2 GPUs in 24 h -> the application, judged apart from the above.
    ("31: once here, once on another GPU: the application", 31, [0], [60], Action.NONE),
    ("31: two bursts here and one on another GPU: still the GPU's", 31, [3 * HOUR, 0], [60], Action.RESET),
    # RepeatedXID13OnSameGPCAndTPC: a burst is lines less than 15 s apart; 2 bursts in 24 h.
    ("13: two lines 5 s apart are one burst", 13, [5, 0], [], Action.NONE),
    ("13: two lines 20 s apart are two bursts: the GPU's", 13, [20, 0], [], Action.RESET),
    ("13: once here, once on another GPU: the application", 13, [0], [30], Action.NONE),
]


@pytest.mark.parametrize("code,here,there,action", [r[1:] for r in RULES], ids=[r[0] for r in RULES])
def test_xid13_and_31_follow_nvsentinels_rules(code, here, there, action):
    *before, _ = here
    history = {**earlier(code, *(NOW - s for s in before)), **earlier(code, *(NOW - s for s in there), on="gpu5")}
    [f] = run(node(gpu(3, xid(code))), xid_history=history)
    assert f.action is action, f.message


def test_a_burst_read_by_two_runs_minutes_apart_is_one_burst_when_the_lines_say_when():
    """The health check reads an XID 31 line, records it; five minutes later it reads the next line of
    the same burst (1 s after the first, by the kernel's clock): one burst, not the GPU's."""
    first = XidEvent(code=31, gpu=3, ts=100.0, source="kmsg", seq=7, boot="b", at=NOW - 301.0)
    again = XidEvent(code=31, gpu=3, ts=101.0, source="kmsg", seq=8, boot="b", at=NOW - 300.0)
    from slurm_hooks.xid.history import XidState, _empty

    state = XidState(None, _empty(), None)
    state.record([first], now=NOW - 299.0)
    [f] = run(node(gpu(3, first, again)), xid_history=state.recorded())
    assert f.action is Action.NONE and "hardware" not in f.message


def test_an_old_xid13_on_the_same_gpu_tells_nothing():
    [f] = run(node(gpu(3, xid(13))), xid_history=earlier(13, NOW - 2 * 24 * HOUR))
    assert (f.action, f.message) == (Action.NONE, "XID 13 (Graphics Engine Exception)")


def test_the_third_xid13_on_one_gpu_goes_to_replace():
    [f] = run(node(gpu(3, xid(13))), xid_history=earlier(13, NOW - 2 * HOUR, NOW - HOUR))
    assert (f.action, f.severity) == (Action.REPLACE, Severity.FAIL)
    assert "3rd time in 24h -> hardware" in f.message


def test_unknown_xid_code_warns():
    [f] = run(node(gpu(2, xid(999, gpu=2))))
    assert (f.action, f.severity) == (Action.WARN, Severity.WARN)
    assert f.message == "XID 999 (unknown XID)"


def test_unused_xid_is_named_by_its_mnemonic():
    [f] = run(node(gpu(3, xid(3))))
    assert f.message == "XID 3 (ROBUST_CHANNEL_FIFO_ERROR_UNK_METHOD, unused)"
    assert f.action is Action.WARN


def test_one_finding_per_gpu_and_code_sorted_by_code():
    snap = node(gpu(1, xid(119, 1, 1), xid(13, 1, 2), xid(119, 1, 3)), gpu(3, xid(119, 3, 4)))
    findings = run(snap, expect=Expectations(xid_repeat_count=10))
    assert [(f.gpu, f.message) for f in findings] == [
        (1, "XID 13 (Graphics Engine Exception)"),
        (1, "XID 119 (GSP RPC Timeout), 2 times"),
        (3, "XID 119 (GSP RPC Timeout)"),
    ]


def test_only_the_jobs_gpus_are_checked():
    snap = node(gpu(0, xid(79, 0)), gpu(3, xid(48, 3)))
    assert [f.gpu for f in run(snap, gpus=(3,))] == [3]


def test_node_level_xid_without_gpu_index_is_reported_for_the_node():
    [f] = run(node(gpu(0), node_xids=(xid(79, gpu=None),)), gpus=(0,))
    assert f.gpu is None
    assert f.summary == "XID 79 on node"
    assert f.line() == "node xid: XID 79 (GPU has fallen off the bus) -> reboot"


def test_third_xid119_in_24h_escalates_reset_to_replace():
    history = earlier(119, NOW - 20 * HOUR, NOW - 2 * HOUR)
    [f] = run(node(gpu(3, xid(119))), xid_history=history)
    assert (f.action, f.severity) == (Action.REPLACE, Severity.FAIL)
    assert f.message == "XID 119 (GSP RPC Timeout), 3rd time in 24h -> hardware"


def test_second_occurrence_stays_a_reset():
    [f] = run(node(gpu(3, xid(119))), xid_history=earlier(119, NOW - HOUR))
    assert f.action is Action.RESET


def test_occurrences_outside_the_window_do_not_escalate():
    history = earlier(119, NOW - 30 * HOUR, NOW - 25 * HOUR, NOW - 24 * HOUR - 1)
    [f] = run(node(gpu(3, xid(119))), xid_history=history)
    assert f.action is Action.RESET


def test_history_of_another_code_does_not_escalate():
    [f] = run(node(gpu(3, xid(119))), xid_history=earlier(120, NOW - HOUR, NOW - HOUR))
    assert f.action is Action.RESET


def test_repeats_within_one_snapshot_count_toward_escalation():
    [f] = run(node(gpu(3, *(xid(46, seq=i) for i in range(3)))))
    assert f.action is Action.REPLACE
    assert "3rd time in 24h -> hardware" in f.message


def test_window_and_count_come_from_expectations():
    expect = Expectations(xid_repeat_count=2, xid_repeat_window_s=7 * 86400)
    [f] = run(node(gpu(3, xid(74))), expect=expect, xid_history=earlier(74, NOW - 5 * 86400))
    assert f.action is Action.REPLACE
    assert f.message.endswith("2nd time in 7d -> hardware")


def test_repeat_count_zero_disables_escalation():
    [f] = run(node(gpu(3, *(xid(46, seq=i) for i in range(5)))), expect=Expectations(xid_repeat_count=0))
    assert f.action is Action.RESET


def test_warn_only_xid92_is_not_escalated():
    [f] = run(node(gpu(3, *(xid(92, seq=i) for i in range(5)))))
    assert (f.action, f.severity) == (Action.WARN, Severity.WARN)


def test_epilog_counts_only_xids_new_since_the_prolog_baseline():
    old = xid(79, seq=1)
    baseline = node(gpu(3, old))
    after = node(gpu(3, old, xid(48, seq=2)))
    findings = run(after, context=Context.EPILOG, baseline=baseline)
    assert [f.message for f in findings] == ["XID 48 (Double Bit ECC Error)"]


def test_epilog_with_nothing_new_since_baseline_is_clean():
    snap = node(gpu(3, xid(79)), node_xids=(xid(119, gpu=None, seq=5),))
    assert run(snap, context=Context.EPILOG, baseline=snap) == []


def test_same_code_again_during_the_job_is_new_in_the_epilog():
    baseline = node(gpu(3, xid(119, seq=1)))
    after = node(gpu(3, xid(119, seq=1), xid(119, seq=2)))
    [f] = run(after, context=Context.EPILOG, baseline=baseline)
    assert f.message == "XID 119 (GSP RPC Timeout)"


def test_baseline_is_ignored_outside_the_epilog():
    snap = node(gpu(3, xid(79)))
    [f] = run(snap, context=Context.PROLOG, baseline=snap)
    assert f.action is Action.REBOOT


# --- escalation counts events, per GPU -------------------------------------------------------


def kmsg_xid(code: int, seq: int, usec: int, bus: str = "9b") -> XidEvent:
    from slurm_hooks.probes import kmsg

    return kmsg.parse_line(f"3,{seq},{usec},-;NVRM: Xid (PCI:0000:{bus}:00): {code}, pid=7, name=python, Timeout")


def gpu_at_9b(*xids: XidEvent, index: int = 4, uuid: str = "GPU-9b") -> GpuSnapshot:
    from slurm_hooks.probes import kmsg

    mapped = kmsg.assign_gpus(xids, {"00000000:9B:00.0": (index, uuid)})
    return GpuSnapshot(index=index, uuid=uuid, pci_bus_id="00000000:9B:00.0", xids=tuple(mapped))


def test_a_burst_of_three_xid119_lines_in_3ms_is_one_event_and_stays_a_reset():
    from slurm_hooks.probes import kmsg

    lines = [kmsg_xid(119, 900 + i, 7_000_000 + i * 1000) for i in range(3)]
    [f] = run(node(gpu_at_9b(*kmsg.coalesce(lines))))
    assert (f.action, f.message) == (Action.RESET, "XID 119 (GSP RPC Timeout)")


def test_three_separate_xid119_events_in_the_window_still_escalate():
    from slurm_hooks.probes import kmsg

    events = [kmsg_xid(119, 900 + i, 7_000_000 + i * 6_000_000) for i in range(3)]  # 6 s apart
    assert kmsg.coalesce(events) == events
    [f] = run(node(gpu_at_9b(*events)))
    assert (f.action, f.message) == (Action.REPLACE, "XID 119 (GSP RPC Timeout), 3rd time in 24h -> hardware")


def test_the_same_code_on_other_gpus_does_not_escalate_this_one():
    history = {**earlier(119, NOW - HOUR, on="GPU-other-1"), **earlier(119, NOW - 2 * HOUR, on="GPU-other-2")}
    [f] = run(node(gpu_at_9b(kmsg_xid(119, 5, 1_000_000))), xid_history=history)
    assert f.action is Action.RESET


def test_earlier_events_count_by_uuid_across_a_reboot_that_renumbered_the_gpu():
    history = earlier(119, NOW - 20 * HOUR, NOW - 2 * HOUR, on="GPU-9b")  # recorded when it was GPU 4
    [f] = run(node(gpu_at_9b(kmsg_xid(119, 5, 1_000_000), index=6)), xid_history=history)
    assert (f.gpu, f.action) == (6, Action.REPLACE)


def test_acknowledged_events_are_no_reason_to_act_but_still_count_toward_escalation():
    """Drained, reset and resumed twice: the third XID 119 on the GPU is the hardware, though the
    first two are still in the kernel log (no reboot) and acknowledged."""
    first, second, third = (kmsg_xid(119, 10 + i, 1_000_000 + i * 3_600_000_000) for i in range(3))
    history = {first.key: ("GPU-9b", 119, NOW - 2 * HOUR), second.key: ("GPU-9b", 119, NOW - HOUR)}
    snap = node(gpu_at_9b(first, second, third))
    [f] = run(snap, xid_history=history, acked_xids=frozenset({first.key, second.key}))
    assert (f.action, f.message) == (Action.REPLACE, "XID 119 (GSP RPC Timeout), 3rd time in 24h -> hardware")
    assert run(node(gpu_at_9b(first, second)), xid_history=history, acked_xids=frozenset({first.key, second.key})) == []


def test_an_event_recorded_long_ago_and_still_in_the_log_does_not_count_as_new():
    old = kmsg_xid(119, 10, 1_000_000)
    new = [kmsg_xid(119, 11 + i, 90_000_000_000 + i * 10_000_000) for i in range(2)]
    history = {old.key: ("GPU-9b", 119, NOW - 3 * 86400)}  # recorded three days ago, outside the window
    [f] = run(node(gpu_at_9b(old, *new)), xid_history=history, acked_xids=frozenset({old.key}))
    assert (f.action, f.message) == (Action.RESET, "XID 119 (GSP RPC Timeout), 2 times")
