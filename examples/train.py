#!/usr/bin/env python3
"""A pure-Python "training" loop that survives a requeue (the demo's job; no torch needed).

Prints ``step N`` after each step, saves a checkpoint every ``--every`` steps
and when SIGTERM arrives, and on start resumes from the newest checkpoint,
printing ``resumed from step N (restart R)`` with R from SLURM_JOB_RESTART_COUNT.
After a SIGTERM save it exits 75 (see slurm_hooks.lab.training.EXIT_REQUEUE).

``--checkpoint-signal USR1 --requeue-self`` is PyTorch Lightning's contract (submit with
``#SBATCH --signal=USR1@90`` and launch with ``srun``): on that signal it saves, runs
``scontrol requeue`` of its own job and exits; slurm-hooks sends it that signal first on a fault.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import subprocess
import sys
import time

try:
    from slurm_hooks.lab.training import EXIT_REQUEUE, Checkpointer, install_sigterm_handler, restart_count
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
    from slurm_hooks.lab.training import EXIT_REQUEUE, Checkpointer, install_sigterm_handler, restart_count


def default_dir() -> str:
    base = os.environ.get("SLURM_SUBMIT_DIR", os.getcwd())
    return os.path.join(base, "checkpoints", os.environ.get("SLURM_JOB_ID", "local"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200, help="Train until this step (default 200).")
    p.add_argument("--every", type=int, default=10, help="Checkpoint every N steps (default 10).")
    p.add_argument("--step-time", type=float, default=0.5, help="Seconds per step (default 0.5).")
    p.add_argument("--ckpt-dir", default=None, help="Default: $SLURM_SUBMIT_DIR/checkpoints/$SLURM_JOB_ID.")
    p.add_argument("--keep", type=int, default=3, help="Checkpoints to keep (default 3).")
    p.add_argument("--checkpoint-signal", default=None, help="Also save on this signal (e.g. USR1).")
    p.add_argument("--requeue-self", action="store_true",
                   help="After saving on --checkpoint-signal, run `scontrol requeue $SLURM_JOB_ID` and exit.")
    args = p.parse_args(argv)

    own = getattr(signal, f"SIG{args.checkpoint_signal.upper().removeprefix('SIG')}") if args.checkpoint_signal \
        else None
    stop = install_sigterm_handler((signal.SIGTERM,) + ((own,) if own else ()))
    ckpt = Checkpointer(args.ckpt_dir or default_dir(), keep=args.keep)
    restarts = restart_count()
    latest = ckpt.load_latest()
    if latest is None:
        step, state = 0, {"loss": 10.0}
        print(f"starting at step 0 (restart {restarts}) on {os.environ.get('SLURMD_NODENAME', 'localhost')}",
              flush=True)
    else:
        step, state = latest
        print(f"resumed from step {step} (restart {restarts}) on {os.environ.get('SLURMD_NODENAME', 'localhost')}",
              flush=True)

    while step < args.steps:
        if stop:
            ckpt.save(step, state)
            name = signal.Signals(stop.signum).name
            if own is not None and stop.signum == own and args.requeue_self:
                job = os.environ.get("SLURM_JOB_ID", "")
                try:
                    rc = subprocess.run(["scontrol", "requeue", job], timeout=30).returncode if job else "no job id"
                except OSError as exc:
                    rc = exc.strerror
                print(f"signal {name}: saved step {step}, requeued itself (scontrol requeue: {rc})", flush=True)
                return EXIT_REQUEUE
            print(f"signal {stop.signum}: saved step {step}, exiting {EXIT_REQUEUE} for requeue", flush=True)
            return EXIT_REQUEUE
        time.sleep(args.step_time)
        step += 1
        state = {"loss": round(10.0 * math.exp(-step / 50.0), 6)}
        print(f"step {step} loss {state['loss']}", flush=True)
        if step % args.every == 0:
            ckpt.save(step, state)
    ckpt.save(step, state)
    print(f"done at step {step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
