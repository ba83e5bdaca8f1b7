"""How many collective test jobs, waves and how much wall time ``isolate`` needs to find 1 and 2
bad nodes among 16 and 64 (a simulated fabric: slurm_hooks.remedy.culprit.Fabric).

    python bench/bench_isolate.py [--trials 200] [--wave-s 30] [--json] [--write]
    python bench/bench_isolate.py --testbed 16 [--runs 20] [--bad 1]     (root: a real local cluster)

Each trial puts random faults (hang, drop, slow 4-20x) on random nodes and runs the search in
both modes. Wall time is waves x ``--wave-s`` (one wave's test jobs run at once: a test job's
start, its collective and the slowest one's time limit; 30 s is a cluster's typical all_reduce_perf
job), as the search runs no faster than its slowest test per wave. Prints, per case: the share of
trials right (exactly the bad nodes drained), trials with a healthy node named (must be 0), and the
median / max test jobs and waves. ``--write`` puts them between this bench's markers in docs/isolate.md
(the commit must be clean: the block names it).

``--testbed N`` runs ``slurm-hooks isolate`` for real instead: a testbed of N nodes (each on its own
address), ``--runs`` times a random fault (hang, slow 8, drop) on ``--bad`` random node(s), the lab's
TCP all-reduce as the test; prints per run the fault, what was drained, test jobs and wall time,
then how many runs were right and whether a healthy node was ever drained.
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

from docblock import DocBlock  # noqa: E402

from slurm_hooks.remedy import culprit  # noqa: E402

DOC = DocBlock(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "isolate.md"), "bench_isolate")


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


def render(rows: list[dict], trials: int) -> str:
    """The figures as docs/isolate.md shows them."""
    lines = [f"Simulated fabric (`slurm_hooks.remedy.culprit.Fabric`: hang, drop or slow 4-20x on random nodes), "
             f"{trials} trials per case (`python bench/bench_isolate.py --trials {trials} --write`):", "",
             "| nodes / bad | mode | right | healthy node drained | test jobs, median / max | waves, median / max |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['nodes']} / {r['bad']} | {r['mode']} | {r['right_pct']:g}% | {r['healthy_named']} | "
                     f"{r['jobs_median']:g} / {r['jobs_max']} | {r['waves_median']:g} / {r['waves_max']} |")
    wrong = sum(r["healthy_named"] for r in rows)
    lines += ["", f"Right in {min(r['right_pct'] for r in rows):g}% of trials at worst; a healthy node drained in "
              f"{wrong} of {trials * len(rows)} trials."]
    return "\n".join(lines) + "\n"


def on_testbed(size: int, runs: int, bad: int) -> dict:
    import subprocess
    import tempfile

    from slurm_hooks.hooks import collective
    from slurm_hooks.lab.testbed import LabSettings, Testbed

    rng = random.Random(f"testbed-{size}-{bad}")
    state = tempfile.mkdtemp(prefix="bench-isolate-")
    tb = Testbed(state, LabSettings(nodes=size, hooks=False, own_addresses=True, kill_wait=2))
    tb.up()
    cfg = os.path.join(state, "bench-config.toml")
    with open(tb.config_path, encoding="utf-8") as fh, open(cfg, "w", encoding="utf-8") as out:
        command = [sys.executable, collective.__file__, "--backend", "tcp", "--timeout", "8", "--size-mb", "2"]
        out.write(fh.read() + f"\n[isolate]\ncommand = {json.dumps(command)}\ntest_timeout = 15.0\nbudget = 600.0\n")
    right = healthy = 0
    rows = []
    try:
        for run_no in range(runs):
            tb.reset(timeout=60.0)
            faults = {n: rng.choice(("hang", "slow 8", "drop")) for n in rng.sample(tb.node_names, bad)}
            for node, fault in faults.items():
                tb.set_fault(node, fault)
            t0 = time.monotonic()
            done = subprocess.run([sys.executable, "-m", "slurm_hooks", "isolate", "--config", cfg, "--json",
                                   "--nodes", ",".join(tb.node_names)], env=tb.env(), capture_output=True, text=True,
                                  timeout=900)
            wall = time.monotonic() - t0
            out = json.loads([x for x in done.stdout.splitlines() if x.startswith("{")][-1])
            drained = sorted(n.name for n in tb.slurm().nodes() if n.drained)
            right += drained == sorted(faults)
            healthy += bool(set(drained) - set(faults))
            rows.append({"faults": faults, "drained": drained, "jobs": out["jobs"], "waves": out["waves"],
                         "wall_s": round(wall, 1)})
            print(f"run {run_no + 1:>2}: {faults} -> drained {drained}: {out['jobs']} jobs, {out['waves']} waves, "
                  f"{wall:.1f}s", flush=True)
    finally:
        tb.down()
    walls = [r["wall_s"] for r in rows]
    print(f"{size} nodes, {bad} bad: right {right}/{runs}, healthy node drained in {healthy} run(s); "
          f"jobs max {max(r['jobs'] for r in rows)}; wall median {statistics.median(walls):.1f}s max {max(walls):.1f}s")
    return {"right": right, "runs": runs, "healthy_drained": healthy, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--wave-s", type=float, default=30.0)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--testbed", type=int, default=0, metavar="N", help="run isolate on a real N-node testbed")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--bad", type=int, default=1)
    ap.add_argument("--write", action="store_true", help="write the simulated figures into docs/isolate.md")
    args = ap.parse_args()
    if args.testbed:
        on_testbed(args.testbed, args.runs, args.bad)
        return
    commit = DOC.ready() if args.write else ""
    rows = [run(size, bad, mode, args.trials, args.wave_s)
            for size in (16, 64) for bad in (1, 2) for mode in culprit.MODES]
    if args.write:
        DOC.write(render(rows, args.trials), commit)
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
