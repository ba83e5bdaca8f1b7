"""The lifecycle as the hooks write it: a person's resume closes the incident, a node drained for
weeks writes a handful of lines. Simulated GPUs and the shared fake Slurm, the checks in-process."""

from __future__ import annotations

import os

import pytest
from fakes.config import sim_config, sim_node

from slurm_hooks.hooks import healthcheck
from slurm_hooks.observe import events, incidents, timeline
from slurm_hooks.probes import sim
from slurm_hooks.values import replace

#: What a check may ask of Slurm and change there.
WRITES = ("drain", "resume", "reboot", "requeue", "release", "start_now", "signal", "set_admin_comment")


@pytest.fixture
def node(tmp_path):
    cfg = sim_config(tmp_path, "[expect]\ngpus = 8\n")
    slurm, w = sim_node(cfg, "IDLE")
    return slurm, w, cfg.gpu.sim_dir


def lines(w):
    with open(w.audit.path) as fh:
        return sum(1 for _ in fh)


def test_a_persons_resume_of_a_node_we_drained_closes_its_incident_as_resumed_by_a_person(node):
    slurm, w, sim_dir = node
    sim.inject(sim_dir, "n1", 3, row_remap_pending=True)
    healthcheck.run(w, follow="none")
    assert slurm.peek("n1").drained
    sim.clear(sim_dir, "n1", 3)  # mended by hand
    slurm.set_node("n1", state="IDLE", reason="")  # scontrol update nodename=n1 state=resume
    _, outcome = healthcheck.run(w, follow="none")
    assert not outcome.resumed  # not ours: the person's
    [inc] = incidents.build(w.audit.read())
    assert not inc.open and inc.resolved_by == "a person" and inc.closed_by == "person"
    assert inc.mttr is not None and inc.mttr >= 0
    healthcheck.run(w, follow="none")
    assert len([r for r in w.audit.read() if r["kind"] == "incident"]) == 1  # closed once


def test_a_persons_resume_with_the_xid_still_in_the_kernel_log_closes_the_incident_too(node):
    slurm, w, sim_dir = node
    sim.inject(sim_dir, "n1", 0, xid=79)
    healthcheck.run(w, follow="none")
    assert slurm.peek("n1").drained
    slurm.set_node("n1", state="IDLE", reason="")
    healthcheck.run(w, follow="none")
    [inc] = incidents.build(w.audit.read())
    assert not inc.open and inc.resolved_by == "a person"
    assert not slurm.peek("n1").drained  # the acknowledged XID does not drain it again


def test_a_thousand_checks_on_a_drained_node_write_a_handful_of_lines_and_change_nothing_in_slurm(node):
    slurm, w, sim_dir = node
    sim.inject(sim_dir, "n1", 0, xid=79)
    healthcheck.run(w, follow="none")
    healthcheck.run(w, follow="none")
    settled = lines(w)
    calls = len(slurm.calls)
    for _ in range(1000):
        # Each check is its own process with its own deadline ([check] deadline): one Wiring reused
        # would keep the first run's, and on a loaded machine the later runs would find it spent.
        healthcheck.run(replace(w, deadline=None), follow="none")
    assert lines(w) == settled  # each repeat counted, none written
    later = [c[0] for c in slurm.calls[calls:]]
    assert not set(later) & set(WRITES)
    assert len(later) <= 3 * 1000  # reads only (the node twice, its jobs once)
    # Still counted: the history says how often and until when.
    repeats = [r for r in w.audit.history() if r["kind"] == "repeat"]
    assert sum(r["count"] for r in repeats) >= 2000
    # `slurm-hooks events` shows the incident in a handful of lines.
    history = events.select(w.audit.history(), "n1")
    shown = timeline.render(timeline.by_incident(incidents.build(history), history))
    assert shown[0].startswith("incident n1-") and len(shown) <= 10
    assert sum(1 for line in shown if "again   " in line and " more times until " in line) >= 1
    # The next change writes the counts out, then itself.
    slurm.set_node("n1", state="IDLE", reason="")
    healthcheck.run(w, follow="none")
    written = list(w.audit.read())
    assert written[-1]["kind"] in ("incident", "action") and any(r["kind"] == "repeat" for r in written)
    [inc] = incidents.build(w.audit.history())
    assert not inc.open and inc.last_seen is not None and inc.last_seen > inc.opened_at
    assert lines(w) - settled <= 10


def test_no_record_is_kept_only_in_the_repeat_count_file_after_a_change(node):
    _, w, sim_dir = node
    sim.inject(sim_dir, "n1", 0, xid=79)
    for _ in range(5):
        healthcheck.run(w, follow="none")
    w.audit.write("action", node="n1", action="resume", result="ok")
    assert not os.path.exists(w.audit.repeats_path) or "n1" not in open(w.audit.repeats_path).read()


def test_gpu_fields_name_the_board_by_uuid_serial_and_pci_bus_id(node):
    from slurm_hooks.remedy.audit import gpu_fields

    _, w, sim_dir = node
    gpu = sim.gpu_entry(sim.read(sim_dir, "n1"), 2)
    report = healthcheck.judge(w, healthcheck.Context.CHECK, acknowledge=False)
    assert gpu_fields(report, 2) == {"uuid": gpu["uuid"], "serial": gpu["serial"], "pci_bus_id": gpu["pci_bus_id"]}
    assert gpu_fields(report, None) == {} and gpu_fields(report, 99) == {}


def test_every_field_the_hooks_write_is_declared_in_records(tmp_path):
    """A new field goes into slurm_hooks/observe/records.py first: readers ask typed records."""
    from fakes.config import repair_config

    from slurm_hooks.observe import records

    cfg = repair_config(tmp_path)
    slurm, w = sim_node(cfg, "IDLE")
    sim.set_diag_seconds(cfg.gpu.sim_dir, "n1", 0.0)
    sim.inject(cfg.gpu.sim_dir, "n1", 3, row_remap_pending=True)
    healthcheck.run(w, follow="none", repair="inline")  # reset, validation, resume
    sim.inject(cfg.gpu.sim_dir, "n1", 0, xid=79, cleared_by="never")
    healthcheck.run(w, follow="none", repair="inline")
    sim.reboot(cfg.gpu.sim_dir, "n1")
    slurm.set_node("n1", state="DOWN", reason="slurm-hooks: XID 79 on GPU 0 [reboot 1/1] : reboot issued : reboot complete")
    healthcheck.run(w, follow="none", repair="inline")  # [replace]
    slurm.set_node("n1", state="IDLE", reason="")
    sim.clear(cfg.gpu.sim_dir, "n1", 0)
    healthcheck.run(w, follow="none", repair="inline")  # a person's resume
    undeclared = {(r["kind"], r.get("action", ""), k) for r in w.audit.history()
                  if r["kind"] in ("alert", "action", "watch", "incident", "repeat") for k in records.parse(r).extra}
    assert undeclared == set(), "declare these fields in slurm_hooks/observe/records.py"
    kinds = {(r["kind"], r.get("action")) for r in w.audit.read()}
    assert {("action", "repair-reset"), ("action", "repair-replace"), ("incident", None)} <= kinds


def test_our_reboot_under_way_is_not_a_persons_resume(tmp_path):
    """While our reboot is issued Slurm may show the node neither drained nor DOWN; the check that
    runs then must not close the incident as resumed by a person."""
    from fakes.config import repair_config

    cfg = repair_config(tmp_path)
    slurm, w = sim_node(cfg, "IDLE")
    sim.inject(cfg.gpu.sim_dir, "n1", 0, xid=79, cleared_by="never")
    healthcheck.run(w, follow="none", repair="inline")
    assert len(slurm.called("reboot")) == 1
    slurm.set_node("n1", state="IDLE+REBOOT_ISSUED")  # the reboot under way: no DRAIN flag shown
    healthcheck.run(w, follow="none", repair="inline")
    assert not [r for r in w.audit.read() if r["kind"] == "incident" or r.get("action") == "ack-xids"]
    assert os.path.exists(w.drained_marker())  # still our drain
    [inc] = incidents.build(w.audit.history())
    assert inc.open


def test_checks_of_a_node_still_drained_for_the_same_fault_leave_the_drain_record_as_written(node):
    """The drain record (its time: what a resume compares a verdict's snapshot with) is written when
    we drain, not again by every later check that finds the same fault: no write, no fsync, per run."""
    slurm, w, sim_dir = node
    sim.inject(sim_dir, "n1", 0, xid=79)
    healthcheck.run(w, follow="none")
    path = w.drained_marker()
    first = os.stat(path).st_mtime_ns, open(path).read()
    for _ in range(3):
        healthcheck.run(replace(w, deadline=None), follow="none")
    assert (os.stat(path).st_mtime_ns, open(path).read()) == first
    sim.inject(sim_dir, "n1", 0, xid=79)  # the fault again: a new event, the record says it
    healthcheck.run(replace(w, deadline=None), follow="none")
    assert open(path).read() != first[1]
