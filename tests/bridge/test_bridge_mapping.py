"""Slurm node -> Kubernetes node: Slinky's Comment JSON, the slurmd pod's label, a table, the same name."""

from __future__ import annotations

import json

from kube.memory import InMemoryKube

from slurm_hooks.bridge.mapping import NodeMapper, parse_comment
from slurm_hooks.slurm import NodeInfo

SLINKY = json.dumps({"namespace": "slurm", "podName": "slurm-worker-gpu-3", "node": "gke-pool-a-7f3k"})


def test_slinky_comment_names_the_kubernetes_node():
    parsed = parse_comment(SLINKY)
    assert parsed.node == "gke-pool-a-7f3k" and parsed.pod == "slurm-worker-gpu-3" and parsed.namespace == "slurm"


def test_other_comments_are_not_slinky():
    for comment in ("", "rack 12", "{broken", '{"node": ""}', '["node"]', '{"podName": "x"}'):
        assert parse_comment(comment) is None


def test_auto_prefers_comment_then_table_then_same_name():
    mapper = NodeMapper("auto", {"gpu-2": "ip-10-0-0-2"})
    assert mapper.kube_name(NodeInfo("gpu-1", "IDLE", comment=SLINKY)) == "gke-pool-a-7f3k"
    assert mapper.kube_name(NodeInfo("gpu-2", "IDLE", comment="rack 12")) == "ip-10-0-0-2"
    assert mapper.kube_name(NodeInfo("gpu-3", "IDLE")) == "gpu-3"


def test_name_mode_ignores_comments():
    mapper = NodeMapper("name")
    assert mapper.kube_name(NodeInfo("gpu-1", "IDLE", comment=SLINKY)) == "gpu-1"


def test_slinky_mode_finds_the_slurmd_pod_by_its_hostname_label():
    kube = InMemoryKube()
    kube.add_pod("slurm-worker-gpu-0", "k8s-node-9", "slurm",
                 metadata={"labels": {"nodeset.slinky.slurm.net/pod-hostname": "gpu-0"}})
    mapper = NodeMapper("slinky", slinky_namespace="slurm")
    assert mapper.kube_name(NodeInfo("gpu-0", "IDLE"), kube) == "k8s-node-9"
    assert mapper.kube_name(NodeInfo("gpu-1", "IDLE"), kube) is None
    assert mapper.kube_name_offline(NodeInfo("gpu-0", "IDLE")) is None
    assert kube.calls["list_pods"] == 2


def test_slinky_lookup_prefers_the_pod_that_is_not_terminating():
    from kube.memory import InMemoryKube

    from slurm_hooks.bridge.mapping import NodeMapper
    from slurm_hooks.slurm import NodeInfo

    kube = InMemoryKube()
    label = {"nodeset.slinky.slurm.net/pod-hostname": "n1"}
    kube.add_pod("a-old", "machine-1", "slurm", metadata={"labels": label, "deletionTimestamp": "2026-01-01T00:00:00Z"})
    kube.add_pod("b-new", "spare-1", "slurm", metadata={"labels": label})
    assert NodeMapper("slinky").kube_name(NodeInfo("n1", "IDLE"), kube) == "spare-1"
