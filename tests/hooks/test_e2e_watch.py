"""The XID watcher on the real testbed: an injected XID drains the node within 2 s."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from slurm_hooks.probes import sim

pytestmark = pytest.mark.slurm


@pytest.fixture
def watcher(hooked_testbed):
    tb = hooked_testbed
    proc = subprocess.Popen([sys.executable, "-m", "slurm_hooks", "watch", "--node", "n1"], env=tb.env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 10
    while not any(r.get("message") == "watcher started" for r in tb.audit_events()):
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline, "watcher did not start"
        time.sleep(0.05)
    yield tb, proc
    proc.terminate()
    proc.wait(10)


def test_watcher_drains_within_2s_of_an_injected_xid79(watcher):
    tb, _ = watcher
    sim.inject(tb.sim_dir, "n1", 6, xid=79)
    injected = time.monotonic()
    node = tb.wait_node("n1", lambda n: n.drained and n.reason.startswith("slurm-hooks:"), timeout=5, interval=0.02)
    took = time.monotonic() - injected
    assert node.reason == "slurm-hooks: XID 79 on GPU 6 [reboot]"
    assert took < 2.0, took


def test_watcher_ignores_an_application_xid_and_acts_once_per_event_across_restarts(watcher, hooked_testbed):
    tb, proc = watcher
    sim.inject(tb.sim_dir, "n1", 1, xid=13)  # graphics engine exception: the user's bug, not the node's
    time.sleep(1.5)
    assert not tb.slurm.node("n1").drained
    sim.inject(tb.sim_dir, "n1", 2, xid=48)
    tb.wait_node("n1", lambda n: n.drained, timeout=5, interval=0.02)
    deadline = time.monotonic() + 5
    while not (acted := [r for r in tb.audit_events() if r.get("kind") == "watch" and r.get("xid") is not None]):
        assert time.monotonic() < deadline, "the watcher drained but wrote no watch record"
        time.sleep(0.05)
    assert [r["xid"] for r in acted] == [48]
    # An admin mends the node by hand; a restarted watcher must not act on the old event again.
    proc.terminate()
    proc.wait(10)
    tb.scontrol("update", "NodeName=n1", "State=RESUME")
    again = subprocess.Popen([sys.executable, "-m", "slurm_hooks", "watch", "--node", "n1"], env=tb.env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(2.0)
        assert not tb.slurm.node("n1").drained
        acted = [r for r in tb.audit_events() if r.get("kind") == "watch" and r.get("xid") is not None]
        assert [r["xid"] for r in acted] == [48]
    finally:
        again.terminate()
        again.wait(10)
