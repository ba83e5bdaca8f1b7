"""Slurm-side timings on a real local cluster (root; brings its own testbed up and down).

    python bench/bench_slurm.py [--runs 10] [--json]

- prolog overhead: sbatch -> the batch script's first line, hooks off vs on (median);
- fault -> job running again: XID 79 under a running job, detected by the
  HealthCheckProgram, until the batch script runs again on the healthy node;
- XID -> node drained: the watcher vs the periodic health check
  (HealthCheckInterval=5 here; on a cluster the wait is about half the interval).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

from slurm_hooks.lab.testbed import LabSettings, Testbed
from slurm_hooks.probes import sim

STAMP_JOB = "#!/bin/sh\necho \"start $(date +%s.%N) restart=${SLURM_RESTART_COUNT:-0} on $SLURMD_NODENAME\"\n{body}\n"


def started_at(tb: Testbed, job: int, restart: int, timeout: float = 30.0) -> tuple[float, str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in tb.job_output(job).splitlines():
            parts = line.split()
            if len(parts) >= 4 and parts[0] == "start" and parts[2] == f"restart={restart}":
                return float(parts[1]), parts[4]
        time.sleep(0.01)
    raise SystemExit(f"job {job} restart {restart} never started: {tb.job_output(job)!r}")


def launch_latency(tb: Testbed, runs: int) -> list[float]:
    samples = []
    for _ in range(runs):
        t0 = time.time()
        job = tb.sbatch(STAMP_JOB.replace("{body}", "true"), "--gres=gpu:1")
        t1, _ = started_at(tb, job, 0)
        samples.append(t1 - t0)
        tb.wait_job(job, ("COMPLETED",), timeout=30)
    return samples


def launch_latency_interleaved(tb: Testbed, runs: int) -> tuple[list[float], list[float]]:
    """Hooks off and on in blocks of 5, so drift in the machine's load hits both alike.

    Each switch is an ``scontrol reconfigure``; a short settle keeps that out of the samples.
    """
    off, on = [], []
    for _ in range(max(1, runs // 5)):
        for hooks, samples in ((False, off), (True, on)):
            tb.set_hooks(hooks)
            time.sleep(1.0)
            samples.extend(launch_latency(tb, 5))
    return off, on


def prolog_wall_time(tb: Testbed, runs: int) -> list[float]:
    """The prolog program itself, as slurmd runs it: the wrapper, no PATH, a job's environment."""
    env = {"SLURMD_NODENAME": "n1", "SLURM_JOB_ID": "999999", "SLURM_JOB_GPUS": "0,1,2,3,4,5,6,7",
           "SLURM_SCRIPT_CONTEXT": "prolog_slurmd"}
    hook = os.path.join(tb.state_dir, "bin", "prolog")
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run([hook], env=env, check=True, timeout=60)
        samples.append(time.perf_counter() - t0)
    return samples


def fault_to_running(tb: Testbed, runs: int) -> list[float]:
    samples = []
    hook = os.path.join(tb.state_dir, "bin", "healthcheck")
    for _ in range(runs):
        tb.reset()
        job = tb.sbatch(STAMP_JOB.replace("{body}", "trap 'exit 0' TERM; while true; do sleep 0.1; done"),
                        "--gres=gpu:1", "--open-mode=append")
        _, node = started_at(tb, job, 0)
        sim.inject(tb.sim_dir, node, 0, xid=79)
        t0 = time.time()
        subprocess.run([hook], env={"SLURMD_NODENAME": node}, check=False, timeout=60)
        t1, again = started_at(tb, job, 1)
        assert again != node, (again, node)
        samples.append(t1 - t0)
    tb.reset()
    return samples


def xid_to_drained(tb: Testbed, runs: int, watcher: bool) -> list[float]:
    samples = []
    for _ in range(runs):
        tb.reset()
        proc = None
        if watcher:
            proc = subprocess.Popen([sys.executable, "-m", "slurm_hooks", "watch", "--node", "n1"], env=tb.env(),
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)
        else:
            time.sleep(random.uniform(0, tb.settings.health_check_interval))
        try:
            sim.inject(tb.sim_dir, "n1", 4, xid=79)
            t0 = time.monotonic()
            tb.wait_node("n1", lambda n: n.drained, timeout=tb.settings.health_check_interval * 3, interval=0.01)
            samples.append(time.monotonic() - t0)
        finally:
            if proc:
                proc.terminate()
                proc.wait(10)
    tb.reset()
    return samples


def summary(samples: list[float]) -> dict[str, float]:
    return {"median_s": round(statistics.median(samples), 3), "min_s": round(min(samples), 3),
            "max_s": round(max(samples), 3), "runs": len(samples)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="sh-bench-") as tmp:
        tb = Testbed(tmp, LabSettings(nodes=2, hooks=False, kill_wait=5, health_check_interval=5, requeue_grace=5.0))
        tb.up()
        try:
            tb.reset()
            off, on = launch_latency_interleaved(tb, args.runs)
            results["sbatch_to_script_no_hooks"] = summary(off)
            results["sbatch_to_script_with_prolog"] = summary(on)
            results["prolog_overhead_ms"] = {"median": round((statistics.median(on) - statistics.median(off)) * 1000, 1)}
            results["prolog_program_wall_time"] = summary(prolog_wall_time(tb, args.runs * 2))
            results["fault_to_job_running_again"] = summary(fault_to_running(tb, max(3, args.runs // 2)))
            results["xid_to_drained_watcher"] = summary(xid_to_drained(tb, max(3, args.runs // 2), watcher=True))
            results["xid_to_drained_healthcheck_interval_5s"] = summary(
                xid_to_drained(tb, max(3, args.runs // 2), watcher=False))
        finally:
            tb.down()
    if args.json:
        print(json.dumps(results, indent=1))
        return
    for name, s in results.items():
        print(f"{name:<42} " + "  ".join(f"{k} {v}" for k, v in s.items()))


if __name__ == "__main__":
    main()
