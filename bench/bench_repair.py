"""Repair and deep validation on a real local cluster (root; brings its own testbed up and down).

    python bench/bench_repair.py [--runs 3] [--json]

- reset (row remap pending on an idle node, HealthCheckInterval=2): fault -> drained ->
  repair worker started -> [validating] -> IDLE again, with the sim's DCGM level 2 (2 s);
- the HealthCheckProgram's own time on the run that hands the reset to the worker, with the
  reset hanging 62 s (past slurmd's 60 s kill): run by hand, as slurmd runs it;
- reboot (XID 79 on an idle node): fault -> reboot requested -> new boot validated -> IDLE;
- ``slurm-hooks sweep --nodes n[1-3] --level 2 --max-parallel 2``: a latent fault on n1's GPU 3,
  a job on n3: the sweep's whole time and each validation job's.
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

from slurm_hooks.lab.testbed import MARKER, LabSettings, Testbed
from slurm_hooks.probes import sim
from slurm_hooks.runner import run_command


def records(tb: Testbed) -> list[dict]:
    try:
        with open(tb.audit_log, encoding="utf-8") as fh:
            return [json.loads(x) for x in fh if x.strip()]
    except FileNotFoundError:
        return []


def first(tb: Testbed, action: str, result: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for r in records(tb):
            if r.get("action") == action and r.get("result") == result:
                return r
        time.sleep(0.05)
    raise SystemExit(f"no {action} {result} within {timeout}s: {[(r.get('action'), r.get('result')) for r in records(tb)]}")


def reset_run(tb: Testbed) -> dict[str, float]:
    tb.reset()
    t0 = time.time()
    sim.inject(tb.sim_dir, "n1", 3, row_remap_pending=True)
    drained = first(tb, "drain", "ok", 30)["ts"]
    worker = first(tb, "repair-worker", "start", 30)["ts"]
    validating = first(tb, "repair-validate", "start", 60)["ts"]
    ok = first(tb, "repair-reset", "ok", 60)["ts"]
    tb.wait_node("n1", lambda n: n.state.upper() == "IDLE" and not n.reason, timeout=30)
    idle = time.time()
    return {"fault_to_drained": drained - t0, "drained_to_worker": worker - drained,
            "worker_to_validating": validating - worker, "validating_to_ok": ok - validating,
            "fault_to_idle": idle - t0}


def reboot_run(tb: Testbed) -> dict[str, float]:
    tb.reset()
    t0 = time.time()
    sim.inject(tb.sim_dir, "n1", 0, xid=79)
    requested = first(tb, "repair-reboot", "start", 30)["ts"]
    ok = first(tb, "repair-reboot", "ok", 90)["ts"]
    tb.wait_node("n1", lambda n: n.state.upper() == "IDLE" and not n.reason, timeout=30)
    return {"xid79_to_reboot_requested": requested - t0, "reboot_requested_to_ok": ok - requested,
            "xid79_to_idle": time.time() - t0}


def hook_time(tb: Testbed) -> float:
    """The HealthCheckProgram that hands a 62 s reset to the worker, as slurmd runs it."""
    tb.reset()
    tb.set_hooks(False)  # slurmd runs no check of its own meanwhile
    try:
        sim.inject(tb.sim_dir, "n1", 3, row_remap_pending=True, reset_hang=62)
        env = {**tb.env(), "SLURMD_NODENAME": "n1", MARKER: tb.state_dir}
        t0 = time.monotonic()
        run_command([tb.path("bin", "healthcheck")], 70, env=env, check=False)
        took = time.monotonic() - t0
        first(tb, "repair-worker", "start", 10)
        return took
    finally:
        tb.stop_repair_workers()
        tb.set_hooks(True)


def sweep_run(tb: Testbed, text: bool = False) -> dict[str, float]:
    tb.reset()
    sim.inject(tb.sim_dir, "n1", 3, diag_failure=2)
    job = tb.sbatch("#!/bin/sh\nsleep 300\n", "-w", "n3")
    tb.wait_job(job, ("RUNNING",), timeout=20)
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "slurm_hooks", "sweep", "--nodes", "n[1-3]", "--level", "2",
                           "--max-parallel", "2", *([] if text else ["--json"])], capture_output=True, text=True,
                          env=tb.env(), timeout=300)
    took = time.monotonic() - t0
    if text:
        print(f"$ slurm-hooks sweep --nodes 'n[1-3]' --level 2 --max-parallel 2\n{done.stdout}(exit {done.returncode})")
        return {}
    data = json.loads(done.stdout)
    per_node = {n["node"]: n["seconds"] for n in data["nodes"] if n["verdict"] != "skipped"}
    return {"sweep_total": took, **{f"job_{k}": v for k, v in per_node.items()}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (the Slurm testbed)")
    with tempfile.TemporaryDirectory(prefix="bench-repair-") as d:
        tb = Testbed(d, LabSettings(nodes=3, gpus=8, health_check_interval=2, repair=True, reset_timeout=120))
        tb.up()
        try:
            runs: dict[str, list[float]] = {}
            for _ in range(args.runs):
                for key, value in {**reset_run(tb), **reboot_run(tb), **sweep_run(tb)}.items():
                    runs.setdefault(key, []).append(value)
            runs["hook_with_62s_reset"] = [hook_time(tb)]
            if not args.json:
                sweep_run(tb, text=True)
        finally:
            tb.down()
    out = {k: {"median": round(statistics.median(v), 2), "min": round(min(v), 2), "max": round(max(v), 2)}
           for k, v in runs.items()}
    if args.json:
        print(json.dumps(out, indent=1))
        return
    for key, v in out.items():
        print(f"{key:<26} median {v['median']:6.2f}s  (min {v['min']:.2f}, max {v['max']:.2f}, {len(runs[key])} run(s))")


if __name__ == "__main__":
    main()
