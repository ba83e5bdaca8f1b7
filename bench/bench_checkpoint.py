"""The job's own checkpoint, measured on a real local cluster (root; brings its own testbed up and down).

    python bench/bench_checkpoint.py [--runs 5] [--json] [--skip-contracts] [--skip-split]

- **Where the time from XID to running elsewhere goes**, for a job without a signal (today's
  path): XID 79 injected under the job, the XID watcher on each node, and the time of each step
  from the audit log and the job's own start line: watcher saw it -> drained -> requeued ->
  the follower's ``StartTime=now`` -> the batch script runs again on the other node. With the
  repair ladder off and on (its ``scontrol reboot`` goes to slurmctld in the same second).
- **Work lost per incident, per contract, before and after**: each framework's contract job
  (:mod:`slurm_hooks.lab.contracts`; a stock submitit job) takes a step every 0.1 s; XID 79
  under it; the health check acts. "before" is today's path (``[requeue] checkpoint_grace =
  0``: no signal first, ``scontrol requeue`` at once); "after" the signal first. Work lost
  is the step reached at the fault minus the step the job resumed from, in seconds.

KillWait is 30 s, as on a site (120 s is the usual recommendation).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from slurm_hooks.errors import SlurmHooksError
from slurm_hooks.lab import contracts
from slurm_hooks.lab.testbed import LabSettings, Testbed
from slurm_hooks.lab.waiting import poll
from slurm_hooks.observe.audit import AuditLog
from slurm_hooks.probes import sim
from slurm_hooks.runner import spawn_detached

STAMP_JOB = ("#!/bin/sh\necho \"start $(date +%s.%N) restart=${SLURM_RESTART_COUNT:-0} on $SLURMD_NODENAME\"\n"
             "trap 'exit 0' TERM\nwhile true; do sleep 0.1; done\n")
GRACE_S = 8.0


def wait_for(pred, timeout: float, what: str, interval: float = 0.01):
    value = poll(pred, timeout, interval)
    if not value:
        raise SystemExit(f"not within {timeout:g}s: {what}")
    return value


def stamp(tb: Testbed, job: int, restart: int) -> tuple[float, str] | None:
    for line in tb.job_output(job).splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[0] == "start" and parts[2] == f"restart={restart}":
            return float(parts[1]), parts[4]
    return None


def first(records: list[dict], **match) -> float | None:
    found = [r["ts"] for r in records if all(r.get(k) == v for k, v in match.items())]
    return min(found) if found else None


def split_once(tb: Testbed) -> dict[str, float]:
    """One XID under a job without a signal, with the watchers running: seconds from the injection."""
    tb.reset()
    job = tb.sbatch(STAMP_JOB, "--gres=gpu:1", "--open-mode=append")
    _, node = wait_for(lambda: stamp(tb, job, 0), 30, "job started")
    gpu = tb.slurm().job_gpus(str(job), node)[0]
    time.sleep(0.5)
    seen: dict[str, float] = {}
    stop = threading.Event()

    def watch_states() -> None:  # what squeue says, every ~30 ms (one squeue each)
        slurm = tb.slurm()
        while not stop.is_set():
            try:
                info = slurm.job(str(job))
            except SlurmHooksError:
                continue
            state = info.base_state if info.restarts or info.base_state != "RUNNING" else ""
            if info.base_state == "RUNNING" and info.restarts:
                state = "RUNNING again"
            if state:
                seen.setdefault(state, time.time())

    watcher = threading.Thread(target=watch_states, daemon=True)
    watcher.start()
    t0 = time.time()
    sim.inject(tb.sim_dir, node, gpu, xid=79)
    t_run, again = wait_for(lambda: stamp(tb, job, 1), 60, "job running again")
    assert again != node, (again, node)
    time.sleep(0.5)
    stop.set()
    watcher.join(5)
    records = [r for r in AuditLog(tb.audit_log).read() if r.get("ts", 0) >= t0 - 0.01]
    marks = {
        "watcher saw the XID": first(records, kind="alert", context="watch"),
        "drained": first(records, kind="action", action="drain", result="ok"),
        "requeued (scontrol requeue back)": first(records, kind="action", action="requeue", result="ok"),
        "squeue: COMPLETING": seen.get("COMPLETING"),
        "epilog on the bad node judged": first(records, kind="alert", context="epilog"),
        "squeue: PENDING": seen.get("PENDING"),
        "StartTime=now (follower)": first(records, kind="action", action="start_now", result="ok"),
        "squeue: RUNNING again": seen.get("RUNNING again"),
        "running elsewhere (script's first line)": t_run,
    }
    return {k: round(v - t0, 3) for k, v in marks.items() if v is not None}


def fault_split(tmp: str, runs: int, repair: bool) -> dict[str, dict[str, float]]:
    tb = Testbed(os.path.join(tmp, f"split-{int(repair)}"),
                 LabSettings(nodes=2, hooks=True, kill_wait=30, health_check_interval=300, requeue_grace=35.0,
                          repair=repair))
    tb.up()
    watchers = []
    try:
        for node in tb.node_names:
            spawned = spawn_detached([sys.executable, "-m", "slurm_hooks", "watch", "--node", node], env=tb.env(),
                                     cwd=None, output=tb.path("log", f"watch-{node}.log"))
            if not spawned.started:
                raise SystemExit(f"watcher on {node}: {spawned.error}")
            watchers.append(spawned)
        samples = [split_once(tb) for _ in range(runs)]
    finally:
        for w in watchers:
            w.stop(5)
        tb.down()
    keys = sorted({k for s in samples for k in s}, key=lambda k: statistics.median(s[k] for s in samples if k in s))
    return {k: {"median_s": round(statistics.median(s[k] for s in samples if k in s), 3),
                "max_s": round(max(s[k] for s in samples if k in s), 3)} for k in keys}


def start_line(text: str, restart: int) -> dict[str, str] | None:
    for line in text.splitlines():
        if line.startswith(f"start restart={restart} "):
            return dict(part.split("=", 1) for part in line.split() if "=" in part)
    return None


def contract_once(tb: Testbed, tmp: str, contract: str) -> dict[str, float]:
    """One fault under a ``contract`` job; work lost (s) and fault -> running elsewhere (s)."""
    tb.reset(timeout=75.0)
    work = tempfile.mkdtemp(dir=tmp, prefix=f"{contract}-")
    if contract == "submitit":
        env = {**tb.env(), "PATH": f"{os.path.dirname(sys.executable)}:/usr/bin:/bin"}
        folder = os.path.join(work, "submitit")
        out = subprocess.run([sys.executable, "-c", contracts.SUBMITIT_DRIVER, folder, work], env=env,
                             capture_output=True, text=True, timeout=60, check=True)
        ref = out.stdout.split()[-1]

        def output() -> str:
            return contracts.submitit_output(folder, ref)
    else:
        save_every = 50 if contract == "none" else 0  # torchtitan: a periodic save only, every 5 s here
        ref = str(tb.sbatch(contracts.batch_script(contract, work, save_every=save_every), "--gres=gpu:1"))

        def output() -> str:
            return tb.job_output(int(ref))
    wait_for(lambda: len(contracts.steps(work)) >= 100, 90, f"{contract} job running 10 s", interval=0.1)
    time.sleep(2.5)  # off the periodic save's beat (every 5 s for "none")
    slurm = tb.slurm()
    node = slurm.job(ref).nodes
    sim.inject(tb.sim_dir, node, slurm.job_gpus(ref, node)[0], xid=79)
    fault = time.time()
    subprocess.run([os.path.join(tb.state_dir, "bin", "healthcheck")], env={"SLURMD_NODENAME": node},
                   capture_output=True, timeout=60, check=False)
    reached = contracts.step_at(work, fault)
    resumed = wait_for(lambda: start_line(output(), 1), 120, f"{contract} job restarted", interval=0.1)
    # The restarted run's first step.
    restarted = wait_for(lambda: contracts.steps(work, restart=1), 30, "a step after the restart", interval=0.1)
    return {"work_lost_s": round(contracts.work_lost(reached, int(resumed["step"])), 1),
            "fault_to_running_again_s": round(restarted[0][1] - fault, 1),
            "restarts": slurm.job(ref).restarts}


def contracts_before_after(tmp: str, runs: int) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for label, grace in (("before", 0.0), ("after", GRACE_S)):
        tb = Testbed(os.path.join(tmp, f"contracts-{label}"),
                     LabSettings(nodes=2, hooks=True, kill_wait=30, health_check_interval=300, requeue_grace=35.0,
                              checkpoint_grace=grace))
        tb.up()
        try:
            for contract in ("submitit", "lightning", "megatron", "none"):
                samples = [contract_once(tb, tmp, contract) for _ in range(runs)]
                out.setdefault(contract, {})[label] = {
                    "work_lost_s": statistics.median(s["work_lost_s"] for s in samples),
                    "fault_to_running_again_s": statistics.median(s["fault_to_running_again_s"] for s in samples),
                    "restarts": sorted({s["restarts"] for s in samples}),
                }
        finally:
            tb.down()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--skip-contracts", action="store_true")
    ap.add_argument("--skip-split", action="store_true")
    args = ap.parse_args()
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="sh-bench-ckpt-") as tmp:
        os.chmod(tmp, 0o755)
        if not args.skip_split:
            results["xid_to_running_elsewhere_no_signal"] = fault_split(tmp, args.runs, repair=False)
            results["xid_to_running_elsewhere_no_signal_with_repair"] = fault_split(tmp, args.runs, repair=True)
        if not args.skip_contracts:
            results["work_lost_per_incident"] = contracts_before_after(tmp, max(1, args.runs // 5))
    if args.json:
        print(json.dumps(results, indent=1))
        return
    for name, table in results.items():
        print(name)
        for key, value in table.items():
            print(f"  {key:45s} {value}")


if __name__ == "__main__":
    main()
