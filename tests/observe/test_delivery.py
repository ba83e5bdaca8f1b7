"""Delivery as receivers fail in the field: an expired token (401), a deleted webhook (404/410), a
proxy that breaks the exchange, a secret file with a second line, a syslog with no socket.

A receiver-wide answer is an outage (every message waits, in order, none thrown away); only an
answer about the message (400/413/422) sets that one message aside. The URL is a secret: it is in
no output, log line, ``failed/`` file or ``notify status``. Receivers are real HTTP servers on
127.0.0.1 (``fakes.webhook``); the clock is injected: ten minutes pass in a loop.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import socket
import subprocess
import sys
import threading

import pytest
from fakes.config import notify_settings
from fakes.webhook import Receiver
from observe.test_notify import Clock, resume, xid79

from slurm_hooks import config, urlsecret
from slurm_hooks.observe import destinations
from slurm_hooks.observe.audit import AuditLog
from slurm_hooks.observe.destinations import DeliveryError, Syslog
from slurm_hooks.observe.incidents import build
from slurm_hooks.observe.notify import Notifier, NotifySettings, compose, pending, receivers_held, send_test

pytest_plugins = ["fakes.webhook"]

SECRET = "s3cr3t-T0-B0"


class Outage(Receiver):
    """Answers ``code`` while ``down``, then 200."""

    def __init__(self, code: int):
        self.code, self.down = code, True
        super().__init__()

    def judge(self, body: dict) -> int:
        return self.code if self.down else 200


def notifier(tmp_path, url: str, clock, said: list[str], **kw) -> Notifier:
    s = notify_settings(audit=str(tmp_path / "audit.jsonl"), dir=str(tmp_path / "notify"),
                 webhook=({"url": url, "format": "json"},), settle=0.0, timeout=2.0, retry_max=60.0, **kw)
    return Notifier(s, clock=clock, log=said.append, rng=random.Random(5), sleep=lambda s: None)


def everything_kept(tmp_path) -> str:
    """Every file the notifier keeps, as one text (to look for a secret in)."""
    out = []
    for root, _, names in os.walk(tmp_path / "notify"):
        for name in names:
            with open(os.path.join(root, name), encoding="utf-8", errors="replace") as fh:
                out.append(fh.read())
    return "\n".join(out)


@pytest.mark.parametrize("code", [401, 403, 404, 410, 503])
def test_a_receiver_answering_an_outage_for_ten_minutes_then_200_gets_every_message_in_order(tmp_path, code):
    rx = Outage(code)
    try:
        clock, said = Clock(), []
        log = AuditLog(str(tmp_path / "audit.jsonl"))
        n = notifier(tmp_path, rx.url(f"/services/{SECRET}"), clock, said)
        xid79(log, node="n1")
        n.flush(5)
        resume(log, "n1")
        xid79(log, node="n2", gpu=5)
        for minute in range(1, 11):
            clock.offset = minute * 60.0
            assert n.flush(5)["sent"] == 0
        assert len(rx.requests) >= 3 and {r["code"] for r in rx.requests} == {code}  # it was tried, and refused
        assert not (tmp_path / "notify" / "failed").exists()
        [held] = receivers_held(n.s, now=clock())  # what `notify status` says
        assert held.startswith(f"http://127.0.0.1:{rx.port} (webhook-") and "failed tries in a row" in held
        assert any(f"last error: HTTP {code}" in line for line in pending(n.outbox.entries()))
        rx.down = False
        for _ in range(20):
            clock.offset += 30.0
            n.flush(5)
        assert os.listdir(tmp_path / "notify" / "outbox") == []
        assert not (tmp_path / "notify" / "failed").exists()
        got = [(b["node"], b["kind"]) for b in rx.delivered(f"/services/{SECRET}")]
        assert sorted(got) == [("n1", "opened"), ("n1", "resolved"), ("n2", "opened")]
        assert got.index(("n1", "opened")) < got.index(("n1", "resolved"))
        assert said and all(SECRET not in m for m in said)
        assert SECRET not in everything_kept(tmp_path)
    finally:
        rx.stop()


@pytest.mark.parametrize("code", [400, 413, 422])
def test_an_answer_about_the_message_sets_that_message_aside_and_the_next_goes(tmp_path, receiver, code):
    clock, said = Clock(), []
    log = AuditLog(str(tmp_path / "audit.jsonl"))
    n = notifier(tmp_path, receiver.url(), clock, said)
    receiver.answers = [(code, {})]
    xid79(log, node="n1")
    xid79(log, node="n2")
    n.flush(5)
    clock.offset = 120.0
    n.flush(5)
    assert len(os.listdir(tmp_path / "notify" / "failed")) == 1
    assert [r["code"] for r in receiver.requests] == [code, 200]


class BrokenExchange:
    """A TCP server that answers every request with ``reply`` (raw bytes; b"" closes without a word)."""

    def __init__(self, reply: bytes):
        self.reply, self.hits = reply, 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    conn.recv(65536)
                    self.hits += 1
                    if self.reply:
                        conn.sendall(self.reply)
                except OSError:
                    pass

    def close(self) -> None:
        self.sock.close()


@pytest.mark.parametrize("reply", [b"", b"HELLO THERE\r\n\r\n", b"HTTP/1.1 2000000 OK\r\n\r\n"],
                         ids=["RemoteDisconnected", "BadStatusLine", "bad status code"])
def test_a_broken_exchange_is_an_outage_retried_never_a_discard(tmp_path, reply):
    server = BrokenExchange(reply)
    try:
        clock, said = Clock(), []
        log = AuditLog(str(tmp_path / "audit.jsonl"))
        n = notifier(tmp_path, f"http://127.0.0.1:{server.port}/services/{SECRET}", clock, said)
        xid79(log)
        for minute in range(3):
            clock.offset = minute * 120.0
            assert n.flush(5)["sent"] == 0
        assert server.hits >= 2
        [entry] = n.outbox.entries()
        assert entry.attempts >= 2 and entry.last_error
        assert not (tmp_path / "notify" / "failed").exists()
        assert said and all(SECRET not in m for m in said) and SECRET not in everything_kept(tmp_path)
    finally:
        server.close()


class LandingPage:
    """Where a moved receiver's redirect points: a page answering 200 to anything."""

    def __init__(self):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        owner, self.methods = self, []

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                owner.methods.append(self.command)
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"welcome")

            do_GET = do_POST = _answer  # noqa: N815 - http.server's names

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/welcome"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("code", [301, 302, 307])
def test_a_receiver_that_redirects_is_an_outage_said_never_a_delivery(tmp_path, receiver, code):
    """urllib re-sent a redirected POST as a GET without the message (a landing page's 200 counted as
    delivered: the page lost), or with the Authorization header to the other host."""
    page = LandingPage()
    try:
        receiver.answers = [(code, {"Location": page.url})] * 3
        clock, said = Clock(), []
        log = AuditLog(str(tmp_path / "audit.jsonl"))
        n = notifier(tmp_path, receiver.url(f"/services/{SECRET}"), clock, said)
        xid79(log)
        assert n.flush(5)["sent"] == 0
        [entry] = n.outbox.entries()
        assert entry.last_error.startswith(f"HTTP {code}") and "it redirects" in entry.last_error
        assert page.methods == []
        clock.offset = 600.0
        receiver.answers = []
        assert n.flush(5)["sent"] == 1  # the receiver is back where it was: delivered
    finally:
        page.stop()


def test_a_url_urllib_refuses_raises_a_delivery_error_that_does_not_hold_it():
    for url in (f"http://127.0.0.1:9/services/{SECRET}\nX-Evil: 1", f"http://127.0.0.1:9/services/{SECRET} x",
                f"127.0.0.1:9/services/{SECRET}", "http://[::1/x"):
        with pytest.raises(DeliveryError) as err:
            destinations.http_post(url, b"{}", {}, 1.0)
        assert SECRET not in str(err.value) and not err.value.permanent, url


def test_an_exception_a_sender_raises_with_the_url_in_it_is_kept_without_the_url(tmp_path):
    url = f"http://127.0.0.1:9/services/{SECRET}"

    def send(u, body, headers, timeout):
        raise RuntimeError(f"cannot post to {u} (path {u.split('9', 1)[1]})")

    clock, said = Clock(), []
    log = AuditLog(str(tmp_path / "audit.jsonl"))
    s = notify_settings(audit=log.path, dir=str(tmp_path / "notify"), webhook=({"url": url},), settle=0.0)
    n = Notifier(s, send=send, clock=clock, log=said.append)
    xid79(log)
    n.flush(5)
    assert said and all(SECRET not in m for m in said)
    assert SECRET not in everything_kept(tmp_path)


# --- the secret file ------------------------------------------------------------------------


def _validate(path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "slurm_hooks", "validate", "--config", str(path), "--json"],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("content", [f"https://hooks.example.org/services/{SECRET}\nsecond-line-{SECRET}\n",
                                     f"https://hooks.example.org/services/{SECRET}\x07\n",
                                     f"https://hooks.example.org/services/{SECRET} trailing\n"],
                         ids=["two lines", "a control character", "a space"])
def test_a_url_file_that_is_not_one_clean_line_fails_validate_and_nothing_shows_it(tmp_path, receiver, content):
    secret = tmp_path / "hook.url"
    secret.write_text(content)
    secret.chmod(0o600)
    path = tmp_path / "config.toml"
    path.write_text(f'[log]\naudit = "{tmp_path}/audit.jsonl"\n[state]\ndir = "{tmp_path}/state"\n'
                    f'[[notify.webhook]]\nurl_file = "{secret}"\n')
    out = _validate(path)
    rows = {r["check"]: r for r in json.loads(out.stdout)}
    assert rows["notify-secrets"]["status"] == "FAIL", out.stdout
    assert "one line" in rows["notify-secrets"]["message"] and str(secret) in rows["notify-secrets"]["message"]
    assert SECRET not in out.stdout + out.stderr
    # The notifier: the receiver waits without a URL, its message is kept, nothing shows the secret.
    env = {**os.environ, "SLURM_HOOKS_CONFIG": str(path)}
    xid79(AuditLog(str(tmp_path / "audit.jsonl")))
    shown = ""
    for argv in (["notify", "flush"], ["notify", "status"], ["notify", "test"]):
        run = subprocess.run([sys.executable, "-m", "slurm_hooks", *argv], capture_output=True, text=True,
                             timeout=120, env=env)
        shown += run.stdout + run.stderr
    assert "waiting" in shown and str(secret) in shown
    assert SECRET not in shown and SECRET not in everything_kept(tmp_path / "state")
    assert receiver.requests == []


@pytest.mark.parametrize("content", [f"xoxb-1234-{SECRET}", f"eyJhbGciOi.{SECRET}.SflKx", f"{SECRET}/services/x"],
                         ids=["a bot token", "a JWT", "a path without a host"])
def test_a_secret_file_holding_a_token_instead_of_a_url_is_refused_without_showing_any_of_it(tmp_path, content):
    secret = tmp_path / "hook.url"
    secret.write_text(content + "\n")
    with pytest.raises(config.ConfigError) as err:
        urlsecret.resolve_url({"url_file": str(secret)}, "[[notify.webhook]] #1")
    assert "must be an http:// or https:// URL" in str(err.value) and str(secret) in str(err.value)
    assert SECRET not in str(err.value)
    with pytest.raises(config.ConfigError) as err:
        config.parse(f'[[notify.webhook]]\nurl = "{content}"\n')
    assert SECRET not in str(err.value)


def test_a_url_with_credentials_in_it_leaves_neither_them_nor_its_path_in_an_error():
    url = f"https://bot:{SECRET}-pw@hooks.example.org/services/{SECRET}"
    text = destinations.scrub(f"refused /services/{SECRET} for user bot:{SECRET}-pw at {url}", url)
    assert SECRET not in text and "hooks.example.org" in text


# --- syslog, duplicates, notify test ----------------------------------------------------------


def test_syslog_without_its_socket_is_a_failed_delivery_not_a_delivered_one(tmp_path):
    with pytest.raises(DeliveryError, match="no syslog socket"):
        Syslog(socket=str(tmp_path / "no-dev-log")).send("x", "opened", {"text": "t"},
                                                          destinations.Delivery(1.0, 0.0))
    log = AuditLog(str(tmp_path / "audit.jsonl"))
    s = notify_settings(audit=log.path, dir=str(tmp_path / "notify"), syslog=True, settle=0.0)
    n = Notifier(s, clock=Clock(), log=lambda m: None)
    n.dests["syslog"] = Syslog(socket=str(tmp_path / "no-dev-log"))
    xid79(log)
    assert n.flush(5)["sent"] == 0
    [entry] = n.outbox.entries()
    assert "no syslog socket" in entry.last_error


def test_two_receivers_with_one_url_file_stay_two(tmp_path, receiver):
    secret = tmp_path / "hook.url"
    secret.write_text(receiver.url() + "\n")
    secret.chmod(0o600)
    cfg = config.parse(f'[[notify.webhook]]\nurl_file = "{secret}"\n[[notify.webhook]]\nurl_file = "{secret}"\n'
                       'format = "slack"\n')
    log = AuditLog(str(tmp_path / "audit.jsonl"))
    s = NotifySettings.from_config(cfg, str(tmp_path / "notify"))
    s = dataclasses.replace(s, audit=log.path, notify=dataclasses.replace(s.notify, settle=0.0))
    n = Notifier(s, log=lambda m: None)
    assert len(n.dests) == 2
    xid79(log)
    assert n.flush(5)["sent"] == 2
    assert sorted("blocks" in b for b in receiver.bodies()) == [False, True]
    path = tmp_path / "config.toml"
    path.write_text(f'[[notify.webhook]]\nurl_file = "{secret}"\n[[notify.webhook]]\nurl_file = "{secret}"\n')
    rows = {r["check"]: r for r in json.loads(_validate(path).stdout)}
    assert rows["notify-duplicates"]["status"] == "WARN"
    assert "#2 and [[notify.webhook]] #1 name the same URL" in rows["notify-duplicates"]["message"]


def test_notify_test_sends_one_marked_message_to_each_receiver_and_says_what_each_answered(tmp_path, receiver):
    refusing = Outage(401)
    try:
        path = tmp_path / "config.toml"
        path.write_text(f'[state]\ndir = "{tmp_path / "state"}"\n[log]\naudit = "{tmp_path / "audit.jsonl"}"\n'
                        f'[[notify.webhook]]\nurl = "{receiver.url(f"/ok/{SECRET}")}"\n'
                        f'[[notify.webhook]]\nurl = "{refusing.url(f"/expired/{SECRET}")}"\n')
        path.chmod(0o600)
        run = subprocess.run([sys.executable, "-m", "slurm_hooks", "notify", "test", "--config", str(path)],
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 1, run.stdout + run.stderr
        lines = run.stdout.splitlines()
        assert any(line.startswith("OK") and f"127.0.0.1:{receiver.port}" in line and "HTTP 200" in line
                   for line in lines), lines
        assert any(line.startswith("FAIL") and f"127.0.0.1:{refusing.port}" in line and "HTTP 401" in line
                   for line in lines), lines
        assert SECRET not in run.stdout + run.stderr
        [body] = receiver.bodies(f"/ok/{SECRET}")
        assert body["test"] is True and "test message" in body["text"]
    finally:
        refusing.stop()


def test_notify_test_answers_for_syslog_without_a_socket(tmp_path):
    s = notify_settings(audit=str(tmp_path / "a"), dir=str(tmp_path / "n"), syslog=True)
    [answer] = send_test(s)
    assert answer.ok == os.path.exists("/dev/log")
    if not answer.ok:
        assert "no syslog socket at /dev/log" in answer.said


# --- what a message says ----------------------------------------------------------------------


def test_a_message_names_every_finding_each_gpus_serial_and_the_job_owner(tmp_path):
    log = AuditLog(str(tmp_path / "audit.jsonl"))
    log.write("alert", node="n1", context="check", gpu=5, check="xid", severity="fail", action="reset",
              message="XID 94 (contained ECC error)", uuid="GPU-n1-5", serial="SN5", job=40, user="bob")
    xid79(log)
    with open(log.path, encoding="utf-8") as fh:
        [inc] = build(json.loads(line) for line in fh)
    text = compose(inc, "opened", inc.opened_at).text
    assert "XID 79 (GPU has fallen off the bus) on GPU 3 (GPU-n1-3, serial SN3)" in text
    assert "XID 94 (contained ECC error) on GPU 5 (GPU-n1-5, serial SN5)" in text
    assert text.index("XID 79") < text.index("XID 94")  # the harshest first
    assert "12 (alice)" in text and "40 (bob)" in text


def test_the_cluster_label_defaults_to_slurm_confs_cluster_name(tmp_path, monkeypatch):
    conf = tmp_path / "slurm.conf"
    (tmp_path / "more.conf").write_text("ResumeTimeout=1800\n")
    conf.write_text("# the lab\nClusterName=alpha\nSlurmctldHost=head\nInclude more.conf\n"
                    "NodeName=n[1-2] Gres=gpu:8\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    monkeypatch.delenv("SLURM_CLUSTER_NAME", raising=False)
    cfg = config.parse('[[notify.alertmanager]]\nurl = "http://127.0.0.1:9"\n')
    s = NotifySettings.from_config(cfg, str(tmp_path / "n"))
    assert s.cluster == "alpha" and s.resume_timeout == 1800.0
    assert s.hold_for("reboot") >= 1800.0 + s.hold_for("drain")
    cfg = config.parse('[notify]\ncluster = "beta"\n[[notify.alertmanager]]\nurl = "http://127.0.0.1:9"\n')
    assert NotifySettings.from_config(cfg, str(tmp_path / "n")).cluster == "beta"


def test_a_quiet_pass_writes_nothing(tmp_path, receiver):
    """The watcher makes a pass every second: with nothing new, no file is rewritten (each write is an
    fsync on the node's disk)."""
    clock, said = Clock(), []
    log = AuditLog(str(tmp_path / "audit.jsonl"))
    n = notifier(tmp_path, receiver.url(), clock, said, reminder_after=0.0)
    xid79(log)
    n.flush(5)
    cursor = tmp_path / "notify" / "cursor.json"
    before = os.stat(cursor)
    for _ in range(3):
        n.flush(5)
        assert notifier(tmp_path, receiver.url(), clock, said, reminder_after=0.0).flush(5)["sent"] == 0
    after = os.stat(cursor)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_an_auth_file_with_a_second_line_fails_validate_and_the_notifier_says_so_without_it(tmp_path):
    auth = tmp_path / "am.token"
    auth.write_text(f"tok-{SECRET}\nX-Evil: 1\n")
    auth.chmod(0o600)
    path = tmp_path / "config.toml"
    path.write_text(f'[[notify.alertmanager]]\nurl = "http://127.0.0.1:9"\nauth_file = "{auth}"\n')
    path.chmod(0o600)
    out = _validate(path)
    rows = {r["check"]: r for r in json.loads(out.stdout)}
    assert rows["notify-secrets"]["status"] == "FAIL" and "one line" in rows["notify-secrets"]["message"]
    assert SECRET not in out.stdout + out.stderr
    said: list[str] = []
    Notifier(NotifySettings.from_config(config.load(str(path)), str(tmp_path / "n")), log=said.append)
    assert len(said) == 1 and str(auth) in said[0] and SECRET not in said[0]


def test_an_escalation_to_replace_names_the_gpu_its_uuid_and_serial(tmp_path, receiver):
    clock, said = Clock(), []
    log = AuditLog(str(tmp_path / "audit.jsonl"))
    n = notifier(tmp_path, receiver.url(), clock, said)
    log.write("alert", node="n1", context="check", gpu=6, check="xid", severity="fail", action="reboot",
              message="XID 79 (GPU has fallen off the bus)", uuid="GPU-8f2c", serial="1652921012345")
    log.write("action", node="n1", action="drain", target="n1", result="ok", reason="slurm-hooks: XID 79 on GPU 6 [reboot]")
    n.flush(5)
    log.write("action", node="n1", action="drain", target="n1", result="ok", reason="slurm-hooks: XID 79 on GPU 6 [replace]")
    n.flush(5)
    opened, escalated = receiver.bodies()
    assert escalated["kind"] == "escalated"
    assert "on GPU 6 (GPU-8f2c, serial 1652921012345)" in escalated["text"]


def test_two_escalations_told_in_one_pass_are_delivered_in_the_order_they_happened(tmp_path, receiver):
    """reset, then reboot, between two passes (a reset refused at once): the page for [reboot] comes
    last, and Alertmanager's [reset] alert is ended by it, not fired again after it."""
    clock, said = Clock(), []
    log = AuditLog(str(tmp_path / "audit.jsonl"))
    n = notifier(tmp_path, receiver.url(), clock, said)
    log.write("alert", node="n1", context="check", gpu=2, check="xid", severity="fail", action="reset",
              message="XID 94 (contained ECC error)")
    log.write("action", node="n1", action="drain", target="n1", result="ok", reason="slurm-hooks: XID 94 on GPU 2 [drain]")
    n.flush(5)
    log.write("action", node="n1", action="drain", target="n1", result="ok", reason="slurm-hooks: XID 94 on GPU 2 [reset]")
    log.write("action", node="n1", action="repair-reboot", target="n1", result="start",
              reason="slurm-hooks: XID 94 on GPU 2 [reboot]")
    n.flush(5)
    assert [(b["kind"], b["action"]) for b in receiver.bodies()] == \
        [("opened", "drain"), ("escalated", "reset"), ("escalated", "reboot")]


def test_a_line_syslog_cannot_take_is_that_messages_refusal_and_a_socket_error_an_outage():
    def refuse(priority: int, text: str) -> None:
        raise ValueError("embedded null character")

    def broken(priority: int, text: str) -> None:
        raise ConnectionRefusedError(111, "Connection refused")

    for send, permanent in ((refuse, True), (broken, False)):
        with pytest.raises(DeliveryError) as err:
            Syslog(send=send).send("x", "opened", {"text": "t"}, destinations.Delivery(1.0, 0.0))
        assert err.value.permanent is permanent
