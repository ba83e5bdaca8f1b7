"""One leader: the Lease loop over the bridge's own client, and the breaker's state in the Lease.

The election's rules against the in-memory API (a clock that moves when told), then two real
``slurm-hooks bridge`` processes against one kmock over HTTP: one acts, the other stands by and
takes over within the lease duration when the first dies, and the breaker's cap holds across both.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import wait_for
from kube.doubles import Clock
from kube.memory import InMemoryKube
from kube.site import write_bridge_site
from paths import ROOT

from slurm_hooks.bridge.api import KubeTransient
from slurm_hooks.bridge.leader import BREAKER_ANNOTATION, LeaderElector, LeaseStateStore
from slurm_hooks.bridge.state import BreakerState

pytest_plugins = ["kube.fixtures"]


def elector(kube, name: str, clock: Clock, duration: float = 15.0) -> LeaderElector:
    return LeaderElector(kube, "ops", "slurm-hooks-bridge", name, lease_duration=duration, clock=clock,
                         monotonic=clock)


def test_first_candidate_creates_the_lease_and_the_second_stands_by():
    kube, clock = InMemoryKube(), Clock()
    a, b = elector(kube, "a", clock), elector(kube, "b", clock)
    assert a.try_acquire_or_renew() and a.is_leader()
    assert not b.try_acquire_or_renew() and not b.is_leader() and b.holder == "a"
    lease = kube.leases[("ops", "slurm-hooks-bridge")]
    assert lease["spec"]["holderIdentity"] == "a" and lease["spec"]["leaseDurationSeconds"] == 15


def test_standby_takes_over_only_after_the_lease_went_unrenewed_for_its_duration():
    kube, clock = InMemoryKube(), Clock()
    a, b = elector(kube, "a", clock), elector(kube, "b", clock)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    clock.advance(10)
    assert a.try_acquire_or_renew()  # a renews: b's observation starts again
    clock.advance(10)
    assert not b.try_acquire_or_renew()
    clock.advance(14.9)  # a is gone (no renewal); not yet a whole lease duration since b saw a change
    assert not a.is_leader()  # a's own view: past its renew deadline, it stopped acting long ago
    assert not b.try_acquire_or_renew()
    clock.advance(0.2)
    assert b.try_acquire_or_renew() and b.holder == "b"
    assert kube.leases[("ops", "slurm-hooks-bridge")]["spec"]["leaseTransitions"] == 1
    assert not a.try_acquire_or_renew()  # a is back: b holds it now


def test_two_candidates_racing_for_an_expired_lease_one_wins():
    kube, clock = InMemoryKube(), Clock()
    a, b, c = elector(kube, "a", clock), elector(kube, "b", clock), elector(kube, "c", clock)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew() and not c.try_acquire_or_renew()
    clock.advance(16)
    stale = kube.get_lease("ops", "slurm-hooks-bridge")
    assert b.try_acquire_or_renew()
    # c read the same version before b's write landed: its PUT is refused (409), it does not lead.
    kube.get_lease = lambda ns, name: stale  # type: ignore[method-assign]
    assert not c.try_acquire_or_renew() and not c.is_leader()


def test_leader_stops_acting_at_its_renew_deadline_when_the_api_server_is_gone():
    kube, clock = InMemoryKube(), Clock()
    a = elector(kube, "a", clock)
    assert a.try_acquire_or_renew()
    kube.fail("get_lease", *[KubeTransient("HTTP 503", 503)] * 5)
    clock.advance(5)
    assert a.try_acquire_or_renew()  # still inside its renew deadline (10 s of 15)
    clock.advance(5.1)
    assert not a.try_acquire_or_renew() and not a.is_leader()


def test_a_long_pass_renews_when_it_asks_whether_it_still_leads():
    kube, clock = InMemoryKube(), Clock()
    a = elector(kube, "a", clock)
    assert a.try_acquire_or_renew()
    writes = kube.calls["replace_lease"]
    clock.advance(1)
    assert a.check() and kube.calls["replace_lease"] == writes  # fresh: no call
    for _ in range(10):  # 60 s of a pass, asking before each take: still the leader, renewed on the way
        clock.advance(6)
        assert a.check()
    assert kube.calls["replace_lease"] > writes and a.is_leader()


def test_release_lets_the_standby_take_over_at_once():
    kube, clock = InMemoryKube(), Clock()
    a, b = elector(kube, "a", clock), elector(kube, "b", clock)
    assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    a.release()
    assert not a.is_leader() and b.try_acquire_or_renew()


def test_the_breakers_state_lives_in_the_lease_and_follows_the_leader():
    kube, clock = InMemoryKube(), Clock()
    a, b = elector(kube, "a", clock), elector(kube, "b", clock)
    assert a.try_acquire_or_renew()
    LeaseStateStore(a).save(BreakerState(taken={"n1": clock.now}, tripped_at=clock.now, trip_reason="cap 1"))
    assert json.loads(kube.leases[("ops", "slurm-hooks-bridge")]["metadata"]["annotations"][BREAKER_ANNOTATION])[
        "tripped_at"] == clock.now
    a.release()
    assert b.try_acquire_or_renew()
    state = LeaseStateStore(b).load()
    assert state.tripped_at == clock.now and state.taken == {"n1": clock.now}
    with pytest.raises(Exception, match="not the leader"):
        LeaseStateStore(a).save(BreakerState())


# -- two real bridge processes against one kmock --------------------------------------------------------

NAMES = [f"n{i:02d}" for i in range(1, 13)]


@pytest.fixture
def fleet(tmp_path, kube_server):
    """12 Kubernetes nodes, 10 of them drained for XID 79 in a fake scontrol; config for the bridge."""
    from kube.emulator import node

    for name in NAMES:
        kube_server.put("v1/nodes", node(name))
    lines = []
    for i, name in enumerate(NAMES):
        if i < 10:
            lines.append(f"NodeName={name} State=IDLE+DRAIN Partitions=gpu "
                         "Reason=slurm-hooks: XID 79 on GPU 3 [replace] [root@2025-01-01T00:00:00]")
        else:
            lines.append(f"NodeName={name} State=IDLE Partitions=gpu")
    config = write_bridge_site(tmp_path, kube_server.url, lines, interval=0.5, lease_namespace="ops",
                               lease_duration=3, drain_pass_budget=1)
    return {"config": config, "server": kube_server, "tmp": tmp_path}


def start(fleet, name: str) -> subprocess.Popen:
    log = open(fleet["tmp"] / f"{name}.log", "w")
    return subprocess.Popen([sys.executable, "-m", "slurm_hooks", "bridge", "--config", fleet["config"],
                             "--no-in-cluster"], cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT},
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def admin(fleet, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "slurm_hooks", "bridge", "--config", fleet["config"], *args],
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True, text=True,
                          timeout=60)


def lease(server) -> dict | None:
    return server.get("coordination.k8s.io/v1/leases", "slurm-hooks-bridge", "ops")


def cordoned(server) -> list[str]:
    return [n for n in NAMES if (server.get("v1/nodes", n)["spec"] or {}).get("unschedulable")]


@pytest.mark.k8s
def test_two_bridges_one_leader_takeover_within_the_lease_and_one_breaker(fleet):
    server = fleet["server"]
    a = start(fleet, "a")
    b = None
    try:
        holder_a = wait_for(lambda: (lease(server) or {}).get("spec", {}).get("holderIdentity"), 30, "a leads")
        wait_for(lambda: len(cordoned(server)) == 2, 30, "a cordons the cap's two nodes")
        b = start(fleet, "b")
        wait_for(lambda: "standing by" in (fleet["tmp"] / "b.log").read_text(), 30, "b stands by")
        time.sleep(2)  # several of a's passes and b's tries: still one leader, still two nodes
        assert lease(server)["spec"]["holderIdentity"] == holder_a and len(cordoned(server)) == 2
        breaker = json.loads(lease(server)["metadata"]["annotations"][BREAKER_ANNOTATION])
        assert breaker["tripped_at"] and len(breaker["taken"]) == 2

        os.killpg(a.pid, signal.SIGKILL)  # no release: b must wait out the lease
        a.wait(10)
        killed = time.monotonic()
        holder_b = wait_for(lambda: (lease(server)["spec"]["holderIdentity"] not in (holder_a, "")
                                     and lease(server)["spec"]["holderIdentity"]), 30, "b takes over")
        took = time.monotonic() - killed
        assert took <= 3 + 3, f"took over after {took:.1f} s with a 3 s lease (not the 60 s default)"
        wait_for(lambda: "leading" in (fleet["tmp"] / "b.log").read_text(), 10, "b says it leads")
        time.sleep(1.5)  # b's passes: the breaker it read from the Lease is still open
        assert len(cordoned(server)) == 2 and lease(server)["spec"]["holderIdentity"] == holder_b
        assert lease(server)["spec"]["leaseTransitions"] >= 1

        b.send_signal(signal.SIGTERM)  # a clean stop releases the Lease
        b.wait(15)
        assert lease(server)["spec"]["holderIdentity"] == ""
        b = None

        # An admin reads and resets the breaker where it lives: the Lease.
        status = json.loads(admin(fleet, "status").stdout)
        assert status["open"] and status["state_file"] == "lease ops/slurm-hooks-bridge" and status["leader"] == ""
        assert len(status["taken_in_window"]) == 2
        assert admin(fleet, "reset-breaker", "--yes").returncode == 0
        assert not json.loads(admin(fleet, "status").stdout)["open"]
        assert json.loads(lease(server)["metadata"]["annotations"][BREAKER_ANNOTATION])["reset_at"]
    finally:
        for proc in (a, b):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
