"""The watcher's sources and its act-once rule, without a cluster (the real one is in test_e2e_watch)."""

from __future__ import annotations

import threading
import time

import pynvml
import pytest
from fakes import FakeNvml
from fakes.config import sim_config
from fakes.slurm import FakeSlurm

from slurm_hooks.audit import AuditLog
from slurm_hooks.errors import ProbeError
from slurm_hooks.hooks.watch import FirstWorking, SimSource, Watcher
from slurm_hooks.hooks.wiring import Wiring
from slurm_hooks.probes import sim
from slurm_hooks.probes.nvml_errors import NotSupported
from slurm_hooks.probes.nvml_events import NvmlEventSource


def collect(source, stop_after: float = 1.0, until: int = 1) -> list:
    got, stop = [], threading.Event()

    def on_event(event):
        got.append(event)
        if len(got) >= until:
            stop.set()

    timer = threading.Timer(stop_after, stop.set)
    timer.start()
    try:
        source.follow(stop, on_event)
    finally:
        timer.cancel()
    return got


def test_nvml_source_registers_every_gpu_for_critical_xids_and_delivers_with_the_gpu_index():
    fake = FakeNvml.healthy(gpus=4).emit_xid(2, 79)
    [event] = collect(NvmlEventSource(nvml=fake, poll=0.05))
    assert (event.code, event.gpu, event.source) == (79, 2, "nvml")
    assert [mask for _, mask in fake.registered] == [pynvml.nvmlEventTypeXidCriticalError] * 4
    assert fake.shutdowns == 1


def test_nvml_source_keeps_waiting_through_timeouts_until_stopped():
    fake = FakeNvml.healthy(gpus=1)
    started = time.monotonic()
    assert collect(NvmlEventSource(nvml=fake, poll=0.05), stop_after=0.3) == []
    assert time.monotonic() - started < 2.0
    assert fake.called("nvmlEventSetWait_v2") >= 2


def test_nvml_source_turns_an_nvml_failure_into_a_typed_error():
    fake = FakeNvml.healthy(gpus=1).fail("nvmlEventSetWait_v2", code=pynvml.NVML_ERROR_GPU_IS_LOST)
    with pytest.raises(ProbeError):
        collect(NvmlEventSource(nvml=fake, poll=0.05))
    assert fake.shutdowns == 1


class ListSource:
    def __init__(self, events=(), error=None):
        self.events, self.error = list(events), error

    def backlog(self):
        return []

    def follow(self, stop, on_event):
        if self.error:
            raise self.error
        for e in self.events:
            on_event(e)
        stop.set()


def test_first_working_falls_back_to_the_kernel_log_when_nvml_events_are_not_supported():
    from slurm_hooks.models import XidEvent

    logs = []
    kmsg_event = XidEvent(48, gpu=1, source="kmsg", seq=7)
    source = FirstWorking(ListSource(error=NotSupported("event sets not supported")), ListSource([kmsg_event]),
                          logs.append)
    assert collect(source) == [kmsg_event]
    assert "reading the kernel log" in logs[0]


def test_first_working_does_not_hide_a_real_nvml_failure():
    source = FirstWorking(ListSource(error=ProbeError("NVML: GPU is lost")), ListSource(), lambda m: None)
    with pytest.raises(ProbeError):
        collect(source)


def test_sim_source_delivers_each_injected_xid_once_in_order(tmp_path):
    sim.init(str(tmp_path), "n1")
    sim.inject(str(tmp_path), "n1", 0, xid=13)
    source = SimSource(str(tmp_path), "n1", poll=0.02)
    assert [e.code for e in source.backlog()] == [13]
    threading.Timer(0.1, lambda: (sim.inject(str(tmp_path), "n1", 5, xid=79),
                                  sim.inject(str(tmp_path), "n1", 6, xid=48))).start()
    got = collect(source, stop_after=3.0, until=2)
    assert [(e.code, e.gpu) for e in got] == [(79, 5), (48, 6)]


@pytest.fixture
def wiring(tmp_path):
    cfg = sim_config(tmp_path, "[expect]\ngpus = 8")
    slurm = FakeSlurm()
    slurm.add_node("n1", "MIXED")
    slurm.add_job(7, "n1")
    sim.init(cfg.gpu.sim_dir, "n1")
    return Wiring(cfg, "n1", AuditLog(cfg.log.audit), slurm_override=slurm), slurm


def test_watcher_drains_and_requeues_on_a_critical_xid_and_acts_once(wiring):
    w, slurm = wiring
    sim.inject(w.config.gpu.sim_dir, "n1", 3, xid=79)
    [event] = SimSource(w.config.gpu.sim_dir, "n1", 0.1).backlog()
    watcher = Watcher(w, ListSource(), log=lambda m: None)
    watcher.handle(event)
    assert slurm.peek("n1").reason == "slurm-hooks: XID 79 on GPU 3 [replace]"
    assert slurm.called("requeue") == [("requeue", 7)]
    watcher.handle(event)  # delivered again (a restart, a second source): nothing more happens
    assert len(slurm.called("drain")) == 1 and len(slurm.called("requeue")) == 1
    again = Watcher(w, ListSource(), log=lambda m: None)  # a new process, same state dir
    again.handle(event)
    assert len(slurm.called("drain")) == 1


def test_watcher_leaves_the_node_alone_for_an_application_xid(wiring):
    w, slurm = wiring
    sim.inject(w.config.gpu.sim_dir, "n1", 3, xid=13)
    [event] = SimSource(w.config.gpu.sim_dir, "n1", 0.1).backlog()
    Watcher(w, ListSource(), log=lambda m: None).handle(event)
    assert slurm.called("drain") == [] and slurm.called("requeue") == []


def test_watcher_survives_a_source_failure_and_keeps_watching(wiring):
    w, _ = wiring
    logs, stop = [], threading.Event()

    class Flaky(ListSource):
        calls = 0

        def follow(self, stop_event, on_event):
            Flaky.calls += 1
            if Flaky.calls == 1:
                raise ProbeError("NVML: unknown error")
            stop_event.set()

    Watcher(w, Flaky(), log=logs.append).run(stop)
    assert Flaky.calls == 2 and "retrying" in logs[0]
