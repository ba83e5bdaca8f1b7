"""Notifications from the audit log: one message per incident, delivered through an outbox.

The receiver is a real HTTP server on 127.0.0.1 (an ephemeral port, in a thread);
records are written with the real AuditLog. The last tests run the whole story on
the real Slurm testbed: XID 79 under a job, the watcher drains, a notifier thread
(as the watcher daemon runs it) posts one message, and one more when the node is back.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
import time

import pytest
from fakes.config import notify_settings, sim_config, sim_node
from hooks.test_e2e_slurm import TRAP_JOB, wait_started

from slurm_hooks import config
from slurm_hooks.errors import ConfigError
from slurm_hooks.hooks import healthcheck
from slurm_hooks.hooks.watch import SimSource, Watcher
from slurm_hooks.observe.audit import AuditLog
from slurm_hooks.observe.notify import Notifier, NotifySettings
from slurm_hooks.probes import sim

pytest_plugins = ["fakes.webhook"]


class Clock:
    def __init__(self):
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


@pytest.fixture
def setup(tmp_path, receiver):
    log = AuditLog(str(tmp_path / "audit.jsonl"))
    clock = Clock()

    def notifier(**kw) -> Notifier:
        hooks = kw.pop("webhook", ({"url": receiver.url(), "format": "json", "name": "test"},))
        s = notify_settings(audit=log.path, dir=str(tmp_path / "notify"), webhook=hooks,
                     settle=kw.pop("settle", 0.0), timeout=2.0, retry_max=5.0,
                     **{k: v for k, v in kw.items() if k not in ("send", "syslog_send")})
        return Notifier(s, send=kw.pop("send", None), syslog=kw.pop("syslog_send", None), clock=clock,
                        log=lambda m: None)

    return log, clock, notifier


def xid79(log: AuditLog, node: str = "n1", gpu: int = 3, jobs=(12,), drain_result: str = "ok",
          context: str = "watch", user: str | None = "alice") -> None:
    """What the hooks write for XID 79 under a job: alert, drain, requeue per job, the watcher's summary."""
    log.write("alert", node=node, context=context, gpu=gpu, check="xid", severity="fail", action="replace",
              message="XID 79 (GPU has fallen off the bus)", uuid=f"GPU-{node}-{gpu}", serial=f"SN{gpu}")
    log.write("action", node=node, action="drain", target=node, result=drain_result, duration_s=0.01,
              reason=f"slurm-hooks: XID 79 on GPU {gpu} [replace]")
    for j in jobs:
        extra = {"user": user} if user else {}
        log.write("action", node=node, action="requeue", target=str(j), result="ok", duration_s=0.01, jobs=[j], **extra)
    if context == "watch":
        log.write("watch", node=node, xid=79, gpu=gpu, event=f"b:{gpu}:79:1", drained=True, requeued=list(jobs),
                  failed=[], duration_s=0.1)


def resume(log: AuditLog, node: str = "n1") -> None:
    log.write("action", node=node, action="resume", target=node, result="ok", duration_s=0.01,
              reason="slurm-hooks: XID 79 on GPU 3 [replace]")


# --- one message per incident -------------------------------------------------------


def test_several_hooks_seeing_one_xid_make_exactly_one_message(setup, receiver):
    log, _, notifier = setup
    xid79(log, context="watch")
    xid79(log, context="check", jobs=(), drain_result="already")
    xid79(log, context="epilog", jobs=(), drain_result="already")
    n = notifier()
    assert n.flush(5)["sent"] == 1
    assert n.flush(5)["sent"] == 0
    [msg] = receiver.bodies()
    assert msg["kind"] == "opened"
    assert msg["node"] == "n1"
    assert msg["gpus"] == [{"index": 3, "uuid": "GPU-n1-3", "serial": "SN3"}]
    assert msg["finding"]["check"] == "xid" and msg["finding"]["xid"] == 79
    assert msg["action"] == "replace" and msg["urgency"] == "high" and msg["scope"] == "gpu"
    assert msg["jobs"] == [{"job_id": "12", "user": "alice", "name": None, "how": "requeued"}]
    assert msg["seen_by"] == ["watch", "check", "epilog"]
    assert msg["incident"].startswith("n1-")
    text = msg["text"]
    assert "n1 drained [replace]: XID 79 (GPU has fallen off the bus) on GPU 3 (GPU-n1-3, serial SN3)" in text
    assert "12 (alice)" in text and msg["incident"] in text
    assert "http" not in text


def test_an_alert_that_takes_no_node_out_is_not_an_incident(setup, receiver):
    log, _, notifier = setup
    log.write("alert", node="n1", context="check", gpu=0, check="thermal", severity="warn", action="warn",
              message="GPU at 88 C")
    assert notifier().flush(5)["sent"] == 0
    assert receiver.requests == []


def test_two_nodes_make_two_incidents_and_a_new_drain_after_resume_a_new_one(setup, receiver):
    log, _, notifier = setup
    xid79(log, node="n1")
    xid79(log, node="n2", gpu=5)
    n = notifier()
    n.flush(5)
    resume(log, "n1")
    xid79(log, node="n1", gpu=3)
    n.flush(5)
    kinds = [(m["node"], m["kind"]) for m in receiver.bodies()]
    assert sorted(kinds[:2]) == [("n1", "opened"), ("n2", "opened")]
    assert kinds[2:] == [("n1", "resolved"), ("n1", "opened")]
    assert len({m["incident"] for m in receiver.bodies() if m["kind"] == "opened"}) == 3


def test_the_message_waits_for_the_requeues_that_follow_the_drain(setup, receiver):
    log, clock, notifier = setup
    n = notifier(settle=30.0)
    log.write("action", node="n1", action="drain", target="n1", result="ok", duration_s=0.01,
              reason="slurm-hooks: XID 79 on GPU 3 [replace]")
    assert n.flush(5)["sent"] == 0  # within the settle time: more may come
    log.write("action", node="n1", action="requeue", target="7", result="ok", duration_s=0.01, jobs=[7])
    clock.offset = 31
    assert n.flush(5)["sent"] == 1
    [msg] = receiver.bodies()
    assert msg["jobs"] == [{"job_id": "7", "user": None, "name": None, "how": "requeued"}]
    assert "requeued: job 7" in msg["text"]


def test_a_job_the_prolog_refused_is_named_as_refused_not_as_no_job(setup, receiver):
    log, _, notifier = setup
    log.write("alert", node="n1", context="prolog", gpu=0, check="xid", severity="fail", action="replace",
              message="XID 79 (GPU has fallen off the bus)", job="5")
    log.write("action", node="n1", action="drain", target="n1", result="ok", duration_s=0.01,
              reason="slurm-hooks: XID 79 on GPU 0 [replace]", job="5", context="prolog")
    log.write("action", node="n1", action="requeue", target="5", result="skipped", duration_s=0.0, jobs=["5"],
              detail="job is COMPLETING (it ended, or a requeue is already under way)")  # the watcher, a moment later
    notifier().flush(5)
    [msg] = receiver.bodies()
    assert msg["jobs"] == [{"job_id": "5", "user": None, "name": None, "how": "refused"}]
    assert "refused at its start (Slurm requeues it): job 5" in msg["text"] and "no job requeued" not in msg["text"]


def test_the_watcher_starting_is_not_the_first_sight_of_a_fault(setup, receiver):
    log, _, notifier = setup
    log.write("watch", node="n1", message="watcher started", ts=time.time() - 1.5)
    xid79(log, context="check", jobs=())
    notifier().flush(5)
    [msg] = receiver.bodies()
    assert msg["seen_by"] == ["check"]
    assert msg["time_to_drain_s"] < 1.0  # from the fault's first sight, not the watcher's start 1.5 s before


# --- follow-ups ------------------------------------------------------------------------


def test_back_in_service_says_how_long_it_took(setup, receiver):
    log, _, notifier = setup
    xid79(log)
    n = notifier()
    n.flush(5)
    log.write("action", node="n1", action="resume", target="n1", result="ok", duration_s=0.01,
              reason="slurm-hooks: XID 79 on GPU 3 [replace]", ts=time.time() + 0.05)
    assert n.flush(5)["sent"] == 1
    opened, back = receiver.bodies()
    assert back["kind"] == "resolved" and back["incident"] == opened["incident"]
    assert back["resolved_by"] == "slurm-hooks"
    assert 0 < back["out_of_service_s"] < 5
    assert back["text"].startswith("n1 back in service after 0s (resumed by slurm-hooks after a passing check)")


def test_an_admin_resume_acknowledged_by_the_check_closes_the_incident(setup, receiver):
    log, _, notifier = setup
    xid79(log)
    log.write("action", node="n1", action="ack-xids", target="n1", result="ok", duration_s=0.0,
              detail="node resumed by an admin after our drain; 1 XID event(s) acknowledged")
    notifier().flush(5)
    assert [m["kind"] for m in receiver.bodies()] == ["opened", "resolved"]
    assert receiver.bodies()[1]["resolved_by"] == "a person"
    assert "resumed by a person" in receiver.bodies()[1]["text"]


def test_a_harsher_drain_is_an_escalation_message(setup, receiver):
    log, _, notifier = setup
    log.write("action", node="n1", action="drain", target="n1", result="ok", duration_s=0.01,
              reason="slurm-hooks: XID 48 on GPU 1 [reset]")
    n = notifier()
    n.flush(5)
    log.write("action", node="n1", action="drain", target="n1", result="ok", duration_s=0.01,
              reason="slurm-hooks: XID 48 on GPU 1; XID 79 on GPU 1 [replace]")
    log.write("action", node="n1", action="drain", target="n1", result="ok", duration_s=0.01,
              reason="slurm-hooks: XID 48 on GPU 1 [reset]")  # not harsher: folded in
    n.flush(5)
    n.flush(5)
    kinds = [(m["kind"], m["action"]) for m in receiver.bodies()]
    assert kinds == [("opened", "reset"), ("escalated", "replace")]
    assert receiver.bodies()[1]["text"].startswith("n1 escalated to [replace]: XID 48 on GPU 1; XID 79 on GPU 1")


def test_an_incident_still_open_gets_one_reminder_per_period(setup, receiver):
    log, clock, notifier = setup
    xid79(log)
    n = notifier(reminder_after=3600.0)
    n.flush(5)
    clock.offset = 3700
    n.flush(5)
    n.flush(5)
    clock.offset = 7300
    n.flush(5)
    kinds = [m["kind"] for m in receiver.bodies()]
    assert kinds == ["opened", "reminder", "reminder"]
    assert "still out of service after 1h 01m" in receiver.bodies()[1]["text"]


def test_a_breaker_trip_in_the_bridge_is_told(setup, receiver):
    log, _, notifier = setup
    log.write("bridge_breaker_tripped", level="critical", node="k8s-node-3", slurm_node="n3",
              reason="3 nodes taken within 600 s (limit 2)",
              message="no new nodes will be taken until `slurm-hooks bridge reset-breaker` or the window passes")
    notifier().flush(5)
    [msg] = receiver.bodies()
    assert msg["kind"] == "breaker" and msg["node"] == "n3" and msg["kube_node"] == "k8s-node-3"
    assert "circuit breaker tripped" in msg["text"] and "3 nodes taken" in msg["text"]


# --- delivery -------------------------------------------------------------------------------


def test_receiver_down_then_up_every_message_arrives_once(setup, receiver, tmp_path):
    log, clock, notifier = setup
    receiver.stop()
    xid79(log)
    n = notifier()
    assert n.flush(5)["sent"] == 0
    [queued] = os.listdir(tmp_path / "notify" / "outbox")
    assert stat.S_IMODE(os.stat(tmp_path / "notify" / "outbox" / queued).st_mode) == 0o600
    resume(log)
    assert n.flush(5)["sent"] == 0  # still backing off
    receiver.start()  # same port
    clock.offset = 60  # past the backoff
    restarted = notifier()  # and a restart in between loses nothing
    assert restarted.flush(5)["sent"] == 2
    assert restarted.flush(5)["sent"] == 0
    assert [m["kind"] for m in receiver.bodies()] == ["opened", "resolved"]
    assert os.listdir(tmp_path / "notify" / "outbox") == []


def test_a_request_answered_with_an_error_is_retried_with_the_same_idempotency_key(setup, receiver):
    log, clock, notifier = setup
    receiver.fail_next = 1  # the receiver got it, but answered 503
    xid79(log)
    n = notifier()
    n.flush(5)
    clock.offset = 10
    n.flush(5)
    keys = [r["headers"]["Idempotency-Key"] for r in receiver.requests]
    assert len(keys) == 2 and keys[0] == keys[1] == receiver.bodies()[0]["id"]
    assert len(receiver.delivered()) == 1


def test_a_message_delivered_before_a_crash_is_not_sent_again(setup, receiver, tmp_path):
    log, _, notifier = setup
    xid79(log)
    n = notifier()
    n.collect()
    box = tmp_path / "notify" / "outbox"
    [name] = os.listdir(box)
    saved = (box / name).read_bytes()
    assert n.flush(5)["sent"] == 1
    (box / name).write_bytes(saved)  # as if the process died after sending, before removing the file
    assert notifier().flush(5)["sent"] == 0
    assert len(receiver.requests) == 1
    assert os.listdir(box) == []


def test_a_rotated_log_is_read_from_its_start(setup, receiver):
    log, _, notifier = setup
    xid79(log, node="n1")
    n = notifier()
    n.flush(5)
    os.rename(log.path, log.path + ".1")
    xid79(log, node="n2")
    n.flush(5)
    assert [m["node"] for m in receiver.bodies()] == ["n1", "n2"]


def test_a_refused_message_is_kept_aside_not_retried_forever(setup, receiver, tmp_path):
    log, clock, notifier = setup
    # A 422 is about this message (the receiver cannot process it): kept aside, the others go on.
    # (A 404, a webhook deleted or moved, is about the receiver: test_delivery holds those.)
    n = notifier(send=lambda url, body, headers, timeout: 422)
    xid79(log)
    n.flush(5)
    clock.offset = 100
    n.flush(5)
    assert os.listdir(tmp_path / "notify" / "outbox") == []
    assert len(os.listdir(tmp_path / "notify" / "failed")) == 1


def test_slack_and_json_receivers_each_get_their_shape(setup, receiver):
    log, _, notifier = setup
    hooks = ({"url": receiver.url("/slack"), "format": "slack", "name": ""},
             {"url": receiver.url("/json"), "format": "json", "name": ""})
    xid79(log)
    notifier(webhook=hooks).flush(5)
    [slack] = receiver.bodies("/slack")
    [plain] = receiver.bodies("/json")
    assert set(slack) == {"text", "blocks"}
    assert slack["text"].startswith(":rotating_light: n1 drained [replace]")
    assert slack["blocks"][0] == {"type": "section", "text": {"type": "mrkdwn", "text": slack["text"]}}
    assert slack["blocks"][1]["text"]["text"] == "*Jobs requeued* (1): 12 (alice)"
    assert {"type": "mrkdwn", "text": "*Node*\nn1"} in slack["blocks"][2]["fields"]
    assert plain["node"] == "n1" and plain["kind"] == "opened" and "12 (alice)" in plain["text"]
    assert plain["headline"] in slack["text"]
    assert "alerts" not in plain  # Alertmanager's own
    assert all(r["headers"]["Content-Type"] == "application/json" for r in receiver.requests)


def test_syslog_gets_one_line_per_message(setup, receiver):
    log, _, notifier = setup
    lines = []
    n = notifier(syslog=True, webhook=(), syslog_send=lambda priority, text: lines.append((priority, text)))
    xid79(log)
    resume(log)
    n.flush(5)
    import syslog

    assert [p for p, _ in lines] == [syslog.LOG_CRIT, syslog.LOG_NOTICE]
    assert lines[0][1].startswith("n1 drained [replace]") and lines[1][1].startswith("n1 back in service")


def test_the_first_run_over_an_old_log_does_not_announce_old_incidents(setup, receiver, tmp_path):
    log, clock, notifier = setup
    xid79(log)
    clock.offset = 2 * 86400  # the notifier is installed two days later
    n = notifier(reminder_after=0.0)
    n.flush(5)
    resume(log)
    n.flush(5)
    assert receiver.requests == []


def test_flush_from_the_cli_delivers_and_says_what_it_did(tmp_path, receiver):
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[log]\naudit = "{tmp_path}/audit.jsonl"\n[state]\ndir = "{tmp_path}/state"\n'
                   f'[notify]\nsettle = 0\n[[notify.webhook]]\nurl = "{receiver.url()}"\nformat = "slack"\n')
    xid79(AuditLog(str(tmp_path / "audit.jsonl")))
    out = subprocess.run([sys.executable, "-m", "slurm_hooks", "notify", "flush", "--config", str(cfg),
                          "--timeout", "5"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "notify: 1 queued, 1 sent, 0 waiting"
    assert len(receiver.bodies()) == 1


def test_a_webhook_table_with_a_mistake_names_its_line(tmp_path):
    text = '[notify]\nsyslog = true\n\n[[notify.webhook]]\nurl = "https://a"\n\n[[notify.webhook]]\nurl = "hooks.slack.com/x"\n'
    with pytest.raises(ConfigError) as err:
        config.parse(text, "c.toml")
    assert str(err.value) == ("c.toml:8: [[notify.webhook]] #2 url: must be an http:// or https:// URL, "
                              "got 'hooks.slack.com'... (the rest is not shown: a webhook URL is a secret)")
    with pytest.raises(ConfigError, match=r"c.toml:3: \[\[notify.webhook\]\] #1 format: must be one of slack, json"):
        config.parse('[[notify.webhook]]\nurl = "http://x"\nformat = "teams"\n', "c.toml")
    ok = config.parse('[[notify.webhook]]\nurl = "http://x"\n')
    assert ok.notify.webhook == ({"url": "http://x", "url_file": "", "url_env": "", "format": "json", "name": ""},)


# --- who delivers: the watcher's thread, else the health check ------------------------------


@pytest.fixture
def node(tmp_path, receiver):
    """A sim node n1 (8 GPUs, job 12 of alice on it) in FakeSlurm, with [notify] posting to the receiver."""
    def make(notify: str = f'settle = 1.0\n[[notify.webhook]]\nurl = "{receiver.url()}"\n'):
        cfg = sim_config(tmp_path, f"[expect]\ngpus = 8\n[notify]\n{notify}")
        return sim_node(cfg, "MIXED", 12)[1]

    return make


def test_the_watcher_runs_a_notifier_thread_that_posts_the_incident(node, receiver):
    w = node()
    sim.inject(w.config.gpu.sim_dir, "n1", 3, xid=79)
    watcher = Watcher(w, SimSource(w.config.gpu.sim_dir, "n1", 0.05), log=lambda m: None)
    stop = threading.Event()
    thread = threading.Thread(target=watcher.run, args=(stop,), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not receiver.bodies():
            assert time.monotonic() < deadline, "the watcher's notifier posted nothing"
            time.sleep(0.05)
        assert "notify" in [t.name for t in threading.enumerate()]
        assert Notifier(NotifySettings.from_config(w.config)).delivering()
    finally:
        stop.set()
        thread.join(5)
    [msg] = receiver.bodies()
    assert msg["kind"] == "opened" and msg["gpus"][0]["index"] == 3
    assert msg["jobs"] == [{"job_id": "12", "user": None, "name": "train", "how": "requeued"}]
    deadline = time.monotonic() + 5
    while Notifier(NotifySettings.from_config(w.config)).delivering():  # a clean stop takes its heartbeat away
        assert time.monotonic() < deadline, "the heartbeat outlived the watcher"
        time.sleep(0.05)


def test_a_watcher_without_receivers_starts_no_notifier(node):
    w = node(notify="")
    assert Watcher(w, SimSource(w.config.gpu.sim_dir, "n1", 0.05), log=lambda m: None).start_notifier(
        threading.Event()) is None


def test_the_health_check_tells_its_own_drain_when_no_watcher_delivers(node, receiver):
    w = node()
    sim.inject(w.config.gpu.sim_dir, "n1", 3, xid=79)
    _, outcome = healthcheck.run(w, follow="none")
    assert outcome.drained and outcome.requeued == ["12"]
    # It waited out the 1 s settle (its own requeue was written already) instead of leaving the
    # message to its next run minutes later.
    [msg] = receiver.bodies()
    assert msg["kind"] == "opened" and msg["jobs"] == [{"job_id": "12", "user": None, "name": "train", "how": "requeued"}]
    healthcheck.run(w, follow="none")  # the node is still bad: no second message
    assert len(receiver.bodies()) == 1


def test_the_health_check_leaves_delivery_to_a_live_watcher(node, receiver, tmp_path):
    w = node()
    n = Notifier(NotifySettings.from_config(w.config))
    n._beat()  # the watcher's notifier made a pass a moment ago
    sim.inject(w.config.gpu.sim_dir, "n1", 3, xid=79)
    _, outcome = healthcheck.run(w, follow="none")
    assert outcome.drained
    assert receiver.requests == []
    assert not os.path.exists(n.state_path)  # not even read into the outbox: the watcher's to do


def test_the_health_check_flushes_only_within_its_deadline(node, receiver):
    w = node()
    sim.inject(w.config.gpu.sim_dir, "n1", 3, xid=79)
    w.deadline = time.monotonic() + 1.2  # less left than the margin and the least flush need
    _, outcome = healthcheck.run(w, follow="none")
    assert outcome.drained  # remediation first, always
    assert receiver.requests == []
    w.deadline = None  # the next run, with its own deadline: nothing was lost
    healthcheck.run(w, follow="none")
    assert [m["kind"] for m in receiver.bodies()] == ["opened"]


def test_has_work_is_true_only_for_something_new_queued_or_open(setup, receiver):
    log, clock, notifier = setup
    n = notifier()
    assert not n.has_work()  # no log yet
    xid79(log)
    assert n.has_work()
    n.flush(5)
    assert n.has_work()  # open: a reminder or the back-in-service message may be due
    resume(log)
    n.flush(5)
    assert not n.has_work()
    receiver.stop()
    log.write("bridge_breaker_tripped", node="k1", slurm_node="n1", reason="3 nodes taken")
    n.flush(5)
    assert n.has_work()  # waiting in the outbox


# --- on the real testbed ---------------------------------------------------------------------


@pytest.mark.slurm
def test_xid79_under_a_job_one_message_within_5s_and_one_when_back(hooked_testbed, receiver, tmp_path):
    """The watcher's own notifier thread tells the drain; with the watcher gone, the health check's
    short flush tells the node back in service."""
    tb = hooked_testbed
    cfg = tmp_path / "config.toml"
    with open(tb.config_path, encoding="utf-8") as fh:
        cfg.write_text(fh.read() + f'\n[notify]\nsettle = 1.0\noutbox = "{tmp_path}/notify"\n'
                                   f'[[notify.webhook]]\nurl = "{receiver.url()}"\n')
    env = {**tb.env, "SLURM_HOOKS_CONFIG": str(cfg)}
    watcher = subprocess.Popen([sys.executable, "-m", "slurm_hooks", "watch", "--node", "n1"], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        job = tb.sbatch(TRAP_JOB, "--gres=gpu:1", "-w", "n1")
        # Under the job: its batch script runs. (A job shows RUNNING while its prolog still runs; an XID
        # then is the prolog's to find, and the prolog refuses the job instead of our requeueing it.)
        _, gpu = wait_started(tb, job, timeout=30)
        deadline = time.monotonic() + 10
        while not any(r.get("message") == "watcher started" for r in tb.audit_events()):
            assert time.monotonic() < deadline, "watcher did not start"
            time.sleep(0.05)
        sim.inject(tb.sim_dir, "n1", gpu, xid=79)
        tb.wait_node("n1", lambda x: x.drained and x.reason.startswith("slurm-hooks:"), timeout=5, interval=0.02)
        drained_at = time.time()
        deadline = time.monotonic() + 10
        while not receiver.bodies():
            assert time.monotonic() < deadline, "no message"
            time.sleep(0.05)
        [msg] = receiver.bodies()
        assert receiver.requests[0]["at"] - drained_at < 5.0
        assert msg["kind"] == "opened" and msg["node"] == "n1" and msg["gpus"][0]["index"] == gpu
        assert msg["finding"]["xid"] == 79 and msg["action"] == "reboot"
        assert msg["jobs"] == [{"job_id": str(job), "user": msg["jobs"][0]["user"], "name": msg["jobs"][0]["name"], "how": "requeued", "gpus": [gpu]}]
        # Mended: the health check judges the node again, resumes its own drain, and (no watcher
        # delivering any more) tells it itself within its run.
        sim.clear(tb.sim_dir, "n1")
        tb.cancel_all()
        watcher.terminate()
        watcher.wait(10)
        check = subprocess.run([sys.executable, "-m", "slurm_hooks", "check", "--node", "n1"], env=env,
                               capture_output=True, text=True, timeout=60)
        assert check.returncode == 0, check.stdout + check.stderr
        kinds = [m["kind"] for m in receiver.bodies()]
        assert kinds == ["opened", "resolved"], check.stderr
        assert receiver.bodies()[1]["incident"] == msg["incident"]
        assert receiver.bodies()[1]["out_of_service_s"] > 0
    finally:
        if watcher.poll() is None:
            watcher.terminate()
            watcher.wait(10)


def test_the_bridge_tells_the_reboots_and_replacements_it_asked_for_but_not_a_dry_run(setup, receiver):
    log, _, notifier = setup
    log.write("bridge_replace", node="k8s-a", slurm_node="n1", backend="template", requested="RebootNode/n1",
              action="reboot")
    log.write("bridge_replace", node="k8s-b", slurm_node="n2", backend="karpenter", requested="NodeClaim/x",
              action="replace")
    log.write("bridge_replace", node="k8s-c", slurm_node="n3", backend="karpenter", requested="NodeClaim/y",
              action="replace", dry_run=True)
    notifier().flush(5)
    msgs = receiver.bodies()
    assert [(m["kind"], m["node"]) for m in msgs] == [("reboot", "n1"), ("replace", "n2")]
    assert "asked for a reboot of node k8s-a (Slurm n1) through template: RebootNode/n1" in msgs[0]["text"]


def test_what_an_older_notifier_saved_about_an_incident_still_reads():
    from slurm_hooks.observe.incidents import Incident

    inc = Incident.from_dict({"id": "n1-x", "node": "n1", "first_seen": 1.0, "opened_at": 1.0,
                              "told": {"opened": "before this notifier", "escalated": ["replace"], "reminders": 2}})
    assert inc.told.opened and inc.told.backfilled and inc.told.escalated == ["replace"] and inc.told.reminders == 2
    assert Incident.from_dict(inc.to_dict()).told == inc.told


def test_a_missing_permission_in_the_bridge_is_told_and_a_poke_delivers_at_once(setup, receiver):
    log, _, notifier = setup
    n = notifier()
    stop = threading.Event()
    worker = threading.Thread(target=n.run, args=(stop, 60.0), daemon=True)
    worker.start()
    try:
        deadline = time.monotonic() + 10
        while not os.path.exists(n.heartbeat_path):  # the first pass is done: the next waits 60 s
            assert time.monotonic() < deadline
            time.sleep(0.02)
        log.write("bridge_permission_missing", level="error", node="k8s-a", slurm_node="n1", backend="karpenter",
                  error="403", message="the bridge may not delete nodeclaims.karpenter.sh")
        n.poke("bridge_permission_missing", {})  # what Reconciler(notify=...) calls
        deadline = time.monotonic() + 10
        while not receiver.bodies():
            assert time.monotonic() < deadline, "the poke did not wake the notifier"
            time.sleep(0.02)
    finally:
        stop.set()
        n.poke()
        worker.join(10)
    [msg] = receiver.bodies()
    assert msg["kind"] == "bridge" and msg["urgency"] == "high"
    assert msg["text"] == ("Kubernetes bridge, node k8s-a (Slurm n1): the bridge may not delete "
                           "nodeclaims.karpenter.sh.")
