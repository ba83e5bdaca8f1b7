"""The incident lifecycle on the real testbed: XID 79 that no reboot mends climbs to [replace], the
records, the report and ``slurm-hooks status`` name the GPU by serial and say a person must act; new
hardware closes the incident once; a person's resume closes it as theirs.

A cluster of its own (one module), with conftest's REPAIR_SETTINGS, as test_e2e_repair.py drives it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from conftest import REPAIR_SETTINGS, audit_records, module_testbed, wait_for

from slurm_hooks import report
from slurm_hooks.commands import status
from slurm_hooks.observe import incidents
from slurm_hooks.probes import sim
from slurm_hooks.remedy.repair import read_rma

pytestmark = pytest.mark.slurm

bed, tb = module_testbed("lifecyclebed", REPAIR_SETTINGS)


def _incidents(tb, node="n1"):
    return [i for i in incidents.build(audit_records(tb.audit_log)) if i.node == node]


def _rung(tb, action, result):
    return any(r.get("action") == action and r.get("result") == result for r in audit_records(tb.audit_log))


def test_xid79_never_cleared_pages_reboot_then_replace_by_serial_waits_for_a_person_and_closes_once(tb, tmp_path):
    sim.inject(tb.sim_dir, "n1", 0, xid=79, cleared_by="never")
    wait_for(lambda: _rung(tb, "repair-replace", "ok"), 120, "the ladder gives GPU 0 up ([replace])")
    gpu = sim.gpu_entry(sim.read(tb.sim_dir, "n1"), 0)
    opened = [i for i in _incidents(tb) if i.open]
    assert len(opened) == 1, [(r.get("kind"), r.get("action"), r.get("result")) for r in audit_records(tb.audit_log)]
    [inc] = opened
    assert [a for _, a in inc.escalations][-1] == "replace" and inc.action == "replace"
    assert inc.rma[0]["serial"] == gpu["serial"] and inc.rma[0]["uuid"] == gpu["uuid"]
    assert inc.waits_for_person and gpu["serial"] in inc.todo
    rma = read_rma(os.path.join(tb.hooks_state_dir, "rma.json"))
    rep = report.build(audit_records(tb.audit_log), time.time() - 3600, rma_list=rma)
    assert [c["serial"] for c in rep["rma_candidates"]] == [gpu["serial"]]
    table = status.rows(tb.slurm().nodes(), {inc.node: inc}, rma, time.time())
    assert [(r["node"], r["tag"], r["next"]) for r in table] == [("n1", "[replace]", "a person")]

    def status_cli():
        done = subprocess.run([sys.executable, "-m", "slurm_hooks", "status", "--json", "--max-wait", "1s",
                               "--textfile", str(tmp_path)], env=tb.env(), capture_output=True, text=True, timeout=60)
        assert done.returncode in (0, 1), done.stderr
        return done if done.returncode == 1 else None

    cli = wait_for(status_cli, 30, "status exits 1 once n1 waited for a person over --max-wait 1s", interval=0.5)
    assert json.loads(cli.stdout)["waiting_for_a_person_too_long"] == ["n1"]
    assert 'slurm_hooks_waiting_for_person{node="n1"} 1' in (tmp_path / "slurm_hooks_status.prom").read_text()

    sim.replace(tb.sim_dir, "n1", 0)
    tb.wait_node("n1", lambda n: n.state.upper() == "IDLE" and not n.drained, timeout=60)
    wait_for(lambda: not any(i.open for i in _incidents(tb)), 30, "the incident closed")
    closed = _incidents(tb)
    assert len(closed) == 1 and closed[0].closed_by == "new hardware"
    assert [e["serial"] for e in read_rma(os.path.join(tb.hooks_state_dir, "rma.json"))] == [gpu["serial"]]


def test_a_persons_resume_of_a_node_we_drained_closes_its_incident_as_theirs_with_its_duration(tb):
    sim.inject(tb.sim_dir, "n1", 3, row_remap_failure=True)  # no repair mends it: [replace] at once
    wait_for(lambda: _rung(tb, "repair-replace", "ok"), 60, "n1 drained [replace]")
    sim.clear(tb.sim_dir, "n1", 3)  # mended by hand
    tb.scontrol("update", "NodeName=n1", "State=RESUME")
    wait_for(lambda: any(not i.open for i in _incidents(tb)), 30, "the incident closed by the next health check")
    [inc] = _incidents(tb)
    assert inc.resolved_by == "a person" and inc.closed_by == "person" and inc.mttr is not None and inc.mttr > 0
    time.sleep(6)  # three more health checks: closed once
    assert len([r for r in audit_records(tb.audit_log) if r["kind"] == "incident"]) == 1
