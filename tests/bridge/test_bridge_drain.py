"""kubectl-exact drains, the verdict in Slurm, and the API calls that scale.

- evicted pods are waited for, by UID, until deleted (bounded by ``drain_timeout``, recorded);
- all draining nodes of a pass share one ``drain_pass_budget``;
- a PDB's 429 is told from API throttling; a terminating namespace's 403 is asked again, then the
  pod waited for (kubectl); pods already terminating that we did not evict are waited for too;
- deletes carry preconditions (UID, resourceVersion): a 409 means not ours;
- LISTs come from the API server's cache, but the drain's LIST after the cordon is a consistent read
  (truly paged): a pod bound just before the cordon is evicted before the request;
- a NodeClaim is found by the Node's owner reference;
- the verdict kept in the Slurm node's Extra when the operator's preStop took the reason.

The logic against the in-memory API (``graceful``: evictions leave pods terminating until
``finish``), the HTTP contract against kmock.
"""

from __future__ import annotations

import dataclasses

import pytest
from fakes.slurm import FakeSlurm
from kube.doubles import XID79, controlled_by, records
from kube.doubles import make_reconciler as make

from slurm_hooks.bridge.api import OWNER_ANNOTATION, OWNER_LABEL, Eviction, Resource
from slurm_hooks.bridge.ownership import Ownership
from slurm_hooks.bridge.settings import BreakerSection
from slurm_hooks.bridge.state import BreakerState, StateStore
from slurm_hooks.bridge.verdict import NodeVerdict
from slurm_hooks.slurm import NodeInfo

pytest_plugins = ["kube.fixtures"]

PRESTOP_REASON = "slurm-operator: Pod is terminating"
SLURMD = controlled_by("NodeSet", "slinky", labels={"nodeset.slinky.slurm.net/pod-hostname": "n1"})


def one_node(kube, *, slurmd: bool = False):
    kube.add_node("n1")
    kube.add_pod("job-n1", "n1", "jobs", **controlled_by())
    if slurmd:
        kube.add_pod("slurmd-n1", "n1", "slurm", **SLURMD)
    return FakeSlurm(NodeInfo("n1", "IDLE+DRAIN", XID79))


# -- waiting for evicted pods' deletion, by UID ------------------------------------------------------

def test_an_evicted_pod_still_terminating_holds_the_replacement_until_it_is_gone(kube, clock, bridge_settings,
                                                                                 audit_path):
    kube.graceful = True
    slurm = one_node(kube, slurmd=True)
    bridge = make(slurm, kube, dataclasses.replace(bridge_settings, drain_pass_budget=3.0), clock, audit_path)
    res = bridge.run_pass()
    assert res.pending == ["n1"] and not res.replaced and not res.drained
    assert kube.evicted == ["jobs/job-n1"]  # the slurmd pod waits for the job pod to be gone
    assert sum(clock.slept) <= 3.0 + 1e-9  # the pass's budget, spent looking again
    record = Ownership.of(kube.nodes["n1"])
    assert record.evicted == {"jobs/job-n1": "uid-jobs-job-n1"} and not record.replacement
    waiting = records(audit_path, "bridge_drain")[-1]
    assert waiting["terminating"] == ["jobs/job-n1"] and waiting["last"] == ["slurm/slurmd-n1"]

    kube.finish("jobs", "job-n1")  # the kubelet is done: deleted
    res = bridge.run_pass()
    assert kube.evicted == ["jobs/job-n1", "slurm/slurmd-n1"] and res.pending == ["n1"] and not res.replaced
    kube.finish("slurm", "slurmd-n1")
    res = bridge.run_pass()
    assert res.drained == ["n1"] and res.replaced == ["n1"]


def test_a_new_pod_of_the_same_name_is_not_the_evicted_one(kube, clock, bridge_settings, audit_path):
    kube.graceful = True
    slurm = one_node(kube)
    bridge = make(slurm, kube, dataclasses.replace(bridge_settings, drain_pass_budget=0.5), clock, audit_path)
    assert bridge.run_pass().pending == ["n1"]
    kube.finish("jobs", "job-n1")
    # Its controller made a new one under the same name (on this node, tolerating the taint): another UID.
    kube.add_pod("job-n1", "n1", "jobs", metadata={"uid": "uid-new", **controlled_by()["metadata"]})
    res = bridge.run_pass()
    assert kube.evicted == ["jobs/job-n1", "jobs/job-n1"]  # evicted in its turn, not waited for as the old one
    assert Ownership.of(kube.nodes["n1"]).evicted == {"jobs/job-n1": "uid-new"} and res.pending == ["n1"]


def test_the_wait_for_deletion_is_bounded_by_drain_timeout_and_recorded(kube, clock, bridge_settings, audit_path):
    kube.graceful = True
    slurm = one_node(kube)
    settings = dataclasses.replace(bridge_settings, drain_pass_budget=1.0, drain_timeout=60.0)
    bridge = make(slurm, kube, settings, clock, audit_path)
    assert bridge.run_pass().pending == ["n1"]
    clock.advance(61)  # the pod never goes (a finalizer, a stuck kubelet)
    res = bridge.run_pass()
    assert res.drained == [] and res.replaced == ["n1"]
    (timeout,) = records(audit_path, "bridge_drain_timeout")
    assert timeout["terminating"] == ["jobs/job-n1"] and timeout["blocked"] == []
    assert Ownership.of(kube.nodes["n1"]).drained == "timeout"


def test_ten_blocked_nodes_share_one_pass_budget(kube, clock, bridge_settings, audit_path, tmp_path):
    slurm = FakeSlurm()
    for i in range(10):
        name = f"n{i}"
        kube.add_node(name)
        kube.add_pod(f"job-{name}", name, "jobs", **controlled_by())
        kube.eviction_script[f"jobs/job-{name}"] = [Eviction.BLOCKED] * 100
        slurm.add_node(name, "IDLE+DRAIN", XID79)
    settings = dataclasses.replace(bridge_settings, drain_pass_budget=10.0,
                                   breaker=BreakerSection(max_percent=100, max_nodes=10))
    t0 = clock.now
    res = make(slurm, kube, settings, clock, audit_path).run_pass()
    assert sorted(res.pending) == sorted(f"n{i}" for i in range(10)) and not res.replaced
    assert clock.now - t0 <= 10.0 + 1e-9  # one budget for the pass, not 10 x 10 s
    assert clock.slept == [0.5, 1.0, 2.0, 4.0, 2.5]  # one backoff for all of them
    assert kube.calls["evict"] == 10 * 6  # every node retried in every round


def test_a_terminating_namespace_is_asked_again_then_its_pod_waited_for(kube, clock, bridge_settings, audit_path):
    """kubectl drain: a 403 NamespaceTerminating is retried until the namespace's deletion marks the
    pod terminating, and then the pod is waited for (before: skipped and never waited for)."""
    slurm = one_node(kube)
    kube.graceful = True
    kube.add_pod("cache", "n1", "doomed", **controlled_by())
    kube.eviction_script["doomed/cache"] = [Eviction.NAMESPACE_TERMINATING] * 2
    bridge = make(slurm, kube, dataclasses.replace(bridge_settings, drain_pass_budget=1.0), clock, audit_path)
    res = bridge.run_pass()
    assert res.pending == ["n1"] and not res.replaced, res.summary()
    assert kube.calls["evict"] >= 3  # job-n1 once, cache asked again each round
    kube.finish("jobs", "job-n1")
    kube.pods[("doomed", "cache")]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"  # the namespace goes
    res = bridge.run_pass()
    assert res.pending == ["n1"] and not res.replaced, res.summary()  # waited for, not evicted again
    kube.finish("doomed", "cache")
    res = bridge.run_pass()
    assert res.drained == ["n1"] and res.replaced == ["n1"] and not res.errors, res.summary()
    assert [r for r in records(audit_path, "bridge_drain") if r.get("namespace_terminating")]


def test_a_pod_terminating_that_we_did_not_evict_is_waited_for(kube, clock, bridge_settings, audit_path):
    slurm = one_node(kube)
    kube.add_pod("leaving", "n1", "jobs", **controlled_by(deletionTimestamp="2026-01-01T00:00:00Z"))
    bridge = make(slurm, kube, dataclasses.replace(bridge_settings, drain_pass_budget=1.0), clock, audit_path)
    res = bridge.run_pass()
    assert res.pending == ["n1"] and not res.replaced and "jobs/job-n1" in kube.evicted, res.summary()
    assert "jobs/leaving" not in kube.evicted
    kube.finish("jobs", "leaving")
    res = bridge.run_pass()
    assert res.drained == ["n1"] and res.replaced == ["n1"], res.summary()


# -- the verdict, where the preStop cannot reach it --------------------------------------------------

def test_the_verdict_goes_to_extra_at_the_take_and_again_with_the_request(kube, clock, bridge_settings, audit_path):
    slurm = one_node(kube)
    make(slurm, kube, bridge_settings, clock, audit_path).run_pass()
    calls = [c for c in slurm.calls if c[0] == "set_node_extra"]
    assert len(calls) == 2
    verdict = NodeVerdict.of(slurm.peek("n1"))
    assert verdict.reason == XID79 and verdict.kube_node == "n1" and verdict.requested == "node condition"
    assert Ownership.of(kube.nodes["n1"]).verdict == "slurm"
    assert not slurm.called("drain") and not slurm.called("resume")  # the bridge never touches the reason


def test_someone_elses_extra_is_left_alone(kube, clock, bridge_settings, audit_path):
    slurm = one_node(kube)
    slurm.set_node("n1", extra={"Extra": "rack=12"})
    res = make(slurm, kube, bridge_settings, clock, audit_path).run_pass()
    assert res.replaced == ["n1"] and slurm.peek("n1").extra_text == "rack=12"
    assert not slurm.called("set_node_extra") and Ownership.of(kube.nodes["n1"]).verdict == "foreign"
    assert len(records(audit_path, "bridge_verdict_not_kept")) == 1


def lose_the_annotation(kube, name: str) -> None:
    """Our record gone with the Node object (a NodeClaim deleted, the Node registered again)."""
    node = kube.nodes[name]
    node["metadata"]["annotations"].pop(OWNER_ANNOTATION)
    node["metadata"]["labels"].pop(OWNER_LABEL)
    node["spec"] = {}


def test_after_the_prestop_a_verdict_already_asked_for_is_not_asked_again(kube, clock, bridge_settings, audit_path):
    slurm = one_node(kube)
    bridge = make(slurm, kube, bridge_settings, clock, audit_path)
    assert bridge.run_pass().replaced == ["n1"]
    slurm.set_node("n1", state="DOWN+DRAIN", reason=PRESTOP_REASON)
    lose_the_annotation(kube, "n1")
    for _ in range(2):
        clock.advance(30)
        res = bridge.run_pass()
        assert not res.taken and not res.replaced and not res.errors
    assert slurm.peek("n1").reason == PRESTOP_REASON


def test_after_the_prestop_a_verdict_not_yet_asked_for_is_taken_again_and_asked_once(
        kube, clock, bridge_settings, audit_path):
    slurm = one_node(kube)
    verdict = NodeVerdict(reason=XID79, action="replace", since=clock.now - 100, kube_node="n1")
    slurm.set_node("n1", state="DOWN+DRAIN", reason=PRESTOP_REASON, extra={"Extra": verdict.to_text()})
    bridge = make(slurm, kube, bridge_settings, clock, audit_path)
    res = bridge.run_pass()
    assert res.taken == ["n1"] and res.replaced == ["n1"], res.summary()
    record = Ownership.of(kube.nodes["n1"])
    assert record.reason == XID79 and kube.condition("n1")["message"].startswith(XID79)
    assert records(audit_path, "bridge_cordon")[0]["from_verdict"] is True
    assert NodeVerdict.of(slurm.peek("n1")).requested == "node condition"
    res = bridge.run_pass()
    assert not res.taken and not res.replaced
    assert slurm.peek("n1").reason == PRESTOP_REASON  # read, never edited


def test_a_verdict_about_another_machine_does_not_take_the_new_one(kube, clock, bridge_settings, audit_path):
    kube.add_node("spare-1")
    slurm = FakeSlurm()
    verdict = NodeVerdict(reason=XID79, action="replace", since=clock.now - 100, kube_node="old-machine")
    slurm.add_node("n1", "DOWN+DRAIN", PRESTOP_REASON, comment='{"node": "spare-1"}', extra=verdict.to_text())
    res = make(slurm, kube, bridge_settings, clock, audit_path).run_pass()
    assert not res.taken and "spec" not in kube.nodes["spare-1"] or not kube.nodes["spare-1"]["spec"]


def test_node_back_in_service_closes_the_incident_from_the_verdict_alone(kube, clock, bridge_settings, audit_path):
    seen = []
    slurm = FakeSlurm()
    verdict = NodeVerdict(reason=XID79, action="replace", since=clock.now - 100, kube_node="gone", requested="x")
    slurm.add_node("n1", "IDLE", comment='{"node": "spare-1"}', extra=verdict.to_text())
    res = make(slurm, kube, bridge_settings, clock, audit_path, notify=lambda k, f: seen.append((k, f))).run_pass()
    assert res.closed == ["n1"] and slurm.peek("n1").extra_text == ""
    (closed,) = records(audit_path, "bridge_incident_closed")
    assert closed["node"] == "n1" and closed["kube_node"] == "gone" and closed["reason"] == XID79
    assert [k for k, _ in seen] == ["bridge_incident_closed"]


# -- small ones --------------------------------------------------------------------------------------

def test_a_slurmd_pod_briefly_missing_does_not_skip_the_wait_for_jobs(kube, clock, bridge_settings, audit_path):
    kube.add_node("n1")
    kube.add_pod("slurmd-n1", "n1", "slurm", **SLURMD)
    slurm = FakeSlurm(NodeInfo("n1", "MIXED+DRAIN", XID79))
    slurm.place_jobs("n1", [7])
    bridge = make(slurm, kube, dataclasses.replace(bridge_settings, mapping="slinky"), clock, audit_path)
    res = bridge.run_pass()
    assert res.taken == ["n1"] and res.waiting == {"n1": ["7"]}
    kube.finish("slurm", "slurmd-n1")  # restarting: for a moment no pod says where n1 runs
    res = bridge.run_pass()
    assert res.waiting == {"n1": ["7"]} and not res.drained and not res.errors
    assert Ownership.of(kube.nodes["n1"]).released == ""


def test_an_open_breaker_costs_no_pod_list_with_slinky_mapping(kube, clock, bridge_settings, audit_path, tmp_path):
    slurm = FakeSlurm(*[NodeInfo(f"n{i}", "IDLE+DRAIN", XID79) for i in range(8)])
    StateStore(bridge_settings.state_file).save(BreakerState(tripped_at=clock.now - 1, trip_reason="cap"))
    res = make(slurm, kube, dataclasses.replace(bridge_settings, mapping="slinky"), clock, audit_path).run_pass()
    assert res.breaker_open and len(res.blocked) == 8 and dict(kube.calls) == {"list_nodes": 1}


def test_notify_hears_breaker_trips_and_replacements(kube, clock, bridge_settings, audit_path):
    seen = []
    slurm = FakeSlurm(*[NodeInfo(f"n{i}", "IDLE+DRAIN", XID79) for i in range(3)])
    for i in range(3):
        kube.add_node(f"n{i}")
    settings = dataclasses.replace(bridge_settings, breaker=BreakerSection(max_percent=100, max_nodes=2))
    make(slurm, kube, settings, clock, audit_path, notify=lambda k, f: seen.append(k)).run_pass()
    assert seen.count("bridge_replace") == 2 and seen.count("bridge_breaker_tripped") == 1


# -- the HTTP contract ------------------------------------------------------------------------------------

@pytest.mark.k8s
def test_a_pdb_429_blocks_and_a_throttling_429_is_retried(kube_server):
    pytest.importorskip("kmock")
    from kube.emulator import pdb_429, pod, throttled_429

    from slurm_hooks.bridge.kubeclient import connect

    for name in ("guarded", "busy"):
        kube_server.put("v1/pods", pod(name, "n1", "jobs"), "jobs")
    kube_server.kmock["post /api/v1/namespaces/jobs/pods/guarded/eviction"][:1] << 429 << pdb_429("jobs/guarded")
    kube_server.kmock["post /api/v1/namespaces/jobs/pods/busy/eviction"][:2] << 429 << {"Retry-After": "1"} \
        << throttled_429()
    slept: list[float] = []
    client = connect(url=kube_server.url, retries=3, backoff=0.5, sleep=slept.append)
    assert client.evict("jobs", "guarded") is Eviction.BLOCKED and client.calls["evict"] == 1 and slept == []
    assert client.evict("jobs", "busy") is Eviction.EVICTED  # throttled twice, then served
    assert client.calls["evict"] == 4 and slept == [1.0, 1.0]
    assert kube_server.get("v1/pods", "busy", "jobs") is None


@pytest.mark.k8s
def test_a_terminating_namespace_403_is_not_an_error(kube_server, kube_client):
    from kube.emulator import namespace_terminating_403, pod

    kube_server.put("v1/pods", pod("cache", "n1", "doomed"), "doomed")
    kube_server.kmock["post /api/v1/namespaces/doomed/pods/cache/eviction"] << 403 << namespace_terminating_403("doomed")
    assert kube_client.evict("doomed", "cache") is Eviction.NAMESPACE_TERMINATING


@pytest.mark.k8s
def test_delete_preconditions_refuse_an_object_made_again_under_the_same_name(kube_server, kube_client):
    from slurm_hooks.bridge.api import KubeConflict

    snr = Resource("self-node-remediation.medik8s.io", "v1alpha1", "selfnoderemediations", namespaced=True)
    path = "self-node-remediation.medik8s.io/v1alpha1/selfnoderemediations"
    kube_server.put(path, {"apiVersion": "self-node-remediation.medik8s.io/v1alpha1", "kind": "SelfNodeRemediation",
                           "metadata": {"name": "n1", "namespace": "medik8s", "uid": "uid-2",
                                        "resourceVersion": "7"}}, "medik8s")
    with pytest.raises(KubeConflict, match="Precondition failed"):
        kube_client.delete_object(snr, "n1", "medik8s", uid="uid-1", resource_version="5")
    assert kube_server.get(path, "n1", "medik8s") is not None
    (req,) = [r for r in kube_server.requests("DELETE")]
    assert req.data["preconditions"] == {"uid": "uid-1", "resourceVersion": "5"}
    assert kube_client.delete_object(snr, "n1", "medik8s", uid="uid-2", resource_version="7") is True
    assert kube_server.get(path, "n1", "medik8s") is None


@pytest.mark.k8s
def test_template_cancel_keeps_an_object_recreated_between_its_read_and_its_delete(kube_server, kube_client,
                                                                                   tmp_path):
    from slurm_hooks.bridge.replace import CREATED_FOR_ANNOTATION, TemplateBackend

    path = "self-node-remediation.medik8s.io/v1alpha1/selfnoderemediations"
    url = "/apis/self-node-remediation.medik8s.io/v1alpha1/namespaces/medik8s/selfnoderemediations/n1"
    ours = {"apiVersion": "self-node-remediation.medik8s.io/v1alpha1", "kind": "SelfNodeRemediation",
            "metadata": {"name": "n1", "namespace": "medik8s", "uid": "uid-ours", "resourceVersion": "3",
                         "annotations": {CREATED_FOR_ANNOTATION: "n1/abc"}}}
    # NodeHealthCheck deleted ours and made its own since: the GET still answers with what we saw.
    kube_server.put(path, {**ours, "metadata": {**ours["metadata"], "uid": "uid-nhc", "resourceVersion": "9"}},
                    "medik8s")
    kube_server.kmock[f"get {url}"][:1] << 200 << ours
    template = tmp_path / "snr.j2"
    template.write_text("apiVersion: self-node-remediation.medik8s.io/v1alpha1\nkind: SelfNodeRemediation\n"
                        "metadata: {name: '{{ node }}', namespace: medik8s}\n")
    backend = TemplateBackend(str(template), "selfnoderemediations")
    ref = "self-node-remediation.medik8s.io/v1alpha1/medik8s/n1 created [n1/abc]"
    assert backend.cancel(kube_client, {"metadata": {"name": "n1"}}, ref) is None
    assert kube_server.get(path, "n1", "medik8s")["metadata"]["uid"] == "uid-nhc"


@pytest.mark.k8s
def test_lists_are_served_from_the_api_servers_cache(kube_server, kube_client):
    from kube.emulator import node, pod

    kube_server.put("v1/nodes", node("n1"))
    kube_server.put("v1/pods", pod("p", "n1", "jobs"), "jobs")
    kube_client.list_nodes("slurm-hooks.io/owned=true")
    kube_client.list_pods_on_node("n1")
    lists = [r for r in kube_server.requests("GET") if r.url.path in ("/api/v1/nodes", "/api/v1/pods")]
    assert len(lists) == 2 and all(r.params["resourceVersion"] == "0" and r.params["limit"] == "500" for r in lists)


@pytest.mark.k8s
def test_karpenter_finds_the_nodeclaim_by_the_nodes_owner_reference(kube_server, kube_client):
    from kube.emulator import node

    from slurm_hooks.bridge.replace import KarpenterBackend, Target
    from slurm_hooks.models import Action

    kube_server.put("karpenter.sh/v1/nodeclaims", {"metadata": {"name": "c1", "uid": "uid-c1"},
                                                   "status": {"nodeName": "n1", "providerID": "aws:///i-1"}})
    n1 = node("n1", metadata={"ownerReferences": [{"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
                                                   "name": "c1", "uid": "uid-c1"}]}, spec={"providerID": "aws:///i-1"})
    target = Target(node=n1, slurm_node="n1", reason=XID79, summary="XID 79", action=Action.REPLACE)
    assert KarpenterBackend().request(kube_client, target) == "nodeclaim/c1 deleted"
    assert kube_client.calls["get_object"] == 1 and kube_client.calls["list_objects"] == 0
    (req,) = kube_server.requests("DELETE")
    assert req.data["preconditions"] == {"uid": "uid-c1"}



SNR_JSON = ('{"apiVersion": "self-node-remediation.medik8s.io/v1alpha1", "kind": "SelfNodeRemediation", '
            '"metadata": {"name": "{{ node }}", "namespace": "medik8s"}}')


@pytest.mark.k8s
def test_a_pod_bound_just_before_the_cordon_is_evicted_before_the_request(kube_server, kube_client, bridge_settings,
                                                                          tmp_path):
    """The watch cache is behind: it does not have the pod bound a moment before the cordon. Listed
    with resourceVersion=0 the node looked empty, the drain was "done" and the replacement asked for
    in the same pass; the drain's consistent LIST sees the pod and evicts it first."""
    from kube.emulator import node, pod

    from slurm_hooks.bridge.reconciler import Reconciler
    from slurm_hooks.bridge.replace import TemplateBackend
    from slurm_hooks.observe.audit import AuditLog

    kube_server.put("v1/nodes", node("n1"))
    kube_server.put("v1/pods", pod("dcgm-n1", "n1", "gpu",
                                   metadata={"ownerReferences": [{"kind": "DaemonSet", "name": "dcgm"}]}), "gpu")
    kube_server.freeze_cache()
    kube_server.put("v1/pods", pod("late", "n1", "jobs", **controlled_by()), "jobs")  # bound just now
    template = tmp_path / "snr.json.j2"
    template.write_text(SNR_JSON)
    bridge = Reconciler(FakeSlurm(NodeInfo("n1", "IDLE+DRAIN", XID79)), kube_client, bridge_settings,
                        audit=AuditLog(str(tmp_path / "audit.jsonl")), sleep=lambda s: None,
                        backend=TemplateBackend(str(template), "selfnoderemediations"))
    res = bridge.run_pass()
    assert res.replaced == ["n1"] and not res.errors, res.summary()
    sent = [f"{r.method.value} {r.url.path}".upper() for r in kube_server.requests()]
    evicted = sent.index("POST /API/V1/NAMESPACES/JOBS/PODS/LATE/EVICTION")
    requested = next(i for i, r in enumerate(sent) if r.startswith("POST") and "SELFNODEREMEDIATIONS" in r)
    assert evicted < requested
    assert kube_server.get("v1/pods", "late", "jobs") is None


@pytest.mark.k8s
def test_a_consistent_list_is_truly_paged(kube_server, kube_client):
    from kube.emulator import node, pod

    kube_server.put("v1/nodes", node("n1"))
    for i in range(5):
        kube_server.put("v1/pods", pod(f"p{i}", "n1", "jobs"), "jobs")
    kube_client.page_size = 2
    assert sorted(p["metadata"]["name"] for p in kube_client.list_pods_on_node("n1", consistent=True)) == \
        [f"p{i}" for i in range(5)]
    lists = [r for r in kube_server.requests("GET") if r.url.path == "/api/v1/pods"]
    assert len(lists) == 3 and all("resourceVersion" not in r.params and r.params["limit"] == "2" for r in lists)
    assert [bool(r.params.get("continue")) for r in lists] == [False, True, True]
