"""A storm on a many-node cluster: XID 79 on several nodes at once. What does it cost slurmctld, what pages go out?

    python bench/bench_storm32.py [--nodes 32] [--hit 8] [--spare 8] [--rounds 3] [--json] [--write]

Brings up its own testbed (root) with ``--nodes`` slurmd's and one full-node batch job on each
node but ``--spare`` (left idle for the hit nodes' jobs to run again on), gives every node a state
dir, an audit log and a webhook of its own (a config per node, as each real node has its own
/var/lib and /var/log), puts XID 79 on GPU 0 of ``--hit`` busy nodes, then runs ``slurm-hooks
check`` on every node at once, as slurmd's HealthCheckProgram would, ``--rounds`` times: round 1
drains and requeues; the later rounds find the hit nodes already drained by us.

Counted as an admin counts it: ``sdiag -r`` right before the fault, ``sdiag`` once the last hit job
runs again (its script's first line, read from its output file: the bench's own waiting asks
slurmctld nothing), and the figure is every RPC sdiag shows for root (``by user``: here slurmd's and
slurmctld's own messages as well as our squeue and scontrol calls; the ``sdiag`` that reads them
left out) over the hit nodes. The healthy nodes' checks are in it too, so it is an upper bound.
The later rounds: ``sdiag -r`` before each, ``sdiag`` a second after its checks. ``--write``: the
figures go between this bench's markers in docs/dev/performance.md. ``--nodes 2 --hit 1 --spare 1``
shows one hit node's RPCs by type.

Pages: a real HTTP receiver (tests/fakes/webhook.py) stands for the plain JSON webhook (each node
sends its own messages: one per node) and for the receiver of a real Alertmanager (Debian's
prometheus-alertmanager, slurm_hooks.lab.alertmanager) that every node also posts to, with
``slurm-hooks render alertmanager``'s route (``group_by: [alertname, cluster]``): one page naming
every hit node is Alertmanager's grouping, not the node's. Before the fault, one healthy round
on every node: each makes its hourly look at Slurm then, as on a cluster that has been running.
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests"), os.path.join(ROOT, "bench")]

from bench_storm import DAEMON_MESSAGES, sdiag_counts  # noqa: E402
from docblock import DocBlock  # noqa: E402
from fakes.webhook import Receiver  # noqa: E402

from slurm_hooks.commands.render import render_all  # noqa: E402
from slurm_hooks.lab.alertmanager import LabAlertmanager, ensure_installed  # noqa: E402
from slurm_hooks.lab.testbed import BIN, LabSettings, Testbed  # noqa: E402
from slurm_hooks.lab.waiting import poll  # noqa: E402
from slurm_hooks.probes import sim  # noqa: E402
from slurm_hooks.runner import run_command  # noqa: E402

PAGE = os.path.join(ROOT, "docs", "dev", "performance.md")
DOC = DocBlock(PAGE, "bench_storm32")
GOAL = 20
#: Says when and where it (re)starts, in its output file: the bench learns that a job runs again
#: without asking slurmctld.
JOB = ("#!/bin/sh\necho \"start $(date +%s.%N) restart=${SLURM_RESTART_COUNT:-0} on $SLURMD_NODENAME\"\n"
       "trap 'exit 0' TERM\nwhile true; do sleep 1; done\n")


def node_config(tb: Testbed, node: str, root: str, url: str, am_url: str) -> tuple[str, str]:
    """A config for ``node`` alone: the testbed's, with its own state dir, audit log and webhook."""
    state, audit = os.path.join(root, node, "state"), os.path.join(root, node, "audit.jsonl")
    os.makedirs(state, mode=0o700, exist_ok=True)
    with open(tb.config_path, encoding="utf-8") as fh:
        text = fh.read()
    for old, new in ((tb.hooks_state_dir, state), (tb.audit_log, audit)):
        if json.dumps(old) not in text:
            raise SystemExit(f"{tb.config_path} does not name {old}: the testbed's config changed")
        text = text.replace(json.dumps(old), json.dumps(new))
    text += (f'\n[notify]\nsettle = 0.5\n\n[[notify.webhook]]\nurl = {json.dumps(url)}\n'
             f'\n[[notify.alertmanager]]\nurl = {json.dumps(am_url)}\n')
    path = os.path.join(root, node, "config.toml")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
    return path, audit


def records(path: str) -> list[dict]:
    try:
        with open(path, encoding="utf-8") as fh:
            return [json.loads(line) for line in fh if line.strip()]
    except FileNotFoundError:
        return []


def check_round(tb: Testbed, python: str, configs: dict[str, str]) -> tuple[list[int], float]:
    env = tb.env()
    env.pop("SLURM_HOOKS_CONFIG", None)
    started = time.monotonic()
    procs = [subprocess.Popen([python, "-m", "slurm_hooks", "check", "--config", configs[n], "--node", n],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/")
             for n in tb.node_names]
    return [p.wait(timeout=300) for p in procs], time.monotonic() - started


def followers_done(audits: dict[str, str], timeout: float) -> None:
    """Until each requeued job has its follower's ``start_now`` record (or ``timeout``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        recs = [r for a in audits.values() for r in records(a)]
        requeued = {r["target"] for r in recs if r.get("action") == "requeue" and r.get("result") == "ok"}
        if {r["target"] for r in recs if r.get("action") == "start_now"} >= requeued:
            return
        time.sleep(0.5)


def started(tb: Testbed, job: int, restart: int) -> tuple[float, str] | None:
    """When and where the job's run number ``restart`` began (its script's first line), if it has."""
    for line in tb.job_output(job).splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[0] == "start" and parts[2] == f"restart={restart}":
            return float(parts[1]), parts[4]
    return None


def running_again(tb: Testbed, jobs: list[int], timeout: float) -> dict[int, tuple[float, str]]:
    """Until every job in ``jobs`` has begun its second run (or ``timeout``): when and where each did."""
    seen: dict[int, tuple[float, str]] = {}

    def all_seen() -> bool:
        for job in jobs:
            again = seen.get(job) or started(tb, job, 1)
            if again is not None:
                seen[job] = again
        return len(seen) == len(jobs)

    poll(all_seen, timeout, 0.1)
    return seen


def counted(tb: Testbed, hit: int, took: float) -> dict:
    """slurmctld's RPCs since the last ``sdiag -r``: every one sdiag shows for root, less its own read."""
    by_type, by_user = sdiag_counts(tb)
    by_type = dict(by_type)
    by_type["REQUEST_STATS_INFO"] = by_type.get("REQUEST_STATS_INFO", 0) - 1
    by_type = {t: c for t, c in by_type.items() if c > 0}
    root = by_user.get("root", 0) - 1
    ours = sum(c for t, c in by_type.items() if not DAEMON_MESSAGES.match(t))
    return {"took_s": round(took, 2), "root_rpcs": root, "per_hit_node": round(root / hit, 1),
            "ours": ours, "ours_per_hit_node": round(ours / hit, 1),
            "other_users": {u: c for u, c in by_user.items() if u != "root"},
            "by_type": dict(sorted(by_type.items(), key=lambda kv: (-kv[1], kv[0])))}


def storm(tb: Testbed, python: str, hit: int, spare: int, rounds: int, receiver: Receiver, am: LabAlertmanager,
          root: str, group_wait: float) -> dict:
    configs, audits = {}, {}
    for n in tb.node_names:
        configs[n], audits[n] = node_config(tb, n, root, receiver.url("/hook"), am.url)
    jobs = [tb.sbatch(JOB, f"--gres=gpu:{tb.settings.gpus}", "--requeue", "--open-mode=append")
            for _ in range(len(tb.node_names) - spare)]
    placed = {}  # node -> its job, as each job's first line says
    for job in jobs:
        tb.wait_job(job, ["RUNNING"], timeout=120)
        begun = poll(lambda job=job: started(tb, job, 0), 30.0, 0.1)
        if not begun:
            raise SystemExit(f"job {job} runs but its script wrote no start line")
        placed[begun[1]] = job
    check_round(tb, python, configs)  # healthy: each node's hourly look at Slurm, as before any storm
    busy = [n for n in tb.node_names if n in placed]
    hit_nodes = busy[:: max(1, len(busy) // hit)][:hit]
    hit_jobs = [placed[n] for n in hit_nodes]
    out = {"nodes": len(tb.node_names), "hit": hit_nodes, "spare": len(tb.node_names) - len(busy), "rounds": []}
    run_command([os.path.join(BIN, "sdiag"), "-r"], 10, env=tb.env())
    fault = time.time()
    for n in hit_nodes:
        sim.inject(tb.sim_dir, n, 0, xid=79)
    codes, took = check_round(tb, python, configs)
    again = running_again(tb, hit_jobs, 180.0)
    first = counted(tb, len(hit_nodes), took)
    if len(again) < len(hit_jobs):
        raise SystemExit(f"only {len(again)} of the {len(hit_jobs)} hit jobs ran again within 180 s")
    span = max(t for t, _ in again.values()) - fault
    out["rounds"].append({**first, "exit_codes": sorted(set(codes)), "span_s": round(span, 2),
                          "running_again_s": sorted(round(t - fault, 2) for t, _ in again.values()),
                          "moved": all(again[j][1] != n for j, n in zip(hit_jobs, hit_nodes))})
    followers_done(audits, 60.0)
    for _ in range(rounds - 1):
        run_command([os.path.join(BIN, "sdiag"), "-r"], 10, env=tb.env())
        codes, took = check_round(tb, python, configs)
        time.sleep(1.0)
        out["rounds"].append({**counted(tb, len(hit_nodes), took), "exit_codes": sorted(set(codes))})
    drained = {n for n in tb.node_names if "slurm-hooks:" in (tb.slurm().node(n).reason or "")}
    out["drained"] = sorted(drained, key=tb.node_names.index)
    time.sleep(group_wait + 2.0)  # Alertmanager's group gathers, then notifies
    grouped = [b for b in receiver.bodies("/am") if b.get("status") == "firing"]
    out["am_pages"] = len(grouped)
    out["am_nodes"] = [sorted({a["labels"]["node"] for a in b["alerts"]}, key=tb.node_names.index) for b in grouped]
    pages = [r["body"] for r in receiver.requests if r["path"] == "/hook"]
    out["pages"] = len(pages)
    out["pages_by_kind"] = {}
    for body in pages:
        kind = str(body.get("kind"))
        out["pages_by_kind"].setdefault(kind, []).append(str(body.get("node")))
    return out


def block(r: dict, command: str) -> str:
    first = r["rounds"][0]
    hit = len(r["hit"])
    times = first["running_again_s"]
    lines = [f"{r['nodes']} nodes, one full-node job on each but {r['spare']} left idle, XID 79 on {hit} at once "
             f"({', '.join(r['hit'])}), one state dir, audit log and webhook per node, `slurm-hooks check` on every "
             f"node at once (`{command}`). Every RPC `sdiag` shows for root (our squeue and scontrol calls and "
             "slurmd's own messages), over the hit nodes; round 1 from `sdiag -r` right before the fault until "
             "the last hit job runs again, each later round over its checks:", "",
             "| round | span (s) | checks took (s) | RPCs | per hit node | of them ours | by type |",
             "|---|---|---|---|---|---|---|"]
    for k, x in enumerate(r["rounds"], 1):
        types = ", ".join(f"{t} {c}" for t, c in x["by_type"].items())
        what = " (drain, requeue, until the last hit job runs again)" if k == 1 else " (already drained)"
        lines.append(f"| {k}{what} | {x.get('span_s', '')} | {x['took_s']} | {x['root_rpcs']} | "
                     f"**{x['per_hit_node']}** | {x['ours_per_hit_node']} | {types} |")
    worst = max(x["per_hit_node"] for x in r["rounds"])
    others = {u: c for x in r["rounds"] for u, c in x["other_users"].items()}
    lines += ["", f"Per hit node: at most {worst} (goal: {GOAL}, {'met' if worst <= GOAL else 'not met'}); first "
              f"round {first['per_hit_node']} (ours {first['ours_per_hit_node']}, the rest slurmd's and slurmctld's "
              f"messages for the jobs' ends and starts)"
              + (f", then {', '.join(str(x['per_hit_node']) for x in r['rounds'][1:])}" if r["rounds"][1:] else "")
              + "." + (f" Other users' RPCs: {others}." if others else ""),
              f"From the fault, the hit jobs ran again (their scripts' first lines) after {times[0]} to {times[-1]} s "
              f"(median {statistics.median(times):g}), {'each' if first['moved'] else 'not each'} on another node; "
              f"the {r['nodes']} checks at once took {first['took_s']} s of it.",
              f"Drained by us: {', '.join(r['drained'])}. Pages to the plain JSON webhook: {r['pages']}, "
              "one message per node and kind (" + "; ".join(f"{k}: {', '.join(v)}" for k, v in
                                                         r["pages_by_kind"].items()) + "). "
              f"Pages from Alertmanager (`group_by: [alertname, cluster]`): {r['am_pages']} firing, naming "
              + "; ".join(", ".join(nodes) for nodes in r["am_nodes"]) + "."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=32)
    ap.add_argument("--hit", type=int, default=8)
    ap.add_argument("--spare", type=int, default=None, help="nodes left idle for the hit jobs (default: --hit)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--python", default=sys.executable, help="interpreter that runs the hooks (the code measured)")
    ap.add_argument("--group-wait", type=float, default=10.0, help="Alertmanager's group_wait (seconds)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--write", action="store_true", help=f"write the figures into {PAGE}")
    args = ap.parse_args()
    spare = args.hit if args.spare is None else args.spare
    if not 1 <= spare < args.nodes or not 1 <= args.hit <= args.nodes - spare:
        raise SystemExit(f"--spare must be 1..{args.nodes - 1} and --hit 1..{args.nodes} - spare, "
                         f"got {spare} and {args.hit}")
    commit = DOC.ready() if args.write else ""  # before the hour's run: it refuses uncommitted code
    ensure_installed()
    receiver = Receiver()
    with tempfile.TemporaryDirectory(prefix="storm32-") as tmp:
        tb = Testbed(os.path.join(tmp, "tb"), LabSettings(nodes=args.nodes, gpus=8, hooks=False, kill_wait=2,
                                                       health_check_interval=0, requeue_grace=3.0,
                                                       up_timeout=300.0))
        am = LabAlertmanager(os.path.join(tmp, "am"), render_all(
            am_webhook_url=receiver.url("/am"), am_group_wait=f"{args.group_wait:g}s", am_group_interval="5m",
        )["alertmanager"])
        try:
            am.start()
            tb.up()
            result = storm(tb, args.python, args.hit, spare, args.rounds, receiver, am, os.path.join(tmp, "nodes"),
                           args.group_wait)
        finally:
            tb.down()
            am.stop()
            receiver.stop()
    if args.json:
        print(json.dumps(result, indent=1))
    text = block(result, "python bench/bench_storm32.py " + " ".join(sys.argv[1:]))
    if not args.json:
        print(text, end="")
    if args.write:
        DOC.write(text, commit)


if __name__ == "__main__":
    main()
