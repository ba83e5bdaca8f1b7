"""slurmctld RPCs per healthy health check, counted by ``sdiag`` on the real testbed.

    python bench/bench_rpc.py [--checks 20] [--json]

Brings up a private testbed (its own temp dir; hooks not wired, so slurmd's own periodic
checks do not run), lays the programs with ``slurm-hooks install``, resets slurmctld's
statistics (``sdiag -r``), runs the installed ``slurm-hooks-healthcheck`` as slurmd runs it
(no PATH, SLURMD_NODENAME only) ``--checks`` times on each node, and reads ``sdiag``'s RPCs by
message type. The same idle window without checks is counted first and subtracted (slurmd's
own traffic), as are the ``sdiag`` calls themselves. The first check on a node makes the one
rate-limited look a node without a drain record makes (once an hour); the rest make none.
Prints RPCs per check, and what 2,000 nodes at HealthCheckInterval=300 cost slurmctld.
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

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from slurm_hooks.lab.testbed import BIN, LabSettings, Testbed  # noqa: E402
from slurm_hooks.remedy.ownership import RECOVER_LOOK_S  # noqa: E402

_RPC = re.compile(r"^\s+([A-Z_0-9]+)\s+\(\s*\d+\)\s+count:(\d+)", re.M)


def rpcs(tb: Testbed) -> dict[str, int]:
    out = subprocess.run([os.path.join(BIN, "sdiag")], env=tb.env(), capture_output=True, text=True,
                         timeout=30, check=True).stdout
    section = out.split("Remote Procedure Call statistics by message type", 1)[-1]
    section = section.split("Remote Procedure Call statistics by user", 1)[0]
    return {name: int(n) for name, n in _RPC.findall(section)}


def reset(tb: Testbed) -> None:
    subprocess.run([os.path.join(BIN, "sdiag"), "-r"], env=tb.env(), capture_output=True, timeout=30, check=True)


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    keys = set(after) | set(before)
    return {k: after.get(k, 0) - before.get(k, 0) for k in keys if after.get(k, 0) != before.get(k, 0)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--checks", type=int, default=20, help="health checks per node")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tb = Testbed(os.path.join(tmp, "tb"), LabSettings(nodes=2, gpus=8, hooks=False, health_check_interval=0))
        tb.up()
        try:
            prefix = os.path.join(tmp, "opt")
            exe = os.path.join(os.path.dirname(os.path.abspath(sys.executable)), "slurm-hooks")
            subprocess.run([exe, "install", "--prefix", prefix, "--config", tb.config_path, "--env",
                            f"SLURM_CONF={tb.slurm_conf}"], check=True, stdout=subprocess.DEVNULL, timeout=120)
            program = os.path.join(prefix, "bin", "slurm-hooks-healthcheck")

            def checks(times: int) -> tuple[dict[str, int], float]:
                """RPCs by type while ``times`` checks run on each node, and how long that took."""
                reset(tb)
                before = rpcs(tb)
                t0 = time.monotonic()
                for _ in range(times):
                    for node in tb.node_names:
                        subprocess.run([program], env={"SLURMD_NODENAME": node}, check=True, timeout=60,
                                       stdout=subprocess.DEVNULL)
                return delta(rpcs(tb), before), time.monotonic() - t0

            first, first_s = checks(1)  # a node without a drain record looks once an hour: here
            steady, took = checks(args.checks)  # within the hour: no look
            reset(tb)
            before = rpcs(tb)
            time.sleep(took)  # slurmd's own traffic over as long, with no check: the baseline
            idle = delta(rpcs(tb), before)
        finally:
            tb.down()

    def ours(counted: dict[str, int], seconds: float) -> dict[str, int]:
        out = {k: v - round(idle.get(k, 0) * seconds / max(took, 1e-9)) for k, v in counted.items()}
        out.pop("REQUEST_STATS_INFO", None)  # sdiag itself
        return {k: v for k, v in out.items() if v > 0}

    looks, steady_rpcs = ours(first, first_s), ours(steady, took)
    n_nodes = 2
    per_look = sum(looks.values()) / n_nodes
    per_check = sum(steady_rpcs.values()) / (args.checks * n_nodes)
    nodes, interval = 2000, 300.0
    fleet = nodes / interval * per_check + nodes / RECOVER_LOOK_S * per_look
    result = {"checks_per_node": args.checks, "first_check_rpcs": looks, "steady_rpcs": steady_rpcs,
              "rpcs_per_hourly_look": per_look, "rpcs_per_check_steady": per_check, "idle_baseline": idle,
              "seconds": round(took, 1),
              "fleet_2000_nodes_interval_300": {"checks_per_s": round(nodes / interval, 2),
                                                "rpcs_per_s": round(fleet, 3)}}
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print(f"first healthy check on each of 2 nodes (the hourly look): {per_look:g} RPC(s) per node {looks}")
    print(f"{args.checks} more healthy checks per node in {took:.1f} s: {per_check:g} RPC(s) per check {steady_rpcs}")
    print(f"2,000 nodes at HealthCheckInterval=300: {nodes / interval:.2f} checks/s -> {fleet:.3f} slurmctld RPCs/s")


if __name__ == "__main__":
    main()
