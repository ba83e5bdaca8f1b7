"""Opt-out as each backend's owner defines it, over HTTP (kmock, the official client).

Karpenter's ``karpenter.sh/do-not-disrupt`` on the Node (``"true"``) and on pods (``"true"``, or a
duration from the pod's start: ``"30m"`` protects the pod for its first 30 minutes), Cluster API's
``skip-remediation`` on the Machine. An opted-out node is cordoned and told about, never drained
nor replaced; a duration that ran out lifts the pin.
"""

from __future__ import annotations

import dataclasses
import datetime

import pytest
from fakes.slurm import FakeSlurm
from kube.doubles import XID79, Clock, controlled_by

from slurm_hooks.bridge.evict import go_duration
from slurm_hooks.bridge.reconciler import Reconciler
from slurm_hooks.observe.audit import AuditLog
from slurm_hooks.slurm import NodeInfo

pytestmark = pytest.mark.k8s
pytest_plugins = ["kube.fixtures"]

T0 = 1_780_000_000.0


def iso(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, tz=datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture
def site(kube_server, tmp_path, bridge_settings):
    from kube.emulator import node, pod

    kube_server.put("v1/nodes", node("n1", metadata={"annotations": {"karpenter.sh/do-not-disrupt": "true"}}))
    kube_server.put("v1/nodes", node("n2"))
    kube_server.put("v1/nodes", node("n3"))
    kube_server.put("v1/pods", pod("train-n1", "n1", "jobs", **controlled_by()), "jobs")
    pinned = pod("train-n2", "n2", "jobs", **controlled_by(annotations={"karpenter.sh/do-not-disrupt": "30m"}))
    pinned["status"]["startTime"] = iso(T0 - 300)  # started 5 minutes ago: 25 minutes of pin left
    kube_server.put("v1/pods", pinned, "jobs")
    slurm = FakeSlurm(NodeInfo("n1", "IDLE"), NodeInfo("n2", "IDLE"), NodeInfo("n3", "IDLE"))
    slurm.drain("n1", XID79)
    slurm.drain("n2", XID79)
    settings = dataclasses.replace(bridge_settings, breaker=dataclasses.replace(bridge_settings.breaker,
                                                                                max_percent=100))
    return kube_server, slurm, settings


def test_node_pinned_true_and_a_pod_pinned_30m_get_no_replacement_until_the_30m_ran_out(site, kube_client, tmp_path):
    server, slurm, settings = site
    clock = Clock(T0)
    bridge = Reconciler(slurm, kube_client, settings, audit=AuditLog(str(tmp_path / "audit.jsonl")), clock=clock,
                        monotonic=clock, sleep=clock.sleep)
    res = bridge.run_pass()
    assert sorted(res.taken) == ["n1", "n2"] and sorted(res.opted_out) == ["n1", "n2"], res.summary()
    assert not res.replaced and not res.drained
    for name in ("n1", "n2"):
        n = server.get("v1/nodes", name)
        assert n["spec"]["unschedulable"] is True and not n["spec"].get("taints")
        assert not [c for c in n["status"]["conditions"] if c["type"] == "GpuHealthy"]
    assert server.get("v1/pods", "train-n2", "jobs") is not None

    clock.advance(20 * 60)  # 25 minutes into the pod's life: still pinned
    res = bridge.run_pass()
    assert sorted(res.opted_out) == ["n1", "n2"] and not res.replaced, res.summary()

    clock.advance(6 * 60)  # 31 minutes: the pod's pin ran out; the Node's "true" never does
    res = bridge.run_pass()
    assert res.opted_out == ["n1"] and res.replaced == ["n2"], res.summary()
    assert server.get("v1/pods", "train-n2", "jobs") is None  # drained before the request
    assert any(t["key"] == "slurm-hooks.io/gpu-unhealthy" for t in server.get("v1/nodes", "n2")["spec"]["taints"])


@pytest.mark.parametrize("text, seconds", [("30m", 1800.0), ("1h30m", 5400.0), ("90s", 90.0), ("1.5h", 5400.0),
                                           ("500ms", 0.5), ("0", 0.0), ("true", None), ("30", None),
                                           ("m30", None), ("", None)])
def test_go_durations_as_karpenter_reads_them(text, seconds):
    assert go_duration(text) == seconds


def test_the_karpenter_backend_reads_the_pin_on_the_nodeclaim_too(kube_server, kube_client, bridge_settings, tmp_path):
    from kube.emulator import node

    from slurm_hooks.bridge.replace import KarpenterBackend

    owner = {"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim", "name": "c1", "uid": "uid-c1"}
    kube_server.put("v1/nodes", node("n1", metadata={"ownerReferences": [owner]}))
    kube_server.put("karpenter.sh/v1/nodeclaims", {"metadata": {"name": "c1", "uid": "uid-c1",
                                                                "annotations": {"karpenter.sh/do-not-disrupt": "true"}},
                                                   "status": {"nodeName": "n1"}})
    slurm = FakeSlurm(NodeInfo("n1", "IDLE+DRAIN", XID79))
    bridge = Reconciler(slurm, kube_client, bridge_settings, audit=AuditLog(str(tmp_path / "audit.jsonl")),
                        backend=KarpenterBackend(), sleep=lambda s: None)
    res = bridge.run_pass()
    assert res.opted_out == ["n1"] and not res.replaced, res.summary()
    assert kube_server.get("karpenter.sh/v1/nodeclaims", "c1") is not None  # not deleted: the owner's pin
