"""How many collective test jobs, waves and how much wall time ``isolate`` needs to find the bad
nodes, and that it never drains a healthy one (a simulated fabric: slurm_hooks.remedy.culprit.Fabric).

    python bench/bench_isolate.py [--trials 300] [--test-s 30] [--json] [--write]
    python bench/bench_isolate.py --testbed 8 [--runs 10] [--fault net-slow] [--bad 1]   (root)

Each case puts faults on random nodes (hang, drop, slow 4-20x unless the case names its own) and
runs the search in both modes with an absolute floor at half the healthy bandwidth (what
``validate --learn`` proposes from a healthy run). The cases: 16 nodes with 1, 2 and 4 bad; 64
with 8; 3 hung of 16 (partners are reused, so tests queue behind hung ones); 1 bad of 16 with 2%
of all tests dipping to 0.25x; a node slow only when it is not rank 0; 1 bad of 16 and a node
that hangs in 30% of its tests, each in a run started because jobs failed (the suspects: the bad
node and a healthy one that shared two of its failed jobs); and, past what the search can
promise, that intermittent node in a preflight run (no failed job) and a healthy fabric with
dips. Prints, per case: trials where exactly the bad nodes were named, trials ending
inconclusive, trials that said "ok" with a bad node missed, trials with a healthy node named
(must be 0), test jobs, waves and the simulated wall time (a test ``--test-s`` long, a hung one
4 times that: its limit).
``--write`` puts them between this bench's markers in docs/isolate.md (the commit must be clean:
the block names it).

``--testbed N`` runs ``slurm-hooks isolate`` for real instead: a testbed of N nodes, each on its
own address, ``--runs`` times the kernel-made ``--fault`` (``testbed fault``: net-drop, net-slow
KBPS, net-loss PCT) on ``--bad`` random node(s), the built-in TCP ring all-reduce as the test;
prints per run the fault, what was drained, test jobs and wall time, then how many runs were right
and whether a healthy node was ever drained.
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
#: The floor the simulated runs use: half the fabric's healthy bandwidth (Fabric's base is 100).
FLOOR = 50.0
#: (label, nodes, bad, fault kinds ("" = hang, drop or slow 4-20x), share of tests dipping, held to the criteria,
#: started because jobs failed (the bad nodes and one healthy node suspected) or a preflight run)
CASES = [
    ("16 / 1", 16, 1, (), 0.0, True, False),
    ("16 / 2", 16, 2, (), 0.0, True, False),
    ("16 / 4", 16, 4, (), 0.0, True, False),
    ("64 / 8", 64, 8, (), 0.0, True, False),
    ("16 / 3 hung", 16, 3, ("hang",), 0.0, True, False),
    ("16 / 1, 2% of tests at 0.25x", 16, 1, (), 0.02, True, False),
    ("16 / 1 slow 8x unless rank 0", 16, 1, ("slow-peer 8",), 0.0, True, False),
    ("16 / 1, after failed jobs", 16, 1, (), 0.0, True, True),
    ("16 / 1 hangs in 30% of tests, after failed jobs", 16, 1, ("flaky 0.3",), 0.0, True, True),
    ("16 / 1 hangs in 30% of tests, preflight", 16, 1, ("flaky 0.3",), 0.0, False, False),
    ("16 / 0, 2% of tests at 0.25x", 16, 0, (), 0.02, False, False),
]


def run(case: tuple, mode: str, trials: int, test_s: float) -> dict:
    label, size, bad, kinds, transient, held, after_failure = case
    rng = random.Random(f"{label}-{mode}")
    nodes = [f"n{k}" for k in range(1, size + 1)]
    right = healthy = inconclusive = missed_ok = 0
    jobs, waves, walls = [], [], []
    t0 = time.perf_counter()
    for trial in range(trials):
        fabric = culprit.Fabric(nodes, culprit.random_faults(nodes, bad, rng, kinds), seed=trial, transient=transient)
        suspected = [*fabric.faults, rng.choice([n for n in nodes if n not in fabric.faults])] if after_failure else []
        found = culprit.search(nodes, fabric.run_wave, mode=mode, floor=FLOOR, suspected=suspected,
                               started_by="failed jobs" if after_failure else "")
        bad_nodes, named = set(fabric.faults), set(found.culprits)
        right += named == bad_nodes
        healthy += bool(named - bad_nodes)
        inconclusive += found.verdict == "inconclusive"
        missed_ok += found.verdict == "ok" and bool(bad_nodes - named)
        jobs.append(found.jobs)
        waves.append(found.waves)
        walls.append(fabric.wall * test_s)
    cpu = (time.perf_counter() - t0) / trials
    return {"case": label, "nodes": size, "bad": bad, "mode": mode, "trials": trials, "held": held,
            "right": right, "inconclusive": inconclusive, "missed_said_ok": missed_ok, "healthy_named": healthy,
            "jobs_median": statistics.median(jobs), "jobs_max": max(jobs),
            "waves_median": statistics.median(waves), "waves_max": max(waves),
            "wall_s_median": statistics.median(walls), "wall_s_max": max(walls), "search_cpu_us": round(cpu * 1e6, 1)}


def render(rows: list[dict], trials: int, test_s: float) -> str:
    """The figures as docs/isolate.md shows them."""
    lines = [f"Simulated fabric (`slurm_hooks.remedy.culprit.Fabric`), {trials} trials per case, floor at half the "
             f"healthy bandwidth, a test {test_s:g} s and a hung one {4 * test_s:g} s "
             f"(`python bench/bench_isolate.py --trials {trials} --write`):", "",
             "| nodes / bad | mode | all bad named, nothing else | inconclusive | said ok, a bad node missed | "
             "healthy node drained | test jobs, median / max | waves, median / max | wall, median / max |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        mark = "" if r["held"] else " (*)"
        lines.append(f"| {r['case']}{mark} | {r['mode']} | {r['right']} | {r['inconclusive']} | {r['missed_said_ok']} | "
                     f"{r['healthy_named']} | {r['jobs_median']:g} / {r['jobs_max']} | "
                     f"{r['waves_median']:g} / {r['waves_max']} | {r['wall_s_median']:.0f} s / {r['wall_s_max']:.0f} s |")
    held = [r for r in rows if r["held"]]
    one = [r for r in held if r["case"] == "16 / 1" and r["mode"] == "bisect"]
    lines += ["", f"A healthy node drained in {sum(r['healthy_named'] for r in rows)} of {trials * len(rows)} trials; "
              f"a bad node missed by a run that said ok in {sum(r['missed_said_ok'] for r in held)} of "
              f"{trials * len(held)} trials of the cases above without (*); 1 bad of 16 (bisect) found in at most "
              f"{one[0]['jobs_max'] if one else '?'} test jobs.",
              "(*) Beyond what the search promises: in a preflight run (no failed job started it) a node that hangs "
              "in 30% of its tests passes a screen 70% of the time (the run says ok); after failed jobs the same "
              "node ends the run inconclusive or found, never ok. A healthy fabric's dips end a run inconclusive, "
              "never with a drain."]
    return "\n".join(lines) + "\n"


def on_testbed(size: int, runs: int, bad: int, fault: str) -> dict:
    import re
    import shlex
    import subprocess
    import tempfile

    from slurm_hooks.hooks import collective
    from slurm_hooks.lab.testbed import LabSettings, Testbed

    rng = random.Random(f"testbed-{size}-{bad}-{fault}")
    state = tempfile.mkdtemp(prefix="bench-isolate-")
    tb = Testbed(state, LabSettings(nodes=size, gpus=1, hooks=False, own_addresses=True, kill_wait=2))
    tb.up()
    # 160 MiB through each link: nftables' rate limit lets about a second's worth through at once.
    ring = [sys.executable, collective.__file__, "--backend", "tcp", "--timeout", "25", "--size-mb", "8", "--iters", "20"]
    right = healthy = 0
    rows = []
    try:
        # A healthy pair's busbw: "net-slow" without a rate is a tenth of it, and the floor a fifth.
        out = subprocess.run(["srun", "-N2", "-w", f"{tb.node_names[0]},{tb.node_names[1]}", "--gres=gpu:1", *ring],
                             env=tb.env(), capture_output=True, text=True, timeout=120).stdout
        peers = float(re.search(r"busbw=([0-9.]+)", out).group(1))
        if fault == "net-slow":
            fault = f"net-slow {max(1, int(peers * 1e6 / 10))}"
        cfg = os.path.join(state, "bench-config.toml")
        with open(tb.config_path, encoding="utf-8") as fh, open(cfg, "w", encoding="utf-8") as out_fh:
            out_fh.write(fh.read() + f"\n[isolate]\ncommand = {json.dumps(ring)}\ntest_timeout = 40.0\n"
                         f"budget = 600.0\nmin_busbw_gbps = {peers / 5:.4g}\n")
        print(f"healthy pair busbw {peers:g} GB/s; fault {fault!r}; floor {peers / 5:.4g}", flush=True)
        for run_no in range(runs):
            tb.reset(timeout=60.0)
            faults = {n: fault for n in rng.sample(tb.node_names, bad)}
            for node, text in faults.items():
                tb.set_fault(node, text)
            t0 = time.monotonic()
            done = subprocess.run([sys.executable, "-m", "slurm_hooks", "isolate", "--config", cfg, "--json",
                                   "--nodes", ",".join(tb.node_names)], env=tb.env(), capture_output=True, text=True,
                                  timeout=900)
            wall = time.monotonic() - t0
            out = json.loads([x for x in done.stdout.splitlines() if x.startswith("{")][-1])
            drained = sorted(n.name for n in tb.slurm().nodes() if n.drained)
            right += drained == sorted(faults)
            healthy += bool(set(drained) - set(faults))
            rows.append({"faults": faults, "drained": drained, "verdict": out["verdict"], "jobs": out["jobs"],
                         "waves": out["waves"], "wall_s": round(wall, 1), "exit": done.returncode})
            print(f"run {run_no + 1:>2}: {shlex.quote(fault)} on {sorted(faults)} -> drained {drained} "
                  f"({out['verdict']}, exit {done.returncode}): {out['jobs']} jobs, {out['waves']} waves, {wall:.1f}s",
                  flush=True)
    finally:
        tb.down()
    walls = [r["wall_s"] for r in rows]
    print(f"{size} nodes, {bad} x {fault}: right {right}/{runs}, healthy node drained in {healthy} run(s); "
          f"jobs max {max(r['jobs'] for r in rows)}; wall median {statistics.median(walls):.1f}s max {max(walls):.1f}s")
    return {"right": right, "runs": runs, "healthy_drained": healthy, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=300)
    ap.add_argument("--test-s", type=float, default=30.0)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--testbed", type=int, default=0, metavar="N", help="run isolate on a real N-node testbed")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--bad", type=int, default=1)
    ap.add_argument("--fault", default="net-drop", help="testbed fault: net-drop, net-slow [KBPS] (default: a "
                                                        "tenth of a healthy pair's busbw), net-loss PCT")
    ap.add_argument("--write", action="store_true", help="write the simulated figures into docs/isolate.md")
    args = ap.parse_args()
    if args.testbed:
        on_testbed(args.testbed, args.runs, args.bad, args.fault)
        return
    commit = DOC.ready() if args.write else ""
    rows = [run(case, mode, args.trials, args.test_s) for case in CASES for mode in culprit.MODES]
    if args.write:
        DOC.write(render(rows, args.trials, args.test_s), commit)
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{'case':<30} {'mode':<8} {'right':>5} {'incon':>5} {'okmiss':>6} {'healthy':>7} {'jobs':>7} {'waves':>5} "
          f"{'wall':>6}")
    for r in rows:
        print(f"{r['case']:<30} {r['mode']:<8} {r['right']:>5} {r['inconclusive']:>5} {r['missed_said_ok']:>6} "
              f"{r['healthy_named']:>7} {r['jobs_median']:>3g}/{r['jobs_max']:<3} {r['waves_median']:>2g}/{r['waves_max']:<2} "
              f"{r['wall_s_median']:>5.0f}s")
    print(f"(of {args.trials} trials each; jobs and waves: median/max; wall: median, a test {args.test_s:g} s)")


if __name__ == "__main__":
    main()
