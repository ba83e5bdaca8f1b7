"""``reset-breaker`` wins over a pass in flight: the pass's save is a compare-and-swap, not a write-back.

The breaker trips in the middle of a pass (3 bad nodes, a cap of 1); an admin resets it before
the pass ends (from the notifier hook: the moment the trip is told). The reset stands: a leader
that wrote back the state it loaded at the start plus its trip would undo it, and this test fails.
"""

from __future__ import annotations

import json
import time

import pytest
from fakes.slurm import FakeSlurm
from kube.doubles import XID79, Clock
from kube.memory import InMemoryKube

from slurm_hooks.bridge.breaker import CircuitBreaker
from slurm_hooks.bridge.leader import BREAKER_ANNOTATION, LeaderElector, LeaseAdminStore, LeaseStateStore
from slurm_hooks.bridge.reconciler import Reconciler
from slurm_hooks.bridge.settings import BreakerSection, BridgeSection
from slurm_hooks.bridge.state import BreakerState, StateStore, rebase
from slurm_hooks.slurm import NodeInfo

pytest_plugins = ["kube.fixtures"]

BREAKER = BreakerSection(max_percent=100, max_nodes=1, window=3600)


def bad_fleet() -> FakeSlurm:
    slurm = FakeSlurm(*(NodeInfo(f"n{i}", "IDLE") for i in range(1, 4)))
    for i in range(1, 4):
        slurm.drain(f"n{i}", XID79)
    return slurm


def admin_reset(store) -> None:
    """What ``slurm-hooks bridge reset-breaker --yes`` does with the store."""
    state = store.load()
    CircuitBreaker(BREAKER, state).reset(time.time())
    store.save(state)


@pytest.mark.k8s
def test_reset_during_a_pass_over_http_is_not_undone_by_the_leaders_save(kube_server, tmp_path):
    from kube.emulator import node

    from slurm_hooks.bridge.kubeclient import connect

    for i in range(1, 4):
        kube_server.put("v1/nodes", node(f"n{i}"))
    leader_client = connect(url=kube_server.url, timeout=5.0, retries=2, backoff=0.01, backoff_max=0.05)
    admin_client = connect(url=kube_server.url, timeout=5.0, retries=2, backoff=0.01, backoff_max=0.05)
    try:
        elector = LeaderElector(leader_client, "ops", "slurm-hooks-bridge", "a", lease_duration=60)
        assert elector.try_acquire_or_renew()
        admin = LeaseAdminStore(admin_client, "ops", "slurm-hooks-bridge")

        def told(kind, fields):
            if kind == "bridge_breaker_tripped":
                admin_reset(admin)

        settings = BridgeSection(state_file=str(tmp_path / "unused.json"), breaker=BREAKER, drain=False)
        bridge = Reconciler(bad_fleet(), leader_client, settings, store=LeaseStateStore(elector),
                            leader=elector.check, notify=told)
        res = bridge.run_pass()
        assert res.taken == ["n1"] and res.blocked, res.summary()
        lease = kube_server.get("coordination.k8s.io/v1/leases", "slurm-hooks-bridge", "ops")
        assert lease["spec"]["holderIdentity"] == "a"
        state = BreakerState.from_dict(json.loads(lease["metadata"]["annotations"][BREAKER_ANNOTATION]))
        assert state.reset_at is not None and state.tripped_at is None and state.taken == {}, state
    finally:
        leader_client.close()
        admin_client.close()


def test_reset_during_a_pass_with_a_state_file_is_not_undone(tmp_path):
    kube, clock = InMemoryKube(), Clock(start=time.time() - 5)  # the pass started before the reset
    for i in range(1, 4):
        kube.add_node(f"n{i}")
    path = str(tmp_path / "state.json")

    def told(kind, fields):
        if kind == "bridge_breaker_tripped":
            admin_reset(StateStore(path))

    settings = BridgeSection(state_file=path, breaker=BREAKER, drain=False)
    bridge = Reconciler(bad_fleet(), kube, settings, clock=clock, monotonic=clock, sleep=clock.sleep, notify=told)
    res = bridge.run_pass()
    assert res.taken == ["n1"] and res.blocked
    state = StateStore(path).load()
    assert state.reset_at is not None and state.tripped_at is None and state.taken == {}, state


def test_rebase_keeps_what_the_pass_did_after_the_reset_and_the_admins_reset_either_way():
    base = BreakerState(taken={"old": 10.0})
    pass_state = BreakerState(taken={"old": 10.0, "early": 20.0, "late": 40.0}, tripped_at=40.0, trip_reason="cap")
    reset = BreakerState(reset_at=30.0)
    merged = rebase(pass_state, base, reset)
    assert merged.taken == {"late": 40.0} and merged.tripped_at == 40.0 and merged.reset_at == 30.0
    # the admin's save finding the pass's write: the same answer
    assert rebase(reset, base, pass_state).to_dict() == merged.to_dict()
