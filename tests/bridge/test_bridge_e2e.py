"""End to end: a real slurmctld and slurmd's, slurm-hooks draining for real, the bridge over HTTP to kmock.

Slurm is the session testbed (``tests/conftest.py``: nodes ``n1`` and ``n2``,
simulated GPUs); Kubernetes is kmock holding Nodes ``n1`` and ``n2`` (bare
metal: same names) and their pods. The bridge reads Slurm through the real
scontrol adapter and writes Kubernetes through the official client.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time

import pytest
from paths import ROOT

pytest.importorskip("kmock")
pytest.importorskip("kubernetes")

from kube.doubles import controlled_by  # noqa: E402
from kube.emulator import node, pod  # noqa: E402

from slurm_hooks.bridge.reconciler import Reconciler, slurm_busy, slurm_healthy  # noqa: E402
from slurm_hooks.bridge.settings import BridgeSection  # noqa: E402
from slurm_hooks.observe.audit import AuditLog  # noqa: E402
from slurm_hooks.probes import sim  # noqa: E402

pytestmark = [pytest.mark.slurm, pytest.mark.k8s]
pytest_plugins = ["kube.fixtures"]

TAINT = "slurm-hooks.io/gpu-unhealthy"


def check(tb, name: str) -> subprocess.CompletedProcess:
    """``slurm-hooks check`` on ``name``, the HealthCheckProgram's command, against the testbed."""
    return subprocess.run([sys.executable, "-m", "slurm_hooks", "check", "--node", name, "--config", tb.config_path],
                          env={**tb.env, "PYTHONPATH": ROOT}, capture_output=True, text=True, timeout=60)


def drained_by_us(info) -> bool:
    return info.drained and info.reason.startswith("slurm-hooks:")


@pytest.fixture
def cluster(clean_testbed, kube_server):
    for name in ("n1", "n2"):
        kube_server.put("v1/nodes", node(name))
        kube_server.put("v1/pods", pod(f"train-{name}", name, "jobs", **controlled_by()), "jobs")
        kube_server.put("v1/pods", pod(f"dcgm-{name}", name, "gpu",
                                       metadata={"ownerReferences": [{"kind": "DaemonSet", "name": "dcgm"}]}), "gpu")
    return clean_testbed, kube_server


@pytest.fixture
def bridge(cluster, kube_client, tmp_path):
    tb, _ = cluster
    settings = BridgeSection(mapping="name", state_file=str(tmp_path / "bridge-state.json"), drain_pass_budget=5)
    return Reconciler(tb.slurm, kube_client, settings, audit=AuditLog(tb.audit_log), sleep=lambda s: None)


def xid79_on_n1_drains_it(tb):
    sim.inject(tb.sim_dir, "n1", 3, xid=79)
    result = check(tb, "n1")
    assert result.returncode == 1, result.stdout + result.stderr
    n1 = tb.wait_node("n1", drained_by_us, timeout=15)
    assert "XID 79" in n1.reason and n1.reason.endswith("[reboot]")


def test_xid79_drain_then_recovery_round_trip(cluster, bridge):
    tb, server = cluster
    n2_before = server.get("v1/nodes", "n2")
    xid79_on_n1_drains_it(tb)

    res = bridge.run_pass()
    n1 = server.get("v1/nodes", "n1")
    assert res.taken == ["n1"] and res.drained == ["n1"] and res.replaced == ["n1"] and not res.errors
    assert n1["spec"]["unschedulable"] is True
    assert [t["key"] for t in n1["spec"]["taints"]] == [TAINT]
    gpu = [c for c in n1["status"]["conditions"] if c["type"] == "GpuHealthy"][0]
    assert gpu["status"] == "False" and "XID 79 on GPU 3" in gpu["message"]
    assert server.get("v1/pods", "train-n1", "jobs") is None  # evicted
    assert server.get("v1/pods", "dcgm-n1", "gpu") is not None  # DaemonSet pod stays
    assert server.get("v1/nodes", "n2") == n2_before
    assert server.get("v1/pods", "train-n2", "jobs") is not None
    assert bridge.run_pass().taken == []  # nothing twice

    sim.clear(tb.sim_dir, "n1")
    check(tb, "n1")
    if tb.slurm.node("n1").drained:  # the health check resumes only what it drained; be explicit
        tb.scontrol("update", "NodeName=n1", "State=RESUME")
    tb.wait_node("n1", slurm_healthy, timeout=30)

    res = bridge.run_pass()
    n1 = server.get("v1/nodes", "n1")
    assert res.restored == ["n1"]
    assert n1["spec"] == {"taints": []} or n1["spec"] == {}
    assert "slurm-hooks.io/remediation" not in n1["metadata"].get("annotations", {})
    assert "slurm-hooks.io/owned" not in n1["metadata"]["labels"]
    assert [c["status"] for c in n1["status"]["conditions"] if c["type"] == "GpuHealthy"] == ["True"]
    assert server.get("v1/nodes", "n2") == n2_before
    kinds = [r["kind"] for r in tb.audit_events() if r.get("kind", "").startswith("bridge_")]
    assert kinds[:3] == ["bridge_cordon", "bridge_drain", "bridge_replace"] and "bridge_restore" in kinds


def test_opt_out_pod_on_n1_means_cordon_only(cluster, bridge):
    tb, server = cluster
    server.put("v1/pods", pod("checkpointing", "n1", "jobs",
                              metadata={"labels": {"slurm-hooks.io/do-not-remediate": "true"}}), "jobs")
    xid79_on_n1_drains_it(tb)

    res = bridge.run_pass()
    n1 = server.get("v1/nodes", "n1")
    assert res.opted_out == ["n1"] and not res.replaced
    assert n1["spec"] == {"unschedulable": True}
    assert [c["type"] for c in n1["status"]["conditions"]] == ["Ready"]
    assert server.get("v1/pods", "train-n1", "jobs") is not None
    assert server.get("v1/pods", "checkpointing", "jobs") is not None
    opt = [r for r in tb.audit_events() if r.get("kind") == "bridge_opt_out"]
    assert opt and "jobs/checkpointing" in opt[0]["opt_out"]


# -- ten of twelve ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def twelve(tmp_path_factory):
    """A second, 12-node cluster for the blast-radius scenario (the session testbed has two)."""
    from conftest import TESTBED_SETTINGS, own_testbed

    with own_testbed(tmp_path_factory, "testbed12", dataclasses.replace(TESTBED_SETTINGS, nodes=12)) as tb:
        yield tb


def test_ten_of_twelve_failing_at_once_cordons_no_more_than_the_cap(twelve, kube_server, kube_client, tmp_path):
    names = list(twelve.node_names)
    assert len(names) == 12
    for name in names:
        kube_server.put("v1/nodes", node(name))
    for name in names[:10]:
        twelve.scontrol("update", f"NodeName={name}", "State=DRAIN", "Reason=slurm-hooks: XID 79 on GPU 3 [replace]")
    try:
        settings = BridgeSection(mapping="name", state_file=str(tmp_path / "state.json"))
        res = Reconciler(twelve.slurm(), kube_client, settings, audit=AuditLog(str(tmp_path / "audit.jsonl")),
                         sleep=lambda s: None).run_pass()
        cordoned = [n for n in names if kube_server.get("v1/nodes", n)["spec"].get("unschedulable")]
        cap = res.breaker_limit
        assert cap == 2  # 20% of 12, under max_nodes = 10
        assert len(cordoned) == cap and res.breaker_open and len(res.blocked) == 10 - cap
        tripped = [r for r in AuditLog(str(tmp_path / "audit.jsonl")).read() if r["kind"] == "bridge_breaker_tripped"]
        assert len(tripped) == 1
    finally:
        for name in names[:10]:
            twelve.scontrol("update", f"NodeName={name}", "State=RESUME")


# -- the checkpoint grace ----------------------------------------------------------------------------------

#: A job whose SIGTERM handler takes 20 s to save its checkpoint, and says when (epoch seconds).
CHECKPOINTING_JOB = """#!/bin/sh
trap 'echo "sigterm at=$(date +%s.%N) restart=${SLURM_RESTART_COUNT:-0} on $SLURMD_NODENAME"; sleep 20; \\
      echo "checkpoint saved at=$(date +%s.%N) on $SLURMD_NODENAME"; exit 0' TERM
echo "start at=$(date +%s.%N) restart=${SLURM_RESTART_COUNT:-0} on $SLURMD_NODENAME gpus=$SLURM_JOB_GPUS"
while true; do sleep 0.1; done
"""


@pytest.fixture(scope="module")
def slow(tmp_path_factory):
    """A two-node cluster whose KillWait (30 s) outlasts the job's 20 s checkpoint, as a site's 120 s does."""
    from conftest import TESTBED_SETTINGS, SlurmTestbed, own_testbed

    settings = dataclasses.replace(TESTBED_SETTINGS, kill_wait=30, requeue_grace=25.0)
    with own_testbed(tmp_path_factory, "testbed-killwait", settings) as tb:
        yield SlurmTestbed(tb)


def output_line(tb, job: int, word: str, timeout: float, **want: str) -> dict[str, str]:
    """The job's first output line starting with ``word`` and carrying ``want``, as its key=value fields."""
    deadline = time.monotonic() + timeout
    while True:
        for line in tb.job_output(job).splitlines():
            if line.split(" ", 1)[0] != word:
                continue
            fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
            fields["on"] = line.split(" on ")[1].split()[0]
            if all(fields.get(k) == v for k, v in want.items()):
                return fields
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job}: no {word!r} {want} line within {timeout:g}s: {tb.job_output(job)!r}")
        time.sleep(0.05)


def test_bridge_waits_out_the_checkpoint_then_evicts_slurmd_last_and_replaces(slow, kube_server, kube_client, tmp_path):
    tb, server = slow, kube_server
    tb.reset()
    timeline: list[tuple[float, str]] = []

    def mark(what: str, at: float | None = None) -> None:
        timeline.append((time.time() if at is None else at, what))

    job = tb.sbatch(CHECKPOINTING_JOB, "--gres=gpu:1", "--requeue", "--open-mode=append")
    try:
        started = output_line(tb, job, "start", 15, restart="0")
        bad, gpu = started["on"], int(started["gpus"].split(",")[0])
        good = next(n for n in tb.nodes if n != bad)
        mark(f"job {job} running on {bad} (GPU {gpu})", float(started["at"]))
        for name in tb.nodes:  # Kubernetes as on Slinky: same node names, a slurmd pod per node
            server.put("v1/nodes", node(name))
            server.put("v1/pods", pod(f"train-{name}", name, "jobs", **controlled_by()), "jobs")
            server.put("v1/pods", pod(f"dcgm-{name}", name, "gpu",
                                      metadata={"ownerReferences": [{"kind": "DaemonSet", "name": "dcgm"}]}), "gpu")
            server.put("v1/pods", pod(f"slurm-worker-{name}", name, "slurm", **controlled_by(
                "NodeSet", "slurm-worker", labels={"nodeset.slinky.slurm.net/pod-hostname": name})), "slurm")
        server.put("v1/pods", pod("notebook", bad, "jobs"), "jobs")  # no controller: kept
        settings = BridgeSection(mapping="name", state_file=str(tmp_path / "state.json"), drain_pass_budget=5)
        bridge = Reconciler(tb.slurm, kube_client, settings, audit=AuditLog(tb.audit_log), sleep=lambda s: None)

        sim.inject(tb.sim_dir, bad, gpu, xid=79)
        mark(f"XID 79 on {bad} GPU {gpu}")
        result = check(tb, bad)  # drains, requeues (SIGTERM), follows the job to a healthy node
        assert result.returncode == 1, result.stdout + result.stderr
        drained = tb.slurm.node(bad)
        assert drained_by_us(drained) and drained.reason.endswith("[reboot]")  # no reboot backend: replaced
        mark(f"slurm-hooks check: {bad} drained ({drained.state}), job {job} requeued")
        sigterm = output_line(tb, job, "sigterm", 15)
        mark(f"job {job} got SIGTERM on {bad}: checkpointing for 20 s", float(sigterm["at"]))

        res = bridge.run_pass()
        mark(f"bridge pass: {res.summary()}")
        assert "checkpoint saved" not in tb.job_output(job), "the pass came too late to test anything"
        assert res.taken == [bad] and res.waiting == {bad: [str(job)]}, res.summary()
        assert not res.drained and not res.replaced and not res.errors
        k8s = server.get("v1/nodes", bad)
        assert k8s["spec"]["unschedulable"] is True and [t["key"] for t in k8s["spec"]["taints"]] == [TAINT]
        for namespace, name in (("jobs", f"train-{bad}"), ("slurm", f"slurm-worker-{bad}"), ("jobs", "notebook")):
            assert server.get("v1/pods", name, namespace) is not None, f"{namespace}/{name} evicted too early"

        saved = output_line(tb, job, "checkpoint", 30)
        mark(f"job {job} saved its checkpoint on {bad}", float(saved["at"]))
        again = output_line(tb, job, "start", 90, restart="1")
        assert again["on"] == good
        mark(f"job {job} running again on {good}", float(again["at"]))
        tb.wait_node(bad, lambda n: not slurm_busy(n) and not tb.slurm.jobs_on_node(n.name), timeout=30)
        mark(f"Slurm: {bad} {tb.slurm.node(bad).state}, no job on it")

        res = bridge.run_pass()
        mark(f"bridge pass: {res.summary()}")
        assert res.drained == [bad] and res.replaced == [bad] and not res.waiting and not res.errors
        assert server.get("v1/pods", f"train-{bad}", "jobs") is None
        assert server.get("v1/pods", f"slurm-worker-{bad}", "slurm") is None
        assert server.get("v1/pods", f"dcgm-{bad}", "gpu") is not None
        assert server.get("v1/pods", "notebook", "jobs") is not None
        assert server.get("v1/pods", f"slurm-worker-{good}", "slurm") is not None
        drains = [r for r in tb.audit_events() if r.get("kind") == "bridge_drain"]
        assert drains[0]["evicted"] == [f"jobs/train-{bad}", f"slurm/slurm-worker-{bad}"]  # slurmd last
        events = [e for e in server.list("v1/events") if e["involvedObject"]["name"] == bad]
        kept = [e for e in events if e["reason"] == "GpuUnhealthyPodsKept"]
        assert len(kept) == 1 and "jobs/notebook" in kept[0]["message"]
        gpu_cond = [c for c in server.get("v1/nodes", bad)["status"]["conditions"] if c["type"] == "GpuHealthy"]
        assert gpu_cond[0]["status"] == "False"
        kinds = [r["kind"] for r in tb.audit_events() if r.get("kind", "").startswith("bridge_")]
        assert kinds == ["bridge_cordon", "bridge_waiting_for_jobs", "bridge_pass", "bridge_jobs_gone",
                         "bridge_drain", "bridge_drain_protected", "bridge_replace", "bridge_pass"], kinds
    finally:
        t0 = timeline[0][0] if timeline else 0.0
        print("\ntimeline (seconds from the job's start):")
        for at, what in sorted(timeline):
            print(f"  {at - t0:7.2f}  {what}")
        for r in tb.audit_events():
            if r.get("kind", "").startswith("bridge_"):
                keep = ("node", "jobs", "waited_s", "evicted", "pods", "requested")
                print("  audit", r["kind"], {k: r[k] for k in keep if r.get(k)})
        tb.cancel_all()
