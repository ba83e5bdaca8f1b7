"""``slurm-hooks bridge`` and ``slurm-hooks render`` as an admin runs them: real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml
from kube.site import write_bridge_site
from paths import ROOT

from slurm_hooks import config as config_mod
from slurm_hooks.bridge import settings as settings_mod


def run(*args, env=None, timeout=60):
    return subprocess.run([sys.executable, "-m", "slurm_hooks", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT, **(env or {})})


# -- render ----------------------------------------------------------------------------------------

def rendered(tmp_path, *args):
    out = tmp_path / "out"
    proc = run("render", "--out", str(out), *args)
    assert proc.returncode == 0, proc.stderr
    return {name: list(yaml.safe_load_all((out / name).read_text())) for name in os.listdir(out)}


def test_render_writes_least_privilege_rbac(tmp_path):
    docs = rendered(tmp_path)
    sa, role, binding, lease_role, lease_binding, events_role, events_binding = docs["rbac.yaml"]
    assert (sa["kind"], role["kind"], binding["kind"]) == ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")
    # The leader's Lease: a Role in the bridge's namespace only, get/update on that one Lease.
    assert (lease_role["kind"], lease_role["metadata"]["namespace"]) == ("Role", "slurm-hooks")
    assert lease_role["rules"] == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                                    "resourceNames": ["slurm-hooks-bridge"], "verbs": ["get", "update"]},
                                   {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]}]
    assert lease_binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                        "name": lease_role["metadata"]["name"]}
    # Events: in event_namespace ("default"), not cluster-wide.
    assert (events_role["kind"], events_role["metadata"]["namespace"]) == ("Role", "default")
    assert events_role["rules"] == [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
    assert events_binding["subjects"][0]["namespace"] == "slurm-hooks"
    rules = {(r["apiGroups"][0], r["resources"][0]): sorted(r["verbs"]) for r in role["rules"]}
    assert rules == {
        ("", "nodes"): ["get", "list", "patch"],
        ("", "nodes/status"): ["patch"],
        ("", "pods"): ["list"],
        ("", "pods/eviction"): ["create"],
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                                    "namespace": "slurm-hooks"}]


def test_render_adds_only_the_backends_own_rule(tmp_path):
    cfg = tmp_path / "bridge.toml"
    cfg.write_text('[bridge.replace]\nbackend = "karpenter"\n')
    role = rendered(tmp_path, "--config", str(cfg))["rbac.yaml"][1]
    extra = [r for r in role["rules"] if r["apiGroups"] != [""]]
    assert extra == [{"apiGroups": ["karpenter.sh"], "resources": ["nodeclaims"], "verbs": ["get", "list", "delete"]}]


def test_render_deployment_runs_one_bridge_with_the_embedded_config(tmp_path):
    configmap, deployment = rendered(tmp_path, "--namespace", "ops", "--image", "registry/bridge:1")["bridge.yaml"]
    spec = deployment["spec"]
    # Two replicas, one leader (the Lease): a standby takes over within the lease duration.
    assert deployment["kind"] == "StatefulSet"
    assert spec["replicas"] == 2 and spec["updateStrategy"] == {"type": "RollingUpdate"}
    # Its audit log and outbox on a volume of its own that outlives the pod, not an emptyDir.
    (claim,) = spec["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "state" and claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert "state" not in [v["name"] for v in spec["template"]["spec"]["volumes"]]
    # Never both replicas on one node, never on a GPU node (it would drain itself).
    affinity = spec["template"]["spec"]["affinity"]
    (anti,) = affinity["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert anti["topologyKey"] == "kubernetes.io/hostname"
    assert anti["labelSelector"]["matchLabels"] == spec["selector"]["matchLabels"]
    (term,) = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": "nvidia.com/gpu.present", "operator": "NotIn", "values": ["true"]}]
    bridge = [c for c in spec["template"]["spec"]["containers"] if c["name"] == "bridge"][0]
    assert bridge["image"] == "registry/bridge:1"
    assert bridge["command"][:2] == ["slurm-hooks", "bridge"]
    assert spec["template"]["spec"]["serviceAccountName"] == "slurm-hooks-bridge"
    cfg = config_mod.parse(configmap["data"]["config.toml"])
    assert settings_mod.from_config(cfg).mapping == "slinky"
    assert deployment["metadata"]["namespace"] == configmap["metadata"]["namespace"] == "ops"


def test_render_slinky_values_wire_hooks_health_check_and_mounts(tmp_path):
    (values,) = rendered(tmp_path, "--nodeset", "gpu", "--prefix", "/opt/sh")["slinky-values.yaml"]
    prolog = values["prologScripts"]["50-slurm-hooks.sh"]
    assert prolog.startswith("#!/bin/sh") and "exec /opt/sh/bin/slurm-hooks-prolog\n" in prolog
    assert "exec /opt/sh/bin/slurm-hooks-epilog\n" in values["epilogScripts"]["50-slurm-hooks.sh"]
    assert "HealthCheckProgram=/opt/sh/bin/slurm-hooks-healthcheck" in values["controller"]["extraConf"]
    mounts = {m["name"]: m["mountPath"] for m in values["nodesets"]["gpu"]["slurmd"]["volumeMounts"]}
    volumes = {v["name"] for v in values["nodesets"]["gpu"]["podSpec"]["volumes"]}
    assert mounts["slurm-hooks-config"] == "/etc/slurm-hooks" and set(mounts) == volumes
    (secret,) = values["extraObjects"]
    assert secret["kind"] == "Secret"  # the config may hold a webhook URL
    assert set(secret["stringData"]) == {"config.toml"}  # the programs come from `slurm-hooks install` in the image
    config_mod.parse(secret["stringData"]["config.toml"])


def test_render_to_stdout_and_a_bad_config_is_one_line(tmp_path):
    proc = run("render", "--only", "rbac")
    assert proc.returncode == 0 and "kind: ClusterRole" in proc.stdout and "prologScripts" not in proc.stdout
    bad = tmp_path / "bad.toml"
    bad.write_text("[bridge.replace]\nbackend = \"ansible\"\n")
    proc = run("render", "--config", str(bad))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"{bad}:2: [bridge.replace] backend: must be one of" in proc.stderr


# -- bridge ----------------------------------------------------------------------------------------

pytest_plugins = ["kube.fixtures"]


@pytest.fixture
def site(tmp_path, kube_server):
    """n1 drained for XID 79, n2 healthy, each with a job pod; the bridge's config, fake Slurm and kubeconfig."""
    from kube.doubles import controlled_by
    from kube.emulator import node, pod

    for name in ("n1", "n2"):
        kube_server.put("v1/nodes", node(name))
        kube_server.put("v1/pods", pod(f"job-{name}", name, "jobs", **controlled_by()), "jobs")
    nodes = ["NodeName=n1 Arch=x86_64 CoresPerSocket=1 State=IDLE+DRAIN Partitions=gpu "
             "Reason=slurm-hooks: XID 79 on GPU 3 [replace] [root@2025-01-01T00:00:00]",
             "NodeName=n2 Arch=x86_64 CoresPerSocket=1 State=IDLE Partitions=gpu"]
    config = write_bridge_site(tmp_path, kube_server.url, nodes, extra=f'[metrics]\ntextfile_dir = "{tmp_path}/prom"\n',
                               state_file=f"{tmp_path}/bridge-state.json", drain_pass_budget=2)
    return {"config": config, "tmp": tmp_path, "server": kube_server}


@pytest.mark.k8s
def test_bridge_once_remediates_and_exits_0(site):
    proc = run("bridge", "--config", site["config"], "--once", "--no-in-cluster")
    assert proc.returncode == 0, proc.stderr
    assert "taken: n1" in proc.stdout and "replacement requested: n1" in proc.stdout
    assert site["server"].get("v1/nodes", "n1")["spec"]["unschedulable"] is True
    assert site["server"].get("v1/pods", "job-n1", "jobs") is None
    assert "unschedulable" not in site["server"].get("v1/nodes", "n2")["spec"]
    kinds = [json.loads(line)["kind"] for line in (site["tmp"] / "audit.jsonl").read_text().splitlines()]
    assert kinds[:2] == ["bridge_leader", "bridge_cordon"] and kinds[-1] == "bridge_pass"
    assert "slurm_hooks_bridge_breaker_open 0" in (site["tmp"] / "prom" / "slurm_hooks_bridge.prom").read_text()


@pytest.mark.k8s
def test_bridge_once_dry_run_json_changes_nothing(site):
    proc = run("bridge", "--config", site["config"], "--once", "--dry-run", "--json", "--no-in-cluster")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["dry_run"] and result["taken"] == ["n1"] and result["api_calls"] > 0
    assert "unschedulable" not in site["server"].get("v1/nodes", "n1")["spec"]
    assert site["server"].list("coordination.k8s.io/v1/leases") == []  # nor the leader's Lease


@pytest.mark.k8s
def test_bridge_once_with_the_api_server_down_exits_3(site):
    site["server"].close()
    proc = run("bridge", "--config", site["config"], "--once", "--no-in-cluster")
    assert proc.returncode == 3 and "aborted" in proc.stderr and "Traceback" not in proc.stderr


def test_reset_breaker_and_status(tmp_path):
    from slurm_hooks.bridge.state import BreakerState, StateStore

    state_file = tmp_path / "state.json"
    config = tmp_path / "config.toml"
    config.write_text(f'[log]\naudit = "{tmp_path}/audit.jsonl"\n[bridge]\nstate_file = "{state_file}"\nleader_election = false\n')
    import time
    now = time.time()
    StateStore(str(state_file)).save(BreakerState(taken={"n1": now, "n2": now}, tripped_at=now,
                                                  trip_reason="2 node(s) taken", blocked=("n3",)))
    status = json.loads(run("bridge", "--config", str(config), "status").stdout)
    assert status["open"] and status["blocked"] == ["n3"] and status["taken_in_window"] == ["n1", "n2"]
    proc = run("bridge", "--config", str(config), "reset-breaker", "--yes")
    assert proc.returncode == 0 and "circuit breaker reset" in proc.stdout
    status = json.loads(run("bridge", "--config", str(config), "status").stdout)
    assert not status["open"] and status["taken_in_window"] == []
    assert json.loads((tmp_path / "audit.jsonl").read_text().splitlines()[-1])["kind"] == "bridge_breaker_reset"


def test_bridge_without_the_kubernetes_client_is_a_one_line_usage_error(tmp_path):
    import subprocess
    import sys

    cfg = tmp_path / "c.toml"
    cfg.write_text("[bridge]\n")
    script = ("import sys; sys.modules['kubernetes'] = None\n"
              "from slurm_hooks.entry import main\n"
              f"main(['bridge', '--once', '--config', {str(cfg)!r}])\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "slurm-hooks: the bridge needs the kubernetes client, which is not installed here: "
        "pip install 'slurm-hooks[k8s]' (Python 3.10+), in the bridge's own environment"]


def test_render_template_backend_may_get_its_resource_to_tell_its_own(tmp_path):
    tpl = tmp_path / "snr.yaml.j2"
    tpl.write_text("apiVersion: remediation.medik8s.io/v1alpha1\nkind: SelfNodeRemediation\nmetadata: {name: x}\n")
    cfg = tmp_path / "bridge.toml"
    cfg.write_text(f'[bridge.replace]\nbackend = "template"\ntemplate = "{tpl}"\nplural = "selfnoderemediations"\n')
    role = rendered(tmp_path, "--config", str(cfg), "--template-group", "remediation.medik8s.io")["rbac.yaml"][1]
    extra = [r for r in role["rules"] if r["apiGroups"] != [""]]
    assert extra == [{"apiGroups": ["remediation.medik8s.io"], "resources": ["selfnoderemediations"],
                      "verbs": ["create", "get", "delete"]}]


@pytest.mark.k8s
def test_the_bridge_tells_the_replacement_it_asked_for_through_the_notifier(site):
    from fakes.webhook import Receiver

    rx = Receiver()
    try:
        with open(site["config"], "a", encoding="utf-8") as fh:
            fh.write(f'[notify]\n[[notify.webhook]]\nurl = "{rx.url()}"\n')
        os.chmod(site["config"], 0o600)
        proc = run("bridge", "--config", site["config"], "--once", "--no-in-cluster")
        assert proc.returncode == 0, proc.stderr
        [msg] = rx.bodies()
        assert msg["kind"] == "replace" and msg["node"] == "n1" and "asked for a replacement of node n1" in msg["text"]
        # Kept beside the state file: a second run (a restart) tells nothing twice.
        assert os.path.exists(site["tmp"] / "notify" / "delivered.json")
        run("bridge", "--config", site["config"], "--once", "--no-in-cluster")
        assert len(rx.bodies()) == 1
    finally:
        rx.stop()


@pytest.mark.k8s
def test_a_latched_breaker_is_given_to_the_notifier_on_every_pass_while_true(tmp_path, kube_server):
    """The breaker trips once (one audit record), but every pass gives it to the notifier as a
    standing problem, so its alert keeps firing while the latch holds (Alertmanager resolves an
    alert that is not posted again)."""
    from fakes.webhook import Receiver
    from kube.emulator import node

    for name in ("n1", "n2", "n3"):
        kube_server.put("v1/nodes", node(name))
    lines = [f"NodeName={n} State=IDLE+DRAIN Partitions=gpu Reason=slurm-hooks: XID 79 on GPU 3 [replace] "
             "[root@2025-01-01T00:00:00]" for n in ("n1", "n2", "n3")]
    rx = Receiver()
    try:
        config = write_bridge_site(tmp_path, kube_server.url, lines, lease_namespace="ops",
                                   state_file=f"{tmp_path}/bridge-state.json", drain_pass_budget=1,
                                   extra=f'[notify]\n[[notify.webhook]]\nurl = "{rx.url()}"\n')
        os.chmod(config, 0o600)
        standing = tmp_path / "notify" / "standing.json"
        for _ in range(2):
            proc = run("bridge", "--config", config, "--once", "--no-in-cluster")
            assert "CIRCUIT BREAKER OPEN" in proc.stderr, proc.stderr
            told = json.loads(standing.read_text())["true"]
            assert list(told) == ["breaker"] and told["breaker"]["kind"] == "bridge_breaker_tripped"
        kinds = [json.loads(line)["kind"] for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
        assert kinds.count("bridge_breaker_tripped") == 1
    finally:
        rx.stop()
