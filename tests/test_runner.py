"""run_command's decoding and spawn_detached: the two ways this project starts a program."""

from __future__ import annotations

import os
import sys
import time

from slurm_hooks.runner import run_command, spawn_detached


def test_bytes_that_are_not_utf8_are_decoded_without_raising():
    # What squeue prints for `sbatch -J $'bad\377name'`.
    out = run_command(["/bin/sh", "-c", r"printf '5|bad\377name|5\n'; printf 'err\377\n' >&2"], 5)
    assert out.stdout == "5|bad\ufffdname|5\n" and out.stderr == "err\ufffd\n"


def _ready_helper(tmp_path, body: str) -> str:
    script = tmp_path / "helper.py"
    script.write_text(f"import sys, time\nsys.path.insert(0, {os.getcwd()!r})\n{body}\n")
    return str(script)


def test_a_helper_that_says_it_runs_is_started_and_outlives_the_wait(tmp_path):
    proof = tmp_path / "done"
    helper = _ready_helper(tmp_path, "from slurm_hooks.runner import signal_ready\nsignal_ready()\n"
                                     "print('to a closed pipe: ignored')\ntime.sleep(0.3)\n"
                                     f"open({str(proof)!r}, 'w').write('ok')")
    spawned = spawn_detached([sys.executable, helper], ready_timeout=5)
    assert spawned.started and spawned.error == ""
    assert spawned.proc.wait(timeout=10) == 0
    assert proof.read_text() == "ok"


def test_a_missing_interpreter_is_reported_not_raised():
    spawned = spawn_detached(["/nonexistent/python3", "-m", "slurm_hooks"], ready_timeout=1)
    assert not spawned.started
    assert spawned.error.startswith("/nonexistent/python3: cannot start: No such file or directory")


def test_a_helper_that_dies_before_it_runs_is_reported_with_its_last_stderr_line(tmp_path):
    helper = _ready_helper(tmp_path, "raise SystemExit('config: bad value in [slurm] timeout')")
    started = time.monotonic()
    spawned = spawn_detached([sys.executable, helper], ready_timeout=5)
    assert not spawned.started
    assert spawned.error == "python3 exited 1: config: bad value in [slurm] timeout".replace(
        "python3", os.path.basename(sys.executable))
    assert time.monotonic() - started < 4  # EOF on the pipe ends the wait, not the timeout


def test_a_helper_that_never_says_it_runs_is_stopped_at_the_bound(tmp_path):
    helper = _ready_helper(tmp_path, "time.sleep(30)")
    spawned = spawn_detached([sys.executable, helper], ready_timeout=0.5)
    assert not spawned.started and "not ready after 0.5s" in spawned.error
    assert spawned.proc.wait(timeout=5) != 0  # killed, not left to act on its own


def test_stop_ends_a_helper_that_ignores_sigterm_and_its_children(tmp_path):
    # The demo's watchers are stopped this way: SIGTERM, a bounded wait, then the whole group killed.
    helper = _ready_helper(tmp_path, "import signal, subprocess\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                                     "from slurm_hooks.runner import signal_ready\n"
                                     f"child = subprocess.Popen(['sleep', '60'])\nopen({str(tmp_path / 'child')!r}, 'w')"
                                     ".write(str(child.pid))\nsignal_ready()\ntime.sleep(60)")
    spawned = spawn_detached([sys.executable, helper], ready_timeout=5)
    assert spawned.started, spawned.error
    child = int((tmp_path / "child").read_text())
    spawned.stop(timeout=0.5)
    assert spawned.proc.wait(timeout=5) == -9
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        raise AssertionError("the helper's child outlived stop()")
