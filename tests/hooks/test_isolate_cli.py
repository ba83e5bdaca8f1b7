"""``slurm-hooks isolate``'s bad input: one line, a usage exit code, no traceback, nothing drained."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from fakes.config import write_sim_config


def isolate(conf, *args):
    env = {k: v for k, v in os.environ.items() if k not in ("SLURM_HOOKS_CONFIG", "SLURM_HOOKS_DEBUG")}
    return subprocess.run([sys.executable, "-m", "slurm_hooks", "isolate", "--config", str(conf), *args],
                          capture_output=True, text=True, env=env, timeout=60)


@pytest.mark.parametrize(("args", "says"), [
    ((), "give --nodes LIST or --job ID"),
    (("--nodes", "n[1-4]", "--job", "12"), "give --nodes LIST or --job ID"),
    (("--nodes", "n1"), "1 node(s); a collective test needs 2"),
    (("--nodes", "n[1-"), "--nodes"),
    (("--nodes", "n[1-4]", "--mode", "ring"), "'ring' is not one of"),
])
def test_bad_input_is_one_line_and_a_usage_exit(tmp_path, args, says):
    done = isolate(write_sim_config(tmp_path, ""), *args)
    assert done.returncode == 2, done
    assert says in done.stderr and "Traceback" not in done.stderr


def test_a_bad_isolate_table_names_the_key(tmp_path):
    done = isolate(write_sim_config(tmp_path, "[isolate]\nratio = 1.5\n"), "--nodes", "n[1-4]")
    assert done.returncode != 0 and "ratio" in done.stderr and "Traceback" not in done.stderr
