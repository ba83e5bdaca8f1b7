"""The fleet path: our alerts through the real Prometheus Alertmanager (Debian's package, installed
and started by the lab), configured with ``slurm-hooks render alertmanager``'s route, its receiver
a local webhook (``fakes.webhook.Receiver``).

Without the package and no way to install it (not root, no apt), these tests skip.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time

import pytest
from conftest import wait_for
from fakes.config import notify_settings
from fakes.webhook import Receiver
from observe.test_notify import Clock, xid79

from slurm_hooks.commands.render import render_all
from slurm_hooks.lab.alertmanager import AMTOOL, AlertmanagerError, LabAlertmanager, ensure_installed
from slurm_hooks.observe.audit import AuditLog
from slurm_hooks.observe.notify import Notifier
from slurm_hooks.probes import sim

pytest_plugins = ["fakes.webhook"]

#: Alertmanager's group_wait in these tests: long enough that two nodes' checks, run at once on a loaded
#: CI machine (three suites side by side), post into the same group; the sleeps after a notification
#: wait one group_wait and more to show that nothing else comes.
GROUP_WAIT_S = 8


def route(receiver: Receiver) -> str:
    return render_all(am_webhook_url=receiver.url("/am"), am_group_wait=f"{GROUP_WAIT_S}s",
                      am_group_interval="1s")["alertmanager"]


@pytest.fixture
def alertmanager(tmp_path, receiver):
    try:
        ensure_installed()
    except AlertmanagerError as exc:
        pytest.skip(f"no Alertmanager here: {exc}")
    am = LabAlertmanager(str(tmp_path / "am"), route(receiver))
    am.start()
    yield am
    am.stop()


def notifications(receiver: Receiver, status: str | None = None) -> list[dict]:
    return [b for b in receiver.bodies("/am") if status is None or b["status"] == status]


def alerted(receiver: Receiver, status: str) -> list[tuple[str, str]]:
    """(node, status) of every alert in every notification Alertmanager sent."""
    return [(a["labels"]["node"], a["status"]) for b in receiver.bodies("/am") for a in b["alerts"]
            if a["status"] == status]


def test_the_rendered_route_groups_by_alertname_and_cluster_and_amtool_accepts_it(tmp_path, receiver):
    try:
        ensure_installed()
    except AlertmanagerError as exc:
        pytest.skip(f"no Alertmanager here: {exc}")
    text = render_all()["alertmanager"]
    assert "group_by: [alertname, cluster]" in text
    path = tmp_path / "alertmanager.yml"
    for body in (text, route(receiver)):
        path.write_text(body)
        check = subprocess.run([AMTOOL, "check-config", str(path)], capture_output=True, text=True, timeout=60)
        assert check.returncode == 0, check.stdout + check.stderr
    cli = subprocess.run([sys.executable, "-m", "slurm_hooks", "render", "alertmanager"], capture_output=True,
                         text=True, timeout=120)
    assert cli.returncode == 0 and "group_by: [alertname, cluster]" in cli.stdout


def node_notifier(tmp_path, name: str, am: LabAlertmanager, clock) -> tuple[AuditLog, Notifier]:
    log = AuditLog(str(tmp_path / name / "audit.jsonl"))
    s = notify_settings(audit=log.path, dir=str(tmp_path / name / "notify"), alertmanager=({"url": am.url},), settle=0.0,
                 timeout=2.0, retry_max=30.0, cluster="lab", alert_repost=60.0)
    return log, Notifier(s, clock=clock, log=lambda m: None, rng=random.Random(3))


def test_alertmanager_down_for_a_while_each_alert_is_delivered_once_when_it_returns(tmp_path, receiver, alertmanager):
    clock = Clock()
    nodes = {name: node_notifier(tmp_path, name, alertmanager, clock) for name in ("n1", "n2")}
    alertmanager.stop()
    for name, (log, n) in nodes.items():
        xid79(log, node=name, gpu=3)
        assert n.flush(5)["sent"] == 0
    # Ten minutes down: re-posts pile up, but only the latest of each incident waits.
    for minute in range(1, 11):
        clock.offset = minute * 60.0
        for _, n in nodes.values():
            n.flush(5)
    for _, n in nodes.values():
        assert sorted(e.kind for e in n.outbox.entries()) == ["firing", "opened"]
    alertmanager.start()
    clock.offset += 120.0  # past the hold
    for _, n in nodes.values():
        n.flush(5)
        assert n.outbox.entries() == []
    wait_for(lambda: sorted(alerted(receiver, "firing")) == [("n1", "firing"), ("n2", "firing")], 30, what="both alerts")
    time.sleep(GROUP_WAIT_S + 1)  # a group_wait and more: nothing more comes
    assert sorted(alerted(receiver, "firing")) == [("n1", "firing"), ("n2", "firing")]
    [group] = notifications(receiver)
    assert group["groupLabels"] == {"alertname": "SlurmHooksXid", "cluster": "lab"}
    alert = group["alerts"][0]
    assert alert["labels"]["xid"] == "79" and alert["labels"]["gpu"] == "3" and alert["labels"]["action"] == "replace"
    assert alert["labels"]["severity"] == "critical"
    assert alert["annotations"]["jobs"] == "requeued: job 12 (alice)" and alert["annotations"]["runbook"]


def test_an_escalation_ends_the_alert_of_the_action_it_replaced(tmp_path, receiver, alertmanager):
    clock = Clock()
    log, n = node_notifier(tmp_path, "n1", alertmanager, clock)
    log.write("alert", node="n1", context="check", gpu=1, check="xid", severity="fail", action="reset",
              message="XID 48 (double-bit ECC)")
    log.write("action", node="n1", action="drain", target="n1", result="ok", reason="slurm-hooks: XID 48 on GPU 1 [reset]")
    n.flush(5)
    wait_for(lambda: alerted(receiver, "firing"), 30, what="the first alert")
    log.write("action", node="n1", action="drain", target="n1", result="ok",
              reason="slurm-hooks: XID 48 on GPU 1 [replace]")
    n.flush(5)
    actions = wait_for(lambda: {(a["labels"]["action"], a["status"]) for b in notifications(receiver)
                                for a in b["alerts"]} >= {("reset", "resolved"), ("replace", "firing")}, 30, what="escalation")
    assert actions


@pytest.mark.slurm
def test_xid79_on_two_nodes_is_one_grouped_notification_and_one_resolution(hooked_testbed, receiver, alertmanager,
                                                                          tmp_path):
    """Done when: real Alertmanager and the real testbed. XID 79 on n1 and n2 within a second -> one
    grouped notification naming both nodes; both back in service while Alertmanager is down -> once it
    returns, resolved for both, once."""
    tb = hooked_testbed
    cfg = tmp_path / "config.toml"
    with open(tb.config_path, encoding="utf-8") as fh:
        cfg.write_text(fh.read() + f'\n[notify]\nsettle = 0.5\ncluster = "lab"\noutbox = "{tmp_path}/notify"\n'
                                   f'[[notify.alertmanager]]\nurl = "{alertmanager.url}"\n')
    cfg.chmod(0o600)
    env = {**tb.env, "SLURM_HOOKS_CONFIG": str(cfg)}

    def checks() -> list[subprocess.Popen]:
        return [subprocess.Popen([sys.executable, "-m", "slurm_hooks", "check", "--node", node], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for node in ("n1", "n2")]

    for node in ("n1", "n2"):
        sim.inject(tb.sim_dir, node, 2, xid=79)
    outs = [p.communicate(timeout=90)[0] for p in checks()]
    for node in ("n1", "n2"):
        tb.wait_node(node, lambda x: x.drained and x.reason.startswith("slurm-hooks:"), timeout=30)
    # The two checks share one notify dir here (one machine): the second waits for the first's turn
    # only within its short flush budget, and under CI's load may leave its alert to the next run.
    # That next run, as on a node: one `notify flush`, a no-op when both were told.
    subprocess.run([sys.executable, "-m", "slurm_hooks", "notify", "flush"], env=env, capture_output=True, timeout=60)
    firing = wait_for(lambda: notifications(receiver, "firing"), 30, what="Alertmanager's notification")
    time.sleep(GROUP_WAIT_S + 1)
    [group] = notifications(receiver, "firing")
    assert firing == [group]
    assert sorted(a["labels"]["node"] for a in group["alerts"]) == ["n1", "n2"], outs
    assert {a["labels"]["xid"] for a in group["alerts"]} == {"79"}
    # Mended while Alertmanager cannot be reached (stopped, not restarted: it keeps alerts in memory only):
    # the health check resumes its own drains; the resolutions wait in the outbox, and go once it is back
    # (a `notify flush`, as the next check or the watcher would).
    alertmanager.pause()
    for node in ("n1", "n2"):
        sim.clear(tb.sim_dir, node)
    for p in checks():
        out, _ = p.communicate(timeout=90)
        assert p.returncode == 0, out
    for node in ("n1", "n2"):
        tb.wait_node(node, lambda x: not x.drained, timeout=30)
    assert not notifications(receiver, "resolved")
    assert os.listdir(tmp_path / "notify" / "outbox")
    alertmanager.resume()

    def flushed() -> bool:
        subprocess.run([sys.executable, "-m", "slurm_hooks", "notify", "flush"], env=env, capture_output=True,
                       timeout=60)
        return not os.listdir(tmp_path / "notify" / "outbox")

    wait_for(flushed, 30, what="the outbox to empty")

    def both_resolved() -> list[dict]:
        return [b for b in notifications(receiver, "resolved")
                if sorted((a["labels"]["node"], a["status"]) for a in b["alerts"]) == [("n1", "resolved"),
                                                                                       ("n2", "resolved")]]

    # (A resolution that came in before the other may have been told first, with the other still firing.)
    wait_for(both_resolved, 30, what="the resolution of both")
    time.sleep(GROUP_WAIT_S + 1)
    assert len(both_resolved()) == 1, json.dumps(receiver.bodies("/am"))[:2000]
    assert len(notifications(receiver, "firing")) <= 2  # the grouped one, and at most one partial update


# --- alerts that stay true: held while true, ended once on a real return ----------------------


def held(am: LabAlertmanager, alertname: str) -> list[dict]:
    """The alerts Alertmanager holds under ``alertname``, active or not (its own view, its own clock)."""
    import urllib.parse
    import urllib.request

    query = urllib.parse.quote(f'alertname="{alertname}"')
    with urllib.request.urlopen(f"{am.url}/api/v2/alerts?filter={query}", timeout=10) as r:  # noqa: S310 - 127.0.0.1
        return json.loads(r.read())


def told(receiver: Receiver, alertname: str, status: str) -> list[dict]:
    """Alertmanager's notifications that carry ``alertname`` with ``status``."""
    return [b for b in receiver.bodies("/am")
            if any(a["labels"].get("alertname") == alertname and a["status"] == status for a in b["alerts"])]


def test_the_breaker_alert_stays_firing_past_its_old_15_minutes_until_the_bridge_says_it_is_reset(
        tmp_path, receiver, alertmanager):
    """The breaker tripped 30 minutes ago and is still latched: the bridge says so every pass, the
    alert is posted again each minute and stays firing (posted once with endsAt = trip + 15 min, it
    resolved at minute 15 while the breaker was still latched). The reset ends it, once."""
    clock = Clock()
    clock.offset = -1800.0
    log, n = node_notifier(tmp_path, "bridge", alertmanager, clock)
    trip = log.write("bridge_breaker_tripped", ts=clock(), level="critical", node="k8s-3", slurm_node="n3",
                     reason="3 nodes taken within 600 s (limit 2)")
    n.standing([trip])
    n.flush(5)
    for _ in range(30):
        clock.offset += 60.0
        n.standing([trip])
        n.flush(5)
    [alert] = held(alertmanager, "SlurmHooksBreakerTripped")
    assert alert["status"]["state"] == "active"
    wait_for(lambda: told(receiver, "SlurmHooksBreakerTripped", "firing"), 30, what="the breaker's page")
    n.standing([])  # reset
    n.flush(5)
    wait_for(lambda: told(receiver, "SlurmHooksBreakerTripped", "resolved"), 30, what="the breaker's resolution")
    time.sleep(GROUP_WAIT_S + 1)
    assert len(told(receiver, "SlurmHooksBreakerTripped", "firing")) == 1
    assert len(told(receiver, "SlurmHooksBreakerTripped", "resolved")) == 1
    assert all(a["status"]["state"] != "active" for a in held(alertmanager, "SlurmHooksBreakerTripped"))


def test_a_node_rebooting_20_minutes_has_one_firing_alert_no_flap_and_one_resolution(tmp_path, receiver,
                                                                                     alertmanager):
    """[reboot] 21 minutes ago, the node silent since (it posts nothing while it reboots): its alert is
    held across Slurm's ResumeTimeout, still active; back, it posts again, then its resolution."""
    clock = Clock()
    clock.offset = -1260.0
    log = AuditLog(str(tmp_path / "n1" / "audit.jsonl"))
    s = notify_settings(audit=log.path, dir=str(tmp_path / "n1" / "notify"), alertmanager=({"url": alertmanager.url},),
                 settle=0.0, timeout=2.0, retry_max=30.0, cluster="lab", alert_repost=60.0, resume_timeout=1800.0)
    n = Notifier(s, clock=clock, log=lambda m: None, rng=random.Random(3))
    log.write("alert", ts=clock(), node="n1", context="check", gpu=2, check="xid", severity="fail", action="reboot",
              message="XID 119 (GSP RPC timeout)")
    log.write("action", ts=clock(), node="n1", action="drain", target="n1", result="ok",
              reason="slurm-hooks: XID 119 on GPU 2 [reboot]")
    n.flush(5)  # then the node reboots: nothing from it for 20 minutes
    wait_for(lambda: told(receiver, "SlurmHooksXid", "firing"), 30, what="the node's page")
    [alert] = held(alertmanager, "SlurmHooksXid")
    assert alert["status"]["state"] == "active"
    clock.offset = -60.0  # back: its checks post again while it validates
    n.flush(5)
    clock.offset = 0.0
    log.write("action", ts=clock(), node="n1", action="resume", target="n1", result="ok",
              reason="slurm-hooks: XID 119 on GPU 2 [reboot]")
    n.flush(5)
    wait_for(lambda: told(receiver, "SlurmHooksXid", "resolved"), 30, what="the resolution")
    time.sleep(GROUP_WAIT_S + 1)
    statuses = [a["status"] for b in receiver.bodies("/am") for a in b["alerts"]
                if a["labels"].get("node") == "n1"]
    assert statuses == ["firing", "resolved"], statuses


def test_the_bridge_closing_an_evicted_node_ends_the_alert_the_node_can_no_longer_end(tmp_path, receiver,
                                                                                    alertmanager):
    """Slinky: the node posted its alert, then its machine (and its outbox) went; the bridge sees the
    Slurm node back on another machine and ends the alert Alertmanager holds for it."""
    clock = Clock()
    log, node = node_notifier(tmp_path, "n1", alertmanager, clock)
    xid79(log, node="n1", gpu=3)
    node.flush(5)
    wait_for(lambda: told(receiver, "SlurmHooksXid", "firing"), 30, what="the node's page")
    blog, bridge = node_notifier(tmp_path, "bridge", alertmanager, clock)
    blog.write("bridge_incident_closed", node="n1", kube_node="k8s-1", back_on="k8s-7", state="IDLE",
               reason="slurm-hooks: XID 79 on GPU 3 [replace]", message="Slurm node back in service on k8s-7")
    assert bridge.flush(5)["sent"] == 1
    wait_for(lambda: told(receiver, "SlurmHooksXid", "resolved"), 30, what="the resolution")
    assert all(a["status"]["state"] != "active" for a in held(alertmanager, "SlurmHooksXid"))
    time.sleep(GROUP_WAIT_S + 1)
    assert len(told(receiver, "SlurmHooksXid", "resolved")) == 1


def test_notify_test_to_a_real_alertmanager_says_its_version_and_posts_the_test_alert(tmp_path, receiver, alertmanager):
    """The other half of the check that a plain web server fails (test_notify_test.py): Alertmanager
    answers GET /api/v2/status as itself, then takes the test alert."""
    from fakes.config import write_sim_config

    path = write_sim_config(tmp_path, f'[[notify.alertmanager]]\nurl = "{alertmanager.url}"\n')
    path.chmod(0o600)
    run = subprocess.run([sys.executable, "-m", "slurm_hooks", "notify", "test", "--config", str(path)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    [line] = run.stdout.splitlines()
    assert line.startswith("OK") and ": Alertmanager " in line and "delivered (HTTP 200)" in line, line
