"""The bridge follows Slurm's clock: cordon at once, evict and replace only when the jobs are off.

Also kubectl drain's protections (pods with no controller, emptyDir), the slurmd
pod going last, and the template backend undoing only what it did. The logic
against the in-memory KubeApi and a fake Slurm; the real thing is in
``test_bridge_e2e.py``.
"""

from __future__ import annotations

import dataclasses

import pytest
from fakes.slurm import FakeSlurm
from kube.doubles import TAINT, XID79, add_gpu_node, controlled_by, records
from kube.doubles import make_reconciler as make
from kube.memory import InMemoryKube

from slurm_hooks.bridge.api import Eviction, Resource
from slurm_hooks.bridge.evict import Evictor, protection
from slurm_hooks.bridge.ownership import Ownership
from slurm_hooks.bridge.replace import CREATED_FOR_ANNOTATION, KarpenterBackend, TemplateBackend
from slurm_hooks.bridge.settings import BreakerSection, parse
from slurm_hooks.errors import ConfigError
from slurm_hooks.slurm import NodeInfo
from slurm_hooks.slurm.scontrol import SlurmUnavailable

pytest_plugins = ["kube.fixtures"]

SLURMD = controlled_by("NodeSet", "slurm-worker-gpu",
                       labels={"nodeset.slinky.slurm.net/pod-hostname": "n1"})
NODECLAIMS = Resource("karpenter.sh", "v1", "nodeclaims")


@pytest.fixture
def cluster(kube):
    """n1 and n2 as on Slinky: a training pod, a DaemonSet pod and the slurmd pod (owned by a NodeSet)."""
    for name in ("n1", "n2"):
        add_gpu_node(kube, name)
        kube.add_pod(f"slurmd-{name}", name, "slurm", **controlled_by(
            "NodeSet", "slurm-worker-gpu", labels={"nodeset.slinky.slurm.net/pod-hostname": name}))
    return kube


@pytest.fixture
def slurm():
    return FakeSlurm(NodeInfo("n1", "IDLE"), NodeInfo("n2", "IDLE"))


def job_running_on_n1(slurm, job=4711):
    """n1 drained by slurm-hooks while a requeued job is still checkpointing on it."""
    slurm.add_node("n1", "MIXED+DRAIN", XID79)
    slurm.place_jobs("n1", [job])


def job_left_n1(slurm):
    slurm.add_node("n1", "IDLE+DRAIN", XID79)
    slurm.place_jobs("n1", [])


# -- wait for the jobs --------------------------------------------------------------------------------

def test_node_with_a_job_is_cordoned_and_tainted_at_once_but_nothing_is_evicted(
        slurm, cluster, bridge_settings, clock, audit_path):
    job_running_on_n1(slurm)
    bridge = make(slurm, cluster, bridge_settings, clock, audit_path)
    res = bridge.run_pass()

    n1 = cluster.nodes["n1"]
    assert n1["spec"]["unschedulable"] is True
    assert {"key": TAINT, "value": "replace", "effect": "NoSchedule"} in n1["spec"]["taints"]
    assert cluster.evicted == [] and ("slurm", "slurmd-n1") in cluster.pods
    # the condition backend's request is the condition: not yet
    assert cluster.condition("n1") is None
    assert res.taken == ["n1"] and res.waiting == {"n1": ["4711"]} and not res.drained and not res.replaced
    assert "waiting for jobs: n1 (4711)" in res.summary()
    waiting = records(audit_path, "bridge_waiting_for_jobs")
    assert [(w["node"], w["jobs"], w["state"]) for w in waiting] == [("n1", ["4711"], "MIXED+DRAIN")]
    record = Ownership.of(n1)
    assert record.released == "" and record.waiting_jobs == ["4711"] and not record.complete

    # Next pass, job still there: asks Slurm again, costs one LIST on Kubernetes and says nothing new.
    clock.advance(30)
    cluster.calls.clear()
    res = bridge.run_pass()
    assert res.waiting == {"n1": ["4711"]} and dict(cluster.calls) == {"list_nodes": 1}
    assert len(records(audit_path, "bridge_waiting_for_jobs")) == 1

    # The job has left (requeued, running elsewhere): evict, slurmd last, then the replacement.
    job_left_n1(slurm)
    clock.advance(30)
    res = bridge.run_pass()
    assert res.drained == ["n1"] and res.replaced == ["n1"] and not res.waiting
    assert cluster.evicted == ["jobs/job-n1", "slurm/slurmd-n1"]
    assert cluster.condition("n1")["status"] == "False"
    assert ("gpu", "dcgm-n1") in cluster.pods and ("slurm", "slurmd-n2") in cluster.pods
    gone = records(audit_path, "bridge_jobs_gone")
    assert gone[0]["jobs"] == ["4711"] and gone[0]["waited_s"] == 60
    assert Ownership.of(cluster.nodes["n1"]).released == "no jobs"


def test_other_backends_set_the_condition_at_once_but_request_only_when_the_jobs_are_gone(
        slurm, cluster, bridge_settings, clock, audit_path):
    cluster.add_object(NODECLAIMS, {"metadata": {"name": "claim-1"}, "status": {"nodeName": "n1"}})
    job_running_on_n1(slurm)
    bridge = make(slurm, cluster, bridge_settings, clock, audit_path, backend=KarpenterBackend())
    bridge.run_pass()
    assert cluster.condition("n1")["status"] == "False"
    assert (NODECLAIMS, "", "claim-1") in cluster.objects
    job_left_n1(slurm)
    assert bridge.run_pass().replaced == ["n1"]
    assert (NODECLAIMS, "", "claim-1") not in cluster.objects


@pytest.mark.parametrize("state, jobs", [
    ("MIXED+DRAIN", []),  # draining: Slurm still counts a job there
    ("COMPLETING+DRAIN", []),
    ("IDLE+COMPLETING+DRAIN", []),
    ("IDLE+DRAIN", [12]),  # drained, but a (completing) job still lists the node
])
def test_drained_means_not_draining_and_no_job_listing_it(
        slurm, cluster, bridge_settings, clock, audit_path, state, jobs):
    slurm.add_node("n1", state, XID79)
    slurm.place_jobs("n1", jobs)
    res = make(slurm, cluster, bridge_settings, clock, audit_path).run_pass()
    assert res.waiting == {"n1": [str(j) for j in jobs]} and cluster.evicted == []


def test_down_and_drained_node_without_jobs_is_drained_in_the_same_pass(
        slurm, cluster, bridge_settings, clock, audit_path):
    slurm.add_node("n1", "DOWN+DRAIN", XID79)
    res = make(slurm, cluster, bridge_settings, clock, audit_path).run_pass()
    assert res.taken == res.drained == res.replaced == ["n1"] and not res.waiting
    assert not records(audit_path, "bridge_waiting_for_jobs") and not records(audit_path, "bridge_jobs_gone")


def test_jobs_that_never_leave_are_cut_after_max_job_wait(slurm, cluster, bridge_settings, clock, audit_path):
    job_running_on_n1(slurm)
    settings = dataclasses.replace(bridge_settings, max_job_wait=300)
    bridge = make(slurm, cluster, settings, clock, audit_path)
    bridge.run_pass()
    clock.advance(299)
    assert bridge.run_pass().waiting == {"n1": ["4711"]} and cluster.evicted == []
    clock.advance(1)
    res = bridge.run_pass()
    assert res.drained == ["n1"] and res.replaced == ["n1"]
    timeout = records(audit_path, "bridge_jobs_wait_timeout")
    assert timeout[0]["jobs"] == ["4711"] and timeout[0]["waited_s"] == 300
    assert Ownership.of(cluster.nodes["n1"]).released == "forced"


def test_max_job_wait_zero_waits_for_ever(slurm, cluster, bridge_settings, clock, audit_path):
    job_running_on_n1(slurm)
    bridge = make(slurm, cluster, dataclasses.replace(bridge_settings, max_job_wait=0), clock, audit_path)
    for _ in range(5):
        assert bridge.run_pass().waiting == {"n1": ["4711"]}
        clock.advance(86400)
    assert cluster.evicted == [] and not records(audit_path, "bridge_jobs_wait_timeout")


def test_default_wait_is_longer_than_the_checkpoint_grace():
    # KillWait (120 s recommended) + [remediation] requeue_grace (120 s) + a margin
    assert parse({}).max_job_wait > 240
    assert parse({"max_job_wait": 0}).max_job_wait == 0
    with pytest.raises(ConfigError, match="max_job_wait"):
        parse({"max_job_wait": -1})


def test_slurm_unable_to_list_jobs_means_no_drain_this_pass(slurm, cluster, bridge_settings, clock, audit_path):
    slurm.drain("n1", XID79)
    slurm.fail("jobs_on_node", SlurmUnavailable("squeue: slurmctld not responding"))
    bridge = make(slurm, cluster, bridge_settings, clock, audit_path)
    res = bridge.run_pass()
    assert res.taken == ["n1"] and cluster.evicted == [] and not res.replaced
    assert res.errors and "cannot list the jobs on Slurm node n1" in res.errors[0][1]
    slurm.fail("jobs_on_node", None)
    res = bridge.run_pass()
    assert res.drained == ["n1"] and not res.errors


def test_a_node_no_slurm_node_maps_to_any_more_is_not_waited_for(kube, bridge_settings, clock, audit_path):
    import json

    kube.add_node("k8s-a")
    kube.add_node("k8s-b")
    kube.add_pod("job", "k8s-a", "jobs", **controlled_by())
    slurm = FakeSlurm(NodeInfo("gpu-0", "MIXED+DRAIN", XID79, json.dumps({"node": "k8s-a"})))
    slurm.place_jobs("gpu-0", [7])
    bridge = make(slurm, kube, bridge_settings, clock, audit_path)
    assert bridge.run_pass().waiting == {"k8s-a": ["7"]}
    # the slurmd pod was deleted by someone and came back on k8s-b: no Slurm job is on k8s-a
    slurm.add_node("gpu-0", "MIXED+DRAIN", XID79, json.dumps({"node": "k8s-b"}))
    res = bridge.run_pass()
    assert res.drained == ["k8s-a"] and kube.evicted == ["jobs/job"]
    assert Ownership.of(kube.nodes["k8s-a"]).released == "no Slurm node"


def test_the_wait_does_not_count_against_the_breaker_window_twice(kube, bridge_settings, clock, audit_path, tmp_path):
    for name in ("n1", "n2", "n3"):
        kube.add_node(name)
    slurm = FakeSlurm(*(NodeInfo(n, "IDLE") for n in ("n1", "n2", "n3")))
    settings = dataclasses.replace(bridge_settings, max_job_wait=0,
                                   breaker=BreakerSection(max_percent=100, max_nodes=2, window=100))
    bridge = make(slurm, kube, settings, clock, audit_path)
    job_running_on_n1(slurm)
    res = bridge.run_pass()
    assert res.taken == ["n1"] and res.breaker_in_window == 1
    clock.advance(150)  # n1 waited out the whole window; it still counts as held, once
    job_left_n1(slurm)
    res = bridge.run_pass()
    assert res.drained == ["n1"] and res.breaker_in_window == 0
    assert Ownership.of(kube.nodes["n1"]).since == clock.now - 150
    slurm.drain("n2", XID79)
    res = bridge.run_pass()
    assert res.taken == ["n2"] and not res.blocked and res.breaker_in_window == 1
    slurm.drain("n3", XID79)
    res = bridge.run_pass()
    assert res.blocked == ["n3"]  # n1 and n2 held: the cap is 2


def test_opt_out_still_wins_over_the_wait(slurm, cluster, bridge_settings, clock, audit_path):
    cluster.add_pod("precious", "n1", "jobs", metadata={"labels": {"slurm-hooks.io/do-not-remediate": "true"}})
    job_running_on_n1(slurm)
    bridge = make(slurm, cluster, bridge_settings, clock, audit_path)
    res = bridge.run_pass()
    assert res.opted_out == ["n1"] and not res.waiting and slurm.job_calls == []
    del cluster.pods[("jobs", "precious")]
    assert bridge.run_pass().waiting == {"n1": ["4711"]}
    job_left_n1(slurm)
    assert bridge.run_pass().replaced == ["n1"]


# -- slurmd last ---------------------------------------------------------------------------------------

def test_slurmd_pod_is_not_evicted_while_another_pod_is_still_on_the_node(
        slurm, cluster, bridge_settings, clock, audit_path):
    slurm.drain("n1", XID79)
    cluster.eviction_script["jobs/job-n1"] = [Eviction.BLOCKED] * 3
    bridge = make(slurm, cluster, dataclasses.replace(bridge_settings, drain_pass_budget=1), clock, audit_path)
    res = bridge.run_pass()
    assert res.pending == ["n1"] and cluster.evicted == [] and not res.replaced
    drain = records(audit_path, "bridge_drain")[0]
    assert drain["blocked"] == ["jobs/job-n1"] and drain["last"] == ["slurm/slurmd-n1"]
    res = bridge.run_pass()
    assert cluster.evicted == ["jobs/job-n1", "slurm/slurmd-n1"] and res.replaced == ["n1"]


def test_slurmd_pod_waits_for_a_terminating_pod_to_leave(kube, clock):
    kube.add_node("n1")
    kube.add_pod("slurmd", "n1", "slurm", **SLURMD)
    kube.add_pod("old", "n1", "jobs", **controlled_by(deletionTimestamp="2025-01-01T00:00:00Z"))
    drainer = Evictor(kube)
    evicted: dict[str, str] = {}
    result = drainer.drain(kube.list_pods_on_node("n1"), evicted=evicted, node="n1")
    assert not result.done and result.last == ["slurm/slurmd"] and kube.evicted == []
    del kube.pods[("jobs", "old")]
    result = drainer.drain(kube.list_pods_on_node("n1"), evicted=evicted, node="n1")
    assert result.done and kube.evicted == ["slurm/slurmd"] and evicted == {"slurm/slurmd": "uid-slurm-slurmd"}


# -- kubectl drain's protections -----------------------------------------------------------------------

def test_pod_without_a_controller_is_kept_and_named_in_the_node_event(
        slurm, cluster, bridge_settings, clock, audit_path):
    cluster.add_pod("notebook", "n1", "jobs")  # a bare pod: evicted, nothing would bring it back
    slurm.drain("n1", XID79)
    res = make(slurm, cluster, bridge_settings, clock, audit_path).run_pass()
    assert ("jobs", "notebook") in cluster.pods
    assert "jobs/job-n1" in cluster.evicted and "slurm/slurmd-n1" in cluster.evicted
    assert res.drained == ["n1"] and res.replaced == ["n1"]  # and the bridge goes on
    kept = [e for e in cluster.events if e["reason"] == "GpuUnhealthyPodsKept"]
    assert len(kept) == 1 and "jobs/notebook" in kept[0]["message"] and "no controller" in kept[0]["message"]
    assert kept[0]["involvedObject"]["name"] == "n1"
    audit = records(audit_path, "bridge_drain_protected")
    assert [p.split(":")[0] for p in audit[0]["pods"]] == ["jobs/notebook"]


def test_drain_force_evicts_the_pod_without_a_controller(slurm, cluster, bridge_settings, clock, audit_path):
    cluster.add_pod("notebook", "n1", "jobs")
    slurm.drain("n1", XID79)
    make(slurm, cluster, dataclasses.replace(bridge_settings, drain_force=True), clock, audit_path).run_pass()
    assert ("jobs", "notebook") not in cluster.pods and "jobs/notebook" in cluster.evicted
    assert not [e for e in cluster.events if e["reason"] == "GpuUnhealthyPodsKept"]


def test_emptydir_pod_is_kept_unless_delete_emptydir_data(slurm, cluster, bridge_settings, clock, audit_path):
    scratch = {"spec": {"volumes": [{"name": "scratch", "emptyDir": {}}]}}
    cluster.add_pod("cache", "n1", "jobs", **controlled_by(), **scratch)
    slurm.drain("n1", XID79)
    make(slurm, cluster, bridge_settings, clock, audit_path).run_pass()
    assert ("jobs", "cache") in cluster.pods
    assert "emptyDir volume scratch" in records(audit_path, "bridge_drain_protected")[0]["pods"][0]

    kube = InMemoryKube()
    kube.add_node("n1")
    kube.add_pod("cache", "n1", "jobs", **controlled_by(), **scratch)
    settings = dataclasses.replace(bridge_settings, drain_delete_emptydir_data=True)
    make(slurm, kube, settings, clock, audit_path + ".2").run_pass()
    assert kube.evicted == ["jobs/cache"]


@pytest.mark.parametrize("pod, force, emptydir, kept", [
    ({}, False, False, True),
    ({}, True, False, False),
    ({"status": {"phase": "Succeeded"}}, False, False, False),  # finished: nothing to lose
    (controlled_by(), False, False, False),
    ({**controlled_by(), "spec": {"volumes": [{"name": "v", "emptyDir": {}}]}}, False, False, True),
    ({**controlled_by(), "spec": {"volumes": [{"name": "v", "emptyDir": {}}]}}, True, True, False),
    ({**controlled_by(), "spec": {"volumes": [{"name": "v", "hostPath": {"path": "/x"}}]}}, False, False, False),
    ({"metadata": {"ownerReferences": [{"kind": "ReplicaSet", "name": "rs"}]}}, False, False, True),  # not controller
])
def test_kubectl_drain_filters(pod, force, emptydir, kept):
    assert bool(protection(pod, force=force, delete_emptydir_data=emptydir)) is kept


# -- the template backend undoes only what it did -------------------------------------------------------

SNR = Resource("remediation.medik8s.io", "v1alpha1", "selfnoderemediations", namespaced=True)


@pytest.fixture
def template(tmp_path):
    pytest.importorskip("yaml", reason="a YAML template needs PyYAML (the k8s extra)")
    tpl = tmp_path / "cr.yaml.j2"
    tpl.write_text("apiVersion: remediation.medik8s.io/v1alpha1\nkind: SelfNodeRemediation\n"
                   "metadata:\n  name: {{ node }}\n  namespace: medik8s\nspec: {}\n")
    return TemplateBackend(str(tpl), "selfnoderemediations")


def test_template_backend_never_deletes_an_object_that_existed_before(
        slurm, cluster, bridge_settings, clock, audit_path, template):
    cluster.add_object(SNR, {"apiVersion": "remediation.medik8s.io/v1alpha1", "kind": "SelfNodeRemediation",
                             "metadata": {"name": "n1", "namespace": "medik8s", "labels": {"by": "admin"}}})
    slurm.drain("n1", XID79)
    bridge = make(slurm, cluster, bridge_settings, clock, audit_path, backend=template)
    bridge.run_pass()
    assert Ownership.of(cluster.nodes["n1"]).replacement == "remediation.medik8s.io/v1alpha1/medik8s/n1 (exists)"
    slurm.resume("n1")
    res = bridge.run_pass()
    assert res.restored == ["n1"]
    (obj,) = cluster.objects.values()
    assert obj["metadata"]["labels"] == {"by": "admin"}
    restore = records(audit_path, "bridge_restore")[0]
    assert not any("deleted" in u for u in restore["undone"])


def test_template_backend_deletes_what_it_created_and_only_that(
        slurm, cluster, bridge_settings, clock, audit_path, template):
    slurm.drain("n1", XID79)
    bridge = make(slurm, cluster, bridge_settings, clock, audit_path, backend=template)
    bridge.run_pass()
    (key, obj), = cluster.objects.items()
    marker = obj["metadata"]["annotations"][CREATED_FOR_ANNOTATION]
    assert marker.startswith("n1/")
    # someone deleted ours and made their own under the same name
    cluster.objects[key] = {**obj, "metadata": {"name": "n1", "namespace": "medik8s"}}
    slurm.resume("n1")
    bridge.run_pass()
    assert key in cluster.objects

    # a fresh take whose object is still ours at recovery: withdrawn
    del cluster.objects[key]
    slurm.drain("n1", XID79)
    clock.advance(10)
    bridge.run_pass()
    slurm.resume("n1")
    bridge.run_pass()
    assert cluster.objects == {}


def test_template_backend_adopts_its_own_create_whose_answer_was_lost(
        slurm, cluster, bridge_settings, clock, audit_path, template):
    from slurm_hooks.bridge.replace import Target
    from slurm_hooks.models import Action

    target = Target(node=cluster.nodes["n1"], slurm_node="n1", reason=XID79, summary="XID 79", action=Action.REPLACE,
                    take="abc")
    first = template.request(cluster, target)
    again = template.request(cluster, target)  # the create went through, its answer did not: 409
    assert first == again == "remediation.medik8s.io/v1alpha1/medik8s/n1 created [n1/abc]"
    assert template.cancel(cluster, cluster.nodes["n1"], again) == "remediation.medik8s.io/v1alpha1/medik8s/n1 deleted"
    assert cluster.objects == {}
    other = dataclasses.replace(target, take="def")
    template.request(cluster, target)
    assert template.request(cluster, other).endswith("(exists)")


def test_a_node_that_recovers_while_waiting_is_given_back_without_any_eviction(
        slurm, cluster, bridge_settings, clock, audit_path):
    job_running_on_n1(slurm)
    bridge = make(slurm, cluster, bridge_settings, clock, audit_path)
    bridge.run_pass()
    slurm.add_node("n1", "MIXED", "")  # an admin resumed it; the job kept running
    res = bridge.run_pass()
    assert res.restored == ["n1"] and cluster.evicted == []
    assert "unschedulable" not in cluster.nodes["n1"]["spec"] and cluster.condition("n1") is None
