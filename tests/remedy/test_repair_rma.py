"""The RMA list: one entry per GPU (by UUID), carrying what the ladder tried on that GPU."""

from __future__ import annotations

from fakes.config import repair_config, sim_node

from slurm_hooks.errors import PermanentError
from slurm_hooks.hooks import healthcheck
from slurm_hooks.probes import sim
from slurm_hooks.remedy import repair


def test_a_gpu_replaced_twice_is_listed_once_with_its_own_history_and_not_its_neighbours(tmp_path):
    """GPU 3 is reset (and healthy again); then GPU 0 falls off the bus, Slurm refuses the reboot
    (no RebootProgram) and GPU 0 goes on the RMA list. A person resumes the node (a reseat, "no
    fault found") without clearing the mark, GPU 0 falls off the bus again and goes on the list
    again at once: the list holds GPU 0 once, the later entry, and its history names GPU 0's rungs,
    not GPU 3's reset."""
    cfg = repair_config(tmp_path)
    slurm, w = sim_node(cfg, "IDLE")
    sim_dir = cfg.gpu.sim_dir
    sim.set_diag_seconds(sim_dir, "n1", 0.0)
    sim.inject(sim_dir, "n1", 3, row_remap_pending=True)
    assert healthcheck.run(w, follow="none", repair="inline")[1].repairs == ["reset:ok"]
    slurm.fail("reboot", PermanentError("scontrol_reboot_nodes error: Unspecified error"))
    sim.inject(sim_dir, "n1", 0, xid=79, cleared_by="never")
    assert healthcheck.run(w, follow="none", repair="inline")[1].repairs == ["reboot:refused", "replace:ok"]
    (first,) = repair.read_rma(repair.rma_path(w))

    slurm.set_node("n1", state="IDLE", reason="")  # a person's resume
    sim.inject(sim_dir, "n1", 0, xid=79, cleared_by="never")
    assert healthcheck.run(w, follow="none", repair="inline")[1].repairs == ["replace:ok"]  # still marked

    uuid = sim.gpu_entry(sim.read(sim_dir, "n1"), 0)["uuid"]
    entries = repair.read_rma(repair.rma_path(w))
    assert [e["uuid"] for e in entries] == [first["uuid"]] == [uuid]
    entry = entries[0]
    assert entry["added"] > first["added"]
    assert [(a["rung"], a["result"]) for a in entry["history"]] == [("reboot", "refused"), ("replace", "ok"),
                                                                    ("replace", "ok")]
    assert all(a["gpus"] == [uuid] for a in entry["history"])
