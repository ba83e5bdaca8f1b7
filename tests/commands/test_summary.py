"""The shared end of ``isolate`` and ``sweep``: the summary said, and the exit code it gives."""

from __future__ import annotations

import json

from slurm_hooks.commands.summary import run_and_say
from slurm_hooks.errors import EXIT_OK, EXIT_UNAVAILABLE, EXIT_UNHEALTHY


class Busy(Exception):
    pass


class Summary:
    def __init__(self, ok: bool):
        self.ok = ok

    def line(self) -> str:
        return f"ok={self.ok}"

    def to_dict(self) -> dict:
        return {"ok": self.ok}


def _raise(exc: BaseException):
    def run():
        raise exc
    return run


def test_the_summary_is_said_as_a_line_or_as_json_and_its_verdict_is_the_exit_code(capsys):
    assert run_and_say("sweep", lambda: Summary(True), Busy, "undone", as_json=False) == EXIT_OK
    assert capsys.readouterr().out == "ok=True\n"
    assert run_and_say("sweep", lambda: Summary(False), Busy, "undone", as_json=True) == EXIT_UNHEALTHY
    assert json.loads(capsys.readouterr().out) == {"ok": False}


def test_then_sees_the_summary_after_it_was_said(capsys):
    seen = []
    run_and_say("sweep", lambda: Summary(True), Busy, "undone", as_json=False,
                then=lambda s: seen.append((s.ok, capsys.readouterr().out)))
    assert seen == [(True, "ok=True\n")]


def test_another_run_holding_the_nodes_is_exit_3_with_its_reason(capsys):
    code = run_and_say("isolate", _raise(Busy("another isolate runs (pid 7)")), Busy, "undone", as_json=False)
    assert code == EXIT_UNAVAILABLE == 3
    assert capsys.readouterr().err == "slurm-hooks isolate: another isolate runs (pid 7)\n"


def test_an_interrupted_run_is_exit_130_and_says_what_it_undid(capsys):
    code = run_and_say("sweep", _raise(KeyboardInterrupt()), Busy, "its jobs cancelled, its reservations deleted",
                       as_json=True)
    assert code == 130
    assert capsys.readouterr().err == "slurm-hooks sweep: interrupted: its jobs cancelled, its reservations deleted\n"
