"""Whole bridge passes over real HTTP: reconciler + official client + kmock (no Slurm daemons)."""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("kmock")
pytest.importorskip("kubernetes")

from fakes.slurm import FakeSlurm  # noqa: E402
from kube.doubles import TAINT, XID79, controlled_by, read_audit  # noqa: E402
from kube.emulator import node, pdb_429, pod  # noqa: E402

from slurm_hooks.bridge.reconciler import Reconciler  # noqa: E402
from slurm_hooks.observe.audit import AuditLog  # noqa: E402
from slurm_hooks.slurm import NodeInfo  # noqa: E402

pytestmark = pytest.mark.k8s
pytest_plugins = ["kube.fixtures"]



@pytest.fixture
def two_nodes(kube_server):
    for name in ("n1", "n2"):
        kube_server.put("v1/nodes", node(name))
        kube_server.put("v1/pods", pod(f"train-{name}", name, "jobs", **controlled_by()), "jobs")
        kube_server.put("v1/pods", pod(f"dcgm-{name}", name, "gpu",
                                       metadata={"ownerReferences": [{"kind": "DaemonSet", "name": "dcgm"}]}), "gpu")
    return kube_server


def bridge(slurm, kube_client, settings, tmp_path, **kw):
    return Reconciler(slurm, kube_client, settings, audit=AuditLog(str(tmp_path / "audit.jsonl")),
                      sleep=lambda s: None, **kw)


def test_one_pass_over_http_remediates_n1_and_leaves_n2(two_nodes, kube_client, bridge_settings, tmp_path):
    server = two_nodes
    slurm = FakeSlurm(NodeInfo("n1", "IDLE+DRAIN", XID79), NodeInfo("n2", "IDLE"))
    res = bridge(slurm, kube_client, bridge_settings, tmp_path).run_pass()

    n1 = server.get("v1/nodes", "n1")
    assert n1["spec"]["unschedulable"] is True
    assert n1["spec"]["taints"] == [{"key": TAINT, "value": "replace", "effect": "NoSchedule"}]
    gpu = [c for c in n1["status"]["conditions"] if c["type"] == "GpuHealthy"][0]
    assert gpu["status"] == "False" and "XID 79" in gpu["message"]
    assert [c["type"] for c in n1["status"]["conditions"]] == ["Ready", "GpuHealthy"]
    assert server.get("v1/pods", "train-n1", "jobs") is None
    assert server.get("v1/pods", "dcgm-n1", "gpu") is not None
    assert not [r for r in server.requests() if "n2" in r.url.path]  # n2: not even read
    assert server.get("v1/nodes", "n2") == {**node("n2"), "metadata": {**node("n2")["metadata"], "resourceVersion": "1"}}
    assert server.get("v1/pods", "train-n2", "jobs") is not None
    events = [r for r in server.requests("POST") if r.url.path == "/api/v1/namespaces/default/events"]
    assert len(events) == 1 and events[0].data["involvedObject"]["name"] == "n1"
    assert res.replaced == ["n1"] and not res.errors
    assert res.api_calls == len(list(server.kmock))


def test_pdb_429s_scripted_per_url_are_waited_out(two_nodes, kube_client, bridge_settings, tmp_path):
    server = two_nodes
    path = "/api/v1/namespaces/jobs/pods/train-n1/eviction"
    server.kmock[f"post {path}"][:3] << 429 << pdb_429("jobs/train-n1")
    slurm = FakeSlurm(NodeInfo("n1", "IDLE+DRAIN", XID79), NodeInfo("n2", "IDLE"))
    res = bridge(slurm, kube_client, bridge_settings, tmp_path).run_pass()
    assert res.drained == ["n1"]
    assert len([r for r in server.requests("POST") if r.url.path == path]) == 4


def test_recovery_over_http_undoes_only_our_changes(two_nodes, kube_client, bridge_settings, tmp_path):
    server = two_nodes
    other = {"key": "example.com/maintenance", "effect": "NoSchedule"}
    server.put("v1/nodes", node("n1", spec={"taints": [other]}))
    slurm = FakeSlurm(NodeInfo("n1", "IDLE+DRAIN", XID79), NodeInfo("n2", "IDLE"))
    b = bridge(slurm, kube_client, bridge_settings, tmp_path)
    b.run_pass()
    slurm.resume("n1")
    res = b.run_pass()
    n1 = server.get("v1/nodes", "n1")
    assert res.restored == ["n1"]
    assert n1["spec"] == {"taints": [other]}
    assert "slurm-hooks.io/remediation" not in n1["metadata"].get("annotations", {})
    assert "slurm-hooks.io/owned" not in n1["metadata"]["labels"]
    assert [c["status"] for c in n1["status"]["conditions"] if c["type"] == "GpuHealthy"] == ["True"]


def test_opt_out_pod_over_http_cordons_only(two_nodes, kube_client, bridge_settings, tmp_path):
    server = two_nodes
    server.put("v1/pods", pod("keep", "n1", "jobs", metadata={"annotations": {"karpenter.sh/do-not-disrupt": "true"}}), "jobs")
    slurm = FakeSlurm(NodeInfo("n1", "IDLE+DRAIN", XID79), NodeInfo("n2", "IDLE"))
    res = bridge(slurm, kube_client, bridge_settings, tmp_path).run_pass()
    n1 = server.get("v1/nodes", "n1")
    assert n1["spec"] == {"unschedulable": True}
    assert [c["type"] for c in n1["status"]["conditions"]] == ["Ready"]
    assert server.get("v1/pods", "train-n1", "jobs") is not None
    assert res.opted_out == ["n1"]
    assert any(r["kind"] == "bridge_opt_out" for r in read_audit(str(tmp_path / "audit.jsonl")))


def test_dry_run_over_http_sends_dryRun_All_and_changes_nothing(two_nodes, kube_client, bridge_settings, tmp_path):
    server = two_nodes
    before = server.get("v1/nodes", "n1")
    slurm = FakeSlurm(NodeInfo("n1", "IDLE+DRAIN", XID79), NodeInfo("n2", "IDLE"))
    res = bridge(slurm, kube_client, bridge_settings, tmp_path, dry_run=True).run_pass()
    assert res.taken == ["n1"] and res.replaced == ["n1"]
    assert server.get("v1/nodes", "n1") == before
    assert server.get("v1/pods", "train-n1", "jobs") is not None
    writes = server.requests("PATCH") + server.requests("POST")
    assert writes and all(r.params.get("dryRun") == "All" for r in writes)


def test_breaker_over_http_caps_ten_of_twelve(kube_server, kube_client, bridge_settings, tmp_path):
    for i in range(1, 13):
        kube_server.put("v1/nodes", node(f"n{i:02d}"))
    slurm = FakeSlurm(*[NodeInfo(f"n{i:02d}", "IDLE+DRAIN" if i <= 10 else "IDLE", XID79 if i <= 10 else "")
                        for i in range(1, 13)])
    res = bridge(slurm, kube_client, bridge_settings, tmp_path).run_pass()
    cordoned = [f"n{i:02d}" for i in range(1, 13) if kube_server.get("v1/nodes", f"n{i:02d}")["spec"].get("unschedulable")]
    assert cordoned == ["n01", "n02"] and res.breaker_open and len(res.blocked) == 8


def test_a_500_mid_pass_is_finished_by_the_next_pass(two_nodes, kube_client, bridge_settings, tmp_path):
    server = two_nodes
    server.kmock["patch /api/v1/nodes/n1/status"][:4] << 500 << {"kind": "Status", "code": 500, "message": "boom"}
    slurm = FakeSlurm(NodeInfo("n1", "IDLE+DRAIN", XID79), NodeInfo("n2", "IDLE"))
    settings = dataclasses.replace(bridge_settings, retries=3)
    b = bridge(slurm, kube_client, settings, tmp_path)
    first = b.run_pass()
    assert first.errors and not first.replaced
    second = b.run_pass()
    assert second.replaced == ["n1"] and not second.errors
    events = [r for r in server.requests("POST") if r.url.path == "/api/v1/namespaces/default/events"]
    assert len(events) == 1


# -- kubectl drain's protections and the template backend, over HTTP --------------------------------------

def test_pod_without_a_controller_is_kept_and_named_in_an_event_unless_forced(
        two_nodes, kube_client, bridge_settings, tmp_path):
    server = two_nodes
    server.put("v1/pods", pod("notebook", "n1", "jobs"), "jobs")
    slurm = FakeSlurm(NodeInfo("n1", "IDLE+DRAIN", XID79), NodeInfo("n2", "IDLE"))
    res = bridge(slurm, kube_client, bridge_settings, tmp_path).run_pass()
    assert res.replaced == ["n1"] and not res.errors
    assert server.get("v1/pods", "notebook", "jobs") is not None
    assert server.get("v1/pods", "train-n1", "jobs") is None
    (kept,) = [e for e in server.list("v1/events") if e["reason"] == "GpuUnhealthyPodsKept"]
    assert kept["involvedObject"]["name"] == "n1" and kept["type"] == "Warning"
    assert "jobs/notebook: no controller" in kept["message"]

    server.put("v1/pods", pod("notebook", "n2", "jobs"), "jobs")
    slurm.drain("n2", XID79)
    forced = dataclasses.replace(bridge_settings, drain_force=True,
                                 state_file=str(tmp_path / "forced-state.json"))
    settings_2 = dataclasses.replace(forced, breaker=dataclasses.replace(forced.breaker, max_percent=100))
    res = bridge(slurm, kube_client, settings_2, tmp_path).run_pass()
    assert res.drained == ["n2"] and server.get("v1/pods", "notebook", "jobs") is None
    assert not [e for e in server.list("v1/events")
                if e["reason"] == "GpuUnhealthyPodsKept" and e["involvedObject"]["name"] == "n2"]


def test_template_backend_over_http_leaves_an_object_that_was_there(two_nodes, kube_client, bridge_settings, tmp_path):
    from slurm_hooks.bridge.replace import CREATED_FOR_ANNOTATION, TemplateBackend

    server = two_nodes
    plural = "remediation.medik8s.io/v1alpha1/selfnoderemediations"
    server.kmock.resources[plural] = {}
    tpl = tmp_path / "snr.yaml.j2"
    tpl.write_text("apiVersion: remediation.medik8s.io/v1alpha1\nkind: SelfNodeRemediation\n"
                   "metadata:\n  name: {{ node }}\n  namespace: medik8s\nspec: {}\n")
    theirs = {"apiVersion": "remediation.medik8s.io/v1alpha1", "kind": "SelfNodeRemediation",
              "metadata": {"name": "n1", "namespace": "medik8s"}, "spec": {"by": "admin"}}
    server.put(plural, theirs, "medik8s")
    slurm = FakeSlurm(NodeInfo("n1", "IDLE+DRAIN", XID79), NodeInfo("n2", "IDLE+DRAIN", XID79))
    settings = dataclasses.replace(bridge_settings, breaker=dataclasses.replace(bridge_settings.breaker, max_percent=100))
    reconciler = bridge(slurm, kube_client, settings, tmp_path,
                        backend=TemplateBackend(str(tpl), "selfnoderemediations"))
    assert sorted(reconciler.run_pass().replaced) == ["n1", "n2"]
    ours = server.get(plural, "n2", "medik8s")
    assert ours["metadata"]["annotations"][CREATED_FOR_ANNOTATION].startswith("n2/")
    slurm.resume("n1")
    slurm.resume("n2")
    assert sorted(reconciler.run_pass().restored) == ["n1", "n2"]
    assert server.get(plural, "n1", "medik8s")["spec"] == {"by": "admin"}  # was there: kept
    assert server.get(plural, "n2", "medik8s") is None  # ours: withdrawn


REBOOT79 = "slurm-hooks: XID 79 on GPU 3 [reboot]"


def test_reboot_backend_over_http_creates_a_rebootnode_for_reboot_and_replaces_on_replace(
        two_nodes, kube_client, bridge_settings, tmp_path):
    from slurm_hooks.bridge.replace import CREATED_FOR_ANNOTATION
    from slurm_hooks.bridge.settings import RebootSection

    server = two_nodes
    plural = "janitor.dgxc.nvidia.com/v1alpha1/rebootnodes"
    server.kmock.resources[plural] = {}
    tpl = tmp_path / "rebootnode.yaml.j2"
    tpl.write_text("apiVersion: janitor.dgxc.nvidia.com/v1alpha1\nkind: RebootNode\n"
                   "metadata:\n  name: slurm-hooks-{{ node }}\nspec:\n  nodeName: {{ node }}\n  force: false\n")
    slurm = FakeSlurm(NodeInfo("n1", "IDLE+DRAIN", REBOOT79), NodeInfo("n2", "IDLE+DRAIN", XID79))
    settings = dataclasses.replace(
        bridge_settings, breaker=dataclasses.replace(bridge_settings.breaker, max_percent=100),
        reboot=RebootSection(backend="template", template=str(tpl), plural="rebootnodes"))
    reconciler = bridge(slurm, kube_client, settings, tmp_path)
    assert sorted(reconciler.run_pass().replaced) == ["n1", "n2"]
    made = server.get(plural, "slurm-hooks-n1")
    assert made["spec"] == {"nodeName": "n1", "force": False}
    assert made["metadata"]["annotations"][CREATED_FOR_ANNOTATION].startswith("n1/")
    assert server.get(plural, "slurm-hooks-n2") is None  # [replace] goes to the replacement backend
    n2 = server.get("v1/nodes", "n2")
    assert [c["status"] for c in n2["status"]["conditions"] if c["type"] == "GpuHealthy"] == ["False"]
    audit = [r for r in read_audit(str(tmp_path / "audit.jsonl")) if r.get("kind") == "bridge_replace"]
    assert {r["node"]: r["backend"] for r in audit} == {"n1": "reboot-template", "n2": "condition"}
    slurm.resume("n1")  # the node side checked the rebooted node healthy
    assert reconciler.run_pass().restored == ["n1"]
    assert server.get(plural, "slurm-hooks-n1") is None  # our request, withdrawn


def test_reboot_annotation_backend_over_http_annotates_and_removes(two_nodes, kube_client, bridge_settings, tmp_path):
    from slurm_hooks.bridge.settings import RebootSection

    server = two_nodes
    slurm = FakeSlurm(NodeInfo("n1", "IDLE+DRAIN", REBOOT79), NodeInfo("n2", "IDLE"))
    settings = dataclasses.replace(bridge_settings, reboot=RebootSection(backend="annotation"))
    reconciler = bridge(slurm, kube_client, settings, tmp_path)
    assert reconciler.run_pass().replaced == ["n1"]
    ann = server.get("v1/nodes", "n1")["metadata"]["annotations"]
    assert ann["slurm-hooks.io/reboot-requested"]
    slurm.resume("n1")
    assert reconciler.run_pass().restored == ["n1"]
    assert "slurm-hooks.io/reboot-requested" not in (server.get("v1/nodes", "n1")["metadata"].get("annotations") or {})
