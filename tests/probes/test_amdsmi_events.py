"""amdsmi's events (``AmdSmiEventReader``) as the watcher's side source: each becomes the row of the
driver's kernel line it is the like of, on its GPU, within a bounded wait."""

from __future__ import annotations

import time

import pytest
from conftest import collect_events
from fakes.fake_amdsmi import STATUS, FakeAmdSmi

from slurm_hooks.errors import ProbeError
from slurm_hooks.probes.amdsmi_events import AmdSmiEventSource, EventsUnavailable
from slurm_hooks.severity import CHECK_RULES


def source(fake: FakeAmdSmi | None) -> AmdSmiEventSource:
    return AmdSmiEventSource(amdsmi=fake, poll=0.05)


def test_a_ring_hang_is_the_drivers_ring_timeout_row_on_its_gpu():
    fake = FakeAmdSmi.healthy(gpus=4).emit(gpu=3, event="RING_HANG", message="gfx_0.0.0")
    [event] = collect_events(source(fake))
    assert (event.rule, event.code, event.gpu, event.source) == ("amdgpu-ring-timeout", 0, 3, "amdsmi")
    assert event.uuid == fake.gpus[3]["uuid"] and event.pci_bus_id == "00000000:3C:00.0"
    assert event.message == "amdsmi RING_HANG: gfx_0.0.0"
    # Every GPU was armed, each disarmed and the session closed once the watcher stopped.
    assert fake.called("amdsmi_init_gpu_event_notification") == 4 and fake.armed == {} and not fake.initialised


def test_each_event_type_has_its_row_and_a_post_reset_is_no_event():
    fake = FakeAmdSmi.healthy(gpus=4)
    for gpu, kind in ((0, "VMFAULT"), (1, "THERMAL_THROTTLE"), (2, "GPU_PRE_RESET"), (2, "GPU_POST_RESET")):
        fake.emit(gpu=gpu, event=kind, message="3f21:python3")
    got = collect_events(source(fake), stop_after=0.5, until=4)
    assert [(e.gpu, e.rule) for e in got] == [(0, "amdgpu-vm-fault"), (1, "amdgpu-thermal-throttle"),
                                              (2, "amdgpu-reset")]
    assert all(e.rule in CHECK_RULES for e in got)
    assert len({e.key for e in got}) == 3


def test_no_event_within_a_read_is_no_failure_and_a_stop_is_seen_within_the_poll():
    fake = FakeAmdSmi.healthy(gpus=1)
    started = time.monotonic()
    assert collect_events(source(fake), stop_after=0.3) == []
    assert time.monotonic() - started < 2.0
    assert fake.called("amdsmi_get_gpu_event_notification") >= 2


@pytest.mark.parametrize("status", ["NOT_SUPPORTED", "NO_PERM"])
def test_an_amdsmi_that_cannot_arm_a_gpu_says_events_are_unavailable_here(status):
    fake = FakeAmdSmi.healthy(gpus=2).fail("amdsmi_init_gpu_event_notification", gpu=1, code=STATUS[status])
    with pytest.raises(EventsUnavailable):
        collect_events(source(fake))
    assert fake.armed == {} and not fake.initialised  # the GPU armed before is disarmed


def test_a_read_that_fails_otherwise_is_a_probe_error_to_retry_not_unavailable():
    fake = FakeAmdSmi.healthy(gpus=2).fail("amdsmi_get_gpu_event_notification", code=STATUS["IO"])
    with pytest.raises(ProbeError) as err:
        collect_events(source(fake))
    assert not isinstance(err.value, EventsUnavailable) and "AMDSMI_STATUS_IO" in str(err.value)


def test_without_amdsmi_events_are_unavailable():
    """The test venv has no amdsmi: as a node without ROCm's Python package."""
    with pytest.raises(EventsUnavailable, match="amdsmi not loadable"):
        collect_events(source(None))


def test_a_check_in_the_watchers_process_does_not_shut_the_library_down_under_the_listener():
    """amdsmi is initialised once per process: a probe that shut it down after its snapshot would
    pull it from under the listening thread (its next read: NOT_INIT), and this test fails."""
    import os
    import threading

    from conftest import wait_for

    from slurm_hooks.probes.amdsmi import AmdSmiProbe

    fake = FakeAmdSmi.healthy(gpus=2)
    got, stop = [], threading.Event()
    listener = threading.Thread(target=source(fake).follow, args=(stop, got.append))
    listener.start()
    try:
        wait_for(lambda: len(fake.armed) == 2, 2.0, "both GPUs armed")
        snap = AmdSmiProbe("n1", amdsmi=fake, drm_root="/nonexistent", kmsg_path=os.devnull).snapshot()
        assert snap.error is None and len(snap.gpus) == 2 and fake.initialised
        fake.emit(gpu=1, event="RING_HANG")
        wait_for(lambda: got, 2.0, "the event after the check")
    finally:
        stop.set()
        listener.join(5)
    assert not fake.initialised and fake.called("amdsmi_shut_down") == 1
