"""A node we hold for replacement, taken over and resumed by a person: the GPU stays marked until new
hardware or ``slurm-hooks rma clear``, the resume is told as such, and ``status`` and the report say the
same thing. Simulated GPUs, the shared fake Slurm, the repair ladder run inline."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from fakes.config import repair_config, sim_node

from slurm_hooks import report
from slurm_hooks.commands import status
from slurm_hooks.commands.rma import rma
from slurm_hooks.hooks import healthcheck
from slurm_hooks.observe import incidents, notify
from slurm_hooks.observe.destinations import ESCALATED, REMINDER, RESOLVED
from slurm_hooks.probes import sim
from slurm_hooks.remedy import repair
from slurm_hooks.report import text


@pytest.fixture
def t(tmp_path):
    """n1 left [replace]: XID 48 on GPU 0 that neither a reset nor a reboot mends."""
    cfg = repair_config(tmp_path)
    slurm, w = sim_node(cfg, "IDLE")
    sim.set_diag_seconds(cfg.gpu.sim_dir, "n1", 0.0)
    sim.inject(cfg.gpu.sim_dir, "n1", 0, xid=48, cleared_by="never")
    healthcheck.run(w, follow="none", repair="inline")  # reset fails: a reboot through Slurm
    sim.reboot(cfg.gpu.sim_dir, "n1")
    slurm.set_node("n1", state="DOWN", reason=slurm.peek("n1").reason + " : reboot issued : reboot complete")
    _, outcome = healthcheck.run(w, follow="none", repair="inline")  # the XID is back on the new boot
    assert outcome.repairs == ["reboot:failed", "replace:ok"]
    gpu = sim.gpu_entry(sim.read(cfg.gpu.sim_dir, "n1"), 0)
    return SimpleNamespace(w=w, slurm=slurm, cfg=cfg, gpu=gpu, rma=os.path.join(cfg.state.dir, "rma.json"))


def check(t):
    return healthcheck.run(t.w, follow="none", repair="inline")[1]


def records(t, action, result=None):
    return [r for r in t.w.audit.read() if r.get("action") == action and (result is None or r.get("result") == result)]


def lines_for_a_person(t):
    """What ``status`` prints and what the report lists as waiting for a person, from one audit log."""
    recs = list(t.w.audit.read())
    fleet = incidents.fold(recs)
    now = time.time()
    table = status.rows(t.slurm.nodes(), {i.node: i for i in fleet.incidents if i.open}, repair.read_rma(t.rma), now,
                        fleet.for_a_person(now))
    rep = report.build(recs, now - 3600, now)
    return ({r["node"]: (r["next"], r["todo"]) for r in table if r["next"] == "a person"},
            {w["node"]: (w["who"], w["todo"]) for w in rep["waiting_for_a_person"]}, status.render(table),
            text.render(rep))


def test_a_persons_resume_of_a_node_held_for_replacement_keeps_the_gpu_marked_and_says_so(t):
    serial = t.gpu["serial"]
    t.slurm.drain("n1", "maint: admin checks cabling")  # theirs replaces our [replace]
    check(t)
    held, waiting, _, _ = lines_for_a_person(t)
    assert held == waiting and "n1" in held  # status does not drop what the report still lists

    t.slurm.resume("n1")
    check(t)
    # Not "back in service", not an acknowledgement alone: the page says the GPU is still marked.
    [inc] = [i for i in incidents.build(t.w.audit.read())]
    page = notify.compose(inc, RESOLVED, time.time()).text
    assert page.startswith("n1 returned to service by a person after ") and "back in service" not in page
    assert f"with GPU 0 ({t.gpu['uuid']}, serial {serial}) still marked for replacement" in page
    assert "Next: a person must replace GPU 0" in page and "slurm-hooks rma clear --node n1 --gpu 0" in page
    # The mark stays where the ladder and the RMA list keep it.
    assert repair.load(t.w).replaced is not None and repair.load(t.w).replaced.resumed > 0
    assert [e["serial"] for e in repair.read_rma(t.rma)] == [serial]
    assert records(t, "repair-replace", "ended") == []
    [told] = records(t, "repair-replace", "resumed")
    assert f"serial {serial}) still marked for replacement" in told["detail"]

    # The person's choice stands: no drain loop for the events their resume acknowledged, told once.
    for _ in range(3):
        assert not check(t).drained
    assert t.slurm.peek("n1").state == "IDLE" and len(records(t, "repair-replace", "resumed")) == 1

    held, waiting, status_lines, report_lines = lines_for_a_person(t)
    assert held == waiting == {"n1": ("a person", held["n1"][1])}
    assert f"serial {serial}) on n1 at its next maintenance" in held["n1"][1]
    assert any(line.startswith("n1") and "rma clear --node n1 --gpu 0" in line for line in status_lines)
    assert any("n1 [replace] in service" in line and "rma clear --node n1 --gpu 0" in line for line in report_lines)


def test_rma_clear_ends_the_mark_with_an_audit_record_and_status_and_report_drop_the_node(t):
    t.slurm.resume("n1")
    check(t)
    done = CliRunner().invoke(rma, ["clear", "--config", t.cfg.path, "--node", "n1", "--gpu", "0"],
                              env={"SUDO_USER": "alice"})
    assert done.exit_code == 0, done.output
    assert f"n1 GPU 0 ({t.gpu['uuid']}, serial {t.gpu['serial']}): no longer marked" in done.output
    [cleared] = records(t, "rma-clear", "ok")
    assert cleared["user"] == "alice" and cleared["gpu_ids"][0]["serial"] == t.gpu["serial"]
    assert repair.read_rma(t.rma) == [] and repair.load(t.w).replaced is None
    held, waiting, _, _ = lines_for_a_person(t)
    assert held == waiting == {}
    again = CliRunner().invoke(rma, ["clear", "--config", t.cfg.path, "--node", "n1", "--gpu", "0"],
                               standalone_mode=False)
    assert again.return_value == 1 and "not marked for replacement" in again.output


def test_new_hardware_in_a_node_a_person_returned_ends_the_mark(t):
    t.slurm.resume("n1")
    check(t)
    sim.replace(t.cfg.gpu.sim_dir, "n1", 0)
    check(t)
    [ended] = records(t, "repair-replace", "ended")
    assert "hardware was replaced" in ended["detail"] and repair.load(t.w).replaced is None
    assert incidents.fold(t.w.audit.read()).marked == {}


def test_the_replace_page_read_alone_says_who_acts_what_to_do_which_serial_and_where_the_evidence_is(t):
    [inc] = [i for i in incidents.build(t.w.audit.read()) if i.open]
    evidence = [r["evidence"] for r in records(t, "repair-replace", "ok")]
    assert evidence and os.path.isdir(evidence[0])
    for kind in (ESCALATED, REMINDER):
        page = notify.compose(inc, kind, time.time(), 1).text
        assert f"Next: a person must replace GPU 0 ({t.gpu['uuid']}, serial {t.gpu['serial']}) on n1 and send it " \
               "back for RMA; new hardware is validated and returns the node to service by itself" in page, page
        assert "Evidence: " in page and f"{evidence[0]} (on n1)" in page and "[reboot 1/1]" not in page
