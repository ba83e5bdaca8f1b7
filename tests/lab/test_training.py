"""The demo's training job: SIGTERM saves a checkpoint, the next run resumes from it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from paths import ROOT

from slurm_hooks.lab import training
from slurm_hooks.lab.training import EXIT_REQUEUE, Checkpointer

TRAIN = os.path.join(ROOT, "examples", "train.py")
SBATCH = os.path.join(ROOT, "examples", "train.sbatch")


def start(ckpt_dir, *args, restarts=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["PYTHONPATH"] = ROOT
    if restarts is not None:
        env["SLURM_JOB_RESTART_COUNT"] = str(restarts)
    return subprocess.Popen([sys.executable, TRAIN, "--ckpt-dir", str(ckpt_dir), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def wait_for_line(proc, pattern, timeout=30.0):
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if re.match(pattern, line):
            return seen
    proc.kill()
    raise AssertionError(f"no line matching {pattern!r} in {seen}")


def test_sigterm_saves_a_checkpoint_and_the_requeued_run_resumes_from_it(tmp_path):
    ckpt = tmp_path / "ckpt"
    first = start(ckpt, "--steps", "1000", "--every", "1000", "--step-time", "0.02", restarts=0)
    wait_for_line(first, r"step 5 ")
    first.send_signal(signal.SIGTERM)
    out, err = first.communicate(timeout=30)
    assert first.returncode == EXIT_REQUEUE, err
    saved = re.search(r"signal 15: saved step (\d+), exiting 75", out)
    assert saved, out
    step = int(saved.group(1))
    assert step >= 5
    assert Checkpointer(str(ckpt)).load_latest()[0] == step

    second = start(ckpt, "--steps", str(step + 3), "--every", "1000", "--step-time", "0.01", restarts=1)
    out, err = second.communicate(timeout=30)
    assert second.returncode == 0, err
    lines = out.splitlines()
    assert lines[0] == f"resumed from step {step} (restart 1) on localhost"
    assert [ln.split()[1] for ln in lines[1:4]] == [str(step + 1), str(step + 2), str(step + 3)]
    assert lines[-1] == f"done at step {step + 3}"


def test_a_fresh_run_starts_at_step_zero_and_checkpoints_every_k_steps(tmp_path):
    proc = start(tmp_path, "--steps", "7", "--every", "3", "--step-time", "0", "--keep", "10")
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert out.splitlines()[0].startswith("starting at step 0 (restart 0)")
    assert Checkpointer(str(tmp_path)).steps() == [3, 6, 7]


def test_save_keeps_only_the_newest_checkpoints(tmp_path):
    ck = Checkpointer(str(tmp_path), keep=2)
    for step in (10, 20, 30, 40):
        ck.save(step, {"step": step})
    assert ck.steps() == [30, 40]
    assert ck.load_latest() == (40, {"step": 40})
    assert sorted(os.listdir(tmp_path)) == ["ckpt-0000000030.json", "ckpt-0000000040.json"]  # no temp files


def test_load_latest_skips_a_torn_newest_checkpoint(tmp_path):
    ck = Checkpointer(str(tmp_path))
    ck.save(10, {"w": [1, 2]})
    with open(tmp_path / "ckpt-0000000020.json", "w") as fh:
        fh.write('{"step": 20, "sta')
    assert ck.load_latest() == (10, {"w": [1, 2]})


def test_load_latest_is_none_without_checkpoints(tmp_path):
    assert Checkpointer(str(tmp_path / "never-made")).load_latest() is None


def test_checkpoint_is_plain_json(tmp_path):
    path = Checkpointer(str(tmp_path)).save(3, {"loss": 1.5})
    with open(path) as fh:
        data = json.load(fh)
    assert (data["step"], data["state"]) == (3, {"loss": 1.5})


def test_sigterm_handler_only_sets_a_flag(tmp_path):
    old = signal.getsignal(signal.SIGTERM)
    try:
        stop = training.install_sigterm_handler()
        assert not stop
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested and stop.signum == signal.SIGTERM
    finally:
        signal.signal(signal.SIGTERM, old)


@pytest.mark.parametrize("value,expected", [("3", 3), ("", 0), ("x", 0), (None, 0)])
def test_restart_count_from_slurm(value, expected):
    env = {} if value is None else {"SLURM_JOB_RESTART_COUNT": value}
    assert training.restart_count(env) == expected


def test_sbatch_asks_for_requeue_append_and_a_gpu_and_execs_the_trainer():
    text = open(SBATCH).read()
    directives = re.findall(r"^#SBATCH (\S+)", text, re.M)
    assert {"--requeue", "--open-mode=append", "--gres=gpu:1"} <= set(directives)
    assert re.search(r"^exec python3 .*examples/train\.py", text, re.M)
    subprocess.run(["bash", "-n", SBATCH], check=True)


def test_on_its_own_checkpoint_signal_it_saves_requeues_itself_and_exits(tmp_path):
    proc = start(tmp_path / "ckpt", "--steps", "1000", "--every", "1000", "--step-time", "0.02",
                 "--checkpoint-signal", "USR1", "--requeue-self")
    wait_for_line(proc, r"step 5 ")
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == EXIT_REQUEUE, err
    saved = re.search(r"signal SIGUSR1: saved step (\d+), requeued itself \(scontrol requeue: (.+)\)", out)
    assert saved, out
    assert saved.group(2) == "no job id"  # outside Slurm: nothing to requeue, and it says so
    assert Checkpointer(str(tmp_path / "ckpt")).load_latest()[0] == int(saved.group(1))
