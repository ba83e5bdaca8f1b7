"""A storm: every node of a cluster fails at once. What does remediation cost slurmctld?

    python bench/bench_storm.py [--nodes 16] [--jobs-per-node 2] [--python PY] [--json]

Brings up its own testbed (root) with ``--nodes`` slurmd's, fills every node
with ``--jobs-per-node`` batch jobs, puts XID 79 on one GPU of every node, resets
slurmctld's counters (``sdiag -r``), then runs ``slurm-hooks check`` on every
node at once, as slurmd's HealthCheckProgram would, and waits until every
requeue follower is done (each requeued job has its ``start_now`` record).
``sdiag`` then gives the RPCs slurmctld served, by type: the client requests
(squeue, scontrol, sinfo: ``REQUEST_*`` other than the daemons' own completion
messages) per requeued job is the figure.

``--python`` picks the interpreter that runs the hooks, and so the code under
test: a virtualenv with another checkout installed measures that checkout
(its hooks and follower) against the same cluster.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

from slurm_hooks.lab.testbed import BIN, LabSettings, Testbed
from slurm_hooks.probes import sim
from slurm_hooks.runner import run_command

#: A job that checkpoints for {checkpoint} seconds on SIGTERM, then exits.
JOB = "#!/bin/sh\ntrap 'sleep {checkpoint}; exit 0' TERM\nwhile true; do sleep 0.2; done\n"
#: What the daemons send on their own (slurmd registering, jobs completing), and sdiag's own request.
DAEMON_MESSAGES = re.compile(r"^(MESSAGE_|REQUEST_COMPLETE_|REQUEST_STEP_COMPLETE|REQUEST_STATS_INFO|"
                             r"REQUEST_EPILOG_COMPLETE|RESPONSE_)")


def sdiag_rpcs(tb: Testbed) -> dict[str, int]:
    """slurmctld's RPC counts by message type since the last ``sdiag -r``."""
    return sdiag_counts(tb)[0]


def sdiag_counts(tb: Testbed) -> tuple[dict[str, int], dict[str, int]]:
    """slurmctld's RPC counts since the last ``sdiag -r``, by message type and by user, as an admin reads
    them (this read is one ``REQUEST_STATS_INFO`` of root's in both)."""
    out = run_command([os.path.join(BIN, "sdiag")], 10, env=tb.env()).stdout
    sections: dict[str, dict[str, int]] = {"message": {}, "user": {}}
    counts: dict[str, int] | None = None
    for line in out.splitlines():
        if line.startswith("Remote Procedure Call statistics by "):
            counts = sections.get(line.split(" by ", 1)[1].split()[0])
            continue
        m = re.match(r"\s+(\S+)\s+\(\s*\d+\)\s+count:(\d+)", line)
        if counts is not None and m:
            counts[m.group(1)] = int(m.group(2))
        elif line.strip() and not line.startswith((" ", "\t")):
            counts = None
    return sections["message"], sections["user"]


def audit(tb: Testbed) -> list[dict]:
    try:
        with open(tb.audit_log, encoding="utf-8") as fh:
            return [json.loads(line) for line in fh if line.strip()]
    except FileNotFoundError:
        return []


def storm(tb: Testbed, python: str, jobs_per_node: int, follow_timeout: float, checkpoint: int) -> dict:
    gpus = tb.settings.gpus // jobs_per_node
    script = JOB.format(checkpoint=checkpoint)
    jobs = [tb.sbatch(script, f"--gres=gpu:{gpus}", "--requeue") for _ in range(len(tb.node_names) * jobs_per_node)]
    for job in jobs:
        tb.wait_job(job, ["RUNNING"], timeout=60)
    for node in tb.node_names:
        sim.inject(tb.sim_dir, node, 0, xid=79)
    run_command([os.path.join(BIN, "sdiag"), "-r"], 10, env=tb.env())
    env = {**tb.env(), "SLURM_HOOKS_CONFIG": tb.config_path}
    started = time.monotonic()
    checks = [subprocess.Popen([python, "-m", "slurm_hooks", "check", "--config", tb.config_path, "--node", node],
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd="/")
              for node in tb.node_names]
    codes = [p.wait(timeout=120) for p in checks]
    checked = time.monotonic() - started
    records = audit(tb)
    requeued = [r["target"] for r in records if r.get("action") == "requeue" and r.get("result") == "ok"]
    deadline = time.monotonic() + follow_timeout
    while time.monotonic() < deadline:
        followed = {r["target"] for r in audit(tb) if r.get("action") == "start_now"}
        if followed >= set(requeued):
            break
        time.sleep(0.5)
    followed_s = time.monotonic() - started
    time.sleep(1.0)  # let the last follower's final squeue land
    counts = sdiag_rpcs(tb)
    client = {k: v for k, v in counts.items() if not DAEMON_MESSAGES.match(k)}
    total = sum(client.values())
    starts = [r for r in audit(tb) if r.get("action") == "start_now"]
    return {
        "nodes": len(tb.node_names), "jobs": len(jobs), "check_exit_codes": sorted(set(codes)),
        "requeued": len(requeued), "start_now_ok": sum(1 for r in starts if r.get("result") == "ok"),
        "checks_s": round(checked, 2), "until_all_followed_s": round(followed_s, 2),
        "client_rpcs": total, "rpcs_per_requeued_job": round(total / max(1, len(requeued)), 1),
        "by_type": dict(sorted(client.items(), key=lambda kv: -kv[1])),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--jobs-per-node", type=int, default=2)
    parser.add_argument("--python", default=sys.executable, help="interpreter that runs the hooks (the code measured)")
    parser.add_argument("--follow-timeout", type=float, default=240.0)
    parser.add_argument("--checkpoint", type=int, default=0,
                        help="seconds each job spends on SIGTERM before it exits (KillWait is set above it)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="storm-") as tmp:
        tb = Testbed(os.path.join(tmp, "tb"), LabSettings(nodes=args.nodes, gpus=8, hooks=False,
                                                       kill_wait=max(2, args.checkpoint + 2),
                                                       requeue_grace=3.0, up_timeout=180.0))
        try:
            tb.up()
            result = storm(tb, args.python, args.jobs_per_node, args.follow_timeout, args.checkpoint)
        finally:
            tb.down()
    result["python"], result["checkpoint_s"] = args.python, args.checkpoint
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print(f"{result['nodes']} nodes failing at once, {result['jobs']} jobs checkpointing {args.checkpoint}s on "
          f"SIGTERM: {result['requeued']} requeued, "
          f"{result['start_now_ok']} made eligible at once; checks done in {result['checks_s']}s, "
          f"all followed in {result['until_all_followed_s']}s")
    print(f"slurmctld client RPCs: {result['client_rpcs']} = {result['rpcs_per_requeued_job']} per requeued job")
    for name, count in result["by_type"].items():
        print(f"  {name:32s} {count}")


if __name__ == "__main__":
    main()
