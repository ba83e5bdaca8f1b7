"""What the bridge tells, through the receivers: its standing problems (breaker, a missing permission)
held while true and ended once, and a node it saw come back (Slinky: the node's outbox went with its
machine) told as back in service. Receivers are real HTTP servers (``fakes.webhook``); the clock is
injected."""

from __future__ import annotations

import random

from fakes.config import notify_settings
from observe.test_notify import Clock

from slurm_hooks.observe.audit import AuditLog
from slurm_hooks.observe.notify import Notifier

pytest_plugins = ["fakes.webhook"]

AM = "/am/api/v2/alerts"


def bridge(tmp_path, receiver, clock) -> tuple[AuditLog, Notifier]:
    log = AuditLog(str(tmp_path / "audit.jsonl"))
    s = notify_settings(audit=log.path, dir=str(tmp_path / "notify"), webhook=({"url": receiver.url(), "format": "json"},),
                 alertmanager=({"url": receiver.url("/am")},), settle=0.0, timeout=2.0, cluster="lab",
                 alert_repost=60.0)
    return log, Notifier(s, clock=clock, log=lambda m: None, rng=random.Random(1))


def test_a_standing_problem_is_posted_again_while_true_and_ended_once_when_the_bridge_stops_saying_it(
        tmp_path, receiver):
    clock = Clock()
    log, n = bridge(tmp_path, receiver, clock)
    denied = log.write("bridge_permission_missing", level="error", node="k8s-2", slurm_node="n2",
                       message="missing permission for the nodepool backend: 403")
    n.standing([denied])
    n.flush(5)
    for minute in range(1, 31):
        clock.offset = minute * 60.0
        n.standing([denied])
        n.flush(5)
    posts = receiver.bodies(AM)
    ends = [a["endsAt"] for body in posts for a in body]
    assert len(posts) == 31 and ends == sorted(ends)  # every minute, each further ahead
    assert {a["labels"]["alertname"] for body in posts for a in body} == {"SlurmHooksBridgePermissionMissing"}
    assert [b["kind"] for b in receiver.bodies()] == ["bridge"]  # the chat hears it once
    clock.offset += 60.0
    n.standing([])
    n.flush(5)
    n.standing([])
    clock.offset += 600.0
    n.flush(5)
    *_, held, [ended] = receiver.bodies(AM)
    assert len(receiver.bodies(AM)) == 32  # the end, once
    assert ended["labels"] == held[0]["labels"] and ended["endsAt"] < held[0]["endsAt"]  # now, not held
    chat = receiver.bodies()
    assert [b["kind"] for b in chat] == ["bridge", "resolved"]
    assert chat[1]["text"].startswith("No longer true") and "missing permission" in chat[1]["text"]


def test_a_breaker_alert_is_one_alert_whichever_node_tripped_it(tmp_path, receiver):
    clock = Clock()
    log, n = bridge(tmp_path, receiver, clock)
    first = log.write("bridge_breaker_tripped", level="critical", node="k8s-3", slurm_node="n3", reason="3 nodes")
    n.flush(5)
    for minute in (1, 2):
        clock.offset = minute * 61.0
        n.standing([{**first, "node": "k8s-9", "slurm_node": "n9"}])  # the bridge restarted: another node named
        n.flush(5)
    labels = [a["labels"] for body in receiver.bodies(AM) for a in body]
    assert len(labels) == 2 and labels[0] == labels[1]
    assert "node" not in labels[0] and labels[0]["cluster"] == "lab"


def test_the_bridge_tells_a_node_back_in_service_that_cannot_tell_it_itself(tmp_path, receiver):
    clock = Clock()
    log, n = bridge(tmp_path, receiver, clock)
    log.write("bridge_incident_closed", node="n1", kube_node="k8s-1", back_on="k8s-7", state="IDLE",
              reason="slurm-hooks: XID 79 on GPU 3 [replace]", message="Slurm node back in service on k8s-7")
    log.write("bridge_incident_closed", node="n2", kube_node="k8s-2", dry_run=True, reason="x")
    n.flush(5)
    [msg] = receiver.bodies()
    assert msg["kind"] == "resolved" and msg["node"] == "n1" and msg["resolved_by"] == "bridge"
    assert msg["text"] == ("n1 back in service on k8s-7 (seen by the Kubernetes bridge in Slurm); it was out for: "
                           "XID 79 on GPU 3 [replace].")
    assert "end_node" not in msg
    # Alertmanager is asked what it holds for n1 first: a receiver that refuses the GET (this fake
    # answers 501) cannot have them ended; that one message is kept aside, the receiver not held.
    assert receiver.bodies(AM) == [] and n.outbox.entries() == []
    [failed] = n.outbox.failed_entries()
    assert "GET /api/v2/alerts" in failed.last_error


def test_a_machine_held_too_long_is_a_standing_alert_as_the_reconciler_gives_it(tmp_path, receiver):
    clock = Clock()
    log, n = bridge(tmp_path, receiver, clock)
    held = {"kind": "bridge_held_too_long", "ts": clock(), "level": "warning", "node": "k8s-4", "slurm_node": "n4",
            "since": clock() - 90000, "held_s": 90000.0, "backend": "nodepool", "requested": None, "closed": False,
            "message": "held (cordoned by the bridge) for more than 86400 s: nothing requested yet"}
    for minute in range(3):
        clock.offset = minute * 61.0
        n.standing([held])
        n.flush(5)
    n.standing([])
    n.flush(5)
    alerts = [a for body in receiver.bodies(AM) for a in body]
    assert {a["labels"]["alertname"] for a in alerts} == {"SlurmHooksBridgeHeldTooLong"}
    assert len(alerts) == 3 and alerts[-1]["endsAt"] < alerts[-2]["endsAt"]  # two re-posts, then the end
    assert alerts[0]["labels"]["node"] == "n4" and alerts[0]["labels"]["kube_node"] == "k8s-4"
    assert [b["kind"] for b in receiver.bodies()] == ["resolved"]  # its start is told from the audit record (none here)
