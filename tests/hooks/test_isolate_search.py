"""The culprit search (slurm_hooks.remedy.culprit) on a simulated fabric: 64 nodes, 1 and 2 bad,
hang / slow / drop, random trials; right in at least 19 of 20, never a healthy node named."""

from __future__ import annotations

import random

import pytest

from slurm_hooks.remedy import culprit
from slurm_hooks.remedy.culprit import Fabric, Outcome, search


def nodes(n: int) -> list[str]:
    return [f"n{k}" for k in range(1, n + 1)]


@pytest.mark.parametrize("mode", culprit.MODES)
@pytest.mark.parametrize("bad", [1, 2])
def test_64_nodes_20_random_trials_find_the_bad_ones_in_at_least_19_and_never_name_a_healthy_node(mode, bad):
    rng = random.Random(f"{mode}-{bad}")
    right, jobs = 0, []
    for trial in range(20):
        fabric = Fabric(nodes(64), culprit.random_faults(nodes(64), bad, rng), seed=trial)
        found = search(fabric.nodes, fabric.run_wave, mode=mode)
        assert set(found.culprits) <= set(fabric.faults), (fabric.faults, found.line())  # never a healthy one
        right += set(found.culprits) == set(fabric.faults)
        assert found.jobs == fabric.jobs and found.waves == fabric.waves
        jobs.append(found.jobs)
    assert right >= 19, right
    assert max(jobs) <= (24 if mode == "bisect" else 40), jobs  # counted: see bench/bench_isolate.py


def test_16_nodes_one_degraded_is_found_in_at_most_10_test_jobs():
    for fault in ("hang", "drop", "slow 8"):
        for bad in nodes(16):
            fabric = Fabric(nodes(16), {bad: fault}, seed=1)
            found = search(fabric.nodes, fabric.run_wave)
            assert list(found.culprits) == [bad], (fault, found.line())
            assert found.jobs <= 10, found.line()


def test_16_nodes_two_degraded_are_both_found_and_nothing_else():
    rng = random.Random(16)
    for trial in range(20):
        fabric = Fabric(nodes(16), culprit.random_faults(nodes(16), 2, rng), seed=trial)
        found = search(fabric.nodes, fabric.run_wave)
        assert set(found.culprits) == set(fabric.faults), (fabric.faults, found.line())


def test_a_healthy_fabric_names_no_culprit_in_one_wave():
    fabric = Fabric(nodes(64), {}, seed=3)
    found = search(fabric.nodes, fabric.run_wave)
    assert found.culprits == {} and found.unconfirmed == {} and found.waves == 1
    assert found.passed == nodes(64)


def test_the_evidence_says_how_far_under_its_peers_the_culprit_was():
    fabric = Fabric(nodes(16), {"n5": "slow 8"}, noise=0.0)
    found = search(fabric.nodes, fabric.run_wave)
    assert found.culprits == {"n5": "bandwidth 12% of peers"}
    hung = Fabric(nodes(16), {"n9": "hang"})
    assert search(hung.nodes, hung.run_wave).culprits == {"n9": "did not complete: time limit reached (a rank hung)"}


def test_a_suspect_that_passes_its_confirmation_is_not_a_culprit():
    """A group fails once (a transient), its members are confirmed against passed nodes and pass."""
    calls = []

    def flaky(groups):
        calls.append(list(groups))
        return [Outcome(len(calls) > 1 or "n1" not in g, 100.0 if len(calls) > 1 or "n1" not in g else None)
                for g in groups]

    found = search(nodes(8), flaky)
    assert found.culprits == {} and set(found.cleared) == {"n1", "n2"}
    assert [t.purpose for t in found.tests if t.wave == 2] == ["confirm", "confirm"]


def test_with_no_node_passing_nothing_is_confirmed_and_nothing_named():
    found = search(nodes(8), lambda groups: [Outcome(False, None, "exit 1") for _ in groups])
    assert found.culprits == {} and set(found.unconfirmed) == set(nodes(8))


def test_the_test_budget_stops_the_search_before_a_wave_it_cannot_afford_and_names_the_suspects():
    fabric = Fabric(nodes(64), {"n40": "hang"})
    found = search(fabric.nodes, fabric.run_wave, max_tests=9)
    assert found.jobs <= 9 and found.culprits == {}
    assert "budget" in found.stopped and "n40" in found.unconfirmed


def test_the_time_budget_is_looked_at_before_each_wave():
    fabric = Fabric(nodes(16), {"n3": "drop"})
    left = iter([10.0, 0.0])
    found = search(fabric.nodes, fabric.run_wave, time_left=lambda: next(left))
    assert found.waves == 1 and found.stopped == "time budget spent" and "n3" in found.unconfirmed


def test_a_bad_mode_and_too_few_nodes_are_said_plainly():
    with pytest.raises(ValueError, match="mode must be one of bisect, pairwise"):
        search(nodes(4), lambda g: [], mode="ring")
    assert "fewer than 2" in search(["n1"], lambda g: []).stopped


def test_groups_are_near_equal_and_never_a_single_node():
    assert culprit.chunks(nodes(7), 3) == [("n1", "n2", "n3"), ("n4", "n5"), ("n6", "n7")]
    assert culprit.first_wave(nodes(5), "bisect") == [("n1", "n2", "n3"), ("n4", "n5")]
    assert [len(g) for g in culprit.first_wave(nodes(64), "bisect")] == [8] * 8
    assert [len(g) for g in culprit.first_wave(nodes(16), "pairwise")] == [2] * 8


def test_under_a_noisy_fabric_no_healthy_node_is_named_in_200_trials():
    """Healthy tests vary by +-30% (a loaded machine's): a marginal confirmation is tested again."""
    rng = random.Random("noisy")
    for trial in range(200):
        fabric = Fabric(nodes(16), culprit.random_faults(nodes(16), rng.choice((1, 2)), rng), noise=0.3, seed=trial)
        found = search(fabric.nodes, fabric.run_wave)
        assert set(found.culprits) <= set(fabric.faults), (fabric.faults, found.line())


def test_a_confirmation_only_just_under_the_bar_is_tested_again_with_another_partner():
    seen = []

    def fabric(groups):
        seen.append(list(groups))
        out = []
        for g in groups:
            if len(seen) == 1:  # screening: n1's group slow
                out.append(Outcome(True, 30.0 if "n1" in g else 100.0))
            else:  # n1 at 45% of peers: marginal the first time, and again
                out.append(Outcome(True, 45.0 if "n1" in g else 100.0))
        return out

    found = search(nodes(8), fabric)
    confirms = [t.nodes for t in found.tests if t.purpose == "confirm" and t.nodes[0] == "n1"]
    assert len(confirms) == 2 and confirms[0][1] != confirms[1][1]
    assert found.culprits == {"n1": "bandwidth 45% of peers"}


def test_a_confirmation_that_did_not_complete_once_is_tried_with_another_partner_and_clears_the_node():
    """n1's group hangs at screening; n1's first confirmation fails too (its partner's job never
    started), its second, with another partner, passes: n1 is not named on one failed job."""
    seen = []

    def fabric(groups):
        seen.append(list(groups))
        out = []
        for g in groups:
            confirm_of_n1 = len(seen) > 1 and g[0] == "n1"
            if len(seen) == 1 and "n1" in g:
                out.append(Outcome(False, None, "time limit reached"))
            elif confirm_of_n1 and len(seen) == 2:
                out.append(Outcome(False, None, "launch failed on the partner"))
            else:
                out.append(Outcome(True, 100.0))
        return out

    found = search(nodes(8), fabric)
    confirms = [t for t in found.tests if t.purpose == "confirm" and t.nodes[0] == "n1"]
    assert [t.passed for t in confirms] == [False, True] and confirms[0].nodes[1] != confirms[1].nodes[1]
    assert found.culprits == {} and "n1" in found.cleared


def test_a_node_whose_tests_never_complete_is_named_after_two_partners():
    hung = Fabric(nodes(16), {"n9": "hang"})
    found = search(hung.nodes, hung.run_wave)
    confirms = [t.nodes for t in found.tests if t.purpose == "confirm" and t.nodes[0] == "n9"]
    assert len(confirms) == 2 and confirms[0][1] != confirms[1][1]
    assert found.culprits == {"n9": "did not complete: time limit reached (a rank hung)"}


@pytest.mark.parametrize("faults", [
    {"n2": "slow 2.5", "n6": "slow 2.5"},  # half the first wave at 40%: the median of all at 70%
    {"n2": "slow 8", "n6": "slow 8", "n10": "slow 8"},  # three groups of four slow: the median of all is slow
], ids=["half-the-groups-mildly-slow", "most-groups-slow"])
def test_slow_groups_do_not_set_the_reference_so_each_slow_node_is_still_found(faults):
    """The peers' reference is the upper half's median: with the median of every test, the slow
    groups would pull the bar under their own bandwidth and pass, and no slow node be named."""
    fabric = Fabric(nodes(16), faults, noise=0.0)
    found = search(fabric.nodes, fabric.run_wave)
    assert set(found.culprits) == set(faults), found.line()
    assert found.reference == 100.0
