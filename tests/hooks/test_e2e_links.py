"""InfiniBand/RoCE links end to end: the simulated ports, the health check, the watcher, Slurm.

First with the fake Slurm (the hooks' own decisions, a fake clock where rates need one), then on
the real testbed (``pytest -m slurm``): a port down on n1 drains it with the reason the issue
names within one check, and three good passes resume it.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time

import pytest
from conftest import wait_for
from fakes.config import sim_config
from fakes.slurm import FakeSlurm

from slurm_hooks.hooks import healthcheck
from slurm_hooks.hooks.watch import Watcher
from slurm_hooks.observe.audit import AuditLog
from slurm_hooks.probes import sim
from slurm_hooks.remedy.wiring import Wiring

DOWN_REASON = "slurm-hooks: IB mlx5_0 port 1 down [drain]"


def node(tmp_path, extra: str = "", ports: int = 8):
    cfg = sim_config(tmp_path, "[expect]\ngpus = 8\nib_ports = 8\nib_rate_gbps = 400\n" + extra)
    slurm = FakeSlurm()
    slurm.add_node("n1", "IDLE")
    sim.init(cfg.gpu.sim_dir, "n1")
    sim.init_ib(cfg.gpu.sim_dir, "n1", ports)
    return Wiring(cfg, "n1", AuditLog(cfg.log.audit), slurm_override=slurm), slurm


def check(w: Wiring):
    return healthcheck.run(Wiring(w.config, w.node, w.audit, slurm_override=w.slurm_override), follow="none",
                           repair="inline")


def test_healthy_node_with_eight_ports_stays_up(tmp_path):
    w, slurm = node(tmp_path)
    report, outcome = check(w)
    assert report.healthy and not outcome.drained
    assert {"links", "link-errors", "link-flaps"} <= set(report.checks_run)


def test_port_down_drains_within_one_check_and_one_good_pass_resumes_by_default(tmp_path):
    w, slurm = node(tmp_path)
    sim.inject_ib(w.config.gpu.sim_dir, "n1", "mlx5_0:1", state="down")
    _, outcome = check(w)
    assert outcome.drained and slurm.peek("n1").reason == DOWN_REASON
    sim.inject_ib(w.config.gpu.sim_dir, "n1", "mlx5_0:1", state="up")
    _, outcome = check(w)
    assert outcome.resumed and not slurm.peek("n1").drained


def test_with_resume_after_3_the_node_comes_back_on_the_third_good_pass(tmp_path, monkeypatch):
    real, later = time.time, [0.0]
    monkeypatch.setattr(time, "time", lambda: real() + later[0])  # the wall clock, moved on by the test
    w, slurm = node(tmp_path, '[hysteresis]\nconfirm = "2/3"\nresume_after = 3\n')
    sim.inject_ib(w.config.gpu.sim_dir, "n1", "mlx5_0:1", state="down")
    _, outcome = check(w)
    assert outcome.drained and slurm.peek("n1").reason == DOWN_REASON  # a state acts at once
    sim.inject_ib(w.config.gpu.sim_dir, "n1", "mlx5_0:1", state="up")
    resumed = []
    for _ in range(3):
        later[0] += 1.1  # runs 1 s apart are one run to the hysteresis (a re-judge)
        report, outcome = check(w)
        resumed.append(outcome.resumed)
    assert resumed == [False, False, True]
    assert not slurm.peek("n1").drained


def test_port_down_requeues_the_multi_node_job_and_leaves_the_single_node_job(tmp_path):
    """A link is no GPU: the jobs that span nodes use it, a job on this node alone does not."""
    w, slurm = node(tmp_path)
    slurm.add_node("n2", "MIXED")
    slurm.set_node("n1", state="MIXED")
    slurm.add_job(7, "n1", name="cpu-only")
    slurm.add_job(8, "n[1-2]", name="allreduce")
    sim.inject_ib(w.config.gpu.sim_dir, "n1", "mlx5_0:1", state="down")
    _, outcome = check(w)
    assert outcome.drained and slurm.peek("n1").reason == DOWN_REASON
    assert slurm.called("requeue") == [("requeue", 8)]
    [spared] = [r for r in AuditLog(w.config.log.audit).read() if r.get("result") == "spared"]
    assert spared["jobs"] == ["7"] and spared["detail"] == "runs on this node alone: the network fault does not touch it"


def test_a_site_that_says_node_scope_requeues_every_job(tmp_path):
    w, slurm = node(tmp_path, '[severity.check.ib-down]\nscope = "node"\n')
    slurm.set_node("n1", state="MIXED")
    slurm.add_job(7, "n1")
    sim.inject_ib(w.config.gpu.sim_dir, "n1", "mlx5_0:1", state="down")
    check(w)
    assert slurm.called("requeue") == [("requeue", 7)]


def test_slow_port_drains_at_job_end(tmp_path):
    w, slurm = node(tmp_path)
    sim.inject_ib(w.config.gpu.sim_dir, "n1", "mlx5_3:1", rate_gbps=200)
    _, outcome = check(w)
    assert slurm.peek("n1").reason == "slurm-hooks: IB mlx5_3 port 1 at 200 Gb/s [drain, at job end]"


def test_an_overheating_cable_module_drains_at_job_end_and_stays_for_the_hour(tmp_path):
    w, slurm = node(tmp_path)
    sim.inject_ib(w.config.gpu.sim_dir, "n1", "mlx5_5:1", event="module-temperature")
    _, outcome = check(w)
    assert outcome.drained
    assert slurm.peek("n1").reason == "slurm-hooks: IB mlx5_5 cable module overheating [drain, at job end]"
    report, _ = check(w)  # the line is still in the kernel log, and still within its hour
    assert [f.rule for f in report.drain_findings()] == ["ib-module-temperature"]


def memory(w: Wiring) -> dict:
    with open(os.path.join(w.config.state.dir, "ib-n1.json")) as fh:
        return json.load(fh)


def age_memory(w: Wiring, seconds: float) -> None:
    """The kept readings as if taken ``seconds`` earlier (the fake clock of a rate over real time)."""
    data = memory(w)
    data["at"] -= seconds
    for port in data["ports"].values():
        port["readings"] = [[t - seconds, totals] for t, totals in port["readings"]]
    with open(os.path.join(w.config.state.dir, "ib-n1.json"), "w") as fh:
        json.dump(data, fh)


def test_counter_rates_survive_a_restart_and_a_reboot_starts_them_afresh(tmp_path):
    w, slurm = node(tmp_path)
    check(w)  # the baseline
    age_memory(w, 3600.0)
    sim.inject_ib(w.config.gpu.sim_dir, "n1", "mlx5_2:1", counter=("symbol_error", 2000))
    report, outcome = check(w)  # a new process: the memory on disk is the only link to the last run
    assert slurm.peek("n1").reason == "slurm-hooks: IB mlx5_2 port 1 symbol errors [drain, at job end]"
    [f] = report.drain_findings()
    assert "2,000 symbol errors in 1 h (2,000/h; 1,440/h, a BER of 1e-12 at 400 Gb/s)" in f.message
    before = memory(w)["boot"]
    sim.reboot(w.config.gpu.sim_dir, "n1")
    report, _ = check(w)
    assert memory(w)["boot"] != before
    assert not [f for f in report.findings if f.check == "link-errors"]  # no rate across a reboot


def test_the_watcher_sees_a_port_down_in_seconds(tmp_path):
    w, slurm = node(tmp_path)
    stop = threading.Event()
    watcher = Watcher(w, Quiet(), log=lambda m: None)
    thread = threading.Thread(target=watcher.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_for(watcher.polling_links.is_set, 20.0, "the port poller's first reading: every port up")
        sim.inject_ib(w.config.gpu.sim_dir, "n1", "mlx5_0:1", state="down")
        wait_for(lambda: slurm.peek("n1").drained, 20.0, "n1 drained by the watcher's port poll")
        assert slurm.peek("n1").reason == DOWN_REASON
        [rec] = wait_for(lambda: [r for r in AuditLog(w.config.log.audit).read()
                                  if r.get("kind") == "watch" and r.get("links")], 20.0, "the watcher's record")
        assert rec["links"] == ["mlx5_0:1"] and rec["drained"]
    finally:
        stop.set()
        thread.join(30)


# --- the real testbed ----------------------------------------------------------------------------


def run_healthcheck(tb, name: str) -> subprocess.CompletedProcess:
    """The HealthCheckProgram exactly as slurmd runs it: the wrapper, no PATH, SLURMD_NODENAME only."""
    return subprocess.run([os.path.join(tb.state_dir, "bin", "healthcheck")], env={"SLURMD_NODENAME": name},
                          capture_output=True, text=True, timeout=60)


SLEEPER = "#!/bin/sh\nwhile true; do sleep 0.2; done\n"


@pytest.mark.slurm
def test_testbed_port_down_on_n1_drains_it_in_one_check_requeues_its_multi_node_job_and_three_passes_resume(
        hooked_testbed):
    tb = hooked_testbed
    with open(tb.config_path) as fh:
        original = fh.read()
    try:
        with open(tb.config_path, "a") as fh:
            fh.write('\n[hysteresis]\nconfirm = "2/3"\nresume_after = 3\n')
        sim.init_ib(tb.sim_dir, "n1", 8)
        sim.init_ib(tb.sim_dir, "n2", 8)
        wide = tb.sbatch(SLEEPER, "--nodes=2", "--ntasks-per-node=1", "--requeue")
        alone = tb.sbatch(SLEEPER, "--nodes=1", "--nodelist=n1", "--requeue")
        tb.wait_job(wide, ("RUNNING",), timeout=30)
        tb.wait_job(alone, ("RUNNING",), timeout=30)
        assert run_healthcheck(tb, "n1").returncode == 0
        assert not tb.slurm.node("n1").drained
        sim.inject_ib(tb.sim_dir, "n1", "mlx5_0:1", state="down")
        run_healthcheck(tb, "n1")
        info = tb.slurm.node("n1")
        assert info.drained and info.reason == DOWN_REASON
        wait_for(lambda: tb.slurm.job(wide).restarts == 1, 30.0, f"multi-node job {wide} requeued")
        single = tb.slurm.job(alone)
        assert (single.base_state, single.nodes, single.restarts) == ("RUNNING", "n1", 0), single
        sim.inject_ib(tb.sim_dir, "n1", "mlx5_0:1", state="up")
        still = []
        while not still or still[-1] and len(still) < 6:
            time.sleep(1.1)  # checks 1 s apart are one reading to the hysteresis
            run_healthcheck(tb, "n1")
            still.append(tb.slurm.node("n1").drained)
        # Three good readings resume it. slurmd's own HealthCheckProgram (every 30 s) is a reader too: a
        # pass of it between two of ours is one more reading (resumed after our 2nd), and one within 1 s
        # of ours is the same reading judged twice (resumed after our 4th); one good reading never resumes.
        assert still[0] is True and still[-1] is False and 2 <= len(still) <= 4, still
    finally:
        with open(tb.config_path, "w") as fh:
            fh.write(original)
        sim.init(tb.sim_dir, "n1", tb.settings.gpus)
        sim.init(tb.sim_dir, "n2", tb.settings.gpus)


# --- the watcher's port poller: never dies, never cut short ---------------------------------------


class Quiet:
    def backlog(self):
        return []

    def follow(self, stop, on_event):
        stop.wait()


class CountingStop(threading.Event):
    """A stop event that counts the poller's waits (its rounds)."""

    def __init__(self):
        super().__init__()
        self.waits = 0

    def wait(self, timeout=None):
        self.waits += 1
        return super().wait(timeout)


def test_the_port_poller_outlives_a_failure_at_its_first_reading_and_says_it_once(tmp_path):
    w, _ = node(tmp_path, '[links]\nsysfs_root = "/nowhere\\u0000"\n')
    said: list[str] = []
    watcher = Watcher(w, Quiet(), log=said.append)
    stop = CountingStop()
    thread = threading.Thread(target=watcher._link_loop, args=(stop, 0.01), daemon=True)
    thread.start()
    try:
        wait_for(lambda: stop.waits >= 20, 20.0, "twenty rounds of the port poller")
        assert thread.is_alive()
        failed = [m for m in said if "polling the IB ports failed" in m]
        assert len(failed) == 1, said  # said once, not every round
        # Python's words differ (3.13: "listdir: embedded null character in path")
        assert failed[0].startswith("slurm-hooks watch: polling the IB ports failed: ValueError: ") and "null" in failed[0]
    finally:
        stop.set()
        thread.join(10)


class SlowDrain(FakeSlurm):
    """A slurmctld that answers the drain only after the watcher was told to stop, and slowly."""

    def __init__(self, stop: threading.Event):
        super().__init__()
        self.stop, self.entered = stop, threading.Event()

    def drain(self, name, reason, *, current=None):
        self.entered.set()
        self.stop.wait(30)
        time.sleep(0.5)
        super().drain(name, reason, current=current)


def test_a_stopping_watcher_lets_the_check_of_a_port_down_finish_with_its_audit_line(tmp_path):
    cfg = sim_config(tmp_path, "[expect]\ngpus = 8\nib_ports = 8\n")
    sim.init(cfg.gpu.sim_dir, "n1")
    sim.init_ib(cfg.gpu.sim_dir, "n1", 8)
    stop = threading.Event()
    slurm = SlowDrain(stop)
    slurm.add_node("n1", "IDLE")
    w = Wiring(cfg, "n1", AuditLog(cfg.log.audit), slurm_override=slurm)
    watcher = Watcher(w, Quiet(), log=lambda m: None)
    thread = threading.Thread(target=watcher.run, args=(stop,), daemon=True)
    thread.start()
    wait_for(watcher.polling_links.is_set, 20.0, "the port poller's first reading")
    sim.inject_ib(cfg.gpu.sim_dir, "n1", "mlx5_0:1", state="down")
    wait_for(slurm.entered.is_set, 20.0, "the poller's check asking for the drain")
    stop.set()  # systemd stops the watcher while the drain is under way
    thread.join(60)
    assert not thread.is_alive()
    assert slurm.peek("n1").reason == DOWN_REASON
    assert [r["links"] for r in AuditLog(cfg.log.audit).read() if r.get("kind") == "watch" and r.get("links")] == \
        [["mlx5_0:1"]]


def test_the_poller_takes_a_port_gone_as_down_and_an_unreadable_state_as_no_news():
    from slurm_hooks.hooks.watch import _went_down

    up = "ACTIVE/LinkUp"
    last = {"mlx5_0:1": up, "mlx5_1:1": up, "mlx5_2:1": up, "mlx5_3:1": "DOWN/Polling"}
    now = {"mlx5_1:1": "/", "mlx5_2:1": "DOWN/Polling", "mlx5_3:1": "DOWN/Polling"}
    assert _went_down(last, now) == ["mlx5_0:1", "mlx5_2:1"]
