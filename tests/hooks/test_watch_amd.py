"""The watcher on an AMD node: the amdgpu driver's kernel lines with amdsmi's events beside them,
each judged by its row; never amdsmi on an NVIDIA node."""

from __future__ import annotations

import threading

import pytest
from conftest import collect_events, wait_for
from fakes.config import sim_config
from fakes.fake_amdsmi import FakeAmdSmi
from fakes.slurm import FakeSlurm

from slurm_hooks.errors import ProbeError
from slurm_hooks.hooks.watch import Alongside, FirstWorking, KmsgSource, Watcher, default_source
from slurm_hooks.models import XidEvent
from slurm_hooks.observe.audit import AuditLog
from slurm_hooks.probes.amdsmi import AmdSmiProbe
from slurm_hooks.probes.amdsmi_events import AmdSmiEventSource, EventsUnavailable
from slurm_hooks.probes.nvml_events import NvmlEventSource
from slurm_hooks.remedy.wiring import Wiring


@pytest.mark.parametrize("backend", ["amdsmi", "nvml", "auto"])
def test_amdsmi_events_run_beside_the_kernel_log_on_amd_nodes_only(tmp_path, backend):
    """``auto`` on this machine (no amdgpu driver) is an NVIDIA node: NVML's XID events in place of
    the kernel log, never amdsmi."""
    from slurm_hooks import config

    cfg = config.parse(f'[gpu]\nbackend = "{backend}"\n[state]\ndir = "{tmp_path}"\n')
    source = default_source(Wiring(cfg, "n1", AuditLog(str(tmp_path / "audit"))), log=lambda m: None)
    if backend == "amdsmi":
        assert isinstance(source, Alongside)
        assert isinstance(source.main, KmsgSource) and isinstance(source.beside, AmdSmiEventSource)
    else:
        assert isinstance(source, FirstWorking) and isinstance(source.primary, NvmlEventSource)


class ListSource:
    def __init__(self, events=(), error=None, unavailable=()):
        self.events, self.error, self.calls = list(events), error, 0
        if unavailable:
            self.unavailable = unavailable

    def backlog(self):
        return []

    def follow(self, stop, on_event):
        self.calls += 1
        if self.error is not None and self.calls == 1:
            raise self.error
        for e in self.events:
            on_event(e)
        stop.wait()


def test_the_kernel_log_goes_on_alone_where_amdsmi_events_cannot_work():
    said = []
    line = XidEvent(0, gpu=2, source="kmsg", seq=7, rule="amdgpu-ue-umc", subject="umc")
    source = Alongside(ListSource([line]), ListSource(error=EventsUnavailable("amdsmi not loadable (no libamd_smi)"),
                                                      unavailable=EventsUnavailable), said.append)
    assert collect_events(source, stop_after=0.5) == [line]
    wait_for(lambda: source.gave_up, 2.0, "the side source given up")
    assert said == ["slurm-hooks watch: GPU library events unavailable (amdsmi not loadable (no libamd_smi)); "
                    "the kernel log alone"]


def test_a_side_source_that_fails_is_said_once_and_listened_to_again():
    said = []
    hang = XidEvent(0, gpu=1, source="amdsmi", seq=9, rule="amdgpu-ring-timeout")
    beside = ListSource([hang], error=ProbeError("AmdSmiEventReader.read failed: AMDSMI_STATUS_IO - I/O Error"),
                        unavailable=EventsUnavailable)
    source = Alongside(ListSource(), beside, said.append, retry_s=0.05)
    assert collect_events(source, stop_after=2.0) == [hang]
    assert beside.calls == 2 and len(said) == 1 and "retrying" in said[0]


@pytest.fixture
def amd_node(tmp_path):
    """Node n1 with four MI300X read by the real AMD probe over the shared fake amdsmi, an empty
    kernel log, job 7 on it."""
    cfg = sim_config(tmp_path, "[severity.check.amdgpu-ring-timeout]\nurgency = \"now\"\naction = \"drain\"\n")
    log = tmp_path / "kmsg.log"
    log.write_text("")
    fake = FakeAmdSmi.healthy(gpus=4)
    slurm = FakeSlurm()
    slurm.add_node("n1", "MIXED")
    slurm.add_job(7, "n1")
    probe = AmdSmiProbe("n1", amdsmi=fake, drm_root="/nonexistent", kmsg_path=str(log))
    w = Wiring(cfg, "n1", AuditLog(cfg.log.audit), probe_override=probe, slurm_override=slurm)
    return w, slurm, fake, str(log)


def test_a_vm_fault_is_said_and_never_drains_the_node(amd_node):
    """A GPU page fault is the job's bug as a rule: a watcher that drained for it would take a
    healthy node out for every crashing job, and this test fails."""
    from slurm_hooks.hooks import healthcheck

    w, slurm, fake, _ = amd_node
    fake.emit(gpu=1, event="VMFAULT", message="3f21:python3")
    [fault] = collect_events(AmdSmiEventSource(amdsmi=fake, poll=0.05))
    said = []
    Watcher(w, ListSource(), log=said.append).handle(fault)
    assert slurm.called("drain") == [] and slurm.called("requeue") == []
    assert said == ["slurm-hooks watch: amdgpu-vm-fault on GPU 1 -> warn (watch)"]
    state = healthcheck.xid_history(w).load()
    assert state.seen(fault.key) and fault.key not in state.recorded()  # said once, never counted as a fault


def test_a_ring_hang_from_amdsmi_is_judged_by_the_kernel_lines_row_as_the_admin_set_it(amd_node):
    """With the ring-timeout row set to drain, amdsmi's RING_HANG drains in the driver's words like the
    kernel's ``ring ... timeout`` line, naming its GPU; while the watcher runs, with no NVIDIA word."""
    w, slurm, fake, log = amd_node
    said: list[str] = []
    watcher = Watcher(w, Alongside(KmsgSource(log, 0.05), AmdSmiEventSource(amdsmi=fake, poll=0.05), said.append),
                      log=said.append, retry_poll=0.05)
    stop = threading.Event()
    thread = threading.Thread(target=watcher.run, args=(stop,))
    thread.start()
    try:
        wait_for(lambda: fake.armed, 5.0, "amdsmi armed")
        fake.emit(gpu=3, event="RING_HANG")
        wait_for(lambda: slurm.called("drain"), 10.0, "the drain", seen=lambda: said)
    finally:
        stop.set()
        thread.join(30)
    assert slurm.peek("n1").reason == "slurm-hooks: ring timeout on GPU 3 [drain]"
    text = " ".join(said)
    assert "amdgpu-ring-timeout on GPU 3" in text and "XID" not in text and "NVML" not in text
    assert fake.armed == {} and not fake.initialised
