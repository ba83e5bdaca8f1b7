"""A pass acts only while its leader holds the Lease: two leaders, each with its own client, one kmock.

Leader ``a`` takes ``n1`` and starts draining it; a PodDisruptionBudget holds the eviction.
Then ``a``'s renewals fail (kmock answers its Lease PUTs with 503) and ``b`` takes the Lease
over once it has seen it unrenewed for the lease duration; only then does the PDB let go.
``a`` stops at its renew deadline: were it to go on with its drain rounds it would evict the pod,
set the condition (the request) and save its record after ``b`` led, and this test fails.
"""

from __future__ import annotations

import threading

import pytest
from conftest import wait_for
from fakes.slurm import FakeSlurm
from kube.doubles import XID79, controlled_by

from slurm_hooks.bridge.leader import LeaderElector, LeaseStateStore
from slurm_hooks.bridge.reconciler import Reconciler
from slurm_hooks.bridge.settings import BridgeSection
from slurm_hooks.observe.audit import AuditLog
from slurm_hooks.slurm import NodeInfo

pytestmark = pytest.mark.k8s
pytest_plugins = ["kube.fixtures"]

LEASE_URL = "/apis/coordination.k8s.io/v1/namespaces/ops/leases/slurm-hooks-bridge"
EVICTION_URL = "/api/v1/namespaces/jobs/pods/job-n1/eviction"


def holder(request) -> str:
    data = request.data if isinstance(request.data, dict) else {}
    return str((data.get("spec") or {}).get("holderIdentity") or "")


def is_write(request) -> bool:
    """A write of a pass: anything but a read and the Lease's own calls."""
    return str(request.method.value).upper() not in ("GET",) and "/leases" not in str(request.url)


@pytest.fixture
def two_leaders(kube_server):
    from kube.emulator import node, pod

    from slurm_hooks.bridge.kubeclient import connect

    kube_server.put("v1/nodes", node("n1"))
    kube_server.put("v1/nodes", node("n2"))
    kube_server.put("v1/pods", pod("job-n1", "n1", "jobs", **controlled_by()), "jobs")
    clients, electors = [], []
    for name in ("a", "b"):
        client = connect(url=kube_server.url, timeout=5.0, retries=2, backoff=0.01, backoff_max=0.05)
        elector = LeaderElector(client, "ops", "slurm-hooks-bridge", name, lease_duration=6)
        client.deadline = elector.acting_deadline
        clients.append(client)
        electors.append(elector)
    try:
        yield kube_server, clients, electors
    finally:
        for client in clients:
            client.close()


def test_old_leader_neither_evicts_nor_requests_nor_writes_after_the_lease_moved(two_leaders, tmp_path):
    server, (client_a, _), (a, b) = two_leaders
    blocked, failing = threading.Event(), threading.Event()
    blocked.set()
    server.kmock["post " + EVICTION_URL, lambda: blocked.is_set()] << 429 << pdb_body()
    server.kmock["put " + LEASE_URL, lambda request: failing.is_set() and holder(request) == "a"] \
        << 503 << {"kind": "Status", "code": 503, "message": "etcd leader changed"}

    slurm = FakeSlurm(NodeInfo("n1", "IDLE"), NodeInfo("n2", "IDLE"))
    slurm.drain("n1", XID79)
    settings = BridgeSection(state_file=str(tmp_path / "state.json"), drain_pass_budget=60.0)
    audit = AuditLog(str(tmp_path / "audit.jsonl"))
    assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    bridge = Reconciler(slurm, client_a, settings, audit=audit, store=LeaseStateStore(a), leader=a.check)
    results = []
    thread = threading.Thread(target=lambda: results.append(bridge.run_pass()), name="leader-a", daemon=True)
    thread.start()
    try:
        wait_for(lambda: (server.get("v1/nodes", "n1")["spec"] or {}).get("unschedulable"), 30, "a cordons n1")
        wait_for(lambda: [r for r in server.requests("POST") if str(r.url).endswith("/eviction")], 30,
                 "a tries to evict job-n1 (the PDB says not now)")
        failing.set()  # a's renewals fail from now on
        wait_for(lambda: b.try_acquire_or_renew(), 60, "b takes the Lease over", interval=0.2)
        takeover = next(i for i, r in enumerate(server.requests())
                        if str(r.method.value).upper() == "PUT" and holder(r) == "b")
        blocked.clear()  # the PDB lets go: a leader still acting would evict now
        thread.join(90)
        assert not thread.is_alive(), "a's pass did not end"
    finally:
        blocked.clear()
        thread.join(90)

    (res,) = results
    assert "Lease" in res.aborted and not res.replaced and not res.drained, res.summary()
    late = [f"{r.method.value} {r.url}" for r in server.requests()[takeover:] if is_write(r)]
    assert late == [], f"a wrote after b took over: {late}"
    assert server.get("v1/pods", "job-n1", "jobs") is not None  # never evicted
    assert server.get("coordination.k8s.io/v1/leases", "slurm-hooks-bridge", "ops")["spec"]["holderIdentity"] == "b"
    aborted = [r for r in audit.read() if r["kind"] == "bridge_pass_aborted"]
    assert aborted and aborted[0].get("leadership_lost") is True


def pdb_body() -> dict:
    from kube.emulator import pdb_429

    return pdb_429("jobs/job-n1")


def test_a_real_bridge_process_stops_writing_once_its_lease_moved_mid_pass(kube_server, tmp_path):
    """The same with ``slurm-hooks bridge`` itself (the command's wiring: the guard, the calls bounded
    by the elector's deadline, the serve loop) as the old leader, and an elector in the test as the new one."""
    import os
    import signal
    import subprocess
    import sys

    from kube.emulator import node, pod
    from kube.site import write_bridge_site
    from paths import ROOT

    from slurm_hooks.bridge.kubeclient import connect

    kube_server.put("v1/nodes", node("n1"))
    kube_server.put("v1/nodes", node("n2"))
    kube_server.put("v1/pods", pod("job-n1", "n1", "jobs", **controlled_by()), "jobs")
    blocked, failing, old = threading.Event(), threading.Event(), {"identity": ""}
    blocked.set()
    kube_server.kmock["post " + EVICTION_URL, lambda: blocked.is_set()] << 429 << pdb_body()
    kube_server.kmock["put " + LEASE_URL, lambda request: failing.is_set() and holder(request) == old["identity"]] \
        << 503 << {"kind": "Status", "code": 503, "message": "etcd leader changed"}
    config = write_bridge_site(tmp_path, kube_server.url, [
        "NodeName=n1 State=IDLE+DRAIN Partitions=gpu Reason=slurm-hooks: XID 79 on GPU 3 [replace] "
        "[root@2025-01-01T00:00:00]", "NodeName=n2 State=IDLE Partitions=gpu"],
        interval=0.5, lease_namespace="ops", lease_duration=6, drain_pass_budget=60,
        state_file=f"{tmp_path}/state.json")
    log = open(tmp_path / "a.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "slurm_hooks", "bridge", "--config", config, "--no-in-cluster"],
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT}, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    client = connect(url=kube_server.url, timeout=5.0, retries=2, backoff=0.01, backoff_max=0.05)
    try:
        lease = "coordination.k8s.io/v1/leases"
        old["identity"] = wait_for(lambda: ((kube_server.get(lease, "slurm-hooks-bridge", "ops") or {}).get("spec")
                                            or {}).get("holderIdentity"), 30, "the bridge leads")
        wait_for(lambda: [r for r in kube_server.requests("POST") if str(r.url).endswith("/eviction")], 30,
                 "it tries to evict job-n1 (the PDB says not now)")
        new = LeaderElector(client, "ops", "slurm-hooks-bridge", "new", lease_duration=6)
        assert not new.try_acquire_or_renew()
        failing.set()
        wait_for(lambda: new.try_acquire_or_renew(), 60, "the new leader takes the Lease over", interval=0.2)
        takeover = next(i for i, r in enumerate(kube_server.requests())
                        if str(r.method.value).upper() == "PUT" and holder(r) == "new")
        blocked.clear()

        def standby_tries() -> int:  # the old process reading the Lease after the takeover (the test does not)
            return sum(1 for r in kube_server.requests()[takeover:]
                       if str(r.method.value).upper() == "GET" and str(r.url.path) == LEASE_URL)

        wait_for(lambda: standby_tries() >= 3, 60, "the old leader tries the Lease again, as a standby")
        assert new.try_acquire_or_renew()  # still the new leader's
        late = [f"{r.method.value} {r.url}" for r in kube_server.requests()[takeover:] if is_write(r)]
        assert late == [], f"the old leader wrote after the takeover: {late}"
        assert kube_server.get("v1/pods", "job-n1", "jobs") is not None
        assert "lost the leader's Lease" in (tmp_path / "a.log").read_text()
    finally:
        blocked.clear()
        client.close()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        log.close()
