"""Notifications at fleet scale, direct webhooks: a bounded outbox, a pace per receiver, Slack's
limits, secrets kept secret.

Receivers are real HTTP servers on 127.0.0.1 (``fakes.webhook.Receiver``; a Slack-like one here
that refuses what Slack's documented limits refuse). The clock and the randomness are injected:
thirty days of outage pass in a loop, nothing sleeps.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import stat
import subprocess
import sys
import time

import pytest
from fakes.config import notify_settings
from fakes.webhook import Receiver
from observe.test_notify import Clock, resume, xid79

from slurm_hooks import config, urlsecret
from slurm_hooks.errors import ConfigError
from slurm_hooks.observe import destinations
from slurm_hooks.observe.audit import AuditLog
from slurm_hooks.observe.notify import BACKOFF_EXP_MAX, Notifier, NotifySettings, backoff
from slurm_hooks.observe.outbox import FAILED_KEEP, Entry
from slurm_hooks.values import fields

pytest_plugins = ["fakes.webhook"]

DAY = 86400.0


@pytest.fixture
def make(tmp_path, receiver):
    log = AuditLog(str(tmp_path / "audit.jsonl"))
    clock = Clock()
    said: list[str] = []

    def notifier(**kw) -> Notifier:
        hooks = kw.pop("webhook", ({"url": receiver.url(), "format": "json", "name": "test"},))
        monotonic = kw.pop("monotonic", time.monotonic)
        s = notify_settings(audit=log.path, dir=str(tmp_path / "notify"), webhook=hooks, settle=0.0, timeout=2.0,
                     retry_max=kw.pop("retry_max", 300.0), **kw)
        return Notifier(s, clock=clock, log=said.append, rng=random.Random(7), monotonic=monotonic)

    return log, clock, notifier, said


def test_the_backoff_never_overflows_and_stays_within_its_cap():
    rng = random.Random(1)
    assert backoff(1025, 300.0, rng) <= 300.0  # 2 ** 1024 would overflow a float
    assert 150.0 <= backoff(10 ** 9, 300.0, rng) <= 300.0
    assert all(0.5 <= backoff(1, 300.0, rng) <= 1.0 for _ in range(50))  # equal jitter: half fixed
    assert 2.0 ** BACKOFF_EXP_MAX > 300.0


def test_an_entry_after_1025_attempts_is_saved_and_retried_like_any_other(make, receiver, tmp_path):
    log, clock, notifier, _ = make
    receiver.stop()
    xid79(log)
    n = notifier(reminder_after=0.0)
    n.flush(5)
    [path] = (tmp_path / "notify" / "outbox").iterdir()
    entry = json.loads(path.read_text())
    entry["attempts"] = 1024
    path.write_text(json.dumps(entry))
    clock.offset = 10 * DAY - 1
    entry["created"] = clock()
    path.write_text(json.dumps(entry))
    (tmp_path / "notify" / "pace.json").unlink(missing_ok=True)
    n = notifier(reminder_after=0.0)  # a restart, reading the entry as edited
    n.flush(5)
    after = json.loads(path.read_text())
    assert after["attempts"] == 1025 and after["next_at"] <= clock() + 300.0 * 1.2
    receiver.start()
    clock.offset += 400
    assert n.flush(5)["sent"] == 1


def test_a_receiver_down_30_days_keeps_the_outbox_capped_and_sends_the_newest_first(make, receiver, tmp_path):
    log, clock, notifier, _ = make
    receiver.stop()
    n = notifier(max_queued=40, max_age=7 * DAY, reminder_after=4 * 3600.0, rate=1.0)
    # A fault every 6 hours on another node, each back in service an hour later; reminders on the
    # one node that stays out.
    xid79(log, node="stuck")
    for hour in range(0, 30 * 24):
        clock.offset = hour * 3600.0
        if hour % 6 == 0:
            node = f"n{hour // 6}"
            log.write("alert", node=node, context="watch", gpu=1, check="xid", severity="fail", action="replace",
                      message="XID 79 (GPU has fallen off the bus)", ts=clock())
            log.write("action", node=node, action="drain", target=node, result="ok", ts=clock(),
                      reason="slurm-hooks: XID 79 on GPU 1 [replace]")
        if hour % 6 == 1:
            log.write("action", node=f"n{hour // 6}", action="resume", target=f"n{hour // 6}", result="ok", ts=clock())
        n.flush(5)
        waiting = os.listdir(tmp_path / "notify" / "outbox")
        assert len(waiting) <= 40
    reminders = [e for e in n.outbox.entries() if e.kind == "reminder"]
    assert len(reminders) == 1  # coalesced: the latest one only
    assert n.outbox.dropped(next(iter(n.dests))) > 0
    receiver.start()
    clock.offset += 3600.0  # past any hold
    for _ in range(60):
        clock.offset += 10.0
        n.flush(5)
    bodies = receiver.bodies()
    assert len(bodies) <= 40 + 2
    opened = [b for b in bodies if b["kind"] == "opened"]
    assert opened[0]["node"] == "n119"  # the newest incident first
    nodes = [int(b["node"][1:]) for b in opened if b["node"] != "stuck"]
    assert nodes == sorted(nodes, reverse=True)
    assert "dropped" in bodies[0] and "older message(s) for this receiver were dropped" in bodies[0]["dropped"]
    assert all("dropped" not in b for b in bodies[1:])  # said once
    assert os.listdir(tmp_path / "notify" / "outbox") == []


def test_an_unreadable_entry_is_moved_aside_reported_once_and_blocks_nothing(make, receiver, tmp_path):
    log, clock, notifier, said = make
    receiver.stop()
    xid79(log, node="n1")
    xid79(log, node="n2")
    n = notifier()
    n.flush(5)
    box = tmp_path / "notify" / "outbox"
    first = sorted(box.iterdir())[0]
    (box / ".torn").write_text("{not json")  # replaced under us (files here change only by rename)
    os.replace(box / ".torn", first)
    receiver.start()
    clock.offset = 600
    assert n.flush(5)["sent"] == 1
    assert os.listdir(tmp_path / "notify" / "bad") == [first.name]
    assert sum("unreadable outbox file" in m for m in said) == 1
    assert not n.has_work() or os.listdir(box) == []
    clock.offset = 700
    n.flush(5)
    assert sum("unreadable outbox file" in m for m in said) == 1


def test_a_message_the_receiver_chokes_on_does_not_block_the_others(make, receiver, tmp_path):
    log, clock, notifier, said = make
    xid79(log, node="n1")
    xid79(log, node="n2")
    n = notifier()
    calls: list[str] = []

    def post(url, body, headers, timeout):
        msg = json.loads(body)
        calls.append(msg["node"])
        if msg["node"] == "n2":
            raise destinations.DeliveryError("HTTP 400 Bad Request", permanent=True)
        return 200

    next(iter(n.dests.values())).post = post
    n.flush(5)
    assert sorted(calls) == ["n1", "n2"]
    assert len(os.listdir(tmp_path / "notify" / "failed")) == 1


def test_a_pass_ends_at_its_deadline_each_request_within_what_is_left_and_the_rest_waits(make, receiver, tmp_path):
    """The pass's deadline is on the notifier's monotonic clock (a test's own): each request may take
    the receiver's timeout or what is left of the pass, the least; none starts past the deadline."""
    log, clock, notifier, _ = make
    elapsed = [0.0]
    for i in range(4):
        xid79(log, node=f"n{i}")
    n = notifier(monotonic=lambda: elapsed[0])
    given: list[float] = []

    def post(url, body, headers, timeout):
        given.append(timeout)
        elapsed[0] += 1.0  # each request takes a second
        return 200

    next(iter(n.dests.values())).post = post
    assert n.flush(2.5)["sent"] == 3
    assert given == [2.0, 1.5, 0.5]  # the 2 s timeout, then what was left of the 2.5 s
    assert len(os.listdir(tmp_path / "notify" / "outbox")) == 1
    result = n.flush(10)
    assert (result["sent"], result["waiting"]) == (1, 0)


def test_an_entry_saved_and_loaded_is_the_same_entry_every_field_but_its_path(tmp_path):
    path = tmp_path / "e.json"
    entry = Entry(id="m1", dest="test", kind="reminder", message={"text": "x", "jobs": [{"job_id": "7"}]},
                  created=1.5, incident="n1-1", attempts=3, next_at=9.5, last_error="HTTP 503", seq=4, path="")
    path.write_text(entry.to_json())
    assert set(json.loads(path.read_text())) == {f.name for f in fields(Entry)} - {"path"}
    assert Entry.load(str(path)) == entry


def test_failed_messages_are_pruned_to_the_newest(make, tmp_path):
    log, clock, notifier, _ = make
    n = notifier()
    failed = tmp_path / "notify" / "failed"
    failed.mkdir(parents=True)
    for k in range(FAILED_KEEP + 30):
        p = failed / f"m{k}.json"
        p.write_text("{}")
        os.utime(p, (1000 + k, 1000 + k))
    assert n.outbox.prune_failed() == 30
    assert len(os.listdir(failed)) == FAILED_KEEP and not (failed / "m0.json").exists()


def test_a_429_holds_the_receiver_for_its_retry_after_with_jitter(make, receiver):
    log, clock, notifier, _ = make
    receiver.answers = [(429, {"Retry-After": "120"})]
    xid79(log, node="n1")
    n = notifier()
    n.flush(5)
    assert len(receiver.requests) == 1
    for t in (10, 60, 119):
        clock.offset = t
        n.flush(5)
    assert len(receiver.requests) == 1  # nothing before Retry-After
    clock.offset = 120 * 1.2 + 1  # at most 20 % jitter on top
    n.flush(5)
    assert len(receiver.requests) == 2 and receiver.requests[1]["headers"]["Idempotency-Key"] == "n1-" \
        + receiver.requests[1]["body"]["incident"].split("-", 1)[1] + "/opened"


def test_a_retry_after_of_years_holds_the_receiver_an_hour_at_most(make, receiver):
    """A proxy's "Retry-After: 99999999" (three years) must not silence a receiver for ever: the hold
    is kept on disk, restarts keep it."""
    log, clock, notifier, _ = make
    receiver.answers = [(503, {"Retry-After": "99999999"})]
    xid79(log, node="n1")
    n = notifier()
    n.flush(5)
    assert len(receiver.requests) == 1
    clock.offset = 3600 * 1.2 + 1  # an hour, and at most 20 % jitter on top
    n.flush(5)
    assert len(receiver.requests) == 2 and receiver.requests[1]["code"] == 200


def test_a_bridge_message_about_a_node_with_a_253_character_name_is_queued_and_delivered(make, receiver):
    """Kubernetes allows node names of 253 characters: the message's file name passed the file
    system's 255 bytes, put() failed every pass and every message waited behind it for ever."""
    log, clock, notifier, said = make
    kube_node = "gpu-" + "a" * 240 + ".internal"
    log.write("bridge_permission_missing", node=kube_node, slurm_node="n1", message="cannot patch nodes")
    xid79(log, node="n2")
    n = notifier()
    assert n.flush(5)["sent"] == 2
    assert {b["kind"] for b in receiver.bodies()} == {"bridge", "opened"}
    assert n.flush(5)["queued"] == 0 and not [m for m in said if "pass failed" in m]


def test_one_receiver_takes_at_most_its_rate(make, receiver):
    log, clock, notifier, _ = make
    for k in range(12):
        xid79(log, node=f"n{k}")
    n = notifier(rate=1.0)
    n.flush(5)
    assert len(receiver.requests) == 5  # the burst
    clock.offset = 3.0
    n.flush(5)
    assert len(receiver.requests) == 8  # one a second
    clock.offset = 60.0
    n.flush(5)
    assert len(receiver.requests) == 12


# --- Slack's limits ---------------------------------------------------------------------------


class SlackReceiver(Receiver):
    """Answers as Slack's incoming webhooks do when a limit of the docs is broken: 400 invalid_blocks."""

    def judge(self, body: dict) -> int:
        blocks = body.get("blocks", [])
        if len(body.get("text", "")) > destinations.SLACK_TEXT_MAX or len(blocks) > destinations.SLACK_BLOCKS_MAX:
            return 400
        for b in blocks:
            if b["type"] == "section":
                if len(b.get("text", {}).get("text", "")) > destinations.SLACK_SECTION_MAX:
                    return 400
                fields = b.get("fields", [])
                if len(fields) > destinations.SLACK_FIELDS_MAX or any(
                        len(f["text"]) > destinations.SLACK_FIELD_MAX for f in fields):
                    return 400
        return 200


def test_200_requeued_jobs_make_a_message_slack_accepts(make, tmp_path):
    slack = SlackReceiver()
    try:
        log, _, notifier, _ = make
        xid79(log, jobs=range(1000, 1200), user="<!channel> & co")
        n = notifier(webhook=({"url": slack.url("/services/T0/B0/secret"), "format": "slack"},))
        assert n.flush(5)["sent"] == 1
        [req] = slack.requests
        assert req["code"] == 200
        jobs = req["body"]["blocks"][1]["text"]["text"]
        assert jobs.startswith("*Jobs requeued* (200): 1000 (&lt;!channel&gt; &amp; co), ")
        assert jobs.endswith(" more") and " ... and " in jobs and len(jobs) <= destinations.SLACK_SECTION_MAX
        assert "<!channel>" not in json.dumps(req["body"])
    finally:
        slack.stop()


def test_the_slack_receiver_refuses_a_section_over_its_limit():
    slack = SlackReceiver()
    try:
        body = {"text": "x", "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": "y" * 3001}}]}
        with pytest.raises(destinations.DeliveryError, match="HTTP 400") as err:
            destinations.http_post(slack.url(), json.dumps(body).encode(), {"Content-Type": "application/json"}, 5)
        assert err.value.permanent
    finally:
        slack.stop()


def test_fit_items_says_how_many_more():
    assert destinations.fit_items("J: ", ["a", "b"], 100) == "J: a, b"
    text = destinations.fit_items("J: ", [str(k) * 5 for k in range(100)], 60)
    assert len(text) <= 60 and text.endswith("more")
    shown = text[3:].split(" ... and ")[0].split(", ")
    assert text.endswith(f"... and {100 - len(shown)} more")


# --- secrets ----------------------------------------------------------------------------------


def test_the_url_comes_from_a_file_or_the_environment_and_is_never_printed(tmp_path, receiver, monkeypatch):
    secret_path = receiver.url("/services/T0/B0/s3cr3t")
    url_file = tmp_path / "slack.url"
    url_file.write_text(secret_path + "\n")
    url_file.chmod(0o600)
    cfg = config.parse(f'[[notify.webhook]]\nurl_file = "{url_file}"\n[[notify.webhook]]\nurl_env = "HOOK_URL"\n')
    monkeypatch.setenv("HOOK_URL", receiver.url("/env-hook"))
    log = AuditLog(str(tmp_path / "audit.jsonl"))
    xid79(log)
    said: list[str] = []
    s = NotifySettings.from_config(cfg, str(tmp_path / "notify"))
    s = dataclasses.replace(s, audit=log.path, notify=dataclasses.replace(s.notify, settle=0.0))
    n = Notifier(s, log=said.append)
    assert n.flush(5)["sent"] == 2
    assert {r["path"] for r in receiver.requests} == {"/services/T0/B0/s3cr3t", "/env-hook"}
    receiver.stop()
    resume(log)
    n.flush(5)
    assert said and all("s3cr3t" not in m and "env-hook" not in m for m in said)
    assert any(f"127.0.0.1:{receiver.port}" in m for m in said)  # the host, to know which one


def test_an_unreadable_url_file_names_the_file_and_the_message_waits(tmp_path):
    cfg = config.parse(f'[[notify.webhook]]\nurl_file = "{tmp_path}/missing.url"\n')
    said: list[str] = []
    Notifier(NotifySettings.from_config(cfg, str(tmp_path / "n")), log=said.append)
    assert said == [f"{tmp_path}/missing.url: [[notify.webhook]] #1 url_file: cannot read: No such file or directory"]
    (tmp_path / "bad.url").write_text("hooks.slack.com/services/T0/B0/s3cr3t")
    with pytest.raises(ConfigError) as err:
        urlsecret.resolve_url({"url_file": str(tmp_path / "bad.url")}, "[[notify.webhook]] #1")
    assert "s3cr3t" not in str(err.value) and "hooks.slack.com" in str(err.value)


def test_a_table_names_exactly_one_source_of_its_url():
    with pytest.raises(ConfigError, match="needs exactly one of url_file"):
        config.parse('[[notify.webhook]]\nformat = "slack"\n')
    with pytest.raises(ConfigError, match="not url and url_env"):
        config.parse('[[notify.webhook]]\nurl = "https://a/b"\nurl_env = "X"\n')
    with pytest.raises(ConfigError) as err:
        config.parse('[[notify.webhook]]\nurl = "ftp://hooks.example.org/services/s3cr3t"\n')
    assert "s3cr3t" not in str(err.value) and "ftp://hooks.example.org" in str(err.value)


def _validate(path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "slurm_hooks", "validate", "--config", str(path), "--json"],
                          capture_output=True, text=True, timeout=120)


def test_validate_fails_a_world_readable_config_that_holds_a_webhook_url(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text('[[notify.webhook]]\nurl = "https://hooks.slack.com/services/T0/B0/s3cr3t"\nformat = "slack"\n')
    path.chmod(0o644)
    out = _validate(path)
    rows = {r["check"]: r for r in json.loads(out.stdout)}
    assert rows["notify-secrets"]["status"] == "FAIL", out.stdout
    assert "readable by its group and others (mode 0644)" in rows["notify-secrets"]["message"]
    assert "s3cr3t" not in out.stdout + out.stderr
    path.chmod(0o600)
    rows = {r["check"]: r for r in json.loads(_validate(path).stdout)}
    assert rows["notify-secrets"]["status"] == "PASS"


def test_validate_fails_a_url_file_readable_by_others(tmp_path):
    secret = tmp_path / "slack.url"
    secret.write_text("https://hooks.slack.com/services/T0/B0/s3cr3t\n")
    secret.chmod(0o644)
    path = tmp_path / "config.toml"
    path.write_text(f'[[notify.webhook]]\nurl_file = "{secret}"\n')
    path.chmod(0o644)  # no secret in it: readable is fine
    out = _validate(path)
    rows = {r["check"]: r for r in json.loads(out.stdout)}
    assert rows["notify-secrets"]["status"] == "FAIL" and str(secret) in rows["notify-secrets"]["message"]
    assert "s3cr3t" not in out.stdout + out.stderr
    secret.chmod(0o600)
    rows = {r["check"]: r for r in json.loads(_validate(path).stdout)}
    assert rows["notify-secrets"]["status"] == "PASS"


@pytest.mark.parametrize("mode, readers", [(0o600, ""), (0o400, ""), (0o660, "its group"), (0o640, "its group"),
                                           (0o604, "others"), (0o644, "its group and others")])
def test_validate_passes_a_url_file_only_its_owner_can_read(tmp_path, mode, readers):
    from slurm_hooks.preflight.environment import check_notify_secrets

    secret = tmp_path / "slack.url"
    secret.write_text("https://hooks.slack.com/services/T0/B0/s3cr3t\n")
    secret.chmod(mode)
    path = tmp_path / "config.toml"
    path.write_text(f'[[notify.webhook]]\nurl_file = "{secret}"\n')
    [row] = check_notify_secrets(config.load(str(path)))
    if not readers:
        assert row.status.value == "PASS" and "readable by its owner alone" in row.message
        return
    assert row.status.value == "FAIL"
    assert f"url_file {secret} is readable by {readers} (mode {mode:04o}): run chmod 600 {secret}" in row.message
    assert "s3cr3t" not in row.message + row.fix


def test_validate_fails_a_config_holding_a_url_that_its_group_can_read(tmp_path):
    from slurm_hooks.preflight.environment import check_notify_secrets

    path = tmp_path / "config.toml"
    path.write_text('[[notify.webhook]]\nurl = "https://hooks.slack.com/services/T0/B0/s3cr3t"\n')
    path.chmod(0o640)
    [row] = check_notify_secrets(config.load(str(path)))
    assert row.status.value == "FAIL" and f"readable by its group (mode 0640): run chmod 600 {path}" in row.message
    path.chmod(0o600)
    assert [r.status.value for r in check_notify_secrets(config.load(str(path)))] == ["PASS"]


def test_render_out_writes_0600_and_gives_slinky_a_secret(tmp_path):
    pytest.importorskip("jinja2")  # render is cluster-side (Python >= 3.10 with the k8s extra)
    yaml = pytest.importorskip("yaml")
    node_cfg = tmp_path / "node.toml"
    node_cfg.write_text('[[notify.webhook]]\nurl = "https://hooks.slack.com/services/T0/B0/s3cr3t"\n')
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "slurm_hooks", "render", "--out", str(out), "--node-config",
                        str(node_cfg)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    for name in os.listdir(out):
        assert stat.S_IMODE(os.stat(out / name).st_mode) == 0o600, name
    values = yaml.safe_load((out / "slinky-values.yaml").read_text())
    [secret] = [o for o in values["extraObjects"] if o["kind"] == "Secret"]
    assert "s3cr3t" in secret["stringData"]["config.toml"]
    assert not any("s3cr3t" in json.dumps(o) for o in values["extraObjects"] if o["kind"] == "ConfigMap")
    [vol] = [v for v in values["nodesets"]["slinky"]["podSpec"]["volumes"] if v["name"] == "slurm-hooks-config"]
    assert vol["secret"]["secretName"] == secret["metadata"]["name"]
    assert vol["secret"]["items"] == [{"key": "config.toml", "path": "config.toml", "mode": 0o600}]


def test_render_refuses_a_bridge_config_with_a_receiver_url_in_it(tmp_path):
    pytest.importorskip("jinja2")
    bridge_cfg = tmp_path / "bridge.toml"
    bridge_cfg.write_text('[bridge]\nmapping = "slinky"\n[[notify.alertmanager]]\nurl = "http://am:9093/s3cr3t"\n')
    bridge_cfg.chmod(0o600)
    r = subprocess.run([sys.executable, "-m", "slurm_hooks", "render", "--config", str(bridge_cfg)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "s3cr3t" not in r.stdout + r.stderr
    assert "[[notify.alertmanager]] #1 url: the bridge's config is rendered into a ConfigMap" in r.stderr


def test_alertmanager_gets_the_authorization_from_its_file(make, receiver, tmp_path):
    log, _, notifier, _ = make
    token = tmp_path / "am.auth"
    token.write_text("s3cr3t-token\n")
    token.chmod(0o600)
    basic = tmp_path / "am.basic"
    basic.write_text("Basic dXNlcjpwYXNz\n")
    xid79(log)
    n = notifier(webhook=(), alertmanager=({"url": receiver.url("/am1"), "auth_file": str(token)},
                                             {"url": receiver.url("/am2/api/v2/alerts"), "auth_file": str(basic)}))
    assert n.flush(5)["sent"] == 2
    by_path = {r["path"]: r for r in receiver.requests}
    assert by_path["/am1/api/v2/alerts"]["headers"]["Authorization"] == "Bearer s3cr3t-token"
    assert by_path["/am2/api/v2/alerts"]["headers"]["Authorization"] == "Basic dXNlcjpwYXNz"
    [alert] = by_path["/am1/api/v2/alerts"]["body"]
    assert alert["labels"] == {"alertname": "SlurmHooksXid", "node": "n1", "gpu": "3", "xid": "79",
                               "action": "replace", "severity": "critical"}
    assert alert["annotations"]["summary"].startswith("n1 drained [replace]: XID 79")


@pytest.mark.parametrize("poison", [{"ts": "noon", "kind": "alert", "node": "n9"},
                                    {"kind": "action", "node": "n9", "action": "drain", "result": "ok", "reason": 5},
                                    {"ts": None, "kind": "bridge_breaker_tripped"}],
                         ids=["ts not a number", "reason not text", "a bridge record with no time"])
def test_one_record_that_makes_no_sense_does_not_hold_every_message_back(make, receiver, poison):
    """A hand-edited line or another version's: it raised in every pass, the cursor never moved past
    it, and nothing was told again."""
    log, clock, notifier, said = make
    with open(log.path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"ts": clock(), **poison}) if "ts" not in poison else json.dumps(poison))
        fh.write("\n")
    xid79(log, node="n1")
    n = notifier()
    assert n.flush(5)["sent"] == 1
    assert [b["node"] for b in receiver.bodies()] == ["n1"]
