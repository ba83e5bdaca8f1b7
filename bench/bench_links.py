"""What the InfiniBand/RoCE link checks add to the healthy health check: ``slurm-hooks check`` on 8
simulated GPUs without ports, and with 8 healthy NDR ports (``sim init --ib 8``, ``[expect]
ib_ports = 8``, ``ib_rate_gbps = 400``), Python start-up included; then the gather step and the
three link checks alone, in process, on the same 8 ports.

    python bench/bench_links.py [--runs 30] [--json]

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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_check import run_once, summary  # noqa: E402


def in_process(sim_dir: str, state_dir: str, rounds: int = 2000) -> dict[str, float]:
    """Median microseconds of one gather of 8 ports (sysfs reads, the memory file read and
    written) and of the three link checks on what it gathered."""
    from slurm_hooks import engine
    from slurm_hooks.models import Context, Expectations, NodeSnapshot
    from slurm_hooks.probes import ib

    gather = ib.LinkGatherer(os.path.join(sim_dir, "ib", "bench1"), state_dir, "bench1", boot=lambda: "bench")
    checks = tuple(c for c in engine.registry.REGISTRY if c.name in engine.LINK_CHECKS)
    expect = Expectations(ib_ports=8, ib_rate_gbps=400)
    snap = NodeSnapshot("bench1", "sim")
    gathers, judges = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        ports = gather()
        t1 = time.perf_counter()
        report = engine.judge(snap, engine.JudgeRequest(expect, Context.CHECK, deadline_s=30.0,
                                                        links=lambda ports=ports: ports, checks=checks))
        t2 = time.perf_counter()
        assert report.healthy, report.findings
        gathers.append(t1 - t0)
        judges.append(t2 - t1)
    return {"gather_8_ports_us": round(statistics.median(gathers) * 1e6, 1),
            "judge_links_us": round(statistics.median(judges) * 1e6, 1), "rounds": rounds}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
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
        inner = in_process(os.path.join(tmp, "ib", "sim"), os.path.join(tmp, "ib", "inproc-state"))
    results = {n: summary(s) for n, s in samples.items()}
    added = {k: round(results[names[1]][k] - results[names[0]][k], 1) for k in ("wall_ms", "cpu_ms")}
    if args.json:
        print(json.dumps({"python": sys.version.split()[0], "results": results, "added": added, "in_process": inner},
                         indent=1))
        return
    for n in names:
        r = results[n]
        print(f"{n:<22} wall {r['wall_ms']:7.1f} ms (p90 {r['wall_p90_ms']:.1f})  cpu {r['cpu_ms']:7.1f} ms  "
              f"({r['runs']} runs)")
    print(f"{'8 ports add':<22} wall {added['wall_ms']:+7.1f} ms               cpu {added['cpu_ms']:+7.1f} ms")
    print(f"in process: gather 8 ports {inner['gather_8_ports_us']} us, judge the links {inner['judge_links_us']} us "
          f"(median of {inner['rounds']})")


if __name__ == "__main__":
    main()
