"""The culprit search (slurm_hooks.remedy.culprit) on a simulated fabric: random and chosen faults,
bad partners, queued tests, dips; every bad node named or the run inconclusive, never a healthy one."""

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


def test_a_healthy_fabric_names_no_culprit_and_ends_ok_after_one_more_test_of_the_rank_0_nodes():
    fabric = Fabric(nodes(64), {}, seed=3)
    found = search(fabric.nodes, fabric.run_wave, floor=50.0)
    assert found.culprits == {} and found.unconfirmed == {} and found.verdict == "ok"
    assert found.passed == nodes(64)
    [rotate] = [t for t in found.tests if t.purpose == "rotate"]
    assert found.waves == 2 and rotate.nodes[1:] == tuple(f"n{k}" for k in range(1, 64, 8))


def test_the_evidence_says_how_far_under_its_peers_the_culprit_was_and_with_which_partners():
    fabric = Fabric(nodes(16), {"n5": "slow 8"}, noise=0.0)
    found = search(fabric.nodes, fabric.run_wave)
    why = found.culprits["n5"]
    assert why.startswith("bandwidth 12% of peers; failed with ") and len(why.split("with ")[1].split(", ")) == 3
    floored = search(fabric.nodes, Fabric(nodes(16), {"n5": "slow 8"}, noise=0.0).run_wave, floor=50.0)
    assert floored.culprits["n5"].startswith("bandwidth 12% of peers, busbw 12.5 < floor 50; failed with ")
    hung = Fabric(nodes(16), {"n9": "hang"})
    assert search(hung.nodes, hung.run_wave).culprits["n9"].startswith(
        "did not complete: time limit reached (a rank hung); failed with ")


def test_a_culprit_is_named_only_after_failing_with_three_different_partners_that_passed():
    hung = Fabric(nodes(16), {"n9": "hang"})
    found = search(hung.nodes, hung.run_wave, floor=50.0)
    confirms = [t for t in found.tests if t.purpose == "confirm" and t.nodes[-1] == "n9"]
    partners = [t.nodes[0] for t in confirms]
    assert len(confirms) == 3 and len(set(partners)) == 3 and not any(t.passed for t in confirms)
    passed_before = {n for t in found.tests if t.passed and t.wave < min(c.wave for c in confirms) for n in t.nodes}
    assert set(partners) <= passed_before | set(found.cleared)
    assert list(found.culprits) == ["n9"] and found.verdict == "found" and found.jobs <= 10


def test_two_failures_with_two_partners_and_nothing_more_name_no_one():
    """A healthy suspect's confirmation fails twice (two partners' jobs died), then passes: it is not
    named, and it is cleared only after ``repeats`` passes."""
    def fabric(groups):
        out = []
        for g in groups:
            confirm_of_n2 = g[-1] == "n2" and g[0] not in ("n1", "n3", "n4")
            tries = sum(1 for t in seen if t[-1] == "n2" and t[0] not in ("n1", "n3", "n4"))
            seen.append(g)
            if "n1" in g and len(g) == 4:
                out.append(Outcome(False, None, "time limit reached"))
            elif confirm_of_n2 and tries < 2:
                out.append(Outcome(False, None, "the partner's rank died"))
            else:
                out.append(Outcome(True, 100.0))
        return out

    seen: list = []
    found = search(nodes(16), fabric, floor=50.0, repeats=2)
    n2 = [t for t in found.tests if t.purpose == "confirm" and t.nodes[-1] == "n2"]
    assert [t.passed for t in n2] == [False, False, True, True]
    assert "n2" not in found.culprits and found.cleared["n2"].startswith("passed with ")
    assert "failed with" in found.cleared["n2"]


def test_slow_nodes_in_every_screen_are_found_against_the_floor_and_none_is_a_partner():
    """Four slow nodes, one in each group of the first wave: the peers' median is slow, so only the
    floor fails them; no slow node serves as anyone's partner."""
    faults = {"n1": "slow 6", "n6": "slow 6", "n11": "slow 6", "n16": "slow 6"}
    fabric = Fabric(nodes(16), faults, noise=0.0)
    found = search(fabric.nodes, fabric.run_wave, floor=50.0)
    assert set(found.culprits) == set(faults), found.line()
    assert not {t.nodes[0] for t in found.tests if t.purpose == "confirm"} & set(faults)
    relative = search(nodes(16), Fabric(nodes(16), faults, noise=0.0).run_wave)
    assert not set(relative.culprits) - set(faults)  # without a floor: nothing found, nothing healthy named


def test_a_failed_screen_that_no_pair_reproduces_ends_inconclusive_and_says_what_it_saw():
    calls = []

    def once(groups):
        calls.append(groups)
        return [Outcome(True, 21.0 if len(calls) == 1 and "n1" in g else 100.0) for g in groups]

    found = search(nodes(16), once, floor=50.0)
    assert found.culprits == {} and set(found.cleared) == {"n1", "n2", "n3", "n4"}
    assert found.verdict == "inconclusive"
    assert found.unexplained == ["n1,n2,n3,n4 (screen, wave 1): bandwidth 21% of peers, busbw 21 < floor 50"]
    assert "failed, no culprit found: n1,n2,n3,n4 (screen, wave 1)" in found.line()


def test_a_test_that_could_not_run_is_retried_and_neither_passes_nor_fails_its_nodes():
    def broken(groups):
        return [Outcome(True, None, "ranks=2, expected 8", ran=False) if "n1" in g else Outcome(True, 100.0)
                for g in groups]

    found = search(nodes(16), broken, floor=50.0)
    assert found.culprits == {} and found.verdict == "inconclusive"
    assert [t.purpose for t in found.tests if "n1" in t.nodes] == ["screen", "retry"]
    assert found.unconfirmed["n1"] == "not tested: could not run: ranks=2, expected 8"
    assert "n1" not in found.passed
    completed_without_figure = search(nodes(4), lambda gs: [Outcome(True, None) for _ in gs], floor=50.0)
    assert completed_without_figure.passed == [] and completed_without_figure.verdict == "inconclusive"


def test_a_node_slow_only_when_not_rank_0_is_found_when_it_leads_every_screen_group():
    fabric = Fabric(nodes(16), {"n5": "slow-peer 8"}, noise=0.0)
    found = search(fabric.nodes, fabric.run_wave, floor=50.0)
    assert list(found.culprits) == ["n5"] and found.jobs <= 11, found.line()


def test_tests_queued_behind_hung_ones_name_no_healthy_node_when_timed_from_their_start():
    """Three hung nodes, partners reused: pair tests that share a partner queue behind the hung
    ones. Timed from their start (as isolate times them), none is cut short; timed from
    submission, queued tests of healthy suspects are cancelled unfinished and name them."""
    def healthy_named(timeout_from: str) -> int:
        rng = random.Random("queued")
        named = 0
        for trial in range(100):
            fabric = Fabric(nodes(16), culprit.random_faults(nodes(16), 3, rng, ("hang",)), seed=trial,
                            timeout_from=timeout_from)
            found = search(fabric.nodes, fabric.run_wave, floor=50.0)
            assert set(fabric.faults) <= set(found.culprits) or found.verdict == "inconclusive"
            named += bool(set(found.culprits) - set(fabric.faults))
        return named

    assert healthy_named("start") == 0
    assert healthy_named("submit") > 0


def test_2_percent_of_tests_dipping_to_a_quarter_never_drains_a_healthy_node():
    rng = random.Random("dips")
    for trial in range(300):
        fabric = Fabric(nodes(16), culprit.random_faults(nodes(16), 1, rng), seed=trial, transient=0.02)
        found = search(fabric.nodes, fabric.run_wave, floor=50.0)
        assert set(found.culprits) == set(fabric.faults), (fabric.faults, found.line())


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
    assert found.verdict == "inconclusive" and found.unexplained[0].startswith("n1,n2 (screen, wave 1): did not")


def test_with_no_node_passing_nothing_is_confirmed_and_nothing_named():
    found = search(nodes(8), lambda groups: [Outcome(False, None, "exit 1") for _ in groups])
    assert found.culprits == {} and set(found.unconfirmed) == set(nodes(8)) and found.verdict == "inconclusive"


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


def test_a_run_started_by_failed_jobs_whose_tests_all_pass_is_inconclusive_and_says_it_did_not_reproduce():
    fabric = Fabric(nodes(16), {}, seed=4)
    found = search(fabric.nodes, fabric.run_wave, floor=50.0, started_by="jobs 101, 102 failed on n4")
    assert found.culprits == {} and found.unexplained == [] and found.stopped == ""
    assert found.verdict == "inconclusive"
    assert (f"the failure did not reproduce in {found.jobs} test(s): started by jobs 101, 102 failed on n4, "
            "its suspects stay recorded") in found.line()
    plain = search(nodes(16), Fabric(nodes(16), {}, seed=4).run_wave, floor=50.0)
    assert plain.verdict == "ok" and "reproduce" not in plain.line()


def test_a_suspected_node_that_passed_its_screen_is_cleared_only_after_repeats_pairs_with_different_partners():
    fabric = Fabric(nodes(16), {}, seed=5)
    found = search(fabric.nodes, fabric.run_wave, floor=50.0, repeats=3, started_by="jobs 7, 9", suspected=["n6"])
    pairs = [t.nodes for t in found.tests if t.purpose == "confirm"]
    assert [p[1] for p in pairs] == ["n6"] * 3 and len({p[0] for p in pairs}) == 3
    assert found.cleared["n6"].startswith("passed with ") and found.verdict == "inconclusive"
    assert "n6" in found.passed


def test_a_node_hanging_in_30_percent_of_its_tests_never_ends_ok_after_failed_jobs_in_300_trials():
    """Its screen passes 70% of the time: a preflight run may say ok; one started by the jobs it
    failed ends inconclusive, or names it after three failed pairs, and names no other node."""
    rng = random.Random("intermittent")
    verdicts = {"ok": 0, "found": 0, "inconclusive": 0}
    preflight_ok = 0
    for trial in range(300):
        [bad] = rng.sample(nodes(16), 1)
        fabric = Fabric(nodes(16), {bad: "flaky 0.3"}, seed=trial)
        found = search(fabric.nodes, fabric.run_wave, floor=50.0, started_by="jobs 1, 2", suspected=[bad])
        assert set(found.culprits) <= {bad}, found.line()
        verdicts[found.verdict] += 1
        preflight_ok += search(nodes(16), Fabric(nodes(16), {bad: "flaky 0.3"}, seed=trial).run_wave,
                               floor=50.0).verdict == "ok"
    assert verdicts["ok"] == 0 and verdicts["found"] > 0, verdicts
    assert preflight_ok > 100  # the same node, in runs no failure started


def test_a_suspected_node_that_hangs_in_one_repeat_pair_is_named_in_the_inconclusive_line():
    def hangs_once_in_pairs(groups):
        return [Outcome(False, None, "time limit reached") if g == ("n2", "n5") else Outcome(True, 100.0)
                for g in groups]

    found = search(nodes(8), hangs_once_in_pairs, floor=50.0, started_by="jobs 3, 4", suspected=["n5"])
    assert found.culprits == {} and found.verdict == "inconclusive"
    assert [t.passed for t in found.tests if t.nodes[-1] == "n5" and t.purpose == "confirm"] == [True, False, True]
    assert ("failed once, then passed: n5 (passed with n1, n3 (failed with n2)); started by jobs 3, 4"
            in found.line())


def test_a_culprit_found_spares_a_co_suspect_that_passed_its_pair_the_repeats():
    """1 bad of 16 after failed jobs, a healthy node suspected beside it: still at most 10 test jobs."""
    for bad in nodes(16):
        other = "n1" if bad != "n1" else "n2"
        fabric = Fabric(nodes(16), {bad: "slow 8"}, seed=6)
        found = search(fabric.nodes, fabric.run_wave, floor=50.0, started_by="jobs 1, 2", suspected=[bad, other])
        assert list(found.culprits) == [bad] and found.jobs <= 10, found.line()
        assert other in found.passed


def test_a_suspected_node_in_a_failed_screen_needs_repeats_passes_where_its_screen_partner_needs_one():
    waves = []

    def screen_fails_once(groups):
        waves.append(groups)
        return [Outcome(False, None, "time limit reached") if len(waves) == 1 and "n5" in g else Outcome(True, 100.0)
                for g in groups]

    found = search(nodes(8), screen_fails_once, floor=50.0, started_by="jobs 3, 4", suspected=["n5"])
    pairs = {n: [t.nodes[0] for t in found.tests if t.purpose == "confirm" and t.nodes[-1] == n] for n in ("n5", "n6")}
    assert len(pairs["n5"]) == 2 and len(set(pairs["n5"])) == 2 and len(pairs["n6"]) == 1, pairs
    assert set(found.cleared) == {"n5", "n6"} and found.verdict == "inconclusive"
