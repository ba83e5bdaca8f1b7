"""What the InfiniBand/RoCE link checks add to the healthy health check: ``slurm-hooks check`` on 8
simulated GPUs without ports, and with 8 healthy NDR ports (``sim init --ib 8``, ``[expect]
ib_ports = 8``, ``ib_rate_gbps = 400``), Python start-up included; then the gather step and the
link checks alone, in process, on the captured H100 tree laid as a node's sysfs with a second
RoCE port (8 InfiniBand + 2 RoCE ports, tests/fakes/ibtree.py), gathered every 5 s of a fake
clock as the XID watcher may (the largest counter memory: ten readings a port). Goal: gathering
and judging under 5 ms. Writes its figures, with the commit, into docs/severity.md.

    python bench/bench_links.py [--runs 30] [--json] [--no-write] [--check-markers]

Every round runs each subject once, in a rotating order; medians of wall and CPU time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))  # the captured tree's layout (tests/fakes/ibtree.py)
from bench_check import run_once, summary  # noqa: E402
from docblock import DocBlock  # noqa: E402

DOC = DocBlock(os.path.join(ROOT, "docs", "severity.md"), "bench_links")
GOAL_MS = 5.0


def in_process(tmp: str, rounds: int = 2000) -> dict[str, float]:
    """Median microseconds of one gather of 8 InfiniBand + 2 RoCE ports (sysfs reads, the memory
    file read and written) and of the link checks on what it gathered."""
    from fakes import ibtree

    from slurm_hooks import engine
    from slurm_hooks.models import Context, Expectations, NodeSnapshot
    from slurm_hooks.probes import ib

    root = ibtree.lay(os.path.join(tmp, "sys"), roce=2)
    clock = [1000.0]
    gather = ib.LinkGatherer(root, os.path.join(tmp, "inproc-state"), "bench1", boot=lambda: "bench",
                             clock=lambda: clock[0])
    checks = tuple(c for c in engine.registry.REGISTRY if c.name in engine.LINK_CHECKS)
    expect = Expectations(ib_ports=8, ib_rate_gbps=400, roce_ports=2, roce_rate_gbps=200)
    snap = NodeSnapshot("bench1", "sim")
    gathers, judges, totals = [], [], []
    for _ in range(rounds):
        clock[0] += 5.0
        t0 = time.perf_counter()
        ports = gather()
        t1 = time.perf_counter()
        report = engine.judge(snap, engine.JudgeRequest(expect, Context.CHECK, deadline_s=30.0,
                                                        links=lambda ports=ports: ports, checks=checks))
        t2 = time.perf_counter()
        assert report.healthy and not report.drain_findings(), report.findings
        assert len(ports) == 10 and sum(p.roce for p in ports) == 2
        gathers.append(t1 - t0)
        judges.append(t2 - t1)
        totals.append(t2 - t0)
    readings = max(len(p["readings"]) for p in gather.load()["ports"].values())
    return {"gather_10_ports_us": round(statistics.median(gathers) * 1e6, 1),
            "judge_links_us": round(statistics.median(judges) * 1e6, 1),
            "total_us": round(statistics.median(totals) * 1e6, 1),
            "total_p90_us": round(sorted(totals)[int(len(totals) * 0.9)] * 1e6, 1),
            "readings_per_port": readings, "rounds": rounds}


def commit() -> str:
    try:
        out = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             timeout=10)
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() + (" with local changes" if dirty else "") if out.returncode == 0 else "unknown"


def block(inner: dict[str, float], results: dict, added: dict, runs: int) -> str:
    load = os.getloadavg()[0]
    met = "met" if inner["total_us"] / 1000 < GOAL_MS else "NOT met"
    return (f"Python {sys.version.split()[0]}, commit {commit()}, load average {load:.1f} on "
            f"{os.cpu_count()} CPUs (`python bench/bench_links.py --runs {runs}`):\n\n"
            f"| in process, median of {inner['rounds']} | us |\n|---|---|\n"
            f"| gather 8 InfiniBand + 2 RoCE ports (sysfs, memory read and written; "
            f"{inner['readings_per_port']} readings a port kept) | {inner['gather_10_ports_us']} |\n"
            f"| judge them (the link checks) | {inner['judge_links_us']} |\n"
            f"| both | {inner['total_us']} (p90 {inner['total_p90_us']}): goal {GOAL_MS:g} ms {met} |\n\n"
            f"`slurm-hooks check`, 8 simulated GPUs, median of {runs} rounds: without ports "
            f"{results['check, no IB ports']['wall_ms']} ms wall / {results['check, no IB ports']['cpu_ms']} ms CPU, "
            f"with 8 simulated IB ports {results['check, 8 IB ports']['wall_ms']} / "
            f"{results['check, 8 IB ports']['cpu_ms']} ms (added: {added['wall_ms']:+} ms wall, "
            f"{added['cpu_ms']:+} ms CPU).\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-write", action="store_true", help="print the figures, leave docs/severity.md alone")
    ap.add_argument("--check-markers", action="store_true", help="only check that the page has its markers")
    args = ap.parse_args()
    if args.check_markers:
        raise SystemExit(DOC.check(ROOT))
    here = os.path.join(os.path.dirname(os.path.abspath(sys.executable)), "slurm-hooks")
    if not os.path.exists(here):
        raise SystemExit(f"{here} not found: run this with the python of a venv that has slurm-hooks")
    with tempfile.TemporaryDirectory() as tmp:
        def setup(label: str, ports: int) -> dict[str, str]:
            d = os.path.join(tmp, label)
            os.makedirs(d)
            cfg = os.path.join(d, "config.toml")
            expect = "ib_ports = 8\nib_rate_gbps = 400\n" if ports else ""
            with open(cfg, "w") as fh:
                fh.write(f'[gpu]\nbackend = "sim"\nsim_dir = "{d}/sim"\n[log]\naudit = "{d}/audit.jsonl"\n'
                         f'[state]\ndir = "{d}/state"\n[expect]\ngpus = 8\n{expect}')
            env = {"PATH": "/usr/bin:/bin", "SLURM_HOOKS_CONFIG": cfg, "SLURMD_NODENAME": "bench1"}
            subprocess.run([here, "sim", "init", "--node", "bench1", "--gpus", "8",
                            *(["--ib", str(ports)] if ports else [])], env=env, check=True, stdout=subprocess.DEVNULL)
            return env

        subjects = {"check, no IB ports": setup("plain", 0), "check, 8 IB ports": setup("ib", 8)}
        names = list(subjects)
        samples: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
        for n in names:  # warm the page cache and the .pyc files (and the ports' first reading)
            run_once([here, "check"], subjects[n], expect_rc=0)
        for i in range(args.runs):
            for n in names[i % len(names):] + names[:i % len(names)]:
                samples[n].append(run_once([here, "check"], subjects[n], expect_rc=0))
        inner = in_process(tmp)
    results = {n: summary(s) for n, s in samples.items()}
    added = {k: round(results[names[1]][k] - results[names[0]][k], 1) for k in ("wall_ms", "cpu_ms")}
    if not args.no_write:
        DOC.write(block(inner, results, added, args.runs))
    if args.json:
        print(json.dumps({"python": sys.version.split()[0], "results": results, "added": added, "in_process": inner},
                         indent=1))
        return
    for n in names:
        r = results[n]
        print(f"{n:<22} wall {r['wall_ms']:7.1f} ms (p90 {r['wall_p90_ms']:.1f})  cpu {r['cpu_ms']:7.1f} ms  "
              f"({r['runs']} runs)")
    print(f"{'8 ports add':<22} wall {added['wall_ms']:+7.1f} ms               cpu {added['cpu_ms']:+7.1f} ms")
    print(f"in process: gather 8 IB + 2 RoCE ports {inner['gather_10_ports_us']} us, judge the links "
          f"{inner['judge_links_us']} us, both {inner['total_us']} us (p90 {inner['total_p90_us']}; median of "
          f"{inner['rounds']}; goal {GOAL_MS:g} ms)")


if __name__ == "__main__":
    main()
