"""Monitor-only (``[check] drain = false``) holds for every hook: the health check, the watcher,
the prolog, the epilog and the repair ladder find, audit and tell, and call no Slurm command.

Simulated GPUs and the shared in-memory Slurm (tests/fakes/slurm.py), which records every call.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from fakes.config import notify_settings, sim_config, sim_node

from slurm_hooks.hooks import healthcheck, jobhooks
from slurm_hooks.hooks.watch import Watcher
from slurm_hooks.probes import sim

REASON = "slurm-hooks: XID 79 on GPU 3 [reboot]"


@pytest.fixture
def t(tmp_path):
    cfg = sim_config(tmp_path, "[expect]\ngpus = 8\n[check]\ndrain = false\n[repair]\nenabled = true\n")
    slurm, w = sim_node(cfg, "MIXED", 41)
    return SimpleNamespace(w=w, cfg=cfg, slurm=slurm, sim_dir=cfg.gpu.sim_dir, audit=w.audit)


def audited(t):
    recs = list(t.audit.read())
    alerts = [r for r in recs if r["kind"] == "alert"]
    steps = [(r["action"], r["result"], r.get("reason")) for r in recs if r["kind"] == "action"]
    return alerts, steps


def test_prolog_with_xid79_on_the_jobs_gpu_lets_the_job_run_and_drains_nothing(t, capsys):
    sim.inject(t.sim_dir, "n1", 3, xid=79)
    assert jobhooks.prolog(t.w, {"SLURM_JOB_ID": "42", "SLURM_JOB_GPUS": "3"}) == 0
    assert t.slurm.calls == []
    alerts, steps = audited(t)
    assert [(a["check"], a["gpu"], a["job"], a["monitor_only"]) for a in alerts] == [("xid", 3, "42", True)]
    assert steps == [("drain", "monitor-only", REASON)]
    assert "not refusing the job: monitor-only ([check] drain = false)" in capsys.readouterr().err


def test_epilog_with_leftovers_exits_0_and_drains_nothing(t):
    env = {"SLURM_JOB_ID": "43", "SLURM_JOB_GPUS": "1"}
    assert jobhooks.prolog(t.w, env) == 0
    sim.inject(t.sim_dir, "n1", 1, process=4242)
    assert jobhooks.epilog(t.w, env) == 0
    assert t.slurm.calls == []
    _, steps = audited(t)
    assert [s[:2] for s in steps] == [("drain", "monitor-only")]


def test_health_check_and_the_repair_ladder_act_on_nothing(t):
    sim.inject(t.sim_dir, "n1", 3, xid=79)
    report, outcome = healthcheck.run(t.w, follow="none")
    assert not report.healthy and outcome.monitor_only and not outcome.drained and outcome.repairs == []
    assert t.slurm.calls == []
    assert audited(t)[1] == [("drain", "monitor-only", REASON)]


def test_the_metrics_count_what_was_not_acted_on(tmp_path):
    cfg = sim_config(tmp_path, f'[check]\ndrain = false\n[metrics]\ntextfile_dir = "{tmp_path}/prom"\n')
    slurm, w = sim_node(cfg, "IDLE")
    sim.inject(cfg.gpu.sim_dir, "n1", 3, xid=79)
    healthcheck.run(w, follow="none")
    prom = (tmp_path / "prom" / "slurm_hooks.prom").read_text()
    assert 'slurm_hooks_remediations_total{node="n1",action="drain-monitor-only"} 1' in prom
    assert 'action="drain"}' not in prom and slurm.calls == []


def test_the_watcher_acts_on_nothing(t):
    sim.inject(t.sim_dir, "n1", 3, xid=79)
    [event] = [e for g in sim.SimProbe(t.sim_dir, "n1").snapshot().gpus for e in g.xids]
    Watcher(t.w, source=None, log=lambda m: None).handle(event)
    assert t.slurm.calls == []
    alerts, steps = audited(t)
    assert alerts and all(a["monitor_only"] for a in alerts)
    assert steps == [("drain", "monitor-only", REASON)]


def test_notifications_tell_a_monitor_only_finding_once_marked_not_acted_on(t):
    """The health check runs every few minutes on a node with XID 79, monitor-only: the receiver
    (syslog here) gets one message, saying it was not acted on; the node stays in service."""
    from slurm_hooks.observe.notify import Notifier

    sim.inject(t.sim_dir, "n1", 3, xid=79)
    for _ in range(3):
        healthcheck.run(t.w, follow="none")
    lines = []
    settings = notify_settings(audit=t.cfg.log.audit, dir=t.cfg.state.dir + "/notify", syslog=True, settle=0.0)
    notifier = Notifier(settings, syslog=lambda priority, text: lines.append(text), log=lambda m: None)
    notifier.flush(5)
    healthcheck.run(t.w, follow="none")
    notifier.flush(5)
    assert lines == [f"n1: XID 79 on GPU 3 [reboot] (seen by check); not acted on: monitor-only ([check] drain = "
                     f"false), the node stays in service. It would have been drained: \"{REASON}\"."]
    assert t.slurm.calls == []


@pytest.mark.parametrize(("text", "expected"), [
    ("[check]\ndrain = false\n[repair]\nenabled = true\n", (False, False, False, True)),
    ("[check]\ndrain = true\n[repair]\nenabled = true\n", (True, True, True, False)),
    ("[check]\ndrain = true\n[repair]\nenabled = false\n[remediation]\nrequeue = false\n", (True, False, False, False)),
])
def test_one_policy_says_what_the_node_side_may_do(tmp_path, text, expected):
    from slurm_hooks.remedy.wiring import ActionPolicy

    policy = ActionPolicy.of(sim_config(tmp_path, text))
    assert (policy.may_drain, policy.may_requeue, policy.may_repair, policy.monitor_only) == expected
