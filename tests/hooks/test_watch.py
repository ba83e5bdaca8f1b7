"""The watcher's sources and its act-once rule, without a cluster (the real one is in test_e2e_watch)."""

from __future__ import annotations

import threading
import time

import pynvml
import pytest
from conftest import collect_events
from fakes import XID79_GPU2, FakeNvml
from fakes.config import nvml_wiring, sim_config, sim_node
from fakes.slurm import FakeSlurm

from slurm_hooks.errors import ProbeError
from slurm_hooks.hooks.watch import RETRY_JOIN_S, FirstWorking, SimSource, Watcher
from slurm_hooks.models import XidEvent
from slurm_hooks.observe.audit import AuditLog
from slurm_hooks.probes import sim
from slurm_hooks.probes.nvml_errors import NotSupported
from slurm_hooks.probes.nvml_events import NvmlEventSource
from slurm_hooks.remedy.wiring import Wiring


def test_nvml_source_registers_every_gpu_for_critical_xids_and_delivers_with_the_gpu_index():
    fake = FakeNvml.healthy(gpus=4).emit_xid(2, 79)
    [event] = collect_events(NvmlEventSource(nvml=fake, poll=0.05))
    assert (event.code, event.gpu, event.source, event.uuid) == (79, 2, "nvml", fake.gpus[2]["uuid"])
    assert [mask for _, mask in fake.registered] == [pynvml.nvmlEventTypeXidCriticalError] * 4
    assert fake.shutdowns == 1


def test_nvml_source_keeps_waiting_through_timeouts_until_stopped():
    fake = FakeNvml.healthy(gpus=1)
    started = time.monotonic()
    assert collect_events(NvmlEventSource(nvml=fake, poll=0.05), stop_after=0.3) == []
    assert time.monotonic() - started < 2.0
    assert fake.called("nvmlEventSetWait_v2") >= 2


def test_nvml_source_turns_an_nvml_failure_into_a_typed_error():
    fake = FakeNvml.healthy(gpus=1).fail("nvmlEventSetWait_v2", code=pynvml.NVML_ERROR_GPU_IS_LOST)
    with pytest.raises(ProbeError):
        collect_events(NvmlEventSource(nvml=fake, poll=0.05))
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
    assert collect_events(source) == [kmsg_event]
    assert "reading the kernel log" in logs[0]


def test_first_working_does_not_hide_a_real_nvml_failure():
    source = FirstWorking(ListSource(error=ProbeError("NVML: GPU is lost")), ListSource(), lambda m: None)
    with pytest.raises(ProbeError):
        collect_events(source)


def test_sim_source_delivers_each_injected_xid_once_in_order(tmp_path):
    sim.init(str(tmp_path), "n1")
    sim.inject(str(tmp_path), "n1", 0, xid=13)
    source = SimSource(str(tmp_path), "n1", poll=0.02)
    assert [e.code for e in source.backlog()] == [13]
    threading.Timer(0.1, lambda: (sim.inject(str(tmp_path), "n1", 5, xid=79),
                                  sim.inject(str(tmp_path), "n1", 6, xid=48))).start()
    got = collect_events(source, stop_after=3.0, until=2)
    assert [(e.code, e.gpu) for e in got] == [(79, 5), (48, 6)]
    state = sim.read(str(tmp_path), "n1")
    assert [e.uuid for e in got] == [state["gpus"][5]["uuid"], state["gpus"][6]["uuid"]]


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
    assert slurm.peek("n1").reason == "slurm-hooks: XID 79 on GPU 3 [reboot]"
    assert slurm.called("requeue") == [("requeue", 7)]
    watcher.handle(event)  # delivered again (a restart, a second source): nothing more happens
    assert len(slurm.called("drain")) == 1 and len(slurm.called("requeue")) == 1
    again = Watcher(w, ListSource(), log=lambda m: None)  # a new process, same state dir
    again.handle(event)
    assert len(slurm.called("drain")) == 1


class CountingProbe:
    """The node's own probe, counting the snapshots taken."""

    def __init__(self, inner):
        self.inner, self.name, self.snapshots = inner, inner.name, 0

    def snapshot(self):
        self.snapshots += 1
        return self.inner.snapshot()


def test_an_xid79_goes_from_the_watcher_to_the_drain_with_one_snapshot_one_lookup_one_history_read(wiring):
    import dataclasses

    from slurm_hooks.hooks import healthcheck
    from slurm_hooks.models import XidEvent
    from slurm_hooks.xid import catalog as xid_catalog
    from slurm_hooks.xid.history import XidHistory

    w, slurm = wiring
    path = healthcheck.xid_history(w).path
    earlier = XidEvent(code=31, gpu=1, ts=1.0, source="sim", seq=99)
    XidHistory(path).record([earlier])  # the history holds something to read
    sim.inject(w.config.gpu.sim_dir, "n1", 3, xid=79)
    [event] = SimSource(w.config.gpu.sim_dir, "n1", 0.1).backlog()
    reads, lookups = [], []

    def opener(name, *args, **kwargs):
        reads.append(name)
        return open(name, *args, **kwargs)

    def catalog(code):
        lookups.append(code)
        return xid_catalog.lookup(code)

    probe = CountingProbe(w.probe())
    w = dataclasses.replace(w, probe_override=probe)
    watcher = Watcher(w, ListSource(), log=lambda m: None, history=XidHistory(path, opener=opener), catalog=catalog)
    watcher.handle(event)
    assert slurm.peek("n1").reason == "slurm-hooks: XID 79 on GPU 3 [reboot]"
    assert slurm.called("requeue") == [("requeue", 7)]
    assert (reads, lookups, probe.snapshots) == ([path], [79], 1)
    after = XidHistory(path).load()  # one write kept both: the event recorded, and marked seen
    assert set(after.recorded()) == {earlier.key, event.key} and after.seen(event.key)


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


def test_a_watcher_that_dies_of_an_unexpected_error_ends_its_retry_thread_at_once(wiring):
    w, _ = wiring
    stop = threading.Event()

    class Broken(ListSource):
        def follow(self, stop_event, on_event):
            raise RuntimeError("a bug")

    def retry_threads() -> set:
        return {t for t in threading.enumerate() if t.name == "pending-retry"}

    before = retry_threads()
    started = time.monotonic()
    with pytest.raises(RuntimeError):
        Watcher(w, Broken(), log=lambda m: None, retry_poll=0.05).run(stop)
    assert stop.is_set() and time.monotonic() - started < RETRY_JOIN_S
    assert retry_threads() <= before


# --- one identity per XID: the kernel log's line is tied to its GPU at the source --------------

@pytest.fixture
def nvml_node(tmp_path):
    """Node n1 with four real-looking GPUs (NVML probe over the shared fake) and a kernel log."""
    from slurm_hooks.probes.identity import store_path
    from slurm_hooks.probes.nvml import NvmlProbe

    cfg = sim_config(tmp_path)
    log = tmp_path / "kmsg.log"
    log.write_text("6,4000,3757000000,-;eth0: link becomes ready\n" + XID79_GPU2)
    fake = FakeNvml.healthy(gpus=4)
    slurm = FakeSlurm()
    slurm.add_node("n1", "MIXED")
    slurm.add_job(7, "n1")
    probe = NvmlProbe("n1", kmsg_path=str(log), nvml=fake, gpu_map_path=store_path(cfg.state.dir, "n1"))
    w = Wiring(cfg, "n1", AuditLog(cfg.log.audit), probe_override=probe, slurm_override=slurm)
    return w, slurm, str(log), fake


def kmsg_source(w, log, fake=None):
    from slurm_hooks.hooks.watch import KmsgSource
    from slurm_hooks.probes.identity import store_path
    from slurm_hooks.probes.nvml import read_gpu_map

    return KmsgSource(log, 0.02, gpu_map=store_path(w.config.state.dir, "n1"),
                      ask_nvml=(lambda: read_gpu_map(fake)) if fake is not None else (lambda: {}))


def test_a_kernel_log_xid_is_one_finding_on_its_gpu_under_one_key(nvml_node):
    from slurm_hooks.hooks import healthcheck

    w, slurm, log, fake = nvml_node
    [event] = kmsg_source(w, log, fake).backlog()  # no map file yet: NVML is asked
    assert (event.gpu, event.uuid) == (2, fake.gpus[2]["uuid"])
    watcher = Watcher(w, ListSource(), log=lambda m: None)
    watcher.handle(event)
    assert slurm.peek("n1").reason == "slurm-hooks: XID 79 on GPU 2 [reboot]"
    report = healthcheck.judge(w, healthcheck.Context.CHECK, acknowledge=False)
    assert [f.summary for f in report.drain_findings()] == ["XID 79 on GPU 2"]
    assert healthcheck._keys(report.snapshot) == [event.key]
    assert set(healthcheck.xid_history(w).recorded()) == {event.key}


def test_an_amdgpu_line_goes_through_the_watcher_in_the_drivers_words(nvml_node):
    """A driver event that is no XID (an amdgpu line) is judged by its row, drains with its own
    words, and is one event under one key for the watcher, the check and the history."""
    from slurm_hooks.hooks import healthcheck

    w, slurm, log, fake = nvml_node
    with open(log, "w") as fh:
        fh.write("6,5000,8123456789,-;amdgpu 0000:38:00.0: amdgpu: {3}socket: 0, die: 0, 1 new uncorrectable "
                 "hardware errors detected in umc block\n")
    said: list = []
    [event] = kmsg_source(w, log, fake).backlog()
    Watcher(w, ListSource(), log=said.append).handle(event)
    assert slurm.peek("n1").reason == "slurm-hooks: uncorrectable ECC in UMC block on GPU 2 [reset]"
    assert said and "XID" not in " ".join(said) and "amdgpu-ue-umc on GPU 2" in said[0]
    assert set(healthcheck.xid_history(w).recorded()) == {event.key}
    [record] = [r for r in AuditLog(w.config.log.audit).read() if r.get("kind") == "watch"]
    assert record["rule"] == "amdgpu-ue-umc" and "xid" not in record


def test_after_an_admin_resumes_neither_the_check_nor_the_watchers_backlog_drains_again(nvml_node):
    from slurm_hooks.hooks import healthcheck

    w, slurm, log, fake = nvml_node
    healthcheck.run(w)  # the health check finds the XID first (the watcher was down)
    assert slurm.peek("n1").reason == "slurm-hooks: XID 79 on GPU 2 [reboot]"
    slurm.resume("n1")  # the admin replaced the GPU's cable, reset it, resumed the node
    report, _ = healthcheck.run(w)
    assert report.drain_findings() == () and slurm.peek("n1").reason == ""
    [acked] = healthcheck.xid_history(w).acked()
    stop = threading.Event()
    stop.set()  # the watcher (re)starts now: it handles its backlog, then stops
    Watcher(w, kmsg_source(w, log), log=lambda m: None).run(stop)  # the map the probe left is used
    assert len(slurm.called("drain")) == 1 and slurm.peek("n1").reason == ""
    [event] = kmsg_source(w, log).backlog()
    assert event.key == acked and event.gpu == 2
    assert healthcheck.run(w)[0].drain_findings() == ()


def test_the_kernel_log_source_reads_the_map_again_for_a_gpu_it_did_not_know(nvml_node, tmp_path):
    w, _, log, fake = nvml_node
    source = kmsg_source(w, log)
    assert source.backlog()[0].gpu is None  # no map anywhere yet: the line stays unmapped, same key
    w.probe().snapshot()  # a health check run leaves the GPUs it read
    got = follow_while_appending(source, log, XID79_GPU2.replace("4123,3757433200", "4200,3800000000"))
    assert [(e.gpu, e.uuid) for e in got] == [(2, fake.gpus[2]["uuid"])]


def follow_while_appending(source, log, text: str) -> list:
    """Events ``source.follow`` delivers after ``text`` is appended to the log it follows."""
    got: list = []
    stop = threading.Event()
    thread = threading.Thread(target=source.follow, args=(stop, got.append), daemon=True)
    thread.start()
    try:
        time.sleep(0.2)
        with open(log, "a") as fh:
            fh.write(text)
        deadline = time.monotonic() + 5
        while not got and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.1)  # anything delivered after the first event shows too
    finally:
        stop.set()
        thread.join(5)
    return got


def test_a_burst_of_lines_is_one_event_for_the_watcher_across_backlog_and_follow(tmp_path):
    from slurm_hooks.hooks.watch import KmsgSource

    log = tmp_path / "kmsg.log"
    line = "3,{seq},{usec},-;NVRM: Xid (PCI:0000:9b:00): 119, pid=7, name=python, Timeout after 6s of waiting\n"
    log.write_text(line.format(seq=10, usec=5_000_000) + line.format(seq=11, usec=5_001_000))
    source = KmsgSource(str(log), 0.02, ask_nvml=lambda: {})
    assert [e.seq for e in source.backlog()] == [10]
    # the burst's third line, then a new event 5 s later
    got = follow_while_appending(source, log, line.format(seq=12, usec=5_003_000) + line.format(seq=13, usec=10_000_000))
    assert [e.seq for e in got] == [13]


def test_a_burst_of_xid119_lines_drains_for_a_reset_not_a_replacement(nvml_node):
    from slurm_hooks.hooks import healthcheck

    w, slurm, log, _ = nvml_node
    with open(log, "w") as fh:
        for i in range(3):  # one GSP timeout, three lines within 3 ms
            fh.write(f"3,{900 + i},{8_000_000 + i * 1000},-;NVRM: Xid (PCI:0000:38:00): 119, pid=7, name=python, "
                     "Timeout after 6s of waiting for RPC response from GPU2 GSP!\n")
    healthcheck.run(w)
    assert slurm.peek("n1").reason == "slurm-hooks: XID 119 on GPU 2 [reset]"
    assert [code for _, code, _ in healthcheck.xid_history(w).recorded().values()] == [119]


def test_watcher_drains_on_a_critical_nvml_xid_event_even_when_the_kernel_log_is_unreadable(tmp_path):
    slurm = FakeSlurm()
    slurm.add_node("n1", "MIXED")
    w = nvml_wiring(tmp_path, slurm, FakeNvml.healthy(8), tmp_path / "no-kmsg-in-this-container")
    event = XidEvent(79, gpu=2, ts=time.time(), message="NVML XID event", source="nvml", seq=1_700_000_000_000_000)
    watcher = Watcher(w, source=None, log=lambda m: None)
    watcher.handle(event)
    assert watcher.history.seen(event.key)  # it will never be looked at again
    assert slurm.peek("n1").drained


# --- a person's resume, seen by the watcher --------------------------------------------------------


def test_the_watcher_sees_a_persons_resume_and_closes_the_incident_within_seconds(tmp_path):
    """XID 79 drains n1 through the watcher; an admin resumes it (scontrol update State=RESUME). No
    health check runs: the watcher itself sees the node back in service, not by us, within seconds,
    and the incident closes as resumed by a person; the XID it was drained for is acknowledged, so
    the node is not drained again for it."""
    from conftest import wait_for

    from slurm_hooks.observe import incidents

    cfg = sim_config(tmp_path, "[expect]\ngpus = 8\n[watch]\npoll_interval = 0.05\n")
    slurm, w = sim_node(cfg, "IDLE")
    stop = threading.Event()
    watcher = Watcher(w, SimSource(cfg.gpu.sim_dir, "n1", 0.05), log=lambda m: None, resume_poll=0.2)
    thread = threading.Thread(target=watcher.run, args=(stop,), daemon=True)
    thread.start()
    try:
        sim.inject(cfg.gpu.sim_dir, "n1", 3, xid=79)
        wait_for(lambda: slurm.peek("n1").drained, 10, what="the watcher's drain")
        time.sleep(1.0)  # the watcher polls while it holds the drain: nothing changes on its own
        assert slurm.peek("n1").drained
        slurm.set_node("n1", state="IDLE", reason="")  # a person's resume
        resumed = time.monotonic()
        closed = wait_for(lambda: [i for i in incidents.build(w.audit.read()) if not i.open], 10,
                          what="the incident closed by the watcher")
        took = time.monotonic() - resumed
    finally:
        stop.set()
        thread.join(RETRY_JOIN_S)
    [inc] = closed
    assert inc.resolved_by == "a person" and took < 3.0
    assert not slurm.peek("n1").drained and len(slurm.called("drain")) == 1
    assert any(r.get("action") == "ack-xids" for r in w.audit.read())


def test_the_watcher_does_not_take_our_own_resume_for_a_persons(tmp_path):
    """The health check mends and resumes n1 itself: the watcher's poll sees no person's resume."""
    from slurm_hooks.hooks import healthcheck
    from slurm_hooks.observe import incidents

    cfg = sim_config(tmp_path, "[expect]\ngpus = 8\n")
    slurm, w = sim_node(cfg, "IDLE")
    sim.inject(cfg.gpu.sim_dir, "n1", 3, row_remap_pending=True)
    healthcheck.run(w, follow="none")
    assert slurm.peek("n1").drained
    stop = threading.Event()
    thread = threading.Thread(target=Watcher(w, ListSource(), log=lambda m: None, resume_poll=0.05)._resume_loop,
                              args=(stop,), daemon=True)
    thread.start()
    try:
        sim.clear(cfg.gpu.sim_dir, "n1", 3)
        healthcheck.run(w, follow="none")
        time.sleep(1.0)
    finally:
        stop.set()
        thread.join(5)
    [inc] = incidents.build(w.audit.read())
    assert not inc.open and inc.closed_by == "slurm-hooks"
    assert [r for r in w.audit.read() if r["kind"] == "incident" and r.get("by") == "person"] == []
