"""``notify test`` and ``notify flush`` prove what the senders will do: the test message goes the way
the watcher and the health check send (through the outbox, a ``url_env`` read from the environment
``slurm-hooks install`` laid for the programs, an Alertmanager asked whether it is one), a receiver
that takes it is no longer held back, and a flush by hand tries a held receiver now.

Receivers are real HTTP servers on 127.0.0.1 (``fakes.webhook``); the commands run as an admin runs
them, in a subprocess, against a config file.
"""

from __future__ import annotations

import os
import subprocess
import sys

from fakes.config import write_sim_config
from fakes.webhook import Receiver
from observe.test_notify import xid79

from slurm_hooks import config
from slurm_hooks.install import apply, layout
from slurm_hooks.observe.audit import AuditLog
from slurm_hooks.observe.notify import Notifier, NotifySettings, receivers_held, send_test

pytest_plugins = ["fakes.webhook"]


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("SLURM_HOOKS_CONFIG", "ALERTS_URL")}
    return subprocess.run([sys.executable, "-m", "slurm_hooks", *args], capture_output=True, text=True,
                          env={**base, **(env or {})}, timeout=120)


def taken(receiver: Receiver) -> list[str]:
    """The kinds of the messages the receiver took (answered 200), in order."""
    return [r["body"]["kind"] for r in receiver.requests if r["code"] == 200]


def held_by_an_outage(tmp_path, receiver: Receiver) -> tuple[str, NotifySettings]:
    """A config with one webhook, an incident told to it while it answered 503 with Retry-After 600:
    its message waits, the receiver is held back for ten minutes. The receiver answers 200 after."""
    path = write_sim_config(tmp_path, f'[[notify.webhook]]\nurl = "{receiver.url()}"\n[notify]\nsettle = 0.0\n')
    path.chmod(0o600)
    settings = NotifySettings.from_config(config.load(str(path)))
    receiver.answers = [(503, {"Retry-After": "600"})]
    xid79(AuditLog(settings.audit))
    assert Notifier(settings, log=lambda m: None).flush(5)["sent"] == 0
    [held] = receivers_held(settings)
    assert "next try after" in held
    return str(path), settings


def test_a_notify_test_that_gets_through_lifts_the_hold_and_what_waits_goes_at_the_next_pass(tmp_path, receiver):
    """An admin mends the receiver and runs `notify test`: OK. Then the receiver is no longer held and
    the watcher's next pass (a plain flush) delivers the incident now, not after the ten minutes."""
    path, settings = held_by_an_outage(tmp_path, receiver)
    run = cli("notify", "test", "--config", path, "--prefix", str(tmp_path / "no-install"))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "OK" in run.stdout and "hold is lifted: 1 waiting message(s) go now" in run.stdout
    assert receivers_held(settings) == []
    assert Notifier(settings, log=lambda m: None).flush(5)["sent"] == 1
    assert taken(receiver) == ["test", "opened"]


def test_notify_flush_by_hand_delivers_now_to_a_receiver_back_from_an_outage(tmp_path, receiver):
    """The docs say flush delivers now: a held receiver is tried at once (once: a failure holds it again)."""
    path, _ = held_by_an_outage(tmp_path, receiver)
    run = cli("notify", "flush", "--config", path)
    assert run.returncode == 0, run.stderr
    assert "1 sent, 0 waiting" in run.stdout
    assert taken(receiver) == ["opened"]


def test_notify_flush_by_hand_tries_a_receiver_still_out_once_and_says_it_is_held(tmp_path, receiver):
    path, _ = held_by_an_outage(tmp_path, receiver)
    receiver.answers = [(503, {})] * 5
    run = cli("notify", "flush", "--config", path)
    assert "0 sent, 1 waiting" in run.stdout and "next try after" in run.stdout, run.stdout
    assert len(receiver.requests) == 2  # the outage's try, and this one: not one per message or more


def test_an_alertmanager_receiver_pointing_at_a_plain_web_server_fails_notify_test(tmp_path, receiver):
    """A web server that takes any POST is not an Alertmanager: asked GET /api/v2/status, it does not
    answer as one, and no alert is posted to it."""
    path = write_sim_config(tmp_path, f'[[notify.alertmanager]]\nurl = "{receiver.url("/")}"\n')
    path.chmod(0o600)
    run = cli("notify", "test", "--config", str(path))
    assert run.returncode == 1
    [line] = run.stdout.splitlines()
    assert line.startswith("FAIL") and "not an Alertmanager (GET /api/v2/status: HTTP 501" in line, line
    assert receiver.requests == []


def test_a_receiver_whose_url_cannot_be_read_says_why_on_its_own_line(tmp_path):
    secret = tmp_path / "missing.url"
    path = write_sim_config(tmp_path, f'[[notify.webhook]]\nurl_file = "{secret}"\n')
    run = cli("notify", "test", "--config", str(path))
    assert run.returncode == 1
    [line] = run.stdout.splitlines()
    assert line.startswith("FAIL") and f"not sent: its URL could not be read: {secret}: [[notify.webhook]] #1 " \
        "url_file: cannot read: No such file or directory" in line, line
    assert "above" not in run.stdout + run.stderr


def test_notify_test_fails_where_the_senders_cannot_queue_a_message(tmp_path, receiver):
    """The senders write each message to the outbox before they send it: a test that cannot write
    there fails, as every real message would wait in vain."""
    (tmp_path / "not-a-dir").write_text("")
    path = write_sim_config(tmp_path, f'[[notify.webhook]]\nurl = "{receiver.url()}"\n'
                                      f'[notify]\noutbox = "{tmp_path / "not-a-dir" / "notify"}"\n')
    path.chmod(0o600)
    run = cli("notify", "test", "--config", str(path))
    assert run.returncode == 1, run.stdout
    assert "FAIL" in run.stdout and "cannot use" in run.stdout and "Not a directory" in run.stdout, run.stdout
    assert receiver.requests == []


def lay(tmp_path, settings_path: str, env: tuple[tuple[str, str], ...] = ()) -> str:
    prefix = str(tmp_path / "opt")
    cfg = config.load(settings_path)
    apply.install(layout.Inputs(prefix=prefix, python=sys.executable, config=settings_path, state_dir=cfg.state.dir,
                                audit=cfg.log.audit, env=env), write_config=False)
    return prefix


def test_a_url_env_receiver_set_only_in_the_admins_shell_fails_for_the_installed_programs(tmp_path, receiver):
    """The watcher (systemd) and the health check (slurmd) never see the admin's shell: the variable
    is read from the environment install laid for them. Only in the shell: FAIL, said plainly, and
    nothing sent; laid with `install --env`: that URL is the one used, whatever the shell says."""
    path = write_sim_config(tmp_path, '[[notify.webhook]]\nurl_env = "ALERTS_URL"\n')
    path.chmod(0o600)
    prefix = lay(tmp_path, str(path))
    run = cli("notify", "test", "--config", str(path), "--prefix", prefix, env={"ALERTS_URL": receiver.url("/shell")})
    assert run.returncode == 1, run.stdout
    assert "url_env $ALERTS_URL: the variable is not set or empty" in run.stdout
    assert f"$ALERTS_URL is not in the environment of the programs laid at {prefix} (this shell has it)" in run.stdout
    assert "--env ALERTS_URL=" in run.stdout
    assert receiver.requests == []

    lay(tmp_path, str(path), env=(("ALERTS_URL", receiver.url("/laid")),))
    run = cli("notify", "test", "--config", str(path), "--prefix", prefix, env={"ALERTS_URL": receiver.url("/shell")})
    assert run.returncode == 0, run.stdout + run.stderr
    assert [r["path"] for r in receiver.requests] == ["/laid"]


def test_send_test_reads_url_env_from_the_environment_it_is_given(tmp_path, receiver):
    path = write_sim_config(tmp_path, '[[notify.webhook]]\nurl_env = "ALERTS_URL"\n')
    settings = NotifySettings.from_config(config.load(str(path)))
    [answer] = send_test(settings, environ={"ALERTS_URL": receiver.url()})
    assert answer.ok, answer.said
    [answer] = send_test(settings, environ={})
    assert not answer.ok and "url_env $ALERTS_URL: the variable is not set or empty" in answer.said
