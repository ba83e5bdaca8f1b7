"""Wall time of ``slurm-hooks check`` on 8 simulated GPUs, Python start-up included.

    python bench/bench_check.py [--runs 50] [--json]

Runs the installed console script (what HealthCheckProgram runs) against a
throwaway config, healthy and with XID 79 injected (dry run, so nothing is
drained), and prints the median and p90 of each. Also times ``prolog`` with a
job's 8 GPUs and a bare ``python -c pass`` for the interpreter's own share.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def timed(argv: list[str], env: dict[str, str], runs: int, expect_rc: int) -> list[float]:
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        proc = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        samples.append(time.perf_counter() - t0)
        if proc.returncode != expect_rc:
            raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}, expected {expect_rc}: {proc.stderr.strip()}")
    return samples


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"median_ms": round(statistics.median(ordered) * 1000, 1),
            "p90_ms": round(ordered[int(len(ordered) * 0.9) - 1] * 1000, 1),
            "min_ms": round(ordered[0] * 1000, 1), "runs": len(ordered)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    exe = shutil.which("slurm-hooks", path=os.path.dirname(sys.executable)) or shutil.which("slurm-hooks")
    base = [exe] if exe else [sys.executable, "-m", "slurm_hooks"]
    with tempfile.TemporaryDirectory() as tmp:
        cfg = os.path.join(tmp, "config.toml")
        with open(cfg, "w") as fh:
            fh.write(f'[gpu]\nbackend = "sim"\nsim_dir = "{tmp}/sim"\n[log]\naudit = "{tmp}/audit.jsonl"\n'
                     f'[state]\ndir = "{tmp}/state"\n[expect]\ngpus = 8\n')
        env = {**os.environ, "SLURM_HOOKS_CONFIG": cfg, "SLURMD_NODENAME": "bench1"}
        subprocess.run([*base, "sim", "init", "--node", "bench1", "--gpus", "8"], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        results = {"python_startup": summary(timed([sys.executable, "-c", "pass"], env, args.runs, 0))}
        results["check_healthy"] = summary(timed([*base, "check", "--dry-run"], env, args.runs, 0))
        job_env = {**env, "SLURM_JOB_ID": "1", "SLURM_JOB_GPUS": "0,1,2,3,4,5,6,7"}
        results["prolog_healthy"] = summary(timed([*base, "prolog"], job_env, args.runs, 0))
        subprocess.run([*base, "sim", "inject", "--node", "bench1", "--gpu", "3", "--xid", "79"], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        results["check_xid79_dry_run"] = summary(timed([*base, "check", "--dry-run"], env, args.runs, 1))
    results["python"] = sys.version.split()[0]
    if args.json:
        print(json.dumps(results, indent=1))
        return
    print(f"Python {results.pop('python')}, {args.runs} runs each, 8 simulated GPUs")
    for name, s in results.items():
        print(f"  {name:<22} median {s['median_ms']:7.1f} ms   p90 {s['p90_ms']:7.1f} ms   min {s['min_ms']:7.1f} ms")


if __name__ == "__main__":
    main()
