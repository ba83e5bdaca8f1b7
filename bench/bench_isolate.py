"""How many collective test jobs, waves and how much wall time ``isolate`` needs to find 1 and 2
bad nodes among 16 and 64 (a simulated fabric: slurm_hooks.hooks.culprit.Fabric).

    python bench/bench_isolate.py [--trials 200] [--wave-s 30] [--json]

Each trial puts random faults (hang, drop, slow 4-20x) on random nodes and runs the search in
both modes. Wall time is waves x ``--wave-s`` (one wave's test jobs run at once: a test job's
start, its collective and the slowest one's time limit; 30 s is a cluster's typical all_reduce_perf
job), as the search runs no faster than its slowest test per wave. Prints, per case: the share of
trials right (exactly the bad nodes drained), trials with a healthy node named (must be 0), and the
median / max test jobs and waves.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from slurm_hooks.hooks import culprit  # noqa: E402


def run(size: int, bad: int, mode: str, trials: int, wave_s: float) -> dict:
    rng = random.Random(f"{size}-{bad}-{mode}")
    nodes = [f"n{k}" for k in range(1, size + 1)]
    right = wrong = 0
    jobs, waves = [], []
    t0 = time.perf_counter()
    for trial in range(trials):
        fabric = culprit.Fabric(nodes, culprit.random_faults(nodes, bad, rng), seed=trial)
        found = culprit.search(nodes, fabric.run_wave, mode=mode)
        right += set(found.culprits) == set(fabric.faults)
        wrong += bool(set(found.culprits) - set(fabric.faults))
        jobs.append(found.jobs)
        waves.append(found.waves)
    cpu = (time.perf_counter() - t0) / trials
    return {"nodes": size, "bad": bad, "mode": mode, "trials": trials, "right_pct": round(100 * right / trials, 1),
            "healthy_named": wrong, "jobs_median": statistics.median(jobs), "jobs_max": max(jobs),
            "waves_median": statistics.median(waves), "waves_max": max(waves),
            "wall_s_median": statistics.median(waves) * wave_s, "search_cpu_us": round(cpu * 1e6, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--wave-s", type=float, default=30.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = [run(size, bad, mode, args.trials, args.wave_s)
            for size in (16, 64) for bad in (1, 2) for mode in culprit.MODES]
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{'nodes':>5} {'bad':>3} {'mode':<8} {'right':>6} {'healthy':>7} {'jobs':>9} {'waves':>7} {'wall':>7}")
    for r in rows:
        print(f"{r['nodes']:>5} {r['bad']:>3} {r['mode']:<8} {r['right_pct']:>5}% {r['healthy_named']:>7} "
              f"{r['jobs_median']:>4g}/{r['jobs_max']:<4} {r['waves_median']:>3g}/{r['waves_max']:<3} "
              f"{r['wall_s_median']:>6g}s")
    print(f"(jobs and waves: median/max of {args.trials} trials; wall: median waves x {args.wave_s:g} s)")


if __name__ == "__main__":
    main()
