"""The circuit breaker on its own: cap, trip, latch, window, reset, restart."""

from __future__ import annotations

import sys

import pytest

from slurm_hooks.bridge.breaker import CircuitBreaker
from slurm_hooks.bridge.settings import BreakerSection
from slurm_hooks.bridge.state import BreakerState, StateStore
from slurm_hooks.observe.audit import AuditLog

T0 = 1_700_000_000.0


def breaker(percent=20.0, nodes=10, window=600.0, state=None):
    return CircuitBreaker(BreakerSection(percent, nodes, window), state or BreakerState())


def test_cap_is_the_smaller_of_percent_and_count_and_never_zero():
    b = breaker(percent=20, nodes=10)
    assert b.limit(12) == 2
    assert b.limit(1000) == 10
    assert b.limit(3) == 1
    assert b.limit(0) == 1


def test_first_node_over_the_cap_trips_it_loudly_once():
    b = breaker()
    decisions = [b.admit(f"n{i}", 12, T0) for i in range(5)]
    assert [d.admitted for d in decisions] == [True, True, False, False, False]
    assert [d.tripped for d in decisions] == [False, False, True, False, False]
    assert "2 node(s) taken in 600 s, cap 2" in decisions[2].reason
    assert b.is_open(T0 + 599) and not b.is_open(T0 + 600)


def test_a_node_already_taken_in_the_window_is_admitted_again():
    b = breaker()
    b.admit("n1", 12, T0)
    b.admit("n2", 12, T0)
    assert b.admit("n1", 12, T0 + 1).admitted


def test_window_slides():
    b = breaker(window=100)
    b.admit("n1", 12, T0)
    b.admit("n2", 12, T0 + 50)
    b.expire(T0 + 101)
    assert b.admit("n3", 12, T0 + 101).admitted
    assert set(b.state.taken) == {"n2", "n3"}


def test_open_breaker_closes_when_the_window_passes():
    b = breaker(window=100)
    for i in range(3):
        b.admit(f"n{i}", 12, T0)
    assert b.is_open(T0 + 10)
    assert b.expire(T0 + 100) and not b.is_open(T0 + 100)
    assert b.state.tripped_at is None and b.admit("n9", 12, T0 + 100).admitted


def test_annotations_count_when_the_state_was_lost():
    b = breaker()
    owned = {"n1": T0 - 10, "n2": T0 - 5, "old": T0 - 10_000}
    assert not b.admit("n3", 12, T0, owned).admitted
    assert sorted(b.in_window(T0, owned)) == ["n1", "n2"]


def test_reset_forgets_the_window_including_what_the_annotations_say():
    b = breaker()
    owned = {"n1": T0, "n2": T0}
    b.admit("n3", 12, T0, owned)
    assert b.is_open(T0)
    b.reset(T0 + 1)
    assert not b.is_open(T0 + 1)
    assert b.admit("n3", 12, T0 + 2, owned).admitted


def test_state_round_trips_through_the_file(tmp_path):
    store = StateStore(str(tmp_path / "s.json"))
    b = breaker(state=store.load())
    for i in range(3):
        b.admit(f"n{i}", 12, T0)
    b.state.blocked = ("n2",)
    store.save(b.state)
    again = breaker(state=store.load())
    assert again.is_open(T0 + 1) and again.state.blocked == ("n2",)
    assert again.state.taken == {"n0": T0, "n1": T0}
    assert oct((tmp_path / "s.json").stat().st_mode & 0o777) == "0o640"


def test_corrupt_or_missing_state_file_starts_empty(tmp_path):
    path = tmp_path / "s.json"
    assert StateStore(str(path)).load() == BreakerState()
    path.write_text("{not json")
    assert StateStore(str(path)).load() == BreakerState()
    assert StateStore("").load() == BreakerState()


@pytest.mark.skipif(sys.version_info < (3, 10), reason="the bridge needs Python 3.10+")
def test_breaker_bounds_the_nodes_held_not_only_the_rate(tmp_path):
    from fakes.slurm import FakeSlurm as BridgeSlurm
    from kube.doubles import Clock
    from kube.memory import InMemoryKube

    from slurm_hooks.bridge.api import OWNER_SELECTOR
    from slurm_hooks.bridge.reconciler import Reconciler
    from slurm_hooks.bridge.settings import BridgeSection

    clock = Clock()
    kube = InMemoryKube()
    slurm = BridgeSlurm()
    for i in range(50):
        name = f"gpu{i:03d}"
        kube.add_node(name)
        slurm.add_node(name, "IDLE+DRAIN", "slurm-hooks: 8 of 9 GPUs visible [reboot]")  # one typo in [expect] gpus
    settings = BridgeSection(state_file=str(tmp_path / "bridge-state.json"), drain_pass_budget=1.0)
    bridge = Reconciler(slurm, kube, settings, audit=AuditLog(str(tmp_path / "audit.jsonl")), clock=clock,
                        monotonic=clock, sleep=clock.sleep)
    limit = bridge.run_pass().breaker_limit
    for _ in range(8):  # eighty minutes of a controller nobody is watching
        clock.advance(settings.breaker.window + 1)
        bridge.run_pass()
    held = kube.list_nodes(OWNER_SELECTOR)
    assert len(held) <= limit, f"{len(held)} of 50 nodes cordoned and drained (cap per window {limit})"
