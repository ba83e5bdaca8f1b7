"""RBAC from every configured backend: what ``render`` grants is what ``validate`` asks about.

kmock answers SelfSubjectAccessReview from the RBAC objects it stores, for the bridge's
ServiceAccount, as kube-apiserver's RBAC authorizer does: the rendered ``rbac.yaml`` is applied
to it as is, and ``validate``'s access review runs against it over HTTP.
"""

from __future__ import annotations

import textwrap

import pytest
import yaml
from fakes.slurm import FakeSlurm
from kube.emulator import node
from kube.site import write_kubeconfig

from slurm_hooks import config as config_mod
from slurm_hooks.bridge.reconciler import Reconciler
from slurm_hooks.bridge.settings import BridgeSection, RebootSection
from slurm_hooks.observe.audit import AuditLog
from slurm_hooks.preflight.environment import check_bridge
from slurm_hooks.preflight.results import Status
from slurm_hooks.slurm import NodeInfo

pytest.importorskip("kmock")
pytest.importorskip("kubernetes")

pytestmark = pytest.mark.k8s
pytest_plugins = ["kube.fixtures"]

#: NVSentinel's reboot request: cluster-scoped, the node in spec.
REBOOT_NODE = """\
apiVersion: janitor.dgxc.nvidia.com/v1alpha1
kind: RebootNode
metadata:
  name: reboot-{{ node }}
spec:
  nodeName: {{ node }}
"""
KINDS = {"ServiceAccount": None, "ClusterRole": "rbac.authorization.k8s.io/v1/clusterroles",
         "ClusterRoleBinding": "rbac.authorization.k8s.io/v1/clusterrolebindings",
         "Role": "rbac.authorization.k8s.io/v1/roles", "RoleBinding": "rbac.authorization.k8s.io/v1/rolebindings"}


@pytest.fixture
def site(tmp_path, kube_server):
    template = tmp_path / "rebootnode.yaml.j2"
    template.write_text(REBOOT_NODE)
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", kube_server.url)
    text = textwrap.dedent(f"""\
        [log]
        audit = "{tmp_path}/audit.jsonl"
        [bridge]
        kubeconfig = "{kubeconfig}"
        lease_namespace = "slurm-hooks"
        [bridge.reboot]
        backend = "template"
        template = "{template}"
        plural = "rebootnodes"
    """)
    path = tmp_path / "bridge.toml"
    path.write_text(text)
    return {"config": config_mod.load(str(path)), "text": text, "template": str(template), "server": kube_server}


def apply(server, docs) -> None:
    for doc in docs:
        resource = KINDS[doc["kind"]]
        if resource:
            server.put(resource, doc, doc["metadata"].get("namespace"))
    server.kmock.rbac_subject = ("slurm-hooks", "slurm-hooks-bridge")


def rendered_rbac(text: str) -> list[dict]:
    from slurm_hooks.commands.render import render_all

    return list(yaml.safe_load_all(render_all(config_text=text, namespace="slurm-hooks")["rbac"]))


def test_render_grants_the_reboot_templates_resource_and_the_lease_and_validate_accepts_it(site):
    docs = rendered_rbac(site["text"])
    role = next(d for d in docs if d["kind"] == "ClusterRole")
    assert {"apiGroups": ["janitor.dgxc.nvidia.com"], "resources": ["rebootnodes"],
            "verbs": ["create", "get", "delete"]} in role["rules"]
    lease_role = next(d for d in docs if d["kind"] == "Role" and d["metadata"]["namespace"] == "slurm-hooks")
    assert lease_role["rules"] == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                                    "resourceNames": ["slurm-hooks-bridge"], "verbs": ["get", "update"]},
                                   {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]}]
    apply(site["server"], docs)
    results = check_bridge(site["config"])
    assert [r.status for r in results] == [Status.PASS], [r.line() for r in results]


def test_validate_names_the_missing_reboot_rule_when_the_rbac_lacks_it(site):
    docs = rendered_rbac(site["text"])
    role = next(d for d in docs if d["kind"] == "ClusterRole")
    role["rules"] = [r for r in role["rules"] if r["resources"] != ["rebootnodes"]]  # as render gave it before
    apply(site["server"], docs)
    results = check_bridge(site["config"])
    failed = [r.line() for r in results if r.status is Status.FAIL]
    assert len(failed) == 3 and all("rebootnodes (janitor.dgxc.nvidia.com)" in line for line in failed), failed
    assert any('resources: ["rebootnodes"], verbs: ["create"]' in line for line in failed)


def test_a_403_on_the_reboot_request_is_a_missing_permission_not_retried(site, kube_client, tmp_path):
    server = site["server"]
    server.put("v1/nodes", node("n1"))
    server.kmock["post /apis/janitor.dgxc.nvidia.com/v1alpha1/rebootnodes"] << 403 << {
        "apiVersion": "v1", "kind": "Status", "status": "Failure", "code": 403, "reason": "Forbidden",
        "message": 'rebootnodes.janitor.dgxc.nvidia.com is forbidden: User "system:serviceaccount:slurm-hooks:'
                   'slurm-hooks-bridge" cannot create resource "rebootnodes"'}
    slurm = FakeSlurm(NodeInfo("n1", "IDLE+DRAIN", "slurm-hooks: XID 79 on GPU 0 [reboot]"))
    settings = BridgeSection(mapping="name", state_file="", drain_pass_budget=1,
                              reboot=RebootSection(backend="template", template=site["template"],
                                                    plural="rebootnodes"))
    bridge = Reconciler(slurm, kube_client, settings, audit=AuditLog(str(tmp_path / "audit.jsonl")),
                        sleep=lambda s: None)
    res = bridge.run_pass()
    assert res.taken == ["n1"] and not res.replaced
    assert len(res.errors) == 1 and "missing permission for the reboot-template backend" in res.errors[0][1]
    creates = lambda: [r for r in server.requests("POST") if "rebootnodes" in str(r.url)]  # noqa: E731
    assert len(creates()) == 1  # a 403 is permanent: the client did not retry it either
    for _ in range(2):
        res = bridge.run_pass()
        assert "missing permission" in res.errors[0][1]
    assert len(creates()) == 1
    records = [r for r in AuditLog(str(tmp_path / "audit.jsonl")).read() if r["kind"] == "bridge_permission_missing"]
    assert len(records) == 1 and "cannot create resource" in records[0]["error"]


def test_render_with_lease_namespace_ops_gives_rbac_under_which_the_bridge_leads_and_acts(kube_server, kube_client,
                                                                                          tmp_path):
    """kmock authorizes every request as the bridge's ServiceAccount from the rendered RBAC. Before,
    the Lease's Role was rendered in --namespace: with lease_namespace = "ops" every Lease call was
    a 403 and the bridge never led."""
    from kube.doubles import XID79, controlled_by
    from kube.emulator import pod

    from slurm_hooks.bridge.leader import LeaderElector, LeaseStateStore
    from slurm_hooks.bridge.settings import parse

    text = '[bridge]\nlease_namespace = "ops"\n'
    apply(kube_server, rendered_rbac(text))
    kube_server.kmock.rbac_enforced = True
    kube_server.put("v1/nodes", node("n1"))
    kube_server.put("v1/pods", pod("train-n1", "n1", "jobs", **controlled_by()), "jobs")

    elsewhere = LeaderElector(kube_client, "slurm-hooks", "slurm-hooks-bridge", "x")
    assert not elsewhere.try_acquire_or_renew() and "403" in elsewhere.last_error  # where it used to be granted
    other_name = LeaderElector(kube_client, "ops", "someone-elses-lease", "x")
    assert not other_name.try_acquire_or_renew() and "403" in other_name.last_error  # get: that one Lease only

    elector = LeaderElector(kube_client, "ops", "slurm-hooks-bridge", "a")
    assert elector.try_acquire_or_renew() and elector.try_acquire_or_renew(), elector.last_error
    settings = parse({"lease_namespace": "ops", "state_file": str(tmp_path / "state.json")})
    bridge = Reconciler(FakeSlurm(NodeInfo("n1", "IDLE+DRAIN", XID79)), kube_client, settings,
                        audit=AuditLog(str(tmp_path / "audit.jsonl")), store=LeaseStateStore(elector),
                        leader=elector.check, sleep=lambda s: None)
    res = bridge.run_pass()
    assert res.replaced == ["n1"] and not res.errors, res.summary()
    assert kube_server.get("v1/pods", "train-n1", "jobs") is None
    assert kube_server.list("v1/events", "default")
    assert kube_server.get("coordination.k8s.io/v1/leases", "slurm-hooks-bridge", "ops")["spec"]["holderIdentity"] == "a"
