"""What the GPU map (hooks.gpumap) costs the healthy prolog, in process, and the prolog before/after.

    python bench/bench_gpumap.py [--runs 2000] [--tree PATH] [--json]
    python bench/bench_gpumap.py --compare BEFORE_TREE [--rounds 6]

Builds a throwaway node (8 simulated GPUs, a gres.conf in reverse order) and times, in one
process: the map built from scratch (gres.conf read, joined with a snapshot, cache written), the
map as every later run gets it (the boot's cache read and checked), a job's SLURM_JOB_GPUS turned
into the snapshot's GPUs, and the whole healthy prolog of an 8-GPU job (probe, checks, baseline;
slurmctld never called). ``--tree`` imports slurm_hooks from another checkout (the commit before
the map, for the "before" prolog); the map's own lines are then skipped. ``--compare`` runs
this checkout and BEFORE_TREE in turns (each round a fresh process of each, so that the load
of a shared machine falls on both alike) and prints the median of the rounds' prolog medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time


def per_call(fn, runs: int) -> dict[str, float]:
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    ordered = sorted(samples)
    return {"median_us": round(statistics.median(ordered) * 1e6, 1),
            "p90_us": round(ordered[int(len(ordered) * 0.9) - 1] * 1e6, 1), "runs": runs}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--tree", help="import slurm_hooks from this checkout instead")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--compare", metavar="BEFORE_TREE")
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()
    if args.compare:
        compare(args.compare, args.rounds, args.runs)
        return
    if args.tree:
        sys.path.insert(0, os.path.abspath(args.tree))
    from slurm_hooks import config
    from slurm_hooks.hooks import jobhooks
    from slurm_hooks.observe.audit import AuditLog
    from slurm_hooks.probes import sim
    from slurm_hooks.remedy.wiring import Wiring

    try:
        from slurm_hooks.remedy import gpumap
    except ImportError:
        gpumap = None
    results: dict[str, object] = {"tree": os.path.dirname(os.path.dirname(os.path.abspath(jobhooks.__file__)))}
    with tempfile.TemporaryDirectory() as tmp:
        gres_conf = os.path.join(tmp, "gres.conf")
        with open(gres_conf, "w") as fh:
            fh.write("NodeName=bench1 Name=gpu File=" + ",".join(f"/dev/nvidia{k}" for k in range(7, -1, -1)) + "\n")
        extra = f'gres_conf = "{gres_conf}"\n' if gpumap is not None else ""
        path = os.path.join(tmp, "config.toml")
        with open(path, "w") as fh:
            fh.write(f'[gpu]\nbackend = "sim"\nsim_dir = "{tmp}/sim"\n{extra}[log]\naudit = "{tmp}/audit.jsonl"\n'
                     f'[state]\ndir = "{tmp}/state"\n[expect]\ngpus = 8\n[repair]\nenabled = false\n')
        cfg = config.load(path)
        sim.init(cfg.gpu.sim_dir, "bench1", 8)
        w = Wiring(cfg, "bench1", AuditLog(cfg.log.audit))
        snap = w.probe().snapshot()
        if gpumap is not None:
            cache = gpumap.cache_path(w)

            def cold() -> None:
                if os.path.exists(cache):
                    os.unlink(cache)
                gpumap.current(w, snap)

            results["map_built"] = per_call(cold, max(args.runs // 10, 50))
            gmap = gpumap.current(w, snap)
            results["map_cached"] = per_call(lambda: gpumap.current(w, snap), args.runs)
            tokens = [str(k) for k in range(8)]
            results["job_tokens_8"] = per_call(lambda: gpumap.job_tokens(gmap, snap, tokens), args.runs)
        env = {"SLURM_JOB_ID": "1", "SLURM_JOB_GPUS": "0,1,2,3,4,5,6,7"}

        def prolog() -> None:
            w.deadline = None
            if jobhooks.prolog(w, env) != 0:
                raise SystemExit("the healthy prolog refused its job")

        results["prolog_healthy_in_process"] = per_call(prolog, max(args.runs // 10, 50))
    results["python"] = sys.version.split()[0]
    if args.json:
        print(json.dumps(results, indent=1))
        return
    print(f"Python {results.pop('python')}, slurm_hooks from {results.pop('tree')}")
    for name, s in results.items():
        print(f"  {name:<28} median {s['median_us']:9.1f} us   p90 {s['p90_us']:9.1f} us   ({s['runs']} runs)")


def compare(before: str, rounds: int, runs: int) -> None:
    import subprocess

    medians: dict[str, list[float]] = {"before": [], "after": []}
    pair = [("before", ["--tree", before]), ("after", [])]
    for k in range(rounds):
        for label, extra in (pair if k % 2 == 0 else pair[::-1]):  # who goes first alternates
            out = subprocess.run([sys.executable, __file__, "--json", "--runs", str(runs), *extra],
                                 capture_output=True, text=True, check=True).stdout
            medians[label].append(json.loads(out)["prolog_healthy_in_process"]["median_us"])
    for label, values in medians.items():
        print(f"  prolog_healthy_in_process {label:<6} median of {rounds} rounds "
              f"{statistics.median(values) / 1000:6.2f} ms, best round {min(values) / 1000:6.2f} ms  "
              f"(rounds: {', '.join(f'{v / 1000:.1f}' for v in values)})")


if __name__ == "__main__":
    main()
