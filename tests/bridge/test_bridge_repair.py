"""Every request the bridge makes is ended by the bridge, and what it cannot end is counted and told.

- an SNR whose controller rewrote its status between our create and our cancel is still deleted
  (UID precondition only: a resourceVersion one made the delete a 409 and the CR, and SNR's own
  taint, stayed for ever);
- a machine held longer than ``held_alert_after`` is a gauge and an alert, told once per take;
- the bridge's own problems (a latched breaker, a missing permission, a machine held too long)
  are given to the notifier every pass while true, so their alerts keep firing and then end.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from fakes.slurm import FakeSlurm
from kube.doubles import XID79, Clock, add_gpu_node, records
from kube.doubles import make_reconciler as make
from kube.memory import InMemoryKube

from slurm_hooks.bridge.api import KubePermanent
from slurm_hooks.bridge.settings import BreakerSection
from slurm_hooks.slurm import NodeInfo

pytest_plugins = ["kube.fixtures"]

SNR = "self-node-remediation.medik8s.io/v1alpha1/selfnoderemediations"


@pytest.mark.k8s
def test_snr_whose_status_changed_between_create_and_cancel_is_deleted(kube_server, kube_client, tmp_path):
    from kube.emulator import node

    from slurm_hooks.bridge.api import Resource
    from slurm_hooks.bridge.replace import Target, TemplateBackend
    from slurm_hooks.models import Action

    kube_server.put("v1/nodes", node("n1"))
    template = tmp_path / "snr.json.j2"
    template.write_text(json.dumps({"apiVersion": "self-node-remediation.medik8s.io/v1alpha1",
                                    "kind": "SelfNodeRemediation",
                                    "metadata": {"name": "{{ node }}", "namespace": "medik8s"}}))
    backend = TemplateBackend(str(template), "selfnoderemediations", keeps_machine=True)
    n1 = kube_client.get_node("n1")
    ref = backend.request(kube_client, Target(node=n1, slurm_node="n1", reason=XID79, summary="XID 79",
                                              action=Action.REBOOT, take="abc"))
    resource = Resource("self-node-remediation.medik8s.io", "v1alpha1", "selfnoderemediations", namespaced=True)
    before = kube_client.get_object(resource, "n1", "medik8s")["metadata"]["resourceVersion"]
    # SNR's controller writes its status (phase, timeAssumedRebooted): a new resourceVersion.
    kube_client.patch_object(resource, "n1", {"status": {"phase": "Rebooting"}}, "medik8s")
    assert kube_client.get_object(resource, "n1", "medik8s")["metadata"]["resourceVersion"] != before
    assert backend.cancel(kube_client, n1, ref) == "self-node-remediation.medik8s.io/v1alpha1/medik8s/n1 deleted"
    assert kube_server.get(SNR, "n1", "medik8s") is None


@pytest.fixture
def fleet():
    kube, slurm = InMemoryKube(), FakeSlurm(NodeInfo("n1", "IDLE"), NodeInfo("n2", "IDLE"), NodeInfo("n3", "IDLE"))
    for name in ("n1", "n2", "n3"):
        add_gpu_node(kube, name)
    return kube, slurm


def test_a_machine_held_too_long_is_a_gauge_and_an_alert_told_once(fleet, bridge_settings, tmp_path, audit_path):
    kube, slurm = fleet
    clock = Clock()
    settings = dataclasses.replace(bridge_settings, held_alert_after=3600.0, opt_out_label="hold")
    kube.nodes["n1"]["metadata"]["labels"]["remediation.medik8s.io/exclude-from-remediation"] = "true"
    slurm.drain("n1", XID79)  # opted out: cordoned and held, never replaced
    metrics = tmp_path / "metrics"
    bridge = make(slurm, kube, settings, clock, audit_path, metrics_dir=str(metrics))
    assert bridge.run_pass().opted_out == ["n1"]
    clock.advance(1800)
    assert bridge.run_pass().held_too_long == []
    clock.advance(1801)
    res = bridge.run_pass()
    assert res.held_too_long == ["n1"]
    assert [r["kind"] for r in res.standing] == ["bridge_held_too_long"]
    assert "slurm_hooks_bridge_held_too_long_nodes 1" in "".join(p.read_text() for p in metrics.iterdir())
    assert bridge.run_pass().held_too_long == ["n1"]
    assert len(records(audit_path, "bridge_held_too_long")) == 1


def test_the_latched_breaker_and_a_missing_permission_are_given_every_pass_while_true(
        fleet, bridge_settings, audit_path):
    kube, slurm = fleet
    clock = Clock()
    settings = dataclasses.replace(bridge_settings, breaker=BreakerSection(max_percent=100, max_nodes=1,
                                                                            window=3600))
    for name in ("n1", "n2"):
        slurm.drain(name, XID79)
    given: list[list[str]] = []

    class Denied:
        name, condition_is_request, keeps_machine = "karpenter", False, False

        def request(self, kube, target, *, dry_run=False):
            raise KubePermanent("HTTP 403: Forbidden: nodeclaims.karpenter.sh is forbidden", 403)

        def cancel(self, kube, node, ref, *, dry_run=False):
            return None

    bridge = make(slurm, kube, settings, clock, audit_path, backend=Denied())
    for _ in range(3):
        res = bridge.run_pass()
        given.append(sorted(r["kind"] for r in res.standing))
        clock.advance(60)
    assert given == [["bridge_breaker_tripped", "bridge_permission_missing"]] * 3
    assert len(records(audit_path, "bridge_breaker_tripped")) == 1  # told once, re-given every pass
    breaker = next(r for r in res.standing if r["kind"] == "bridge_breaker_tripped")
    assert breaker["ts"] == res.started - 120 and "cap 1" in breaker["reason"]
    clock.advance(3600)  # the window passes: the breaker closes; its alert is no longer given
    slurm.resume("n2")
    assert [r["kind"] for r in bridge.run_pass().standing] == ["bridge_permission_missing"]
