"""Slurm-side timings on a real local cluster (root; brings its own testbed up and down).

    python bench/bench_slurm.py [--runs 10] [--json]
    python bench/bench_slurm.py --backends [--runs 50] [--json] [--write]

- prolog overhead: sbatch -> the batch script's first line, hooks off vs on (median);
- fault -> job running again: XID 79 under a running job, detected by the
  HealthCheckProgram, until the batch script runs again on the healthy node;
- XID -> node drained: the watcher vs the periodic health check
  (HealthCheckInterval=5 here; on a cluster the wait is about half the interval).

``--backends``: each adapter call, through the scontrol backend and through pyslurm, on the same
cluster in one run (the two in turn, call by call, so a noisy machine slows both alike), and what
each costs a fresh process to set up (``from_config`` in a child: pyslurm's import, the version
check). pyslurm needs a pyslurm built for the testbed's Slurm in this interpreter, and a testbed
of that Slurm: ``SLURM_HOOKS_SLURM_PREFIX=/opt/slurm-25.11 VENV/bin/python bench/bench_slurm.py
--backends`` (docs/dev/testing.md builds both); without them only scontrol is timed, and the
output says why. ``--write`` puts the table between the ``bench_slurm`` markers of
docs/dev/performance.md.
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
from types import SimpleNamespace

from docblock import DocBlock

from slurm_hooks.lab.testbed import LabSettings, Testbed
from slurm_hooks.probes import sim

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = DocBlock(os.path.join(ROOT, "docs", "dev", "performance.md"), "bench_slurm")
OUR_REASON = "slurm-hooks: bench drain [reboot]"
SETUP = """\
import sys, time
t0 = time.perf_counter()
from types import SimpleNamespace
from slurm_hooks.slurm.factory import backend_for
config = SimpleNamespace(path=None, slurm=SimpleNamespace(backend=sys.argv[1], bin_dir=sys.argv[2], timeout=10.0))
slurm, choice = backend_for(config)
print(slurm.name, time.perf_counter() - t0)
"""

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


def backend_calls(tb: Testbed, runs: int) -> tuple[dict[str, dict[str, list[float]]], str]:
    """{call: {backend: seconds per call}} on ``tb``, the backends in turn; and why pyslurm is absent, if it is."""
    from slurm_hooks.slurm.factory import PYSLURM, backend_for

    config = SimpleNamespace(path=None, slurm=SimpleNamespace(backend="auto", bin_dir=tb.slurm_bin, timeout=10.0))
    chosen, choice = backend_for(config, env=tb.exports())
    adapters = {"scontrol": tb.slurm(timeout=10.0)}
    if choice.backend == PYSLURM:
        adapters["pyslurm"] = chosen
    tb.reset()
    job = tb.sbatch("#!/bin/sh\nsleep 600\n", "-w", "n1", "--gres=gpu:1")
    tb.wait_job(job, ("RUNNING",))

    def drain_resume(slurm) -> None:
        slurm.drain("n2", OUR_REASON)
        slurm.resume("n2")

    calls = {"node": lambda s: s.node("n1"), "nodes": lambda s: s.nodes(), "jobs_on_node": lambda s: s.jobs_on_node("n1"),
             "job": lambda s: s.job(job), "drain + resume": drain_resume}
    times: dict[str, dict[str, list[float]]] = {name: {b: [] for b in adapters} for name in calls}
    for name, call in calls.items():
        for slurm in adapters.values():
            call(slurm)  # warm: the scontrol backend asks the version once per process
        for _ in range(runs):
            for backend, slurm in adapters.items():
                t0 = time.perf_counter()
                call(slurm)
                times[name][backend].append(time.perf_counter() - t0)
    tb.reset()
    return times, "" if choice.backend == PYSLURM else choice.why


def backend_setup(tb: Testbed, runs: int, backends: list[str]) -> dict[str, list[float]]:
    """Seconds a fresh process takes to import the factory and build each backend's adapter."""
    env = {**tb.env(), "PYTHONPATH": ROOT}
    asked = {"scontrol": "scontrol", "pyslurm": "pyslurm"}
    out: dict[str, list[float]] = {b: [] for b in backends}
    for _ in range(runs):
        for backend in backends:
            done = subprocess.run([sys.executable, "-c", SETUP, asked[backend], tb.slurm_bin], env=env, check=True,
                                  capture_output=True, text=True, timeout=60)
            name, took = done.stdout.split()
            assert name == backend, (name, backend)
            out[backend].append(float(took))
    return out


def ms(samples: list[float]) -> str:
    return f"{statistics.median(samples) * 1000:.2f}"


def backends_table(tb: Testbed, runs: int) -> tuple[str, dict]:
    times, why_not = backend_calls(tb, runs)
    backends = list(next(iter(times.values())))
    setup = backend_setup(tb, max(5, runs // 5), backends)
    major, minor = tb.slurm_version
    load = os.getloadavg()[0]
    lines = [f"Slurm {major}.{minor:02d} testbed (2 nodes), Python {sys.version.split()[0]}, load average {load:.1f} "
             f"on {os.cpu_count()} CPUs, median of {runs} calls each, the backends in turn "
             f"(`python bench/bench_slurm.py --backends --runs {runs}`):", "",
             "| call | " + " | ".join(f"{b} ms" for b in backends) + (" | scontrol / pyslurm |" if len(backends) > 1
                                                                     else " |"),
             "|---|" + "---|" * (len(backends) + (len(backends) > 1))]
    for name, by in [*times.items(), (f"set up in a fresh process ({len(setup[backends[0]])} runs)", setup)]:
        ratio = (f" | {statistics.median(by['scontrol']) / statistics.median(by['pyslurm']):.1f}x"
                 if len(backends) > 1 else "")
        lines.append(f"| {name} | " + " | ".join(ms(by[b]) for b in backends) + ratio + " |")
    if why_not:
        lines += ["", f"pyslurm not timed: {why_not}."]
    data = {name: {b: round(statistics.median(v) * 1000, 3) for b, v in by.items()} for name, by in times.items()}
    data["setup"] = {b: round(statistics.median(v) * 1000, 3) for b, v in setup.items()}
    return "\n".join(lines) + "\n", data


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--backends", action="store_true", help="time each adapter call through scontrol and pyslurm")
    ap.add_argument("--write", action="store_true", help="with --backends: write the table into docs/dev/performance.md")
    args = ap.parse_args()
    if args.backends:
        with tempfile.TemporaryDirectory(prefix="sh-bench-") as tmp:
            tb = Testbed(tmp, LabSettings(nodes=2, hooks=False, kill_wait=2))
            tb.up()
            try:
                table, data = backends_table(tb, args.runs)
            finally:
                tb.down()
        print(json.dumps(data, indent=1) if args.json else table)
        if args.write:
            DOC.write(table)
        return
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
