"""Training jobs that speak the frameworks' checkpoint contracts, for the testbed, the demo and bench.

Each job is a step loop (a step every :data:`STEP_S` seconds) run under ``srun``, as the
frameworks launch it, with its framework's handler:

- ``lightning``: ``#SBATCH --signal=SIGUSR1@90``; on SIGUSR1 it saves and runs
  ``scontrol requeue`` of its own id (PyTorch Lightning's ``auto_requeue``); SIGTERM is
  "bypassed": it stops at the next step without saving.
- ``megatron``: no ``--signal``; on SIGTERM it saves at the next step's end and exits, and
  does not requeue itself (Megatron-LM's ``--exit-signal-handler``).
- ``none``: no handler at all (torchtitan): only what it saved every ``save_every`` steps survives.

``no_scontrol`` runs the step without ``scontrol`` on its PATH (a container without Slurm's
binaries: its own requeue fails). Every step is logged as ``<step> <unix time> <restart>`` to
the log file, and each start as ``start restart=<n> step=<s> on <node>`` on stdout, so work lost per
fault is read back exactly (:func:`work_lost`). A stock submitit job is submitted by
submitit itself (:func:`submitit_driver`).
"""

from __future__ import annotations

import os
import shlex
import sys

#: Seconds per training step.
STEP_S = 0.1
CONTRACTS = ("lightning", "megatron", "none")

#: The step loop, run as ``python -c LOOP <contract> <checkpoint> <log> <save_every>``.
LOOP = r'''
import json, os, signal, subprocess, sys, time
contract, ckpt, log, save_every = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
step = 0
if os.path.exists(ckpt):
    with open(ckpt) as fh:
        step = json.load(fh)["step"]
print(f"start restart={os.environ.get('SLURM_RESTART_COUNT', '0')} step={step} on {os.environ.get('SLURMD_NODENAME')}",
      flush=True)
restart = os.environ.get("SLURM_RESTART_COUNT", "0")
got = []
if contract != "none":  # torchtitan has no handler: SIGTERM ends it where it stands
    signal.signal(signal.SIGUSR1, lambda s, f: got.append("USR1"))
    signal.signal(signal.SIGTERM, lambda s, f: got.append("TERM"))

def save(step):
    tmp = ckpt + ".tmp"
    with open(tmp, "w") as fh:
        json.dump({"step": step, "t": time.time()}, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, ckpt)
    print(f"saved step={step} at={time.time():.3f}", flush=True)

while True:
    time.sleep(STEP_S)
    step += 1
    with open(log, "a") as fh:
        fh.write(f"{step} {time.time():.3f} {restart}\n")
    if save_every and step % save_every == 0:
        save(step)
    while got:
        sig = got.pop(0)
        print(f"got SIG{sig} at step={step} t={time.time():.3f}", flush=True)
        if contract == "lightning" and sig == "USR1":
            save(step)
            try:
                rc = subprocess.run(["scontrol", "requeue", os.environ["SLURM_JOB_ID"]], timeout=30).returncode
            except OSError as exc:
                rc = f"not run: {exc.strerror}"
            print(f"requeue rc={rc}", flush=True)
        elif contract == "lightning" and sig == "TERM":
            print("bypassing SIGTERM: stopping", flush=True)
            sys.exit(0)
        elif contract == "megatron" and sig == "TERM":
            save(step)
            sys.exit(0)
'''.replace("STEP_S", repr(STEP_S))


def batch_script(contract: str, workdir: str, *, python: str | None = None, save_every: int = 0,
                 no_scontrol: bool = False, signal: str | None = None) -> str:
    """The sbatch script of a ``contract`` job keeping its checkpoint and step log in ``workdir``.
    ``signal``: the ``--signal`` spec, over the contract's own (``""``: none)."""
    if contract not in CONTRACTS:
        raise ValueError(f"unknown contract {contract!r} (known: {', '.join(CONTRACTS)})")
    spec = {"lightning": "SIGUSR1@90"}.get(contract, "") if signal is None else signal
    os.makedirs(workdir, exist_ok=True)
    loop = os.path.join(workdir, "loop.py")
    with open(loop, "w", encoding="utf-8") as fh:
        fh.write(LOOP)
    argv = [python or sys.executable, loop, contract, os.path.join(workdir, "ckpt.json"),
            os.path.join(workdir, "steps.log"), str(save_every)]
    if no_scontrol:
        argv = ["/usr/bin/env", "PATH=/nonexistent", *argv]
    lines = ["#!/bin/sh"] + ([f"#SBATCH --signal={spec}"] if spec else []) + [
        "#SBATCH --open-mode=append",
        "#SBATCH --requeue",
        f"exec srun --unbuffered {' '.join(shlex.quote(a) for a in argv)}",
    ]
    return "\n".join(lines) + "\n"


def steps(workdir: str, restart: int | None = None) -> list[tuple[int, float]]:
    """(step, unix time) of every step the job has logged, in order (``restart``: only that run's)."""
    out = []
    try:
        with open(os.path.join(workdir, "steps.log"), encoding="utf-8") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) == 3 and (restart is None or parts[2] == str(restart)):
                    out.append((int(parts[0]), float(parts[1])))
    except (OSError, ValueError):
        pass
    return out


def step_at(workdir: str, when: float) -> int:
    """The last step the job had finished at unix time ``when`` (0 before any)."""
    done = [s for s, t in steps(workdir) if t <= when]
    return max(done) if done else 0


def work_lost(reached: int, resumed: int) -> float:
    """Seconds of training lost: steps reached at the fault but not in the checkpoint resumed from."""
    return max(0, reached - resumed) * STEP_S


#: A stock submitit job: ``python -c SUBMITIT <folder> <workdir> [<timeout_min> [plain|class [<signal_delay_s>]]]``
#: submits it and prints its id (Slurm itself sends USR2 ``signal_delay_s``, default submitit's 90, before
#: the limit: a short limit needs a short delay, or Slurm's own signal lands first). The task logs its steps like the loop above; submitit's own USR2 handler calls
#: ``checkpoint()`` (which pickles the task with its step) and runs ``scontrol requeue`` itself.
#: ``plain``: a function with no ``checkpoint()`` that saves its step to ``<workdir>/ckpt.json``
#: itself; late in its time limit (submitit's ``has_timed_out()``: elapsed >= min(0.8 x limit,
#: limit - 600 s), so a limit under 10 minutes always) submitit's handler raises "timed-out and
#: not checkpointable" and the job ends FAILED.
SUBMITIT_DRIVER = r'''
import json, os, sys, time
import submitit

folder, workdir = sys.argv[1], sys.argv[2]
timeout_min = int(sys.argv[3]) if len(sys.argv) > 3 else 60
plain = len(sys.argv) > 4 and sys.argv[4] == "plain"
delay = {"slurm_signal_delay_s": int(sys.argv[5])} if len(sys.argv) > 5 else {}

class Train(submitit.helpers.Checkpointable):
    def __init__(self):
        self.step = 0

    def __call__(self, workdir):
        print(f"start restart={os.environ.get('SLURM_RESTART_COUNT', '0')} step={self.step} "
              f"on {os.environ.get('SLURMD_NODENAME')}", flush=True)
        while True:
            time.sleep(STEP_S)
            self.step += 1
            with open(os.path.join(workdir, "steps.log"), "a") as fh:
                fh.write(f"{self.step} {time.time():.3f} {os.environ.get('SLURM_RESTART_COUNT', '0')}\n")

    def checkpoint(self, workdir):
        print(f"saved step={self.step} at={time.time():.3f}", flush=True)
        return super().checkpoint(workdir)

def train_plain(workdir):
    ckpt, step = os.path.join(workdir, "ckpt.json"), 0
    if os.path.exists(ckpt):
        with open(ckpt) as fh:
            step = json.load(fh)["step"]
    restart = os.environ.get("SLURM_RESTART_COUNT", "0")
    print(f"start restart={restart} step={step} on {os.environ.get('SLURMD_NODENAME')}", flush=True)
    while True:
        time.sleep(STEP_S)
        step += 1
        with open(os.path.join(workdir, "steps.log"), "a") as fh:
            fh.write(f"{step} {time.time():.3f} {restart}\n")
        if step % 10 == 0:
            with open(ckpt + ".tmp", "w") as fh:
                json.dump({"step": step}, fh)
            os.replace(ckpt + ".tmp", ckpt)

ex = submitit.AutoExecutor(folder=folder, cluster="slurm")
ex.update_parameters(timeout_min=timeout_min, slurm_gres="gpu:1", slurm_additional_parameters={"requeue": True},
                     **delay)
job = ex.submit(train_plain, workdir) if plain else ex.submit(Train(), workdir)
print(job.job_id)
'''.replace("STEP_S", repr(STEP_S))


def submitit_output(folder: str, job_id: int | str) -> str:
    """What a submitit job printed: its ``<id>_0_log.out``, then its ``.err`` (submitit's own log)."""
    text = []
    for ext in ("out", "err"):
        try:
            with open(os.path.join(folder, f"{job_id}_0_log.{ext}"), encoding="utf-8", errors="replace") as fh:
                text.append(fh.read())
        except OSError:
            continue
    return "".join(text)
