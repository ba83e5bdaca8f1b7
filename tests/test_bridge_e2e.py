"""End to end: a real slurmctld and slurmd's, slurm-hooks draining for real, the bridge over HTTP to kmock.

Slurm is the session testbed (``tests/conftest.py``: nodes ``n1`` and ``n2``,
simulated GPUs); Kubernetes is kmock holding Nodes ``n1`` and ``n2`` (bare
metal: same names) and their pods. The bridge reads Slurm through the real
scontrol adapter and writes Kubernetes through the official client.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest

pytest.importorskip("kmock")
pytest.importorskip("kubernetes")

from kube.doubles import controlled_by  # noqa: E402
from kube.emulator import node, pod  # noqa: E402

from slurm_hooks.audit import AuditLog  # noqa: E402
from slurm_hooks.bridge.reconciler import Reconciler, slurm_healthy  # noqa: E402
from slurm_hooks.bridge.settings import BridgeSettings  # noqa: E402
from slurm_hooks.probes import sim  # noqa: E402

pytestmark = [pytest.mark.slurm, pytest.mark.k8s]
pytest_plugins = ["kube.fixtures"]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
    settings = BridgeSettings(mapping="name", state_file=str(tmp_path / "bridge-state.json"), drain_pass_budget=5)
    return Reconciler(tb.slurm, kube_client, settings, audit=AuditLog(tb.audit_log), sleep=lambda s: None)


def xid79_on_n1_drains_it(tb):
    sim.inject(tb.sim_dir, "n1", 3, xid=79)
    result = check(tb, "n1")
    assert result.returncode == 1, result.stdout + result.stderr
    n1 = tb.wait_node("n1", drained_by_us, timeout=15)
    assert "XID 79" in n1.reason and n1.reason.endswith(("[replace]", "[reboot]"))


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
    if os.geteuid() != 0:
        pytest.skip("the Slurm testbed needs root")
    from conftest import TESTBED_SETTINGS

    from slurm_hooks.testbed import Testbed

    tb = Testbed(str(tmp_path_factory.mktemp("testbed12")), dataclasses.replace(TESTBED_SETTINGS, nodes=12))
    try:
        tb.up()
    except BaseException:
        tb.down()
        raise
    try:
        yield tb
    finally:
        tb.down()


def test_ten_of_twelve_failing_at_once_cordons_no_more_than_the_cap(twelve, kube_server, kube_client, tmp_path):
    names = list(twelve.node_names)
    assert len(names) == 12
    for name in names:
        kube_server.put("v1/nodes", node(name))
    for name in names[:10]:
        twelve.scontrol("update", f"NodeName={name}", "State=DRAIN", "Reason=slurm-hooks: XID 79 on GPU 3 [replace]")
    try:
        settings = BridgeSettings(mapping="name", state_file=str(tmp_path / "state.json"))
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
