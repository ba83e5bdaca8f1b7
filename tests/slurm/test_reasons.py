"""Reason texts as Slurm really shows them: its " : ..." suffixes, other tools' prefixes, our counts."""

from __future__ import annotations

import pytest

from slurm_hooks.models import Action
from slurm_hooks.slurm import (
    NodeInfo,
    format_reason,
    format_status_reason,
    held_for,
    held_tag,
    is_held,
    may_drain,
    may_resume,
    parse_reason,
    reason_attempt,
    reason_is_ours,
    split_reason,
    waits_for_job_end,
)
from slurm_hooks.slurm.scontrol import parse_node_line

OURS = "slurm-hooks: XID 79 on GPU 3 [reboot]"


@pytest.mark.parametrize("suffix", ["Not responding", "reboot issued", "reboot issued : reboot complete",
                                    "reboot timed out", "reboot issued : reboot timed out"])
def test_slurm_s_own_suffixes_keep_the_drain_ours_and_parse(suffix):
    reason = f"{OURS} : {suffix}"
    assert reason_is_ours(reason)
    assert split_reason(reason) == (OURS, tuple(suffix.split(" : ")))
    assert parse_reason(reason) == ("XID 79 on GPU 3", Action.REBOOT)
    node = NodeInfo("n1", "DOWN+DRAIN", reason)
    assert node.ours and may_resume(node) and may_drain(node)


@pytest.mark.parametrize("suffix", ["Prolog error", "Epilog error", "Kill task failed",
                                    "Kill task failed (JobId=12 StepId=0)", "Reboot ASAP", "admin says no"])
def test_a_later_drain_that_kept_our_text_in_front_is_not_ours(suffix):
    reason = f"{OURS} : {suffix}"
    assert not reason_is_ours(reason)
    node = NodeInfo("n1", "IDLE+DRAIN", reason)
    assert not node.ours and not may_resume(node) and not may_drain(node)
    # What it says is still readable (the bridge and the incident view show it).
    assert parse_reason(reason) == ("XID 79 on GPU 3", Action.REBOOT)


@pytest.mark.parametrize("reason", ["NHC: check_gpu: GPU 3 missing", "slurm-operator: Pod is terminating",
                                    "NHC: slurm-hooks: lookalike", "Not responding"])
def test_other_tools_reasons_are_never_ours(reason):
    node = NodeInfo("n1", "DOWN+DRAIN", reason)
    assert not reason_is_ours(reason) and not node.ours and not may_resume(node) and not may_drain(node)


def test_the_ladder_s_count_rides_in_the_reason_and_survives_suffixes():
    reason = format_reason("XID 79 on GPU 3", Action.REBOOT, attempt=(1, 2))
    assert reason == "slurm-hooks: XID 79 on GPU 3 [reboot 1/2]"
    assert reason_attempt(reason + " : reboot issued : reboot complete") == (Action.REBOOT, 1, 2)
    assert parse_reason(reason + " : reboot timed out") == ("XID 79 on GPU 3", Action.REBOOT)
    assert reason_attempt(OURS) is None and reason_attempt("Prolog error") is None
    at_end = format_reason("row remap pending on GPU 6", Action.RESET, at_job_end=True)
    assert waits_for_job_end(at_end + " : Not responding")


def test_a_held_drain_says_so_in_its_tag_and_is_read_through_slurm_s_suffixes():
    reason = format_status_reason("IB mlx5_0 port 1 down", held_tag(5, "7d"))
    assert reason == "slurm-hooks: IB mlx5_0 port 1 down [held: 5 remediations in 7d]"
    assert is_held(reason + " : Not responding")
    assert not is_held("slurm-hooks: IB mlx5_0 port 1 down [drain]")
    assert not is_held("admin: [held: 5 remediations in 7d]")
    assert held_for("slurm-hooks: XID 79 on GPU 3 [held: 5 remediations in 7d] : reboot issued") == \
        "5 remediations in 7d"


def test_our_text_never_holds_slurm_s_separator():
    reason = format_reason("ECC : volatile 3", Action.RESET)
    assert " : " not in reason and split_reason(reason) == (reason, ())


def test_reason_time_and_user_come_from_scontrol_s_bracket():
    line = ("NodeName=n1 Arch=x86_64 CoresPerSocket=1 State=DOWN+DRAIN+REBOOT_ISSUED NextState=UNDRAIN "
            f"Reason={OURS} : reboot issued [root@2026-12-01T15:37:46] Comment=x")
    node = parse_node_line(line)
    assert (node.reason, node.reason_time, node.reason_user) == (
        f"{OURS} : reboot issued", "2026-12-01T15:37:46", "root")


@pytest.mark.parametrize(("reason", "action"), [
    ("slurm-hooks: XID 79 on GPU 0 [reboot 1/1] : reboot issued : reboot timed out", "reboot"),
    ("slurm-hooks: row remap pending on GPU 6 [reset, at job end] : Not responding", "reset"),
    ("slurm-hooks: XID 79 on GPU 0 [replace]", "replace"), ("Prolog error", "drain")])
def test_the_incident_view_reads_the_action_through_slurm_s_suffixes(reason, action):
    from slurm_hooks.observe.incidents import reason_action

    assert reason_action(reason) == action
    parsed = parse_reason(reason)
    assert (parsed[1].value if parsed else "drain") == action
