"""The shape of the healthy check's and prolog's start-up (what bench/bench_check.py times): with the
parsed config kept from an earlier run, no TOML parser, no subprocess, no click, and no pattern of
ours compiled at import; and the kept config never hides an edit from the next run."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

#: Modules a warm healthy check or prolog must not load (each costs ms at every start).
NOT_ON_THE_PATH = ("tomllib", "tomli", "subprocess", "click", "jinja2", "kubernetes")

_PROBE = """
import contextlib, io, json, re, sys
from slurm_hooks import entry
from slurm_hooks.values import compile_later
rcs = []
for hook in ("check", "prolog"):
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            entry.main([hook, "--config", sys.argv[1]])
    except SystemExit as exc:
        rcs.append(exc.code)
ours = [(n, m) for n, m in list(sys.modules.items()) if n.startswith("slurm_hooks")]
at_import = sorted(f"{n}.{k}" for n, m in ours for k, v in vars(m).items() if isinstance(v, re.Pattern))
print(json.dumps({"rcs": rcs, "modules": sorted(sys.modules), "compiled_at_import": at_import}))
"""


@pytest.fixture
def node(tmp_path):
    """A config and 8 simulated GPUs, as bench/bench_check.py sets them up."""
    conf = tmp_path / "config.toml"
    conf.write_text(f'[gpu]\nbackend = "sim"\nsim_dir = "{tmp_path}/sim"\n[log]\naudit = "{tmp_path}/audit.jsonl"\n'
                    f'[state]\ndir = "{tmp_path}/state"\n[check]\ndrain = false\n[repair]\nenabled = false\n'
                    f'[slurm]\nbin_dir = "{tmp_path}/no-slurm"\n[expect]\ngpus = 8\n')
    env = {**os.environ, "SLURMD_NODENAME": "n1", "SLURM_JOB_ID": "1", "SLURM_JOB_GPUS": "0,1,2,3,4,5,6,7"}
    env.pop("SLURM_HOOKS_CONFIG", None)
    out = subprocess.run([sys.executable, "-m", "slurm_hooks", "sim", "init", "--node", "n1", "--gpus", "8",
                          "--config", str(conf)], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return str(conf), env


def _check(conf: str, env: dict) -> subprocess.CompletedProcess:
    """The healthy check as the installed program runs it."""
    return subprocess.run([sys.executable, "-I", "-m", "slurm_hooks", "check", "--config", conf], env=env,
                          capture_output=True, text=True, timeout=120)


def test_a_warm_check_and_prolog_load_no_parser_subprocess_or_click_and_compile_no_pattern_at_import(node):
    conf, env = node
    first = _check(conf, env)  # a cold run: parses the file and keeps the table
    assert first.returncode == 0, first.stdout + first.stderr
    out = subprocess.run([sys.executable, "-I", "-c", _PROBE, conf], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["rcs"] == [0, 0]
    loaded = sorted(set(NOT_ON_THE_PATH) & set(seen["modules"]))
    assert loaded == [], f"a module on the healthy path imports {loaded} at import: import it where it is used"
    assert not any(m.startswith(("click.", "kubernetes.", "jinja2.")) for m in seen["modules"])
    assert seen["compiled_at_import"] == [], "use slurm_hooks.values.compile_later for these"


def test_an_edit_of_the_same_size_and_mtime_is_seen_by_the_next_check(node):
    conf, env = node
    assert _check(conf, env).returncode == 0
    st = os.stat(conf)
    with open(conf, encoding="utf-8") as fh:
        text = fh.read()
    with open(conf, "w", encoding="utf-8") as fh:
        fh.write(text.replace("gpus = 8", "gpus = 9"))
    os.utime(conf, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(conf).st_size == st.st_size
    edited = _check(conf, env)
    assert edited.returncode == 1, edited.stdout + edited.stderr
    assert "9 expected" in edited.stdout
