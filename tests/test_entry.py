"""The fast path for Slurm's hooks must mean exactly what the click CLI means."""

from __future__ import annotations

import pytest

from slurm_hooks import entry


@pytest.mark.parametrize("args, fast", [
    (["prolog"], ("prolog", None, None)),
    (["epilog", "--config", "/etc/x.toml"], ("epilog", "/etc/x.toml", None)),
    (["prolog", "--node", "n1", "--config", "c.toml"], ("prolog", "c.toml", "n1")),
    (["check", "--config", "/etc/x.toml"], ("check", "/etc/x.toml", None)),
    (["check"], ("check", None, None)),
])
def test_hook_forms_slurm_uses_take_the_fast_path(args, fast):
    assert entry._fast_args(args) == fast


@pytest.mark.parametrize("args", [
    [], ["check", "--dry-run"], ["check", "--json"], ["check", "--explain"], ["prolog", "--help"], ["prolog", "--config"], ["prolog", "--config", "a", "--config", "b"],
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


def test_under_the_wrapper_the_verdict_unhealthy_has_its_own_code(monkeypatch):
    from slurm_hooks.errors import EXIT_WRAPPED_UNHEALTHY, WRAPPER_ENV

    assert entry.guard(lambda: 1) == 1
    monkeypatch.setenv(WRAPPER_ENV, "1")
    assert entry.guard(lambda: 1) == EXIT_WRAPPED_UNHEALTHY  # Python's own failures exit 1
    assert entry.guard(lambda: 0) == 0 and entry.guard(lambda: 2) == 2


def test_the_fast_check_says_what_the_click_check_says_and_loads_no_click(tmp_path):
    import subprocess
    import sys

    from fakes.config import write_sim_config

    conf = str(write_sim_config(tmp_path, "[check]\ndrain = false\n"))
    env = {"SLURMD_NODENAME": "n1", "PATH": "/usr/bin:/bin"}

    def run(*args):
        return subprocess.run([sys.executable, "-X", "importtime", "-m", "slurm_hooks", *args], capture_output=True,
                              text=True, timeout=60, env=env)

    assert run("sim", "init", "--node", "n1", "--gpus", "4", "--config", conf).returncode == 0
    assert run("sim", "inject", "--node", "n1", "--gpu", "2", "--xid", "79", "--config", conf).returncode == 0
    fast = run("check", "--config", conf)
    assert " click" not in fast.stderr and "slurm_hooks.cli" not in fast.stderr
    slow = run("check", "--node", "n1", "--config", conf, "--json")  # through click
    assert " click" in slow.stderr
    assert fast.returncode == 1 and fast.stdout == "gpu2 xid: XID 79 (GPU has fallen off the bus) -> reboot\n"
