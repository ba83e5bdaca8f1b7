"""A storm on a many-node cluster: XID 79 on several nodes at once. What does it cost slurmctld, what pages go out?

    python bench/bench_storm32.py [--nodes 32] [--hit 8] [--rounds 3] [--json] [--write]

Brings up its own testbed (root) with ``--nodes`` slurmd's and one full-node batch job on each
node, gives every node a state dir, an audit log and a webhook of its own (a config per node, as
each real node has its own /var/lib and /var/log), puts XID 79 on GPU 0 of ``--hit`` nodes, then
runs ``slurm-hooks check`` on every node at once, as slurmd's HealthCheckProgram would, ``--rounds``
times: round 1 drains and requeues; the later rounds find the hit nodes already drained by us.
``sdiag -r`` before each round; after it, ``sdiag``'s client requests (``REQUEST_*`` other than the
daemons' own messages) over the hit nodes is the figure (the healthy nodes' checks are in it too,
so it is an upper bound). ``--write``: the figures go between this bench's markers in
docs/dev/performance.md. ``--nodes 2 --hit 1`` shows one hit node's RPCs by type.

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
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests"), os.path.join(ROOT, "bench")]

from bench_storm import DAEMON_MESSAGES, sdiag_rpcs  # noqa: E402
from docblock import DocBlock  # noqa: E402
from fakes.webhook import Receiver  # noqa: E402

from slurm_hooks.commands.render import render_all  # noqa: E402
from slurm_hooks.lab.alertmanager import LabAlertmanager, ensure_installed  # noqa: E402
from slurm_hooks.lab.testbed import BIN, LabSettings, Testbed  # noqa: E402
from slurm_hooks.probes import sim  # noqa: E402
from slurm_hooks.runner import run_command  # noqa: E402

PAGE = os.path.join(ROOT, "docs", "dev", "performance.md")
DOC = DocBlock(PAGE, "bench_storm32")
GOAL = 20
JOB = "#!/bin/sh\ntrap 'exit 0' TERM\nwhile true; do sleep 1; done\n"


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


def storm(tb: Testbed, python: str, hit: int, rounds: int, receiver: Receiver, am: LabAlertmanager, root: str,
          group_wait: float) -> dict:
    configs, audits = {}, {}
    for n in tb.node_names:
        configs[n], audits[n] = node_config(tb, n, root, receiver.url("/hook"), am.url)
    jobs = [tb.sbatch(JOB, f"--gres=gpu:{tb.settings.gpus}", "--requeue") for _ in tb.node_names]
    for job in jobs:
        tb.wait_job(job, ["RUNNING"], timeout=120)
    check_round(tb, python, configs)  # healthy: each node's hourly look at Slurm, as before any storm
    hit_nodes = tb.node_names[:: max(1, len(tb.node_names) // hit)][:hit]
    for n in hit_nodes:
        sim.inject(tb.sim_dir, n, 0, xid=79)
    out = {"nodes": len(tb.node_names), "hit": hit_nodes, "rounds": []}
    for k in range(rounds):
        run_command([os.path.join(BIN, "sdiag"), "-r"], 10, env=tb.env())
        codes, took = check_round(tb, python, configs)
        if k == 0:
            followers_done(audits, 120.0)
        time.sleep(1.0)  # the last follower's final squeue
        client = {t: c for t, c in sdiag_rpcs(tb).items() if not DAEMON_MESSAGES.match(t)}
        total = sum(client.values())
        out["rounds"].append({"checks_s": round(took, 2), "exit_codes": sorted(set(codes)), "client_rpcs": total,
                              "per_hit_node": round(total / len(hit_nodes), 1),
                              "by_type": dict(sorted(client.items(), key=lambda kv: -kv[1]))})
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
    first, later = r["rounds"][0], r["rounds"][1:]
    worst = max(x["per_hit_node"] for x in r["rounds"])
    lines = [f"{r['nodes']} nodes, XID 79 on {len(r['hit'])} at once ({', '.join(r['hit'])}), one state dir, "
             f"audit log and webhook per node, `slurm-hooks check` on every node at once (`{command}`):", "",
             "| round | checks took (s) | client RPCs | per hit node | by type |", "|---|---|---|---|---|"]
    for k, x in enumerate(r["rounds"], 1):
        types = ", ".join(f"{t} {c}" for t, c in x["by_type"].items())
        lines.append(f"| {k}{' (drain, requeue)' if k == 1 else ' (already drained)'} | {x['checks_s']} | "
                     f"{x['client_rpcs']} | {x['per_hit_node']} | {types} |")
    lines += ["", f"Per hit node (every node's checks counted, the healthy ones' too): at most {worst} "
              f"(goal: {GOAL}, {'met' if worst <= GOAL else 'not met'}); first round {first['per_hit_node']}"
              + (f", then {', '.join(str(x['per_hit_node']) for x in later)}" if later else "") + ".",
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
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--python", default=sys.executable, help="interpreter that runs the hooks (the code measured)")
    ap.add_argument("--group-wait", type=float, default=10.0, help="Alertmanager's group_wait (seconds)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--write", action="store_true", help=f"write the figures into {PAGE}")
    args = ap.parse_args()
    if not 1 <= args.hit <= args.nodes:
        raise SystemExit(f"--hit must be 1..{args.nodes}, got {args.hit}")
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
            result = storm(tb, args.python, args.hit, args.rounds, receiver, am, os.path.join(tmp, "nodes"),
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
