"""Time bridge passes over a big cluster and count the API calls.

    python bench/bench_bridge.py                 # 1,000 nodes, 50 bad, kmock over HTTP and in-memory
    python bench/bench_bridge.py --nodes 10000 --bad 500 --pods-per-node 30 --api memory

Three passes per API: the first (the bad nodes to cordon, taint, condition,
drain, replace), the steady state (nothing to do), and the recovery (the bad
nodes given back). ``kmock`` is the official client over real HTTP against the
kmock emulator in a thread (so its time includes an in-process API server
written in Python); ``memory`` is the bridge's logic against its in-memory
KubeApi. Both index pods by ``spec.nodeName`` as kube-apiserver's cache does, so
a field-selected LIST costs the node's pods, not the cluster's.

Each pass's time is split: ``api`` is the time spent inside the KubeApi calls
(the fake's work, or the HTTP round trips and kmock's), ``slurm`` the time inside
the fake Slurm, and ``bridge`` the rest: the bridge's own cost. The Slurm side of
a real cluster is measured apart: the parse of N ``scontrol -o show nodes`` lines.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

from fakes.slurm import FakeSlurm  # noqa: E402

from slurm_hooks.bridge.reconciler import Reconciler  # noqa: E402
from slurm_hooks.bridge.settings import BreakerSection, BridgeSection  # noqa: E402
from slurm_hooks.slurm import NodeInfo  # noqa: E402

REASON = "slurm-hooks: XID 79 on GPU 3 [replace]"


TRAIN_OWNER = {"metadata": {"ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "train",
                                                  "uid": "uid-train", "controller": True}]}}


def node_name(i: int) -> str:
    return f"gpu{i:05d}"


def populate(put_node, put_pod, nodes: int, pods_per_node: int) -> None:
    for i in range(nodes):
        name = node_name(i)
        put_node(name)
        put_pod(f"train-{i}", name, "jobs", TRAIN_OWNER)  # a controller: evictable (kubectl drain's rule)
        for k in range(1, pods_per_node):
            owner = {"metadata": {"ownerReferences": [{"kind": "DaemonSet", "name": f"ds{k}"}]}}
            put_pod(f"ds{k}-{i}", name, "kube-system", owner)


def slurm_for(nodes: int, bad: int) -> FakeSlurm:
    slurm = FakeSlurm(*[NodeInfo(node_name(i), "IDLE") for i in range(nodes)])
    for i in range(0, nodes, max(1, nodes // bad))[:bad]:
        slurm.drain(node_name(i), REASON)
    return slurm


class Timed:
    """Every method call on ``inner`` timed into ``self.seconds`` (attributes pass through)."""

    def __init__(self, inner):
        self._inner = inner
        self.seconds = 0.0

    def __getattr__(self, name):
        value = getattr(self._inner, name)
        if not callable(value):
            return value

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return value(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0

        return timed


def three_passes(kube, slurm: FakeSlurm, settings: BridgeSection, calls, bad: int) -> list[dict]:
    timed_kube, timed_slurm = Timed(kube), Timed(slurm)
    bridge = Reconciler(timed_slurm, timed_kube, settings, audit=None, sleep=lambda s: None)
    results = []
    for label in (f"first pass ({bad} bad)", "steady state", "recovery"):
        if label == "recovery":
            for info in slurm.nodes():
                if info.drained:
                    slurm.resume(info.name)
        before = dict(calls())
        timed_kube.seconds = timed_slurm.seconds = 0.0
        t0 = time.perf_counter()
        res = bridge.run_pass()
        elapsed = time.perf_counter() - t0
        after = calls()
        delta = {verb: after[verb] - before.get(verb, 0) for verb in after if after[verb] - before.get(verb, 0)}
        assert not res.errors, res.errors
        results.append({
            "pass": label, "seconds": round(elapsed, 3), "api_s": round(timed_kube.seconds, 3),
            "slurm_s": round(timed_slurm.seconds, 3),
            "bridge_s": round(elapsed - timed_kube.seconds - timed_slurm.seconds, 3),
            "api_calls": sum(delta.values()), "by_verb": delta,
            "taken": len(res.taken), "replaced": len(res.replaced), "restored": len(res.restored),
        })
    return results


def bench_memory(args, settings) -> list[dict]:
    from kube.memory import InMemoryKube

    kube = InMemoryKube()

    def put_pod(name: str, node: str, namespace: str, extra: dict) -> None:
        kube.load_pod({"apiVersion": "v1", "kind": "Pod",
                       "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}",
                                    **extra["metadata"]},
                       "spec": {"nodeName": node}, "status": {"phase": "Running"}})

    populate(lambda n: kube.add_node(n), put_pod, args.nodes, args.pods_per_node)
    return three_passes(kube, slurm_for(args.nodes, args.bad), settings, lambda: dict(kube.calls), args.bad)


def bench_kmock(args, settings) -> list[dict]:
    from kube.emulator import KubeServer, node, pod

    from slurm_hooks.bridge.kubeclient import connect

    server = KubeServer()
    try:
        populate(lambda n: server.put("v1/nodes", node(n)),
                 lambda p, n, ns, extra: server.put("v1/pods", pod(p, n, ns, **extra), ns),
                 args.nodes, args.pods_per_node)
        client = connect(url=server.url, timeout=30.0)
        return three_passes(client, slurm_for(args.nodes, args.bad), settings, lambda: dict(client.calls), args.bad)
    finally:
        server.close()


def bench_scontrol_parse(nodes: int) -> dict:
    from slurm_hooks.slurm.scontrol import parse_node_line

    lines = [
        f"NodeName={node_name(i)} Arch=x86_64 CoresPerSocket=56 CPUAlloc=0 CPUTot=224 Gres=gpu:h100:8 "
        f"NodeAddr={node_name(i)} State={'IDLE+DRAIN' if i % 20 == 0 else 'MIXED'} Partitions=gpu "
        + (f"Reason={REASON} [root@2025-01-01T00:00:00]" if i % 20 == 0 else "Comment=(null)")
        for i in range(nodes)
    ]
    t0 = time.perf_counter()
    parsed = [parse_node_line(line) for line in lines]
    elapsed = time.perf_counter() - t0
    assert sum(n.drained for n in parsed) == len(range(0, nodes, 20))
    return {"pass": f"parse {nodes} scontrol lines", "seconds": round(elapsed, 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--bad", type=int, default=50)
    parser.add_argument("--pods-per-node", type=int, default=3, help="1 evictable + N-1 DaemonSet pods")
    parser.add_argument("--api", choices=("kmock", "memory", "both"), default="both")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        settings = BridgeSection(
            state_file=os.path.join(tmp, "state.json"),
            breaker=BreakerSection(max_percent=10.0, max_nodes=max(args.bad, 1), window=600.0),
            leader_election=False,
        )
        settings = dataclasses.replace(settings, drain_pass_budget=5.0)
        report: dict[str, object] = {"nodes": args.nodes, "bad": args.bad, "pods_per_node": args.pods_per_node}
        if args.api in ("memory", "both"):
            report["memory"] = bench_memory(args, settings)
        if args.api in ("kmock", "both"):
            report["kmock"] = bench_kmock(args, settings)
        report["slurm"] = bench_scontrol_parse(args.nodes)

    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print(f"{args.nodes} nodes, {args.bad} bad, {args.pods_per_node} pods per node "
          f"(1 evictable + {args.pods_per_node - 1} DaemonSet)")
    for api in ("kmock", "memory"):
        for row in report.get(api, []):
            verbs = ", ".join(f"{v} {n}" for v, n in sorted(row["by_verb"].items()))
            print(f"  {api:6s} {row['pass']:22s} {row['seconds']:7.3f} s (bridge {row['bridge_s']:.3f}, "
                  f"API {row['api_s']:.3f}, Slurm {row['slurm_s']:.3f})  {row['api_calls']:5d} calls  ({verbs})")
    print(f"  slurm  {report['slurm']['pass']:22s} {report['slurm']['seconds']:7.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
