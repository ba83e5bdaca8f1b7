"""``./scripts/demo`` on a first run says what it is doing before the long environment build."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _checkout(tmp_path: Path, ready: bool) -> Path:
    """A copy of scripts/demo beside a stand-in setup (it only logs) and a stand-in slurm-hooks."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "demo", tmp_path / "scripts" / "demo")
    setup = tmp_path / "scripts" / "setup"
    setup.write_text("#!/bin/sh\necho 'setup ran'\n")
    tool = tmp_path / ".venv" / "bin" / "slurm-hooks"
    tool.parent.mkdir(parents=True)
    tool.write_text("#!/bin/sh\necho \"slurm-hooks $*\"\n")
    for path in (setup, tool):
        path.chmod(0o755)
    if ready:
        (tmp_path / ".venv" / ".slurm-hooks-ready").write_text("x")
    return tmp_path


def _run(root: Path) -> str:
    out = subprocess.run([str(root / "scripts" / "demo"), "--keep"], capture_output=True, text=True, timeout=30,
                         env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_a_first_demo_says_it_builds_the_environments_and_how_long_before_it_does(tmp_path):
    lines = _run(_checkout(tmp_path, ready=False)).splitlines()
    assert lines[0].startswith("demo: first run:") and "2-3 minutes" in lines[0]
    assert lines[1:] == ["setup ran", "slurm-hooks demo --keep"]


def test_a_later_demo_goes_straight_on(tmp_path):
    assert _run(_checkout(tmp_path, ready=True)).splitlines() == ["setup ran", "slurm-hooks demo --keep"]
