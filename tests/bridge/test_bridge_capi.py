"""Cluster API in its own management cluster: two kmock API servers, a client for each.

The workload cluster holds the Nodes (annotated with their Machine); the management cluster holds
the Machines and the MachineHealthCheck that acts on ``remediate-machine``. Before, the bridge
patched the Machine through the workload cluster's client: a 404 for ever unless self-hosted.
"""

from __future__ import annotations

import dataclasses

import pytest
from fakes.slurm import FakeSlurm
from kube.doubles import XID79

from slurm_hooks.bridge.reconciler import Reconciler
from slurm_hooks.bridge.replace import CapiBackend
from slurm_hooks.observe.audit import AuditLog
from slurm_hooks.slurm import NodeInfo

pytestmark = pytest.mark.k8s
pytest_plugins = ["kube.fixtures"]

MACHINES = "cluster.x-k8s.io/v1beta1/machines"
CHECKS = "cluster.x-k8s.io/v1beta1/machinehealthchecks"


def machine(name: str, **annotations: str) -> dict:
    return {"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Machine",
            "metadata": {"name": name, "namespace": "capi", "uid": f"uid-{name}", "labels": {"pool": "gpu"},
                         "annotations": annotations},
            "spec": {"clusterName": "gpu-cluster"}}


@pytest.fixture
def management():
    from kube.emulator import KubeServer

    from slurm_hooks.bridge.kubeclient import connect

    server = KubeServer()
    client = connect(url=server.url, timeout=5.0, retries=2, backoff=0.01, backoff_max=0.05)
    try:
        yield server, client
    finally:
        client.close()
        server.close()


def test_the_machine_is_annotated_in_the_management_cluster_and_its_own_pin_is_honoured(
        kube_server, kube_client, management, bridge_settings, tmp_path):
    from kube.emulator import node

    mgmt, mgmt_client = management
    for name, m in (("n1", "m-1"), ("n2", "m-2"), ("n3", "m-3")):
        kube_server.put("v1/nodes", node(name, metadata={"annotations": {
            "cluster.x-k8s.io/machine": m, "cluster.x-k8s.io/cluster-namespace": "capi"}}))
    mgmt.put(MACHINES, machine("m-1"), "capi")
    mgmt.put(MACHINES, machine("m-2", **{"cluster.x-k8s.io/skip-remediation": ""}), "capi")
    mgmt.put(CHECKS, {"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "MachineHealthCheck",
                      "metadata": {"name": "gpu", "namespace": "capi"},
                      "spec": {"clusterName": "gpu-cluster", "selector": {"matchLabels": {"pool": "gpu"}}}}, "capi")
    slurm = FakeSlurm(NodeInfo("n1", "IDLE"), NodeInfo("n2", "IDLE"), NodeInfo("n3", "IDLE"))
    slurm.drain("n1", XID79)
    slurm.drain("n2", XID79)
    settings = dataclasses.replace(bridge_settings, breaker=dataclasses.replace(bridge_settings.breaker,
                                                                                max_percent=100))
    bridge = Reconciler(slurm, kube_client, settings, audit=AuditLog(str(tmp_path / "audit.jsonl")),
                        backend=CapiBackend(management=mgmt_client), sleep=lambda s: None)
    res = bridge.run_pass()
    assert res.replaced == ["n1"] and res.opted_out == ["n2"] and not res.errors, res.summary()
    assert "cluster.x-k8s.io/remediate-machine" in mgmt.get(MACHINES, "m-1", "capi")["metadata"]["annotations"]
    assert "cluster.x-k8s.io/remediate-machine" not in mgmt.get(MACHINES, "m-2", "capi")["metadata"]["annotations"]
    assert not [r for r in kube_server.requests() if "cluster.x-k8s.io" in str(r.url)]  # never asked here

    slurm.resume("n1")  # recovered before the MachineHealthCheck acted: the request is withdrawn there
    assert bridge.run_pass().restored == ["n1"]
    assert "cluster.x-k8s.io/remediate-machine" not in mgmt.get(MACHINES, "m-1", "capi")["metadata"]["annotations"]


def test_a_machine_no_health_check_selects_is_an_error_not_a_silent_annotation(
        kube_server, kube_client, management, bridge_settings, tmp_path):
    from kube.emulator import node

    mgmt, mgmt_client = management
    kube_server.put("v1/nodes", node("n1", metadata={"annotations": {
        "cluster.x-k8s.io/machine": "m-1", "cluster.x-k8s.io/cluster-namespace": "capi"}}))
    mgmt.put(MACHINES, machine("m-1"), "capi")
    mgmt.put(CHECKS, {"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "MachineHealthCheck",
                      "metadata": {"name": "cpu", "namespace": "capi"},
                      "spec": {"clusterName": "gpu-cluster", "selector": {"matchLabels": {"pool": "cpu"}}}}, "capi")
    slurm = FakeSlurm(NodeInfo("n1", "IDLE"))
    slurm.drain("n1", XID79)
    bridge = Reconciler(slurm, kube_client, bridge_settings, audit=AuditLog(str(tmp_path / "audit.jsonl")),
                        backend=CapiBackend(management=mgmt_client), sleep=lambda s: None)
    res = bridge.run_pass()
    assert not res.replaced and res.errors and "no MachineHealthCheck" in res.errors[0][1], res.summary()
    assert "cluster.x-k8s.io/remediate-machine" not in mgmt.get(MACHINES, "m-1", "capi")["metadata"]["annotations"]
