"""Hysteresis of the threshold checks: confirm before acting, hold until good for long enough.

A fake clock: each run is 5 minutes after the one before."""

from __future__ import annotations

import json

import pytest

from slurm_hooks.checks import hysteresis
from slurm_hooks.checks.hysteresis import Hysteresis, fold
from slurm_hooks.models import Action, Finding, Severity

HOT = Finding("thermal", Severity.FAIL, Action.DRAIN, "temperature 97 C (limit 95 C)", 3, "GPU 3 at 97 C")
PORT_DOWN = Finding("links", Severity.FAIL, Action.DRAIN, "IB mlx5_0 port 1: state DOWN", None,
                    "IB mlx5_0 port 1 down", rule="ib-down")
XID = Finding("xid", Severity.FAIL, Action.REBOOT, "XID 79", 3, "XID 79 on GPU 3", rule="xid.79")
LOST = Finding("gpu-lost", Severity.FAIL, Action.REPLACE, "GPU fell off the bus", 5, "GPU 5 lost")
STEP = 300.0


def runs(pattern, confirm=(2, 3), resume_after=3, finding=HOT):
    """Fold one run per entry of ``pattern`` (True: the check reads bad); whether each run acts."""
    memory, acted, now = None, [], 0.0
    for bad in pattern:
        out, memory = fold([finding] if bad else [], memory, now, confirm, resume_after)
        acted.append(any(f.action.takes_node_out for f in out))
        now += STEP
    return acted


def test_failing_one_run_in_three_for_an_hour_never_drains():
    pattern = [True, False, False] * 4  # 12 runs, 5 minutes apart
    assert not any(runs(pattern))


def test_failing_two_runs_in_a_row_drains_on_the_second():
    assert runs([False, True, True]) == [False, False, True]


def test_two_bad_of_three_with_a_good_between_drains():
    assert runs([True, False, True]) == [False, False, True]


def test_one_bad_reading_is_a_warning_that_says_why():
    out, _ = fold([HOT], None, 0.0, (2, 3), 3)
    [f] = out
    assert (f.severity, f.action) == (Severity.WARN, Action.WARN)
    assert f.message == "temperature 97 C (limit 95 C) (bad in 1 of the last 1 readings; acts on 2 of 3)"


def test_drained_node_is_resumed_only_after_three_good_passes():
    acted = runs([True, True, False, False, False, False])
    assert acted == [False, True, True, True, False, False]


def test_a_bad_reading_while_held_starts_the_good_count_again():
    acted = runs([True, True, False, False, True, False, False, False])
    assert acted == [False, True, True, True, True, True, True, False]


def test_held_finding_says_how_many_good_readings_it_has():
    memory = None
    for now, found in ((0.0, [HOT]), (STEP, [HOT]), (2 * STEP, [])):
        out, memory = fold(found, memory, now, (2, 3), 3)
    [f] = out
    assert f.action is Action.DRAIN and f.gpu == 3 and f.summary == "GPU 3 at 97 C"
    assert f.message.endswith("(held: 1 of 3 good readings before resuming)")


def test_a_port_down_acts_at_once_and_is_held_for_three_good_passes():
    assert runs([True, False, False, False], finding=PORT_DOWN) == [True, True, True, False]


def test_an_xid_or_a_lost_gpu_is_never_delayed_nor_held():
    out, memory = fold([XID, LOST], None, 0.0, (2, 3), 3)
    assert out == [XID, LOST]
    out, memory = fold([], memory, STEP, (2, 3), 3)
    assert out == []


def test_gpus_are_confirmed_apart():
    other = Finding("thermal", Severity.FAIL, Action.DRAIN, "temperature 96 C", 4, "GPU 4 at 96 C")
    out, memory = fold([HOT], None, 0.0, (2, 3), 3)
    out, memory = fold([other], memory, STEP, (2, 3), 3)
    assert not any(f.action.takes_node_out for f in out)


def test_the_same_run_judged_twice_counts_once():
    out, memory = fold([HOT], None, 0.0, (2, 3), 3)
    out, memory = fold([HOT], memory, 0.4, (2, 3), 3)  # the health check's re-judge after a resume
    assert not any(f.action.takes_node_out for f in out)
    out, memory = fold([HOT], memory, STEP, (2, 3), 3)
    assert any(f.action.takes_node_out for f in out)


def test_off_by_default_every_reading_stands_alone(tmp_path):
    h = Hysteresis(str(tmp_path), "n1")
    assert h.off and h.fold([HOT], 0.0) == [HOT]
    assert not (tmp_path / "hysteresis-n1.json").exists()


def test_memory_is_kept_in_the_state_dir_across_runs(tmp_path):
    h = Hysteresis(str(tmp_path), "n1", (2, 3), 3)
    assert h.fold([HOT], 0.0)[0].action is Action.WARN
    again = Hysteresis(str(tmp_path), "n1", (2, 3), 3)  # the next health check, a new process
    assert again.fold([HOT], STEP)[0].action is Action.DRAIN
    memory = json.loads((tmp_path / "hysteresis-n1.json").read_text())
    assert memory["rules"]["thermal|3"]["seen"] == [True, True]


def test_an_unreadable_memory_starts_afresh(tmp_path):
    (tmp_path / "hysteresis-n1.json").write_text("{not json")
    h = Hysteresis(str(tmp_path), "n1", (2, 3), 3)
    assert h.fold([HOT], 0.0)[0].action is Action.WARN


@pytest.mark.parametrize("memory", [{"at": "noon"}, {"at": 1, "rules": {"thermal|3": {"seen": 5}}},
                                    {"at": 1, "rules": {"thermal|3": {"seen": [True], "held": {"x": 1}}}},
                                    {"at": 1, "rules": {"thermal|3": {"seen": [], "held": {}, "bad_at": "x"}}},
                                    {"at": 1, "rules": []}])
def test_a_memory_that_makes_no_sense_starts_afresh_and_never_crashes_the_run(tmp_path, memory):
    """Our own state file edited or torn: an exception here escaped the engine (no report, no drain)."""
    (tmp_path / "hysteresis-n1.json").write_text(json.dumps(memory))
    h = Hysteresis(str(tmp_path), "n1", (2, 3), 3)
    assert h.fold([], 1000.0) == []
    assert h.fold([HOT], 1000.0 + STEP)[0].action is Action.WARN  # one bad reading of a fresh memory
    assert json.loads((tmp_path / "hysteresis-n1.json").read_text())["at"] == 1000.0 + STEP


def test_rules_covered_name_the_threshold_checks():
    assert {"ib-rate", "ib-errors", "pcie", "nvlink-errors", "thermal"} <= hysteresis.CONFIRMED
    assert "ib-down" in hysteresis.HELD and "ib-down" not in hysteresis.CONFIRMED
    assert not any(rule.startswith("xid") or rule == "gpu-lost" for rule in hysteresis.HELD)


def test_config_reads_confirm_and_resume_after(tmp_path):
    from slurm_hooks import config

    cfg = config.parse(f'[hysteresis]\nconfirm = "2/3"\nresume_after = 3\n[state]\ndir = "{tmp_path}"\n')
    h = hysteresis.from_config(cfg, "n1")
    assert (h.confirm, h.resume_after, h.off) == ((2, 3), 3, False)


def test_a_confirm_that_is_no_ratio_is_a_config_error_naming_its_line():
    import pytest

    from slurm_hooks import config
    from slurm_hooks.errors import ConfigError

    for bad in ('"3/2"', '"two of three"', '"0/3"'):
        with pytest.raises(ConfigError) as exc:
            config.parse(f"[hysteresis]\nconfirm = {bad}\n")
        assert ":2: [hysteresis] confirm: must be \"K/N\"" in str(exc.value)


def test_a_sticky_window_holds_a_port_drop_ten_minutes_after_it_cleared():
    memory, acted = None, []
    for now, found in ((0.0, [PORT_DOWN]), (30.0, []), (300.0, []), (590.0, []), (601.0, [])):
        out, memory = fold(found, memory, now, (1, 1), 1, sticky=600.0)
        acted.append(any(f.action.takes_node_out for f in out))
    assert acted == [True, True, True, True, False]
    out, _ = fold([], fold([PORT_DOWN], None, 0.0, (1, 1), 1, sticky=600.0)[1], 30.0, (1, 1), 1, sticky=600.0)
    assert out[0].message.endswith("(held: 1 of 1 good readings before resuming, held 600 s after the last bad "
                                   "one (570 s left))")


def test_sticky_alone_turns_the_hysteresis_on(tmp_path):
    assert not Hysteresis(str(tmp_path), "n1", sticky=600.0).off


def port(name: str, rule: str = "ib-rate") -> Finding:
    """A port's finding as the links check gives it: the port named in ``subject``."""
    return Finding("links", Severity.FAIL, Action.DRAIN, f"IB {name}: rate 200 Gb/s, expected 400 Gb/s", None,
                   f"IB {name} at 200 Gb/s", config_based=True, rule=rule, subject=name)


def test_two_ports_each_bad_once_are_not_one_port_bad_twice():
    """confirm 2/3 counts readings of one port: mlx5_0 bad in one run and mlx5_1 in the next are
    two ports each bad once, a warning for each, never a drain."""
    a, b = port("mlx5_0 port 1"), port("mlx5_1 port 1")
    first, memory = fold([a], None, 0.0, (2, 3), 3)
    second, memory = fold([b], memory, STEP, (2, 3), 3)
    assert [f.action for f in first + second] == [Action.WARN, Action.WARN]
    assert "bad in 1 of the last 1 readings" in second[0].message  # its own first reading
    third, _ = fold([b], memory, 2 * STEP, (2, 3), 3)
    assert [(f.subject, f.action) for f in third] == [("mlx5_1 port 1", Action.DRAIN)]


def test_two_ports_down_at_once_are_both_named():
    a, b = port("mlx5_0 port 1", "ib-down"), port("mlx5_3 port 1", "ib-down")
    out, memory = fold([a, b], None, 0.0, (2, 3), 3)
    assert sorted(f.subject for f in out if f.action.takes_node_out) == ["mlx5_0 port 1", "mlx5_3 port 1"]
    held, _ = fold([], memory, STEP, (2, 3), 3)  # both held apart, each with its own good count
    assert sorted(f.subject for f in held) == ["mlx5_0 port 1", "mlx5_3 port 1"]
    assert all("1 of 3 good readings" in f.message for f in held)


def test_a_port_finding_keeps_its_subject_through_the_memory():
    f = port("mlx5_2 port 1")
    assert Finding.from_dict(f.to_dict()) == f
    assert "subject" not in HOT.to_dict()  # a GPU's finding reads as it always did


@pytest.mark.parametrize("break_it", ["state dir is a file", "memory is a directory"])
def test_a_memory_that_cannot_be_kept_is_a_warning_of_its_own(tmp_path, break_it):
    """A full or read-only state disk (here: the paths as a broken disk leaves them, which even root
    cannot write through): every run starts afresh, so K of N is never reached. Said in the report,
    never a drain, and the run's own findings stand."""
    if break_it == "state dir is a file":
        state = tmp_path / "state"
        state.write_text("")
    else:
        state = tmp_path
        (tmp_path / "hysteresis-n1.json").mkdir()
    h = Hysteresis(str(state), "n1", (2, 3), 3)
    for run in range(3):
        out = h.fold([HOT], run * STEP)
        assert [f.action for f in out if f.check == "thermal"] == [Action.WARN]  # never confirmed: no memory
        [lost] = [f for f in out if f.rule == hysteresis.MEMORY_RULE]
        assert lost.message.startswith("cannot remember readings: ")
        assert "hysteresis-n1.json" in lost.message
        assert (lost.severity, lost.action, lost.gpu) == (Severity.WARN, Action.WARN, None)


def test_a_memory_kept_well_says_nothing(tmp_path):
    h = Hysteresis(str(tmp_path), "n1", (2, 3), 3)
    assert [f.check for f in h.fold([HOT], 0.0)] == ["thermal"]
    assert [f.check for f in h.fold([], STEP)] == []
