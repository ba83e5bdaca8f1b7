"""A repeat offender on the real testbed (``pytest -m slurm``): a flaky link on n1 drained and resumed
by the health check as slurmd runs it, held at its fifth drain with Slurm keeping our held reason,
then resumed by a person with ``scontrol update State=RESUME``, which ends the hold (on Slurm
>= 23.11 without accounting the resumed node keeps our reason: it must still read as a person's resume).
"""

from __future__ import annotations

import os
import subprocess

import pytest

from slurm_hooks.probes import sim
from slurm_hooks.remedy import offenders

pytestmark = pytest.mark.slurm

HELD = "slurm-hooks: IB mlx5_0 port 1 down [held: 5 remediations in 7d]"


def run_healthcheck(tb, name: str) -> subprocess.CompletedProcess:
    """The HealthCheckProgram exactly as slurmd runs it: the wrapper, no PATH, SLURMD_NODENAME only."""
    return subprocess.run([os.path.join(tb.state_dir, "bin", "healthcheck")], env={"SLURMD_NODENAME": name},
                          capture_output=True, text=True, timeout=60)


def port(tb, state: str):
    sim.inject_ib(tb.sim_dir, "n1", "mlx5_0:1", state=state)
    run_healthcheck(tb, "n1")
    return tb.slurm.node("n1")


def test_testbed_flaky_link_is_held_at_its_fifth_drain_and_a_persons_resume_starts_the_count_afresh(
        hooked_testbed):
    tb = hooked_testbed
    log = offenders.Log(os.path.join(tb.hooks_state_dir, "remediations-n1.json"))
    sim.init_ib(tb.sim_dir, "n1", 8)
    sim.init_ib(tb.sim_dir, "n2", 8)
    try:
        for _ in range(4):
            assert port(tb, "down").drained
            assert not port(tb, "up").drained
        node = port(tb, "down")
        assert node.drained and node.reason == HELD, node
        for _ in range(2):
            node = port(tb, "up")
            assert node.drained and node.reason == HELD, node
        assert len(log.read()) == 5
        tb.scontrol("update", "NodeName=n1", "State=RESUME")
        run_healthcheck(tb, "n1")
        assert log.read() == []
        assert [r["result"] for r in tb.audit_events() if r.get("action") == "offender-release"] == ["ok"]
        node = port(tb, "down")
        assert node.drained and node.reason == "slurm-hooks: IB mlx5_0 port 1 down [drain]", node
    finally:
        sim.init(tb.sim_dir, "n1", tb.settings.gpus)
        sim.init(tb.sim_dir, "n2", tb.settings.gpus)
