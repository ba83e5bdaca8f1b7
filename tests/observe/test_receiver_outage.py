"""A receiver's outage is an event a person can see: its start and its end in the audit log, shown
by ``status``, failed by ``validate`` while it lasts, a gauge in the textfile; and a message that
arrives late says how late, and what happened since.

The receiver is a real HTTP server on 127.0.0.1 answering 401 (an expired token) for 90 s of the
notifier's injected clock, then 200.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import subprocess
import sys

import pytest
from commands.test_status import SCONTROL
from fakes.config import write_sim_config
from observe.test_delivery import Outage
from observe.test_metrics import parse_exposition, value
from observe.test_notify import Clock, resume, xid79

from slurm_hooks import config
from slurm_hooks.observe import receivers
from slurm_hooks.observe.audit import AuditLog
from slurm_hooks.observe.notify import Notifier, NotifySettings
from slurm_hooks.preflight.environment import check_notify_receivers
from slurm_hooks.preflight.results import Status


@pytest.fixture
def outage(tmp_path):
    rx = Outage(401)
    yield rx
    rx.stop()


def setup(tmp_path, rx: Outage):
    """A config with one webhook and a fake scontrol (for ``status``), its settings with a textfile
    directory, and a notifier on an injected clock."""
    bin_dir = tmp_path / "slurm-bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(SCONTROL)
    (bin_dir / "scontrol").chmod(0o755)
    path = write_sim_config(tmp_path, f'[[notify.webhook]]\nurl = "{rx.url()}"\nname = "oncall"\n'
                                      f'[notify]\nsettle = 0.0\nretry_max = 20.0\n'
                                      f'[metrics]\ntextfile_dir = "{tmp_path / "textfile"}"\n'
                                      f'[slurm]\nbackend = "scontrol"\nbin_dir = "{bin_dir}"\n')
    path.chmod(0o600)
    (tmp_path / "textfile").mkdir()
    cfg = config.load(str(path))
    settings = NotifySettings.from_config(cfg)
    clock = Clock()
    return str(path), cfg, settings, clock, Notifier(settings, clock=clock, log=lambda m: None, rng=random.Random(1))


def outage_records(settings: NotifySettings) -> list[dict]:
    return [r for r in AuditLog(settings.audit).read() if r["kind"] == "receiver"]


def prom(tmp_path) -> dict:
    with open(tmp_path / "textfile" / receivers.PROM_FILE) as fh:
        return parse_exposition(fh.read())


def status_cli(path: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SLURM_HOOKS_CONFIG"}
    return subprocess.run([sys.executable, "-m", "slurm_hooks", "status", "--max-wait", "0", "--config", path, "--json"],
                          capture_output=True, text=True, env=env, timeout=60)


def test_a_receiver_out_for_90_seconds_is_an_audited_outage_shown_by_status_validate_and_the_textfile(tmp_path, outage):
    path, cfg, settings, clock, n = setup(tmp_path, outage)
    log = AuditLog(settings.audit)
    xid79(log)
    n.flush(5)
    [out] = outage_records(settings)
    assert out["state"] == "out" and out["where"] == "oncall" and out["error"].startswith("HTTP 401") and "check its credentials" in out["error"]
    started = out["since"]
    assert out["message"].startswith("oncall (webhook-") and " out: HTTP 401" in out["message"]  # as `events` shows it

    # While it lasts: status, validate and the textfile say so.
    shown = json.loads(status_cli(path).stdout)["receivers"]
    assert [(r["where"], r["out"]) for r in shown] == [("oncall", True)]
    assert "out since" in shown[0]["line"] and "HTTP 401" in shown[0]["line"]
    [row] = check_notify_receivers(cfg)
    assert row.status is Status.FAIL and "oncall" in row.message and "out since" in row.message
    assert "notify test" in row.fix
    families = prom(tmp_path)
    assert value(families, "slurm_hooks_notify_receiver_up", where="oncall") == 0
    assert value(families, "slurm_hooks_notify_receiver_out_since_seconds", where="oncall") == pytest.approx(started)
    assert value(families, "slurm_hooks_notify_waiting_messages", where="oncall") == 1

    for t in (30.0, 60.0):
        clock.offset = t
        n.flush(5)
    resume(log)  # the node is back while its receiver is still out
    n.flush(5)
    outage.down = False
    clock.offset = 90.0
    for _ in range(10):
        clock.offset += 5.0
        n.flush(5)
    assert n.outbox.entries() == []

    out, back = outage_records(settings)
    assert back["state"] == "back" and back["since"] == started and back["tries"] >= 3
    assert 90.0 <= back["out_s"] <= 150.0
    shown = json.loads(status_cli(path).stdout)["receivers"]
    assert [(r["where"], r["out"]) for r in shown] == [("oncall", False)]
    assert "back at" in shown[0]["line"]
    [row] = check_notify_receivers(cfg)
    assert row.status is Status.PASS
    assert value(prom(tmp_path), "slurm_hooks_notify_receiver_up", where="oncall") == 1
    # The fleet report over the window tells it too, with how long and how many tries.
    from slurm_hooks import report

    [told] = report.build(report.read_audit([settings.audit]), started - 60, started + 3600)["receiver_outages"]
    assert (told["where"], told["open"], told["tries"], told["out_s"]) == ("oncall", False, back["tries"], back["out_s"])

    # The page that waited says how late it is and that the node is back already.
    opened = next(r["body"] for r in outage.requests if r["code"] == 200 and r["body"]["kind"] == "opened")
    assert opened["late_s"] >= 90.0
    assert opened["late"].startswith("delivered ") and "late (its receiver was out from" in opened["late"]
    assert "since then: n1 was back in service" in opened["late"]


def test_a_message_delivered_at_once_says_nothing_of_lateness(tmp_path, outage):
    outage.down = False
    _, _, settings, _, n = setup(tmp_path, outage)
    xid79(AuditLog(settings.audit))
    assert n.flush(5)["sent"] == 1
    [body] = outage.delivered()
    assert "late" not in body and "late_s" not in body
    assert outage_records(settings) == []


def test_an_outage_is_ended_by_a_notify_test_that_gets_through(tmp_path, outage):
    """The admin's test after mending the token is the receiver's first answer: it ends the outage."""
    from slurm_hooks.observe.notify import send_test

    _, _, settings, _, n = setup(tmp_path, outage)
    xid79(AuditLog(settings.audit))
    n.flush(5)
    outage.down = False
    [answer] = send_test(dataclasses.replace(settings))
    assert answer.ok
    assert [r["state"] for r in outage_records(settings)] == ["out", "back"]


def test_outages_fold_into_one_per_receiver_and_node_open_until_its_end():
    recs = [{"kind": "receiver", "node": "h1", "receiver": "r", "where": "w", "state": "out", "since": 10.0,
             "error": "HTTP 401"},
            {"kind": "receiver", "node": "h2", "receiver": "r", "where": "w", "state": "out", "since": 20.0},
            {"kind": "receiver", "node": "h1", "receiver": "r", "where": "w", "state": "back", "since": 10.0,
             "until": 100.0, "tries": 4}]
    closed, still = receivers.fold(recs)
    assert (closed.node, closed.until, closed.tries, closed.error) == ("h1", 100.0, 4, "HTTP 401")
    assert still.node == "h2" and still.open
    assert receivers.shown([closed, still], 100.0 + receivers.RECENT_S + 1) == [still]
