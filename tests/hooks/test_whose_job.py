"""Whose job a fault took: its id, owner and name in the requeue record and in every message, the
name bounded and unable to forge a line. Simulated GPUs and the shared fake Slurm."""

from __future__ import annotations

import time

from fakes.config import sim_config, sim_node

from slurm_hooks.hooks import healthcheck
from slurm_hooks.observe import incidents, notify
from slurm_hooks.observe.destinations import OPENED
from slurm_hooks.probes import sim


def test_an_xid_under_a_job_names_its_owner_and_name_in_the_record_and_the_page(tmp_path):
    cfg = sim_config(tmp_path, "[expect]\ngpus = 8\n")
    slurm, w = sim_node(cfg, "MIXED")
    name = "train\nn9 back in service" + "x" * 100  # an owner's text: not a line of ours, not unbounded
    slurm.add_job(4242, "n1", user="alice", name=name)
    sim.inject(cfg.gpu.sim_dir, "n1", 0, xid=79)
    _, outcome = healthcheck.run(w, follow="none")
    assert outcome.requeued == ["4242"]
    [rec] = [r for r in w.audit.read() if r.get("action") == "requeue" and r.get("result") == "ok"]
    assert rec["users"] == {"4242": "alice"} and rec["names"]["4242"].startswith("train?n9 back in service")
    assert len(rec["names"]["4242"]) == 40 and "\n" not in rec["names"]["4242"]
    [inc] = incidents.build(w.audit.read())
    [job] = incidents.summary(inc)["jobs"]
    assert (job["job_id"], job["user"], job["how"]) == ("4242", "alice", "requeued")
    text = notify.compose(inc, OPENED, time.time()).text
    assert "requeued: job 4242 (alice, train?n9 back in service" in text and "\n" not in text
    assert "jobs requeued: 1" not in text
