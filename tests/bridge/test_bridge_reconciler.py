"""The bridge's logic against its own interface: an in-memory KubeApi, a fake Slurm, a fake clock."""

from __future__ import annotations

import dataclasses
import json

import pytest
from fakes.slurm import FakeSlurm
from kube.doubles import TAINT, XID79, add_gpu_node, controlled_by, read_audit
from kube.doubles import make_reconciler as make
from kube.memory import InMemoryKube

from slurm_hooks.bridge.api import OWNER_LABEL, Eviction, KubeTransient, Resource
from slurm_hooks.bridge.ownership import Ownership
from slurm_hooks.bridge.reconciler import trigger
from slurm_hooks.bridge.replace import CapiBackend, KarpenterBackend, TemplateBackend
from slurm_hooks.bridge.settings import BreakerSection
from slurm_hooks.errors import CommandTimeout
from slurm_hooks.models import Action
from slurm_hooks.slurm import NodeInfo

pytest_plugins = ["kube.fixtures"]


@pytest.fixture
def cluster(kube):
    """n1 and n2, each with a job pod, a DaemonSet pod and a static (mirror) pod."""
    for name in ("n1", "n2"):
        add_gpu_node(kube, name)
        kube.add_pod(f"static-{name}", name, "kube-system",
                     metadata={"annotations": {"kubernetes.io/config.mirror": "abc"}})
    return kube


@pytest.fixture
def slurm():
    return FakeSlurm(NodeInfo("n1", "IDLE"), NodeInfo("n2", "IDLE"))


def kinds(audit_path):
    return [r["kind"] for r in read_audit(audit_path)]


# -- which Slurm nodes ask for action ------------------------------------------------------------

@pytest.mark.parametrize("state, reason, expected", [
    ("IDLE+DRAIN", XID79, Action.REPLACE),
    ("MIXED+DRAIN", "slurm-hooks: XID 79 on GPU 0 [reboot]", Action.REBOOT),
    ("IDLE+DRAIN", "slurm-hooks: XID 48 on GPU 1 [reset]", None),
    ("IDLE+DRAIN", "slurm-hooks: ECC [drain]", None),
    ("IDLE+DRAIN", "slurm-hooks: no tag", None),
    ("IDLE+DRAIN", "Prolog error", None),
    ("IDLE+DRAIN", "slurm-operator: cordoned", None),
    ("IDLE", XID79, None),
    # Our reboot that never came back: DOWN, Slurm's suffixes on our reason (22.05 clears DRAIN).
    ("DOWN", "slurm-hooks: XID 79 on GPU 0 [reboot 1/1] : reboot issued : reboot timed out", Action.REBOOT),
    ("DOWN+DRAIN", "slurm-hooks: XID 79 on GPU 0 [replace] : Not responding", Action.REPLACE),
    ("IDLE+DRAIN", "slurm-hooks: XID 79 on GPU 0 [reboot] : Prolog error", None),
    ("DOWN+DRAIN", "NHC: check_gpu failed", None),
])
def test_only_our_drains_with_reboot_or_replace_trigger_the_bridge(state, reason, expected):
    hit = trigger(NodeInfo("n1", state, reason), (Action.REBOOT, Action.REPLACE))
    assert (hit[1] if hit else None) == expected


# -- the main scenario -----------------------------------------------------------------------------

def test_xid79_node_is_cordoned_tainted_conditioned_drained_and_replaced_in_one_pass(
        slurm, cluster, bridge_settings, clock, audit_path):
    slurm.drain("n1", XID79)
    res = make(slurm, cluster, bridge_settings, clock, audit_path).run_pass()

    n1 = cluster.nodes["n1"]
    assert n1["spec"]["unschedulable"] is True
    assert {"key": TAINT, "value": "replace", "effect": "NoSchedule"} in n1["spec"]["taints"]
    cond = cluster.condition("n1")
    assert cond["status"] == "False" and cond["reason"] == "GpuFault" and "XID 79" in cond["message"]
    assert n1["metadata"]["labels"][OWNER_LABEL] == "true"
    record = Ownership.of(n1)
    assert record.complete and record.cordoned and record.tainted and record.drained == "done"
    assert record.replacement == "node condition"
    assert cluster.evicted == ["jobs/job-n1"]  # not the DaemonSet pod, not the mirror pod
    assert [e["reason"] for e in cluster.events] == ["GpuUnhealthy"]
    assert cluster.events[0]["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "uid-n1"}
    assert res.taken == ["n1"] and res.drained == ["n1"] and res.replaced == ["n1"] and not res.errors
    assert kinds(audit_path) == ["bridge_cordon", "bridge_drain", "bridge_replace", "bridge_pass"]


def test_healthy_node_is_never_touched(slurm, cluster, bridge_settings, clock, audit_path):
    n2_before = json.dumps(cluster.nodes["n2"], sort_keys=True)
    slurm.drain("n1", XID79)
    make(slurm, cluster, bridge_settings, clock, audit_path).run_pass()
    assert json.dumps(cluster.nodes["n2"], sort_keys=True) == n2_before
    assert ("jobs", "job-n2") in cluster.pods


def test_second_pass_costs_one_list_and_changes_nothing(slurm, cluster, bridge_settings, clock, audit_path):
    slurm.drain("n1", XID79)
    bridge = make(slurm, cluster, bridge_settings, clock, audit_path)
    bridge.run_pass()
    cluster.calls.clear()
    n_audit = len(kinds(audit_path))
    res = bridge.run_pass()
    assert dict(cluster.calls) == {"list_nodes": 1}
    assert not res.acted and len(kinds(audit_path)) == n_audit


def test_recovered_node_gets_back_exactly_what_we_took(slurm, cluster, bridge_settings, clock, audit_path):
    other_taint = {"key": "example.com/maintenance", "effect": "NoSchedule"}
    cluster.nodes["n1"]["spec"]["taints"] = [other_taint]
    cluster.nodes["n1"]["metadata"]["annotations"] = {"keep": "me"}
    slurm.drain("n1", XID79)
    bridge = make(slurm, cluster, bridge_settings, clock, audit_path)
    bridge.run_pass()

    slurm.resume("n1")
    clock.advance(60)
    res = bridge.run_pass()

    n1 = cluster.nodes["n1"]
    assert res.restored == ["n1"]
    assert "unschedulable" not in n1["spec"]
    assert n1["spec"]["taints"] == [other_taint]
    assert n1["metadata"]["annotations"] == {"keep": "me"}
    assert OWNER_LABEL not in n1["metadata"]["labels"]
    assert cluster.condition("n1")["status"] == "True"
    assert cluster.condition("n1")["reason"] == "SlurmNodeHealthy"
    assert [e["reason"] for e in cluster.events] == ["GpuUnhealthy", "GpuHealthy"]
    restore = [r for r in read_audit(audit_path) if r["kind"] == "bridge_restore"][0]
    assert "uncordoned" in restore["undone"] and f"taint {TAINT} removed" in restore["undone"]
    cluster.calls.clear()
    assert not bridge.run_pass().acted and dict(cluster.calls) == {"list_nodes": 1}


def test_node_cordoned_by_someone_else_stays_cordoned_after_recovery(slurm, cluster, bridge_settings, clock, audit_path):
    cluster.nodes["n1"]["spec"]["unschedulable"] = True
    slurm.drain("n1", XID79)
    bridge = make(slurm, cluster, bridge_settings, clock, audit_path)
    bridge.run_pass()
    assert Ownership.of(cluster.nodes["n1"]).cordoned is False
    slurm.resume("n1")
    bridge.run_pass()
    assert cluster.nodes["n1"]["spec"]["unschedulable"] is True
    assert not [t for t in cluster.nodes["n1"]["spec"].get("taints", []) if t["key"] == TAINT]


def test_drain_reason_overwritten_by_slinky_operator_still_finishes_the_job(
        slurm, cluster, bridge_settings, clock, audit_path):
    slurm.drain("n1", XID79)
    cluster.eviction_script["jobs/job-n1"] = [Eviction.BLOCKED] * 50
    bridge = make(slurm, cluster, dataclasses.replace(bridge_settings, drain_pass_budget=1), clock, audit_path)
    assert bridge.run_pass().pending == ["n1"]
    slurm.add_node("n1", "IDLE+DRAIN", "slurm-operator: node cordoned")
    cluster.eviction_script.clear()
    res = bridge.run_pass()
    assert res.drained == ["n1"] and res.replaced == ["n1"] and not res.restored


def test_slinky_pod_moved_to_a_new_node_leaves_the_bad_machine_cordoned(kube, bridge_settings, clock, audit_path):
    kube.add_node("k8s-a")
    kube.add_node("k8s-b")
    comment = json.dumps({"namespace": "slurm", "podName": "gpu-0", "node": "k8s-a"})
    slurm = FakeSlurm(NodeInfo("gpu-0", "IDLE+DRAIN", XID79, comment))
    bridge = make(slurm, kube, bridge_settings, clock, audit_path)
    assert bridge.run_pass().taken == ["k8s-a"]
    slurm.add_node("gpu-0", "IDLE", "", json.dumps({"namespace": "slurm", "podName": "gpu-0", "node": "k8s-b"}))
    res = bridge.run_pass()
    assert not res.restored and res.detached == ["k8s-a"]
    assert kube.nodes["k8s-a"]["spec"]["unschedulable"] is True
    assert "unschedulable" not in kube.nodes["k8s-b"]["spec"]


@pytest.mark.parametrize("reason", ["slurm-hooks: XID 48 on GPU 1 [reset]", "Kill task failed", ""])
def test_drains_that_do_not_ask_for_replacement_are_left_alone(slurm, cluster, bridge_settings, clock, audit_path, reason):
    slurm.add_node("n1", "IDLE+DRAIN", reason)
    res = make(slurm, cluster, bridge_settings, clock, audit_path).run_pass()
    assert not res.acted and cluster.mutations() == 0


# -- opt-out -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("marker", [
    {"metadata": {"labels": {"slurm-hooks.io/do-not-remediate": "true"}}},
    {"metadata": {"annotations": {"karpenter.sh/do-not-disrupt": "true"}}},
    {"metadata": {"labels": {"karpenter.sh/do-not-disrupt": "true"}}},
])
def test_opt_out_pod_means_cordon_and_alert_only(slurm, cluster, bridge_settings, clock, audit_path, marker):
    cluster.add_pod("precious", "n1", "jobs", **marker)
    slurm.drain("n1", XID79)
    res = make(slurm, cluster, bridge_settings, clock, audit_path).run_pass()

    n1 = cluster.nodes["n1"]
    assert n1["spec"]["unschedulable"] is True
    assert not n1["spec"].get("taints")
    assert cluster.condition("n1") is None
    assert cluster.evicted == []
    assert [e["reason"] for e in cluster.events] == ["GpuUnhealthyOptOut"]
    assert res.opted_out == ["n1"] and not res.replaced
    opt = [r for r in read_audit(audit_path) if r["kind"] == "bridge_opt_out"]
    assert opt and "jobs/precious" in opt[0]["opt_out"] and "no drain, no replacement" in opt[0]["message"]


def test_opt_out_lifted_when_the_pod_leaves_then_remediation_proceeds(slurm, cluster, bridge_settings, clock, audit_path):
    cluster.add_pod("precious", "n1", "jobs", metadata={"labels": {"slurm-hooks.io/do-not-remediate": "true"}})
    slurm.drain("n1", XID79)
    bridge = make(slurm, cluster, bridge_settings, clock, audit_path)
    bridge.run_pass()
    cluster.calls.clear()
    bridge.run_pass()  # still there: one more look at the pods, nothing else
    assert cluster.mutations() == 0
    del cluster.pods[("jobs", "precious")]
    res = bridge.run_pass()
    assert res.replaced == ["n1"] and cluster.evicted == ["jobs/job-n1"]
    assert any(t["key"] == TAINT for t in cluster.nodes["n1"]["spec"]["taints"])
    assert "bridge_opt_out_lifted" in kinds(audit_path)


def test_custom_opt_out_label_and_finished_pods(slurm, cluster, bridge_settings, clock, audit_path):
    settings = dataclasses.replace(bridge_settings, opt_out_label="example.com/keep")
    cluster.add_pod("done", "n1", "jobs", metadata={"labels": {"example.com/keep": "true"}}, status={"phase": "Succeeded"})
    slurm.drain("n1", XID79)
    assert make(slurm, cluster, settings, clock, audit_path).run_pass().replaced == ["n1"]


# -- drain ---------------------------------------------------------------------------------------------

def test_pdb_429_is_retried_with_backoff_inside_the_pass(slurm, cluster, bridge_settings, clock, audit_path):
    cluster.eviction_script["jobs/job-n1"] = [Eviction.BLOCKED, Eviction.BLOCKED]
    slurm.drain("n1", XID79)
    res = make(slurm, cluster, bridge_settings, clock, audit_path).run_pass()
    assert res.drained == ["n1"] and cluster.evicted == ["jobs/job-n1"]
    assert cluster.calls["evict"] == 3 and clock.slept == [0.5, 1.0]


def test_pdb_that_outlasts_the_pass_is_finished_by_a_later_pass(slurm, cluster, bridge_settings, clock, audit_path):
    cluster.eviction_script["jobs/job-n1"] = [Eviction.BLOCKED] * 6
    slurm.drain("n1", XID79)
    settings = dataclasses.replace(bridge_settings, drain_pass_budget=2.0)
    bridge = make(slurm, cluster, settings, clock, audit_path)
    first = bridge.run_pass()
    assert first.pending == ["n1"] and not first.replaced
    assert Ownership.of(cluster.nodes["n1"]).drain_started is not None
    clock.advance(30)
    while cluster.eviction_script["jobs/job-n1"]:
        res = bridge.run_pass()
        clock.advance(30)
    res = bridge.run_pass() if not res.replaced else res
    assert res.replaced == ["n1"] and cluster.evicted == ["jobs/job-n1"]


def test_drain_timeout_gives_up_waiting_and_requests_the_replacement(slurm, cluster, bridge_settings, clock, audit_path):
    cluster.eviction_script["jobs/job-n1"] = [Eviction.BLOCKED] * 1000
    slurm.drain("n1", XID79)
    settings = dataclasses.replace(bridge_settings, drain_pass_budget=5.0, drain_timeout=60.0)
    bridge = make(slurm, cluster, settings, clock, audit_path)
    bridge.run_pass()
    clock.advance(61)
    res = bridge.run_pass()
    assert res.replaced == ["n1"]
    assert Ownership.of(cluster.nodes["n1"]).drained == "timeout"
    timeout = [r for r in read_audit(audit_path) if r["kind"] == "bridge_drain_timeout"][0]
    assert timeout["blocked"] == ["jobs/job-n1"]


def test_drain_off_still_cordons_and_requests_replacement(slurm, cluster, bridge_settings, clock, audit_path):
    slurm.drain("n1", XID79)
    res = make(slurm, cluster, dataclasses.replace(bridge_settings, drain=False), clock, audit_path).run_pass()
    assert res.replaced == ["n1"] and cluster.evicted == []


# -- circuit breaker ---------------------------------------------------------------------------------

def twelve_nodes(kube):
    slurm = FakeSlurm(*[NodeInfo(f"n{i:02d}", "IDLE") for i in range(1, 13)])
    for i in range(1, 13):
        kube.add_node(f"n{i:02d}")
    return slurm


def test_ten_of_twelve_failing_at_once_cordons_no_more_than_the_cap(kube, bridge_settings, clock, audit_path, tmp_path):
    slurm = twelve_nodes(kube)
    for i in range(1, 11):
        slurm.drain(f"n{i:02d}", XID79)
    res = make(slurm, kube, bridge_settings, clock, audit_path).run_pass()
    cordoned = [n for n, obj in kube.nodes.items() if obj["spec"].get("unschedulable")]
    assert len(cordoned) == 2 == res.breaker_limit  # 20% of 12 = 2 (< max_nodes 10)
    assert res.taken == ["n01", "n02"] and len(res.blocked) == 8 and res.breaker_open
    trip = [r for r in read_audit(audit_path) if r["kind"] == "bridge_breaker_tripped"]
    assert len(trip) == 1 and trip[0]["level"] == "critical"
    blocked = [r for r in read_audit(audit_path) if r["kind"] == "bridge_breaker_blocked"]
    assert blocked[0]["nodes"] == [f"n{i:02d}" for i in range(3, 11)]
    state = json.loads(open(bridge_settings.state_file).read())
    assert state["tripped_at"] == clock.now and set(state["taken"]) == {"n01", "n02"}


def test_open_breaker_survives_a_restart_and_stays_quiet(kube, bridge_settings, clock, audit_path):
    slurm = twelve_nodes(kube)
    for i in range(1, 11):
        slurm.drain(f"n{i:02d}", XID79)
    make(slurm, kube, bridge_settings, clock, audit_path).run_pass()
    n_audit = len(kinds(audit_path))
    clock.advance(60)
    res = make(slurm, kube, bridge_settings, clock, audit_path).run_pass()  # a new process
    assert res.breaker_open and not res.taken and len(res.blocked) == 8
    assert len(kinds(audit_path)) == n_audit  # the same blocked set is not re-announced


def test_open_breaker_refuses_without_api_calls(kube, bridge_settings, clock, audit_path):
    slurm = twelve_nodes(kube)
    for i in range(1, 11):
        slurm.drain(f"n{i:02d}", XID79)
    bridge = make(slurm, kube, bridge_settings, clock, audit_path)
    bridge.run_pass()
    kube.calls.clear()
    res = bridge.run_pass()
    assert len(res.blocked) == 8 and dict(kube.calls) == {"list_nodes": 1}


def test_admin_reset_lets_the_next_nodes_in(kube, bridge_settings, clock, audit_path):
    from slurm_hooks.bridge.breaker import CircuitBreaker
    from slurm_hooks.bridge.state import StateStore

    slurm = twelve_nodes(kube)
    for i in range(1, 11):
        slurm.drain(f"n{i:02d}", XID79)
    make(slurm, kube, bridge_settings, clock, audit_path).run_pass()
    store = StateStore(bridge_settings.state_file)
    state = store.load()
    CircuitBreaker(bridge_settings.breaker, state).reset(clock.now)
    store.save(state)
    clock.advance(1)
    res = make(slurm, kube, bridge_settings, clock, audit_path).run_pass()
    assert res.taken == ["n03", "n04"] and res.breaker_open


def test_breaker_window_passing_does_not_let_more_in_while_the_cap_is_held(kube, bridge_settings, clock, audit_path):
    slurm = twelve_nodes(kube)
    for i in range(1, 11):
        slurm.drain(f"n{i:02d}", XID79)
    bridge = make(slurm, kube, bridge_settings, clock, audit_path)
    bridge.run_pass()
    clock.advance(bridge_settings.breaker.window + 1)
    res = bridge.run_pass()
    assert res.taken == [] and res.breaker_open  # n01, n02 are still held: the cap is a total, not a rate
    slurm.resume("n01")  # mended: given back, which frees one place
    clock.advance(1)
    bridge.run_pass()
    clock.advance(bridge_settings.breaker.window + 1)
    res = bridge.run_pass()
    assert res.taken == ["n03"]


def test_lost_state_file_cannot_reset_the_budget(kube, bridge_settings, clock, audit_path, tmp_path):
    """The window is also read from the nodes' ownership annotations."""
    slurm = twelve_nodes(kube)
    for i in range(1, 3):
        slurm.drain(f"n{i:02d}", XID79)
    make(slurm, kube, bridge_settings, clock, audit_path).run_pass()
    import os
    os.unlink(bridge_settings.state_file)
    for i in range(3, 11):
        slurm.drain(f"n{i:02d}", XID79)
    res = make(slurm, kube, bridge_settings, clock, audit_path).run_pass()
    assert not res.taken and res.breaker_open


def test_max_nodes_caps_a_big_cluster(kube, bridge_settings, clock, audit_path):
    settings = dataclasses.replace(bridge_settings, breaker=BreakerSection(max_percent=50, max_nodes=3, window=600))
    slurm = FakeSlurm(*[NodeInfo(f"n{i:03d}", "IDLE") for i in range(100)])
    for i in range(100):
        kube.add_node(f"n{i:03d}")
    for i in range(10):
        slurm.drain(f"n{i:03d}", XID79)
    res = make(slurm, kube, settings, clock, audit_path).run_pass()
    assert len(res.taken) == 3


def test_recovery_goes_on_while_the_breaker_is_open(kube, bridge_settings, clock, audit_path):
    slurm = twelve_nodes(kube)
    for i in range(1, 11):
        slurm.drain(f"n{i:02d}", XID79)
    bridge = make(slurm, kube, bridge_settings, clock, audit_path)
    bridge.run_pass()
    slurm.resume("n01")
    res = bridge.run_pass()
    assert res.restored == ["n01"] and res.breaker_open and not res.taken


# -- failures and restarts -------------------------------------------------------------------------------

def test_restart_midway_finishes_the_job_without_doing_anything_twice(
        slurm, cluster, bridge_settings, clock, audit_path):
    slurm.drain("n1", XID79)
    cluster.fail("patch_node_status", KubeTransient("HTTP 503: apiserver restarting", 503))
    first = make(slurm, cluster, bridge_settings, clock, audit_path).run_pass()
    assert first.taken == ["n1"] and first.errors
    record = Ownership.of(cluster.nodes["n1"])
    assert record.events == ["taken"] and not record.condition  # progress saved up to the failure

    second = make(slurm, cluster, bridge_settings, clock, audit_path).run_pass()  # a new process
    assert second.replaced == ["n1"] and not second.taken
    assert len(cluster.events) == 1 and cluster.calls["create_event"] == 1
    assert cluster.evicted == ["jobs/job-n1"]
    assert "bridge_error" in kinds(audit_path)


def test_lost_answer_to_the_cordon_patch_is_adopted_on_retry(slurm, cluster, bridge_settings, clock, audit_path):
    """The server applied the take but the client saw a conflict: re-read finds our own record."""
    slurm.drain("n1", XID79)
    real = cluster.json_patch_node
    calls = []

    def applied_then_conflict(name, ops, *, dry_run=False):
        calls.append(name)
        result = real(name, ops, dry_run=dry_run)
        if len(calls) == 1:
            from slurm_hooks.bridge.api import KubeConflict
            raise KubeConflict("HTTP 422: test failed")
        return result

    cluster.json_patch_node = applied_then_conflict
    res = make(slurm, cluster, bridge_settings, clock, audit_path).run_pass()
    assert res.replaced == ["n1"] and Ownership.of(cluster.nodes["n1"]).cordoned is True


def test_conflicting_writer_is_survived_by_rereading(slurm, cluster, bridge_settings, clock, audit_path):
    slurm.drain("n1", XID79)
    real_get = cluster.get_node
    bumped = []

    def get_then_someone_writes(name):
        node = real_get(name)
        if not bumped:
            bumped.append(1)
            cluster.patch_node(name, {"metadata": {"labels": {"other": "writer"}}})
        return node

    cluster.get_node = get_then_someone_writes
    res = make(slurm, cluster, bridge_settings, clock, audit_path).run_pass()
    assert res.taken == ["n1"] and cluster.calls["json_patch_node"] == 2
    assert cluster.nodes["n1"]["metadata"]["labels"]["other"] == "writer"


def test_api_server_down_aborts_the_pass_and_the_next_one_completes(kube, bridge_settings, clock, audit_path):
    slurm = FakeSlurm(*[NodeInfo(f"n{i}", "IDLE") for i in range(5)])
    for i in range(5):
        kube.add_node(f"n{i}")
        slurm.drain(f"n{i}", XID79)
    settings = dataclasses.replace(bridge_settings, breaker=BreakerSection(max_percent=100, max_nodes=10))
    down = KubeTransient("NewConnectionError: connection refused")
    kube.fail("get_node", down, down, down)
    first = make(slurm, kube, settings, clock, audit_path).run_pass()
    assert first.aborted and not first.taken and kube.calls["get_node"] == 3
    assert "bridge_pass_aborted" in kinds(audit_path)
    second = make(slurm, kube, settings, clock, audit_path).run_pass()
    assert sorted(second.replaced) == [f"n{i}" for i in range(5)]


def test_api_server_down_at_the_start_of_a_pass(slurm, cluster, bridge_settings, clock, audit_path):
    cluster.fail("list_nodes", KubeTransient("HTTP 500: etcd timeout", 500))
    res = make(slurm, cluster, bridge_settings, clock, audit_path).run_pass()
    assert res.aborted.startswith("cannot list nodes held by the bridge")


def test_slurm_unreachable_aborts_the_pass(slurm, cluster, bridge_settings, clock, audit_path):
    slurm.fail("nodes", CommandTimeout(["scontrol", "show", "node"], None, "", "", timed_out=True))
    res = make(slurm, cluster, bridge_settings, clock, audit_path).run_pass()
    assert "cannot read Slurm node states" in res.aborted and cluster.mutations() == 0


def test_missing_kubernetes_node_is_reported_once(slurm, cluster, bridge_settings, clock, audit_path):
    slurm.add_node("gpu-x", "IDLE+DRAIN", XID79)
    bridge = make(slurm, cluster, bridge_settings, clock, audit_path)
    bridge.run_pass()
    bridge.run_pass()
    errors = [r for r in read_audit(audit_path) if r["kind"] == "bridge_error"]
    assert len(errors) == 1 and "gpu-x not found" in errors[0]["error"]


def test_dry_run_changes_nothing_and_says_so(slurm, cluster, bridge_settings, clock, audit_path):
    slurm.drain("n1", XID79)
    before = json.dumps(cluster.nodes, sort_keys=True)
    res = make(slurm, cluster, bridge_settings, clock, audit_path, dry_run=True).run_pass()
    assert res.dry_run and res.taken == ["n1"] and res.replaced == ["n1"]
    assert json.dumps(cluster.nodes, sort_keys=True) == before
    assert cluster.evicted == [] and cluster.events == []
    assert "json_patch_node n1" in cluster.dry_runs and "evict jobs/job-n1" in cluster.dry_runs
    assert all(r.get("dry_run") for r in read_audit(audit_path))
    import os
    assert not os.path.exists(bridge_settings.state_file)


def test_metrics_textfile_tells_the_breaker_state(kube, bridge_settings, clock, audit_path, tmp_path):
    slurm = twelve_nodes(kube)
    for i in range(1, 11):
        slurm.drain(f"n{i:02d}", XID79)
    make(slurm, kube, bridge_settings, clock, audit_path, metrics_dir=str(tmp_path / "prom")).run_pass()
    text = (tmp_path / "prom" / "slurm_hooks_bridge.prom").read_text()
    assert "slurm_hooks_bridge_breaker_open 1" in text
    assert "slurm_hooks_bridge_breaker_blocked_nodes 8" in text
    assert "# TYPE slurm_hooks_bridge_breaker_limit gauge" in text


# -- replacement backends ---------------------------------------------------------------------------------

def test_karpenter_backend_deletes_the_nodeclaim(slurm, cluster, bridge_settings, clock, audit_path):
    claims = Resource("karpenter.sh", "v1", "nodeclaims")
    cluster.add_object(claims, {"metadata": {"name": "gpu-abc"}, "status": {"nodeName": "n1"}})
    cluster.add_object(claims, {"metadata": {"name": "gpu-def"}, "status": {"nodeName": "n2"}})
    slurm.drain("n1", XID79)
    res = make(slurm, cluster, bridge_settings, clock, audit_path, backend=KarpenterBackend()).run_pass()
    assert res.replaced == ["n1"]
    assert [k[2] for k in cluster.objects] == ["gpu-def"]
    assert Ownership.of(cluster.nodes["n1"]).replacement == "nodeclaim/gpu-abc deleted"


def test_karpenter_backend_without_a_nodeclaim_retries_next_pass(slurm, cluster, bridge_settings, clock, audit_path):
    slurm.drain("n1", XID79)
    bridge = make(slurm, cluster, bridge_settings, clock, audit_path, backend=KarpenterBackend())
    res = bridge.run_pass()
    assert res.errors and "no Karpenter NodeClaim" in res.errors[0][1]
    assert Ownership.of(cluster.nodes["n1"]).drained == "done"  # progress kept
    cluster.add_object(Resource("karpenter.sh", "v1", "nodeclaims"), {"metadata": {"name": "c"}, "status": {"nodeName": "n1"}})
    assert bridge.run_pass().replaced == ["n1"]


def test_capi_backend_annotates_the_machine_and_withdraws_on_recovery(slurm, cluster, bridge_settings, clock, audit_path):
    machines = Resource("cluster.x-k8s.io", "v1beta1", "machines", namespaced=True)
    cluster.add_object(machines, {"metadata": {"name": "m-1", "namespace": "capi", "annotations": {},
                                               "labels": {"pool": "gpu"}}, "spec": {"clusterName": "c1"}})
    checks = Resource("cluster.x-k8s.io", "v1beta1", "machinehealthchecks", namespaced=True)
    cluster.add_object(checks, {"metadata": {"name": "gpu", "namespace": "capi"},
                                "spec": {"clusterName": "c1", "selector": {"matchLabels": {"pool": "gpu"}}}})
    cluster.nodes["n1"]["metadata"]["annotations"] = {
        "cluster.x-k8s.io/machine": "m-1", "cluster.x-k8s.io/cluster-namespace": "capi"}
    slurm.drain("n1", XID79)
    bridge = make(slurm, cluster, bridge_settings, clock, audit_path, backend=CapiBackend())
    bridge.run_pass()
    machine = cluster.objects[(machines, "capi", "m-1")]
    assert machine["metadata"]["annotations"] == {"cluster.x-k8s.io/remediate-machine": ""}
    slurm.resume("n1")
    bridge.run_pass()
    assert cluster.objects[(machines, "capi", "m-1")]["metadata"]["annotations"] == {}


def test_template_backend_creates_the_rendered_resource_once(slurm, cluster, bridge_settings, clock, audit_path, tmp_path):
    pytest.importorskip("yaml", reason="a YAML template needs PyYAML (the k8s extra)")
    tpl = tmp_path / "cr.yaml.j2"
    tpl.write_text(
        "apiVersion: remediation.medik8s.io/v1alpha1\n"
        "kind: SelfNodeRemediation\n"
        "metadata:\n  name: {{ node }}\n  namespace: medik8s\n"
        "  annotations:\n    slurm-hooks.io/reason: {{ reason | tojson }}\n"
        "spec:\n  remediationStrategy: {{ 'OutOfServiceTaint' if action == 'replace' else 'Automatic' }}\n"
    )
    slurm.drain("n1", XID79)
    bridge = make(slurm, cluster, bridge_settings, clock, audit_path, backend=TemplateBackend(str(tpl), "selfnoderemediations"))
    bridge.run_pass()
    (key, obj), = cluster.objects.items()
    assert key[1:] == ("medik8s", "n1")
    assert obj["spec"]["remediationStrategy"] == "OutOfServiceTaint"
    assert obj["metadata"]["annotations"]["slurm-hooks.io/reason"] == XID79
    slurm.resume("n1")
    bridge.run_pass()
    assert cluster.objects == {}


def test_condition_backend_makes_no_extra_call(slurm, cluster, bridge_settings, clock, audit_path):
    slurm.drain("n1", XID79)
    make(slurm, cluster, bridge_settings, clock, audit_path).run_pass()
    assert not any(verb.endswith("_object") or verb == "list_objects" for verb in cluster.calls)


# -- cost -------------------------------------------------------------------------------------------------

def test_api_calls_grow_with_bad_nodes_not_with_the_cluster(bridge_settings, clock, audit_path):
    def calls(total: int, bad: int) -> int:
        kube = InMemoryKube()
        slurm = FakeSlurm(*[NodeInfo(f"n{i:04d}", "IDLE") for i in range(total)])
        for i in range(total):
            kube.add_node(f"n{i:04d}")
            kube.add_pod(f"job-{i}", f"n{i:04d}", "jobs", **controlled_by())
        for i in range(bad):
            slurm.drain(f"n{i:04d}", XID79)
        settings = dataclasses.replace(bridge_settings, breaker=BreakerSection(max_percent=100, max_nodes=1000))
        make(slurm, kube, settings, clock, audit_path).run_pass()
        return sum(kube.calls.values())

    assert calls(100, 5) == calls(1000, 5)
    assert calls(1000, 50) - calls(1000, 0) == 10 * (calls(1000, 5) - calls(1000, 0))
