"""HTTP contract of the bridge's client layer: the official ``kubernetes`` client against kmock.

Nothing of the client is patched: requests go over real HTTP to kmock's
emulator, and what kmock lacks (evictions, PDB 429s, 5xx, slow answers) is
scripted per URL with kmock's own rules.
"""

from __future__ import annotations

import asyncio
import time

import pytest

pytest.importorskip("kmock")
pytest.importorskip("kubernetes")

from kube.emulator import node, pdb_429, pod, status  # noqa: E402

from slurm_hooks.bridge.api import Eviction, KubeConflict, KubePermanent, KubeTransient, Resource  # noqa: E402
from slurm_hooks.bridge.kubeclient import connect  # noqa: E402

pytestmark = pytest.mark.k8s
pytest_plugins = ["kube.fixtures"]


def sent(server, method, path):
    return [r for r in server.requests(method) if r.url.path == path]


def test_cordon_goes_as_a_strategic_merge_patch(kube_server, kube_client):
    kube_server.put("v1/nodes", node("n1"))
    result = kube_client.patch_node("n1", {"spec": {"unschedulable": True}})
    assert result["spec"]["unschedulable"] is True
    (req,) = sent(kube_server, "PATCH", "/api/v1/nodes/n1")
    assert req.headers["Content-Type"] == "application/strategic-merge-patch+json"
    assert req.params["fieldManager"] == "slurm-hooks-bridge"
    assert kube_server.get("v1/nodes", "n1")["spec"]["unschedulable"] is True


def test_taint_json_patch_is_guarded_by_resource_version(kube_server, kube_client):
    kube_server.put("v1/nodes", node("n1"))
    fresh = kube_client.get_node("n1")
    rv = fresh["metadata"]["resourceVersion"]
    ops = [{"op": "test", "path": "/metadata/resourceVersion", "value": rv},
           {"op": "add", "path": "/spec/taints", "value": [{"key": "k", "effect": "NoSchedule"}]}]
    patched = kube_client.json_patch_node("n1", ops)
    assert patched["spec"]["taints"] == [{"key": "k", "effect": "NoSchedule"}]
    assert patched["metadata"]["resourceVersion"] != rv
    with pytest.raises(KubeConflict):
        kube_client.json_patch_node("n1", ops)  # the same, now stale, resourceVersion
    assert sent(kube_server, "PATCH", "/api/v1/nodes/n1")[0].headers["Content-Type"] == "application/json-patch+json"


def test_409_on_a_patch_is_a_conflict(kube_server, kube_client):
    kube_server.put("v1/nodes", node("n1"))
    kube_server.kmock["patch /api/v1/nodes/n1"][:1] << 409 << status(409, "Conflict", "the object has been modified")
    with pytest.raises(KubeConflict):
        kube_client.json_patch_node("n1", [{"op": "add", "path": "/spec/unschedulable", "value": True}])


def test_node_status_patch_merges_conditions_by_type(kube_server, kube_client):
    kube_server.put("v1/nodes", node("n1"))
    kube_client.patch_node_status("n1", {"status": {"conditions": [{"type": "GpuHealthy", "status": "False"}]}})
    conds = kube_server.get("v1/nodes", "n1")["status"]["conditions"]
    assert [(c["type"], c["status"]) for c in conds] == [("Ready", "True"), ("GpuHealthy", "False")]
    (req,) = sent(kube_server, "PATCH", "/api/v1/nodes/n1/status")
    assert req.headers["Content-Type"] == "application/strategic-merge-patch+json"


def test_patching_a_missing_object_is_a_no_op(kube_server, kube_client):
    machines = Resource("cluster.x-k8s.io", "v1beta1", "machines", namespaced=True)
    assert kube_client.patch_node("gone", {"spec": {"unschedulable": True}}) is None
    assert kube_client.json_patch_node("gone", [{"op": "add", "path": "/spec/x", "value": 1}]) is None
    assert kube_client.patch_node_status("gone", {"status": {}}) is None
    assert kube_client.get_node("gone") is None
    assert kube_client.patch_object(machines, "gone", {"metadata": {}}, "capi") is None
    assert kube_client.delete_object(machines, "gone", "capi") is False


def test_pods_on_a_node_are_listed_by_field_selector_in_pages_of_500(kube_server, kube_client):
    """A consistent LIST (the drain's) is paged; one from the cache (resourceVersion=0) is one page:
    kube-apiserver ignores limit there, and so does the emulator."""
    for i in range(1100):
        kube_server.put("v1/pods", pod(f"p{i}", "n1", "jobs"), "jobs")
    kube_server.put("v1/pods", pod("elsewhere", "n2", "jobs"), "jobs")
    assert len(kube_client.list_pods_on_node("n1")) == 1100
    assert len(sent(kube_server, "GET", "/api/v1/pods")) == 1
    pods = kube_client.list_pods_on_node("n1", consistent=True)
    assert len(pods) == 1100 and all(p["spec"]["nodeName"] == "n1" for p in pods)
    pages = sent(kube_server, "GET", "/api/v1/pods")[1:]
    assert len(pages) == 3
    assert all(r.params["fieldSelector"] == "spec.nodeName=n1" and r.params["limit"] == "500" for r in pages)
    assert "continue" not in pages[0].params and pages[1].params["continue"]


def test_nodes_we_hold_are_found_with_one_label_selected_list(kube_server, kube_client):
    kube_server.put("v1/nodes", node("n1", metadata={"labels": {"slurm-hooks.io/owned": "true"}}))
    kube_server.put("v1/nodes", node("n2"))
    held = kube_client.list_nodes("slurm-hooks.io/owned=true")
    assert [n["metadata"]["name"] for n in held] == ["n1"]
    (req,) = sent(kube_server, "GET", "/api/v1/nodes")
    assert req.params["labelSelector"] == "slurm-hooks.io/owned=true"


def test_eviction_is_201_then_404_and_a_pdb_429_is_blocked_without_retry(kube_server, kube_client):
    kube_server.put("v1/pods", pod("job", "n1", "jobs"), "jobs")
    kube_server.put("v1/pods", pod("guarded", "n1", "jobs"), "jobs")
    path = "/api/v1/namespaces/jobs/pods/guarded/eviction"
    kube_server.kmock[f"post {path}"][:1] << 429 << pdb_429("jobs/guarded")

    assert kube_client.evict("jobs", "job") is Eviction.EVICTED
    assert kube_server.get("v1/pods", "job", "jobs") is None
    assert kube_client.evict("jobs", "job") is Eviction.GONE
    assert kube_client.evict("jobs", "guarded") is Eviction.BLOCKED
    assert len(sent(kube_server, "POST", path)) == 1  # the drain loop retries a PDB, not the client
    assert kube_client.evict("jobs", "guarded") is Eviction.EVICTED
    body = sent(kube_server, "POST", path)[0].data
    assert body["apiVersion"] == "policy/v1" and body["kind"] == "Eviction"
    assert body["metadata"] == {"name": "guarded", "namespace": "jobs"}


def test_429_from_the_api_server_is_retried_after_retry_after(kube_server):
    kube_server.put("v1/nodes", node("n1"))
    kube_server.kmock["get /api/v1/nodes/n1"][:2] << 429 << {"Retry-After": "2"} << status(429)
    slept: list[float] = []
    client = connect(url=kube_server.url, retries=3, backoff=0.5, sleep=slept.append)
    assert client.get_node("n1")["metadata"]["name"] == "n1"
    assert slept == [2.0, 2.0] and client.calls["get_node"] == 3


def test_5xx_is_retried_with_backoff_then_given_up_as_transient(kube_server):
    kube_server.put("v1/nodes", node("n1"))
    kube_server.kmock["get /api/v1/nodes/n1"] << 503 << status(503, message="etcd leader changed")
    slept: list[float] = []
    client = connect(url=kube_server.url, retries=3, backoff=0.5, backoff_max=1.5, sleep=slept.append)
    with pytest.raises(KubeTransient) as err:
        client.get_node("n1")
    assert err.value.status == 503 and "etcd leader changed" in str(err.value)
    assert slept == [0.5, 1.0, 1.5] and client.calls["get_node"] == 4


def test_forbidden_is_permanent_and_not_retried(kube_server):
    kube_server.kmock["patch /api/v1/nodes/n1"] << 403 << status(403, "Forbidden", "nodes \"n1\" is forbidden")
    client = connect(url=kube_server.url, retries=3, sleep=lambda s: None)
    with pytest.raises(KubePermanent) as err:
        client.patch_node("n1", {"spec": {"unschedulable": True}})
    assert err.value.status == 403 and client.calls["patch_node"] == 1


def test_a_slow_api_server_times_out_as_transient(kube_server):
    kube_server.put("v1/nodes", node("n1"))
    kube_server.kmock["get /api/v1/nodes/n1"] << (lambda: asyncio.sleep(3))
    client = connect(url=kube_server.url, timeout=0.2, retries=1, backoff=0.01)
    t0 = time.monotonic()
    with pytest.raises(KubeTransient):
        client.get_node("n1")
    assert time.monotonic() - t0 < 2.0 and client.calls["get_node"] == 2


def test_api_server_down_is_transient(kube_server):
    url = kube_server.url
    kube_server.close()
    client = connect(url=url, timeout=1, retries=2, sleep=lambda s: None)
    with pytest.raises(KubeTransient):
        client.list_nodes()
    assert client.calls["list_nodes"] == 3


def test_dry_run_is_server_side_and_changes_nothing(kube_server, kube_client):
    kube_server.put("v1/nodes", node("n1"))
    kube_server.put("v1/pods", pod("job", "n1", "jobs"), "jobs")
    result = kube_client.patch_node("n1", {"spec": {"unschedulable": True}}, dry_run=True)
    assert result["spec"]["unschedulable"] is True
    assert kube_client.evict("jobs", "job", dry_run=True) is Eviction.EVICTED
    assert kube_client.create_event("default", _event("e1"), dry_run=True) is True
    assert "unschedulable" not in kube_server.get("v1/nodes", "n1")["spec"]
    assert kube_server.get("v1/pods", "job", "jobs") is not None
    writes = kube_server.requests("PATCH") + kube_server.requests("POST")
    assert len(writes) == 3 and all(r.params.get("dryRun") == "All" for r in writes)


def _event(name):
    return {"apiVersion": "v1", "kind": "Event", "metadata": {"name": name, "namespace": "default"},
            "involvedObject": {"kind": "Node", "name": "n1"}, "reason": "GpuUnhealthy", "message": "m", "type": "Warning"}


def test_an_event_with_the_same_name_is_created_once(kube_server, kube_client):
    assert kube_client.create_event("default", _event("n1.slurm-hooks.taken.1")) is True
    assert kube_client.create_event("default", _event("n1.slurm-hooks.taken.1")) is False


def test_custom_resources_for_replacement_backends(kube_server, kube_client):
    claims = Resource("karpenter.sh", "v1", "nodeclaims")
    machines = Resource("cluster.x-k8s.io", "v1beta1", "machines", namespaced=True)
    kube_server.put("karpenter.sh/v1/nodeclaims", {"metadata": {"name": "c1"}, "status": {"nodeName": "n1"}})
    kube_server.put("cluster.x-k8s.io/v1beta1/machines", {"metadata": {"name": "m1", "namespace": "capi"}}, "capi")

    assert [c["metadata"]["name"] for c in kube_client.list_objects(claims)] == ["c1"]
    assert kube_client.delete_object(claims, "c1") is True
    assert kube_client.list_objects(claims) == []
    patched = kube_client.patch_object(machines, "m1", {"metadata": {"annotations": {"x": ""}}}, "capi")
    assert patched["metadata"]["annotations"] == {"x": ""}
    (req,) = sent(kube_server, "PATCH", "/apis/cluster.x-k8s.io/v1beta1/namespaces/capi/machines/m1")
    assert req.headers["Content-Type"] == "application/merge-patch+json"
    cr = {"apiVersion": "example.com/v1", "kind": "Fix", "metadata": {"name": "n1", "namespace": "ops"}}
    fixes = Resource("example.com", "v1", "fixes", namespaced=True)
    kube_server.kmock.resources["example.com/v1/fixes"] = {}
    assert kube_client.create_object(fixes, cr) is True
    assert kube_client.create_object(fixes, cr) is False
    assert kube_client.get_object(fixes, "n1", "ops")["kind"] == "Fix"
