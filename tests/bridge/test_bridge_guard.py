"""The leader guard: a pass whose Lease moved to another bridge sends no write through its KubeApi.

Leader ``a`` takes ``n1`` and starts draining it; a PodDisruptionBudget holds the eviction, so the
drain goes on in ``a``'s next pass. Between the two passes ``b`` takes the Lease over (``a`` went
unrenewed for the lease duration) and the PDB lets go. In that next pass the first write ``a``
would send is the eviction, and nothing in the reconciler asks for the Lease before it:
:class:`~slurm_hooks.bridge.guard.LeaderGuard` is what refuses it. The client here has no renew
deadline of its own (``KubeClient.deadline`` unset), so the guard is the only fence under test.
"""

from __future__ import annotations

import pytest
from fakes.slurm import FakeSlurm
from kube.doubles import XID79, Clock, controlled_by

from slurm_hooks.bridge.leader import LeaderElector
from slurm_hooks.bridge.reconciler import Reconciler
from slurm_hooks.bridge.settings import BridgeSection
from slurm_hooks.observe.audit import AuditLog
from slurm_hooks.slurm import NodeInfo

pytestmark = pytest.mark.k8s
pytest_plugins = ["kube.fixtures"]

EVICTION_URL = "/api/v1/namespaces/jobs/pods/job-n1/eviction"
LEASE_DURATION = 15.0


def is_write(request) -> bool:
    """A write of a pass: anything but a read and the Lease's own calls."""
    return str(request.method.value).upper() != "GET" and "/leases" not in str(request.url)


def test_a_pass_after_the_lease_moved_is_stopped_by_the_guard_before_its_eviction(kube_server, tmp_path):
    from kube.emulator import node, pdb_429, pod

    from slurm_hooks.bridge.kubeclient import connect

    kube_server.put("v1/nodes", node("n1"))
    kube_server.put("v1/pods", pod("job-n1", "n1", "jobs", **controlled_by()), "jobs")
    pdb_holds = [True]
    kube_server.kmock["post " + EVICTION_URL, lambda: pdb_holds[0]] << 429 << pdb_429("jobs/job-n1")
    clock = Clock()
    clients = [connect(url=kube_server.url, timeout=5.0, retries=1, backoff=0.01, backoff_max=0.05)
               for _ in range(2)]
    try:
        a, b = (LeaderElector(c, "ops", "slurm-hooks-bridge", name, lease_duration=LEASE_DURATION, clock=clock,
                              monotonic=clock) for c, name in zip(clients, "ab"))
        assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
        slurm = FakeSlurm(NodeInfo("n1", "IDLE"))
        slurm.drain("n1", XID79)
        settings = BridgeSection(state_file=str(tmp_path / "state.json"), drain_pass_budget=0.0)
        audit = AuditLog(str(tmp_path / "audit.jsonl"))
        bridge = Reconciler(slurm, clients[0], settings, audit=audit, leader=a.check)

        first = bridge.run_pass()
        assert first.taken == ["n1"] and first.pending == ["n1"], first.summary()
        assert kube_server.get("v1/nodes", "n1")["spec"].get("unschedulable") is True

        clock.advance(LEASE_DURATION + 1)  # a did not renew for a whole lease duration: b may take over
        assert b.try_acquire_or_renew() and b.holder == "b"
        pdb_holds[0] = False  # a leader still acting would evict now
        since = len(kube_server.requests())

        res = bridge.run_pass()
    finally:
        for client in clients:
            client.close()

    late = [f"{r.method.value} {r.url}" for r in kube_server.requests()[since:] if is_write(r)]
    assert late == [], f"a wrote after b took over: {late}"
    assert kube_server.get("v1/pods", "job-n1", "jobs") is not None  # never evicted
    assert "Lease" in res.aborted and "evicting pod jobs/job-n1" in res.aborted, res.summary()
    aborted = [r for r in audit.read() if r["kind"] == "bridge_pass_aborted"]
    assert [r.get("leadership_lost") for r in aborted] == [True]
