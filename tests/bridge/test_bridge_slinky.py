"""End to end on Slinky: the operator's preStop overwrites our reason, and the bridge still finishes.

The real testbed slurmctld and slurmd's (``n1``, ``n2``); kmock as the API server with
graceful evictions (an evicted pod terminates until the kubelet deletes it); the Slinky
double (``kube/slinky.py``) running the slurmd pod's real preStop command against
slurmctld, keeping the operator's reason rule and its Comment JSON; a spare Kubernetes
node for the NodeSet to move the pod to. The replacement backend is a medik8s
SelfNodeRemediation from a template, so that "requested exactly once" can be counted.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import wait_for
from paths import ROOT

pytest.importorskip("kmock")
pytest.importorskip("kubernetes")

from kube.doubles import controlled_by  # noqa: E402
from kube.emulator import node, pod  # noqa: E402
from kube.slinky import SlinkyOperator  # noqa: E402

from slurm_hooks.bridge.reconciler import Reconciler, slurm_busy, slurm_healthy  # noqa: E402
from slurm_hooks.bridge.settings import BridgeSection, ReplaceSection  # noqa: E402
from slurm_hooks.bridge.verdict import NodeVerdict  # noqa: E402
from slurm_hooks.observe.audit import AuditLog  # noqa: E402
from slurm_hooks.probes import sim  # noqa: E402

pytestmark = [pytest.mark.slurm, pytest.mark.k8s]
pytest_plugins = ["kube.fixtures"]

SNR = "self-node-remediation.medik8s.io/v1alpha1/selfnoderemediations"
TEMPLATE = """\
apiVersion: self-node-remediation.medik8s.io/v1alpha1
kind: SelfNodeRemediation
metadata:
  name: {{ node }}
  namespace: medik8s
  annotations:
    slurm-hooks.io/reason: {{ reason | tojson }}
spec:
  remediationStrategy: OutOfServiceTaint
"""

#: Saves a checkpoint for 1.5 s on SIGTERM (inside the testbed's KillWait of 2 s).
LOOPING_JOB = """#!/bin/sh
trap 'sleep 1.5; exit 0' TERM
echo "start restart=${SLURM_RESTART_COUNT:-0} on $SLURMD_NODENAME"
while true; do sleep 0.1; done
"""


def check(tb, name: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "slurm_hooks", "check", "--node", name, "--config", tb.config_path],
                          env={**tb.env, "PYTHONPATH": ROOT}, capture_output=True, text=True, timeout=60)


def job_line(tb, job: int, restart: str) -> str | None:
    for line in tb.job_output(job).splitlines():
        if line.startswith("start ") and f"restart={restart} " in line:
            return line.rsplit(" on ", 1)[1].strip()
    return None


@pytest.fixture
def slinky(clean_testbed, kube_server):
    tb = clean_testbed
    for name in tb.nodes:
        kube_server.put("v1/nodes", node(name))
        kube_server.put("v1/pods", pod(f"train-{name}", name, "jobs", **controlled_by()), "jobs")
        kube_server.put("v1/pods", pod(f"dcgm-{name}", name, "gpu",
                                       metadata={"ownerReferences": [{"kind": "DaemonSet", "name": "dcgm"}]}), "gpu")
    kube_server.put("v1/nodes", node("spare-1"))
    operator = SlinkyOperator(kube_server, tb)
    for name in tb.nodes:
        operator.place(name, name)
    try:
        yield tb, kube_server, operator
    finally:
        operator.close()
        tb.cancel_all()
        for name in tb.nodes:
            tb.scontrol("update", f"NodeName={name}", "Comment=", "Extra=")


def test_prestop_overwrites_our_reason_and_the_bridge_replaces_once_and_closes_the_incident(
        slinky, kube_client, tmp_path):
    tb, server, operator = slinky
    template = tmp_path / "snr.yaml.j2"
    template.write_text(TEMPLATE)
    settings = BridgeSection(mapping="auto", state_file=str(tmp_path / "state.json"), drain_pass_budget=15,
                              replace=ReplaceSection(backend="template", template=str(template),
                                                      plural="selfnoderemediations"))
    bridge = Reconciler(tb.slurm, kube_client, settings, audit=AuditLog(tb.audit_log))

    # XID 79 under a job: slurm-hooks check drains the node and requeues the job.
    job = tb.sbatch(LOOPING_JOB, "--gres=gpu:1", "--requeue", "--open-mode=append")
    bad = wait_for(lambda: job_line(tb, job, "0"), 20, f"job {job} started")
    good = next(n for n in tb.nodes if n != bad)
    sim.inject(tb.sim_dir, bad, 0, xid=79)
    result = check(tb, bad)
    assert result.returncode == 1, result.stdout + result.stderr
    assert tb.slurm.node(bad).reason.startswith("slurm-hooks: XID 79")

    # The bridge takes the node at once: the cordon does not make the operator replace our reason.
    res = bridge.run_pass()
    assert res.taken == [bad] and res.waiting and not res.drained and not res.errors, res.summary()
    assert operator.sync_cordons() == []
    assert tb.slurm.node(bad).reason.startswith("slurm-hooks: XID 79")
    verdict = NodeVerdict.of(tb.slurm.node(bad))
    assert verdict is not None and verdict.kube_node == bad and verdict.reason.startswith("slurm-hooks: XID 79")

    # The job is requeued and runs again on the good node; the bad node has no job left.
    assert wait_for(lambda: job_line(tb, job, "1"), 60, f"job {job} running again") == good
    tb.wait_node(bad, lambda n: not slurm_busy(n) and not tb.slurm.jobs_on_node(n.name), timeout=30)

    # Drain: the job pod first (waited for until deleted), the slurmd pod last; its preStop runs.
    res = bridge.run_pass()
    assert res.drained == [bad] and res.replaced == [bad] and not res.errors, res.summary()
    assert [host for host, rc, _ in operator.prestops] == [bad] and operator.prestops[0][1] == 0, operator.prestops
    info = tb.slurm.node(bad)
    # DOWN+DRAIN at once; the testbed's slurmd outlives its "pod" and registers again: IDLE+DRAIN.
    assert info.reason == "slurm-operator: Pod is terminating" and info.drained, info
    assert NodeVerdict.of(info).requested.startswith(f"self-node-remediation.medik8s.io/v1alpha1/medik8s/{bad} created")
    assert server.get("v1/pods", f"train-{bad}", "jobs") is None
    assert server.get("v1/pods", operator.pod_name(bad), "slurm") is None
    drains = [r for r in tb.audit_events() if r.get("kind") == "bridge_drain" and r.get("evicted")]
    assert [r["evicted"] for r in drains] == [[f"jobs/train-{bad}"], [f"slurm/{operator.pod_name(bad)}"]]

    # The reason is the operator's now: nothing is asked twice, nothing is resumed by the bridge.
    for _ in range(2):
        res = bridge.run_pass()
        assert not res.taken and not res.replaced and not res.errors, res.summary()
    assert tb.slurm.node(bad).reason == "slurm-operator: Pod is terminating"
    assert len(server.list(SNR)) == 1
    assert [r["kind"] for r in tb.audit_events()].count("bridge_replace") == 1
    posts = [r for r in server.requests("POST") if "selfnoderemediations" in str(r.url)]
    assert len(posts) == 1

    # The NodeSet moves the pod to the spare node; the operator undrains its own reason.
    operator.reschedule(bad, "spare-1")
    tb.wait_node(bad, slurm_healthy, timeout=60)
    res = bridge.run_pass()
    assert res.closed == [bad] and res.detached == [bad] and not res.taken and not res.errors, res.summary()
    assert NodeVerdict.of(tb.slurm.node(bad)) is None and tb.slurm.node(bad).extra_text == ""
    old = server.get("v1/nodes", bad)
    assert old["spec"]["unschedulable"] is True  # the machine stays out for its repair
    closed = [r for r in tb.audit_events() if r.get("kind") == "bridge_incident_closed"]
    assert len(closed) == 1 and closed[0]["node"] == bad and closed[0]["back_on"] == "spare-1"
    assert server.get("v1/nodes", "spare-1")["spec"].get("unschedulable") is None

    res = bridge.run_pass()
    assert not res.closed and not res.taken and not res.replaced and res.detached == [bad], res.summary()


def test_the_double_keeps_the_operators_reason_rule(slinky):
    """IsNodeReasonOurs: the operator drains a cordoned node only when nobody drained it, and
    undrains only its own reasons."""
    tb, server, operator = slinky
    ours, other = tb.nodes
    tb.scontrol("update", f"NodeName={ours}", "State=DRAIN", "Reason=slurm-hooks: XID 79 on GPU 3 [replace]")
    for name in (ours, other):
        body = server.get("v1/nodes", name)
        body["spec"]["unschedulable"] = True
        server.put("v1/nodes", body)
    assert operator.sync_cordons() == [other]
    assert tb.slurm.node(ours).reason.startswith("slurm-hooks: XID 79")
    assert tb.slurm.node(other).reason == "slurm-operator: node is cordoned"
    operator.reschedule(ours, "spare-1")
    operator.reschedule(other, "spare-1")
    assert tb.slurm.node(ours).drained and tb.slurm.node(ours).reason.startswith("slurm-hooks: XID 79")
    assert not tb.slurm.node(other).drained
    tb.scontrol("update", f"NodeName={ours}", "State=RESUME")


REBOOTNODES = "janitor.dgxc.nvidia.com/v1alpha1/rebootnodes"
REBOOT_TEMPLATE = """\
apiVersion: janitor.dgxc.nvidia.com/v1alpha1
kind: RebootNode
metadata:
  name: slurm-hooks-{{ node }}
spec:
  nodeName: {{ node }}
"""


def rebooted(server, name: str, boot_id: str) -> None:
    """The kubelet after a reboot: Ready again with another boot id (the bridge's cordon and taint stay)."""
    body = server.get("v1/nodes", name)
    body.setdefault("status", {}).setdefault("nodeInfo", {})["bootID"] = boot_id
    server.put("v1/nodes", body)


def _rebooting_bridge(tb, kube_client, tmp_path) -> Reconciler:
    """A bridge that asks a machine's reboot with a RebootNode (REBOOT_TEMPLATE)."""
    from slurm_hooks.bridge.settings import RebootSection

    template = tmp_path / "rebootnode.yaml.j2"
    template.write_text(REBOOT_TEMPLATE)
    settings = BridgeSection(mapping="auto", state_file=str(tmp_path / "state.json"), drain_pass_budget=15,
                              reboot=RebootSection(backend="template", template=str(template), plural="rebootnodes"))
    return Reconciler(tb.slurm, kube_client, settings, audit=AuditLog(tb.audit_log))


def test_a_machine_rebooted_in_place_is_given_back_once_its_slurm_node_is_healthy_again(
        slinky, kube_client, tmp_path):
    """Every request the bridge makes is ended by the bridge: the slurmd pod moves to the spare while
    the machine reboots; once the Slurm node is back and the machine reports a new boot, the RebootNode
    is deleted and the machine uncordoned and untainted (before: detached, cordoned for ever)."""
    tb, server, operator = slinky
    bad = tb.nodes[0]
    rebooted(server, bad, "boot-1")
    bridge = _rebooting_bridge(tb, kube_client, tmp_path)

    tb.scontrol("update", f"NodeName={bad}", "State=DRAIN", "Reason=slurm-hooks: XID 79 on GPU 0 [reboot]")
    res = wait_for(lambda: (lambda r: r if r.replaced or r.errors else None)(bridge.run_pass()), 60,
                   "the bridge drains the node and asks for the reboot")
    assert res.replaced == [bad] and not res.errors, res.summary()
    assert server.get(REBOOTNODES, f"slurm-hooks-{bad}")["spec"] == {"nodeName": bad}
    assert server.get("v1/nodes", bad)["spec"]["unschedulable"] is True

    # The machine reboots; the NodeSet moved the slurmd pod to the spare meanwhile, slurmd registers.
    operator.reschedule(bad, "spare-1")
    tb.wait_node(bad, slurm_healthy, timeout=60)
    rebooted(server, bad, "boot-2")
    res = bridge.run_pass()
    assert res.closed == [bad] and res.restored == [bad] and not res.detached and not res.errors, res.summary()

    machine = server.get("v1/nodes", bad)
    assert not machine["spec"].get("unschedulable")
    assert not [t for t in machine["spec"].get("taints") or () if t["key"].startswith("slurm-hooks.io/")]
    assert server.get(REBOOTNODES, f"slurm-hooks-{bad}") is None
    assert "slurm-hooks.io/owned" not in (machine["metadata"].get("labels") or {})
    closed = [r for r in tb.audit_events() if r.get("kind") == "bridge_incident_closed"]
    assert len(closed) == 1 and closed[0]["node"] == bad
    res = bridge.run_pass()
    assert not res.restored and not res.detached and not res.taken, res.summary()


def test_a_machine_whose_reboot_has_not_happened_yet_stays_held(slinky, kube_client, tmp_path):
    """The Slurm node is back on the spare, but the machine reports the boot it had when the reboot
    was asked: the request stands and the machine stays cordoned until it comes back."""
    tb, server, operator = slinky
    bad = tb.nodes[0]
    rebooted(server, bad, "boot-1")
    bridge = _rebooting_bridge(tb, kube_client, tmp_path)
    tb.scontrol("update", f"NodeName={bad}", "State=DRAIN", "Reason=slurm-hooks: XID 79 on GPU 0 [reboot]")
    wait_for(lambda: bridge.run_pass().replaced, 60, "the reboot is asked for")
    operator.reschedule(bad, "spare-1")
    tb.wait_node(bad, slurm_healthy, timeout=60)
    res = bridge.run_pass()
    assert res.closed == [bad] and res.detached == [bad] and not res.restored, res.summary()
    assert server.get(REBOOTNODES, f"slurm-hooks-{bad}") is not None
    assert server.get("v1/nodes", bad)["spec"]["unschedulable"] is True
    rebooted(server, bad, "boot-2")
    res = bridge.run_pass()
    assert res.restored == [bad] and not res.closed, res.summary()
    assert server.get(REBOOTNODES, f"slurm-hooks-{bad}") is None
