"""The fast path for Slurm's hooks must mean exactly what the click CLI means."""

from __future__ import annotations

import pytest

from slurm_hooks import entry


@pytest.mark.parametrize("args, fast", [
    (["prolog"], ("prolog", None, None)),
    (["epilog", "--config", "/etc/x.toml"], ("epilog", "/etc/x.toml", None)),
    (["prolog", "--node", "n1", "--config", "c.toml"], ("prolog", "c.toml", "n1")),
])
def test_hook_forms_slurm_uses_take_the_fast_path(args, fast):
    assert entry._fast_args(args) == fast


@pytest.mark.parametrize("args", [
    [], ["check"], ["prolog", "--help"], ["prolog", "--config"], ["prolog", "--config", "a", "--config", "b"],
    ["prolog", "--bogus", "x"], ["prolog", "extra"], ["prolog", "--node", "--config"],
])
def test_anything_else_goes_through_click(args):
    assert entry._fast_args(args) is None


def test_guard_maps_errors_to_exit_codes_and_one_line(capsys):
    from slurm_hooks.errors import ConfigError, SlurmHooksError, TransientError

    def raiser(exc):
        def fn():
            raise exc
        return fn

    assert entry.guard(raiser(ConfigError("bad key", "/etc/c.toml", 3, "[gpu] x"))) == entry.EXIT_USAGE
    assert entry.guard(raiser(TransientError("scontrol timed out"))) == entry.EXIT_UNAVAILABLE
    assert entry.guard(raiser(SlurmHooksError("nope"))) == entry.EXIT_USAGE
    assert entry.guard(raiser(ZeroDivisionError("x"))) == entry.EXIT_INTERNAL
    assert entry.guard(lambda: 1) == 1 and entry.guard(lambda: None) == 0
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "slurm-hooks: config error: /etc/c.toml:3: [gpu] x: bad key"
    assert lines[3].startswith("slurm-hooks: internal error: ZeroDivisionError: x at test_entry.py:")
    assert len(lines) == 4


def test_the_click_cli_does_not_import_the_entry_point_back():
    # entry -> cli is the one edge (for everything but the hooks' fast path); no cycle.
    import subprocess
    import sys

    code = "import sys, slurm_hooks.cli; print('slurm_hooks.entry' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False"
