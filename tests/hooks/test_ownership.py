"""Whose drain is it: what we recorded at the drain against what Slurm shows now.

The in-memory Slurm (tests/fakes/slurm.py) with ``keeps_reason`` behaves as Slurm 24.11
without accounting was seen to on Debian 13's testbed: RESUME leaves the reason and its
ReasonTime; every reason set gets a new ReasonTime. The real-Slurm versions of these
scenarios are in test_e2e_ownership.py.
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest
from fakes.config import sim_config, sim_node

from slurm_hooks.hooks import healthcheck
from slurm_hooks.probes import sim
from slurm_hooks.remedy import ownership
from slurm_hooks.remedy.ownership import DrainMarker, MarkerUnreadable

XID79 = "slurm-hooks: XID 79 on GPU 3 [reboot]"


@pytest.fixture
def t(tmp_path):
    cfg = sim_config(tmp_path, "[expect]\ngpus = 8")
    slurm, w = sim_node(cfg, "IDLE")
    slurm.keeps_reason = True
    return SimpleNamespace(w=w, cfg=cfg, slurm=slurm, sim_dir=cfg.gpu.sim_dir, audit=w.audit)


def check(t):
    return healthcheck.run(t.w, follow="none")


def drain_then_mend(t):
    """Our drain for XID 79 on GPU 3, the fault cleared (a reboot would), our resume."""
    sim.inject(t.sim_dir, "n1", 3, xid=79)
    _, out = check(t)
    assert out.drained and t.slurm.peek("n1").reason == XID79
    sim.reboot(t.sim_dir, "n1")  # XID gone with the boot
    _, out = check(t)
    assert out.resumed
    node = t.slurm.peek("n1")
    assert (node.state, node.reason) == ("IDLE", XID79)  # 24.11 kept our text on the resumed node
    return node


def resumes(t) -> int:
    return len(t.slurm.called("resume"))


# --- the marker ---------------------------------------------------------------------


def test_the_marker_keeps_the_exact_reason_and_slurm_s_reason_time_and_user(t):
    sim.inject(t.sim_dir, "n1", 3, xid=79)
    check(t)
    marker = ownership.load_marker(t.w)
    node = t.slurm.peek("n1")
    assert isinstance(marker, DrainMarker) and marker.reason == XID79
    assert (marker.reason_time, marker.reason_user) == (node.reason_time, node.reason_user) != ("", "")
    with pytest.raises(AttributeError):
        marker.reason = "x"  # frozen


@pytest.mark.parametrize("content", ["{not json", "[]", '{"ts": 1}', '{"reason": "x", "ts": "soon"}'])
def test_an_unreadable_marker_raises_and_is_not_taken_for_a_drain_of_ours(t, content):
    os.makedirs(os.path.dirname(t.w.drained_marker()), exist_ok=True)
    with open(t.w.drained_marker(), "w") as fh:
        fh.write(content)
    with pytest.raises(MarkerUnreadable) as err:
        ownership.load_marker(t.w)
    assert t.w.drained_marker() in str(err.value)


# --- 24.11 without accounting: our text outlives our resume --------------------------


def test_prolog_error_over_our_kept_text_is_not_resumed(t):
    drain_then_mend(t)
    before = resumes(t)
    # Slurm drains the node itself; on 23.11+ our old text may stay in front of its own.
    t.slurm.set_node("n1", state="IDLE+DRAIN", reason=XID79 + " : Prolog error")
    for _ in range(2):
        check(t)
    assert resumes(t) == before and t.slurm.peek("n1").state == "IDLE+DRAIN"


def test_a_drain_that_kept_our_old_text_and_time_is_not_adopted_after_our_resume(t):
    node = drain_then_mend(t)
    before = resumes(t)
    # A later drain that kept our text and ReasonTime exactly (slurmctld's own drain path on 24.11).
    t.slurm.set_node("n1", state="IDLE+DRAIN", reason=node.reason, extra=node.extra)
    for _ in range(2):
        check(t)
    assert resumes(t) == before and t.slurm.peek("n1").drained
    # Even with the state dir's marker gone (its look at Slurm is not rate-limited now).
    os.unlink(os.path.join(t.cfg.state.dir, "slurm-look-n1"))
    check(t)
    assert resumes(t) == before


def test_an_admin_reboot_asap_over_our_kept_text_is_neither_resumed_nor_cancelled(t):
    drain_then_mend(t)
    before = resumes(t)
    # `scontrol reboot ASAP n1` with no reason (24.11, seen): our text, " : reboot issued", a new ReasonTime.
    node = t.slurm.peek("n1")
    t.slurm._nodes["n1"] = t.slurm.stamped(node, XID79 + " : reboot issued", state="DOWN+DRAIN+REBOOT_ISSUED")
    for _ in range(2):
        check(t)
    assert resumes(t) == before and "REBOOT_ISSUED" in t.slurm.peek("n1").state


def test_a_person_draining_with_our_very_text_later_is_not_resumed(t):
    sim.inject(t.sim_dir, "n1", 3, xid=79)
    check(t)
    node = t.slurm.peek("n1")
    t.slurm._nodes["n1"] = t.slurm.stamped(node, XID79, user="alice")  # same text, set again by a person
    sim.reboot(t.sim_dir, "n1")
    _, out = check(t)
    assert not out.resumed and t.slurm.peek("n1").drained
    skipped = [r for r in t.audit.read() if r.get("action") == "resume" and r.get("result") == "skipped"]
    assert skipped and "alice" in skipped[-1]["detail"]


@pytest.mark.parametrize("suffix", [" : Not responding", " : reboot issued : reboot complete"])
def test_our_drain_with_a_slurm_suffix_is_resumed_once_healthy(t, suffix):
    sim.inject(t.sim_dir, "n1", 3, xid=79)
    check(t)
    node = t.slurm.peek("n1")
    # Slurm appends (and a reboot's completion stamps the reason anew: seen on 22.05).
    t.slurm._nodes["n1"] = t.slurm.stamped(node, XID79 + suffix, user="slurm", state="IDLE+DRAIN")
    sim.reboot(t.sim_dir, "n1")
    _, out = check(t)
    assert out.resumed and t.slurm.peek("n1").state == "IDLE"


@pytest.mark.parametrize("reason", ["NHC: check_gpu: GPU 3 missing", "slurm-operator: Pod is terminating"])
def test_other_tools_reasons_are_never_ours_even_with_our_marker(t, reason):
    sim.inject(t.sim_dir, "n1", 3, xid=79)
    check(t)
    t.slurm.set_node("n1", reason=reason)
    sim.reboot(t.sim_dir, "n1")
    _, out = check(t)
    assert not out.resumed and t.slurm.peek("n1").reason == reason
    assert not os.path.exists(t.w.drained_marker())  # theirs now: we let go


def test_a_released_reason_is_remembered_for_when_the_marker_is_lost(t):
    node = drain_then_mend(t)
    with open(os.path.join(t.cfg.state.dir, "released-n1.json"), encoding="utf-8") as fh:
        released = json.load(fh)
    assert released[-1]["reason"] == XID79 and released[-1]["reason_time"] == node.reason_time


def test_slurm_s_own_verdict_in_the_health_check_s_environment_is_recorded(t, monkeypatch):
    check(t)
    assert not [r for r in t.audit.read() if r["kind"] == "slurm-view"]  # older Slurm: says nothing
    monkeypatch.setenv("SLURM_NODE_IS_HEALTHY", "no")  # 26.05.2+, health_check_report
    check(t)
    [seen] = [r for r in t.audit.read() if r["kind"] == "slurm-view"]
    assert (seen["node_is_healthy"], seen["ours"], seen["node"]) == ("no", "healthy", "n1")


def test_a_drain_by_someone_else_after_the_runs_first_read_is_seen_by_the_resume(t):
    """The run read the node early (ours, and mended now); an admin drains it for maintenance before
    our resume: the resume reads the node afresh, sees their reason, and leaves their drain."""
    from slurm_hooks.models import Context
    from slurm_hooks.remedy import drain
    from slurm_hooks.remedy.outcome import Outcome

    sim.inject(t.sim_dir, "n1", 3, xid=79)
    _, out = check(t)
    assert out.drained
    sim.reboot(t.sim_dir, "n1")  # mended
    w = t.w.recording()
    report = healthcheck.judge(w, Context.CHECK)
    assert report.healthy and w.slurm.node("n1").reason == XID79  # the run's read: still ours
    t.slurm.drain("n1", "maintenance: swap PSU")  # an admin's scontrol update state=drain
    outcome = Outcome()
    drain.resume_if_ours(w, outcome, report)
    assert not outcome.resumed and t.slurm.peek("n1").drained
    assert t.slurm.peek("n1").reason == "maintenance: swap PSU"
