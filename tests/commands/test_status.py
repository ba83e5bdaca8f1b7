"""``slurm-hooks status``: the fleet from Slurm's view plus the local lifecycle, who acts next."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from fakes.config import repair_config, sim_node
from fakes.slurm import FakeSlurm

from slurm_hooks.commands import status
from slurm_hooks.hooks import healthcheck
from slurm_hooks.observe import incidents
from slurm_hooks.probes import sim
from slurm_hooks.remedy import repair


def test_status_names_who_acts_next_for_each_node_we_hold_and_skips_the_rest():
    slurm = FakeSlurm()
    slurm.add_node("n1", "IDLE+DRAIN", "slurm-hooks: XID 79 on GPU 6 [replace]")
    slurm.add_node("n2", "IDLE+DRAIN", "slurm-hooks: DCGM diag L2 failed on GPU 5 [reset]")
    slurm.add_node("n3", "IDLE+DRAIN", "disk replaced by bob")
    slurm.add_node("n4", "IDLE")
    slurm.add_node("n5", "DOWN", "slurm-hooks: GPU lost [reboot 1/1] : reboot issued : reboot complete")
    slurm.add_node("n6", "MIXED+DRAIN", "slurm-hooks: row remap pending on GPU 3 [reset, at job end]",
                   extra="slurm-hooks-bridge: waiting for the node's jobs")
    rma = [{"node": "n1", "gpu": 6, "uuid": "GPU-8f2c", "serial": "1650923012345"}]
    table = status.rows(slurm.nodes(), {}, rma, time.time())
    assert [(r["node"], r["tag"], r["next"]) for r in table] == [
        ("n1", "[replace]", "a person"), ("n2", "[reset]", "a person"), ("n5", "[reboot 1/1]", "slurm-hooks"),
        ("n6", "[reset, at job end]", "its jobs")]
    assert table[0]["todo"].startswith("replace GPU 6 (GPU-8f2c, serial 1650923012345)")
    assert "periodic check does not run" in table[1]["why"] and "State=RESUME" in table[1]["todo"]
    lines = status.render(table)
    assert lines[-1].endswith("[Extra: slurm-hooks-bridge: waiting for the node's jobs]")
    assert lines[0].startswith("n1  [replace]") and "a person: replace GPU 6 (GPU-8f2c, serial 1650923012345)" in lines[0]


def test_xid79_never_cleared_climbs_to_replace_named_by_serial_waits_for_a_person_then_closes_once_on_new_hardware(
        tmp_path):
    cfg = repair_config(tmp_path)
    slurm, w = sim_node(cfg, "IDLE")
    sim.set_diag_seconds(cfg.gpu.sim_dir, "n1", 0.0)
    gpu = sim.gpu_entry(sim.read(cfg.gpu.sim_dir, "n1"), 0)
    sim.inject(cfg.gpu.sim_dir, "n1", 0, xid=79, cleared_by="never")
    healthcheck.run(w, follow="none", repair="inline")
    sim.reboot(cfg.gpu.sim_dir, "n1")
    slurm.set_node("n1", state="DOWN", reason="slurm-hooks: XID 79 on GPU 0 [reboot 1/1] : reboot issued : reboot complete")
    healthcheck.run(w, follow="none", repair="inline")
    assert slurm.peek("n1").reason == "slurm-hooks: XID 79 on GPU 0 [replace]"

    # The records: a [reboot] then a [replace] escalation naming GPU, UUID and serial.
    [inc] = incidents.build(w.audit.history())
    assert inc.action == "replace" and [a for _, a in inc.escalations][-1] == "replace"
    assert inc.rma and inc.rma[0]["serial"] == gpu["serial"] and inc.rma[0]["uuid"] == gpu["uuid"]
    assert inc.waits_for_person and gpu["serial"] in inc.todo
    # Evidence kept before the reboot and before the [replace], named by the RMA entry.
    entries = repair.read_rma(os.path.join(cfg.state.dir, "rma.json"))
    assert entries[0]["serial"] == gpu["serial"] and os.path.isdir(entries[0]["evidence"])
    assert os.path.exists(os.path.join(entries[0]["evidence"], "snapshot.json"))
    assert entries[0]["evidence"] in inc.evidence

    table = status.rows(slurm.nodes(), {inc.node: inc}, entries, time.time())
    assert [(r["node"], r["tag"], r["next"]) for r in table] == [("n1", "[replace]", "a person")]
    assert f"serial {gpu['serial']}" in table[0]["todo"]

    # New hardware: validated, resumed, the incident closed once; the RMA entry stays.
    for _ in range(3):
        healthcheck.run(w, follow="none", repair="inline")  # waiting: nothing changes, nothing written twice
    sim.replace(cfg.gpu.sim_dir, "n1", 0)
    for _ in range(3):
        healthcheck.run(w, follow="none", repair="inline")
    assert slurm.peek("n1").state == "IDLE"
    built = incidents.build(w.audit.history())
    assert len(built) == 1 and not built[0].open and built[0].closed_by == "new hardware"
    assert [r for r in w.audit.read() if r.get("action") == "resume" and r.get("result") == "ok"].__len__() == 1
    assert [e["serial"] for e in repair.read_rma(os.path.join(cfg.state.dir, "rma.json"))] == [gpu["serial"]]
    assert status.rows(slurm.nodes(), {}, entries, time.time()) == []


def test_a_sweep_drained_node_says_it_waits_for_a_person_and_why_without_repeating_itself(tmp_path):
    from fakes.config import sim_config

    from slurm_hooks.remedy.ownership import DrainMarker

    cfg = sim_config(tmp_path, "[expect]\ngpus = 8\n")
    slurm, w = sim_node(cfg, "IDLE")
    reason = "slurm-hooks: DCGM diag L2 failed on GPU 5 [reset]"
    slurm.drain("n1", reason)  # the sweep's drain: a check the periodic run does not do
    DrainMarker(reason=reason, ts=time.time() - 60, checks=("dcgm",)).seen(slurm.peek("n1")).save(w.drained_marker())
    for _ in range(30):
        healthcheck.run(w, follow="none")
    assert slurm.peek("n1").drained  # not ours to resume: the check cannot judge DCGM again
    skipped = [r for r in w.audit.read() if r.get("action") == "resume" and r.get("result") == "skipped"]
    assert len(skipped) == 1  # once, then counted: the log does not grow every check
    lines = status.held_lines(w)
    assert len(lines) == 1 and lines[0].startswith("held by slurm-hooks: n1  [reset]")
    assert "a person:" in lines[0] and "State=RESUME" in lines[0]


#: ``scontrol`` as 22.05 answers ``-o show nodes``: n1 left for a person ([replace]) since 2024, n2
#: since a minute ago, n3 ours but with slurm-hooks to act next (a reboot under way), n4 in service.
SCONTROL = """#!/bin/sh
now=$(date -d '-1 minute' +%Y-%m-%dT%H:%M:%S)
case "$*" in
  --version) echo "slurm 22.05.8" ;;
  "-o show nodes")
    echo "NodeName=n1 CPUTot=8 Gres=gpu:8 State=IDLE+DRAIN Partitions=gpu Reason=slurm-hooks: XID 79 on GPU 3 [replace] [root@2024-09-01T10:06:00]"
    echo "NodeName=n2 CPUTot=8 Gres=gpu:8 State=IDLE+DRAIN Partitions=gpu Reason=slurm-hooks: XID 79 on GPU 5 [replace] [root@$now]"
    echo "NodeName=n3 CPUTot=8 Gres=gpu:8 State=DOWN Partitions=gpu Reason=slurm-hooks: GPU lost [reboot 1/1] : reboot issued : reboot complete [root@2024-09-01T10:06:00]"
    echo "NodeName=n4 CPUTot=8 Gres=gpu:8 State=IDLE Partitions=gpu" ;;
  *) exit 1 ;;
esac
"""


@pytest.mark.parametrize("max_wait,exit_code,late", [("1d", 1, ["n1"]), ("30d", 1, ["n1"]), ("0", 0, [])])
def test_status_exits_1_only_when_a_node_waited_for_a_person_longer_than_max_wait(tmp_path, max_wait, exit_code,
                                                                                    late):
    """n3 waits longer than any limit too, but for slurm-hooks (its first check on the new boot), not a person."""
    from fakes.config import write_sim_config

    bin_dir = tmp_path / "slurm-bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(SCONTROL)
    (bin_dir / "scontrol").chmod(0o755)
    conf = write_sim_config(tmp_path, f'[slurm]\nbackend = "scontrol"\nbin_dir = "{bin_dir}"\n')
    env = {k: v for k, v in os.environ.items() if k != "SLURM_HOOKS_CONFIG"}
    r = subprocess.run([sys.executable, "-m", "slurm_hooks", "status", "--json", "--max-wait", max_wait,
                        "--config", str(conf)], capture_output=True, text=True, env=env, timeout=60)
    out = json.loads(r.stdout)
    assert [(n["node"], n["next"]) for n in out["nodes"]] == [("n1", "a person"), ("n2", "a person"),
                                                               ("n3", "slurm-hooks")]
    assert (r.returncode, out["waiting_for_a_person_too_long"]) == (exit_code, late), r.stderr


def test_a_node_whose_kernel_log_and_memory_cannot_be_read_is_shown_by_check_and_status(tmp_path, capsys):
    """Its verdict is "healthy" only as far as it could see: the kernel log unreadable (XIDs unseen)
    and the hysteresis memory unwritable. Both are warnings in the check's report, drain nothing,
    and status lists them for the node though it holds no drain, again after the second run."""
    from fakes import FakeNvml
    from fakes.config import sim_config

    from slurm_hooks.observe.audit import AuditLog
    from slurm_hooks.probes.nvml import NvmlProbe
    from slurm_hooks.remedy.wiring import Wiring

    cfg = sim_config(tmp_path, '[expect]\ngpus = 8\n[hysteresis]\nconfirm = "2/3"\n')
    os.makedirs(os.path.join(cfg.state.dir, "hysteresis-n1.json"))  # where the memory goes, as a torn disk leaves it
    log = tmp_path / "kmsg"
    log.mkdir()  # no record can be read from it
    slurm = FakeSlurm()
    slurm.add_node("n1", "IDLE")
    w = Wiring(cfg, "n1", AuditLog(cfg.log.audit), probe_override=NvmlProbe("n1", kmsg_path=str(log),
               nvml=FakeNvml.healthy(gpus=8)), slurm_override=slurm)
    for _ in range(2):
        report, _ = healthcheck.run(w, follow="none")
    assert sorted(f.rule for f in report.findings) == ["hysteresis-memory", "kernel-log"]
    assert not report.drain_findings() and slurm.peek("n1").state == "IDLE"
    spots = status.blind_spots(w.audit.history(), time.time())
    assert [(s["node"], s["rule"]) for s in spots] == [("n1", "hysteresis-memory"), ("n1", "kernel-log")]
    assert spots[1]["message"].startswith("kernel log unreadable: GPU driver events not seen")
    assert status.render_blind(spots, time.time())[0].startswith("n1: cannot remember readings: ")
    # An hour later, with nothing said since, it is no longer shown.
    assert status.blind_spots(w.audit.history(), time.time() + 2 * status.BLIND_RECENT_S) == []
