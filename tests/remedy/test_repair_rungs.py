"""Each rung runs once and returns its result; climbing is the worker's (rungs never climb)."""

from __future__ import annotations

import pytest
from fakes.config import repair_config, sim_node

from slurm_hooks.errors import PermanentError
from slurm_hooks.hooks import healthcheck
from slurm_hooks.models import Context
from slurm_hooks.probes import sim
from slurm_hooks.probes.gpureset import SimReset
from slurm_hooks.remedy.outcome import Outcome
from slurm_hooks.remedy.repair import planner, rungs, store


@pytest.fixture
def node(tmp_path):
    cfg = repair_config(tmp_path)
    slurm, w = sim_node(cfg, "DRAIN")
    slurm.set_node("n1", reason="slurm-hooks: XID 79 on GPU 0 [reboot]")
    sim.set_diag_seconds(cfg.gpu.sim_dir, "n1", 0.0)
    return slurm, w, cfg.gpu.sim_dir


def test_a_refused_reboot_is_returned_counted_and_does_not_climb_to_replace(node):
    slurm, w, sim_dir = node
    slurm.fail("reboot", PermanentError("scontrol_reboot_nodes error: Unspecified error"))
    sim.inject(sim_dir, "n1", 0, xid=79)
    report = healthcheck.judge(w, Context.CHECK, acknowledge=False)
    ledger = store.Ledger(w)
    p = planner.plan(w, report, ledger.state)
    outcome = Outcome()
    assert p is not None and p.rung == "reboot"
    assert rungs.reboot(w, p, outcome, ledger, SimReset(sim_dir, "n1"), report) == "refused"
    assert [(a.rung, a.result) for a in store.load(w).attempts] == [("reboot", "refused")]
    assert outcome.repairs == ["reboot:refused"] and "[replace]" not in slurm.peek("n1").reason
    assert planner.plan(w, report, store.load(w)).rung == "replace"  # the worker's next step, not the rung's


def test_every_rung_says_on_which_results_the_worker_climbs_on_and_the_top_on_none():
    from slurm_hooks.remedy.repair import ladder

    assert set(rungs.CLIMBS_ON) == set(ladder.Rung)
    assert rungs.CLIMBS_ON[ladder.Rung.REPLACE] == frozenset()
