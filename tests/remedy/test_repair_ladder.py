"""The repair ladder's pure decisions, table by table: every rung, mode and phase transition,
with no Slurm, no GPUs and no files (ladder.py imports nothing that does I/O)."""

from __future__ import annotations

import ast
import inspect

import pytest

from slurm_hooks import config
from slurm_hooks.models import Action, Context, Finding, Report, Severity
from slurm_hooks.remedy.repair import ladder
from slurm_hooks.remedy.repair.ladder import Decision, Mode, Policy, Rung
from slurm_hooks.remedy.repair.state import Active, Attempt, Phase, RepairState, Replaced, Stopped, Validating
from slurm_hooks.slurm import NodeInfo
from slurm_hooks.values import replace

NOW = 1_000_000.0
GPU0 = [(0, "GPU-0")]
NODE = [(None, "node")]


def f(action, message="fault", gpu=0, check="row-remap", rule=""):
    return Finding(check, Severity.FAIL, action, message, gpu, rule=rule)


def att(rung, result="failed", gpus=("GPU-0",), age=60.0):
    return Attempt(rung, NOW - age, result, tuple(gpus), "s")


def node(flags=()):
    return NodeInfo("n1", "+".join(("IDLE", *flags)))


def policy(**keys):
    """The ladder's policy of a default ``[repair]`` section (the one place its defaults are), ``keys`` changed."""
    return replace(Policy.from_config(config.RepairSection()), **keys)


def test_ladder_imports_nothing_that_does_io():
    tree = ast.parse(inspect.getsource(ladder))
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    allowed = {"__future__", "enum", "collections.abc", "typing", "slurm_hooks.models", "slurm_hooks.values",
               "slurm_hooks.remedy.repair.state"}
    assert names <= allowed, names - allowed


@pytest.mark.parametrize("finding,rung", [
    (f(Action.RESET), Rung.RESET),
    (f(Action.REBOOT, check="gpu-count"), Rung.REBOOT),
    (f(Action.REPLACE, "XID 79 (GPU has fallen off the bus)", check="xid", rule="xid.79"), Rung.REBOOT),
    (f(Action.REPLACE, "XID 79 (x), 3rd time in 24h -> hardware", check="xid", rule="xid.79"), Rung.REPLACE),
    (f(Action.REPLACE, "XID 48 (DBE)", check="xid", rule="xid.48"), Rung.REPLACE),
    (f(Action.REPLACE, "GPU is lost", check="gpu-lost"), Rung.REBOOT),
    (f(Action.REPLACE, "row remapping failed"), Rung.REPLACE),
    (f(Action.DRAIN, "model 'A100', expected 'H100'", check="gpu-model"), None),
    (f(Action.WARN), None),
])
def test_start_rung_comes_from_the_action_and_the_rule(finding, rung):
    assert ladder.start_rung(finding) is rung


@pytest.mark.parametrize("rung,above", [(Rung.RESET, Rung.REBOOT), (Rung.REBOOT, Rung.REPLACE),
                                        (Rung.REPLACE, Rung.REPLACE)])
def test_each_rung_climbs_to_the_next_and_replace_is_the_top(rung, above):
    assert rung.above() is above


def test_rungs_and_modes_keep_the_words_of_the_state_file_and_the_cli():
    assert ladder.RUNGS == ("reset", "reboot", "replace")
    assert [m.value for m in Mode] == ["detached", "inline", "held"]
    assert Mode("held") is Mode.HELD and Mode.HELD == "held"


@pytest.mark.parametrize("findings,gpus,attempts,policy,rung,why", [
    # where each fault starts, nothing on record
    ([f(Action.RESET)], GPU0, [], policy(), Rung.RESET, "starts at reset"),
    ([f(Action.REBOOT)], GPU0, [], policy(), Rung.REBOOT, "starts at reboot"),
    ([f(Action.REPLACE)], GPU0, [], policy(), Rung.REPLACE, "starts at replace"),
    ([f(Action.RESET), f(Action.REBOOT, gpu=1)], GPU0, [], policy(), Rung.REBOOT, "starts at reboot"),
    # back on the same GPU within the window: one rung above the last tried
    ([f(Action.RESET)], GPU0, [att("reset", "ok")], policy(), Rung.REBOOT, "after a reset"),
    ([f(Action.RESET)], GPU0, [att("reboot", "ok")], policy(), Rung.REPLACE, "after a reboot"),
    ([f(Action.RESET)], GPU0, [att("reset", "ok", age=90_000)], policy(), Rung.RESET, "starts at reset"),
    ([f(Action.RESET)], GPU0, [att("reset", "ok", gpus=("GPU-1",))], policy(), Rung.RESET, "starts at reset"),
    # a refused reboot: a person must act, no second ask
    ([f(Action.REBOOT)], GPU0, [att("reboot", "refused")], policy(), Rung.REPLACE, "refused by Slurm"),
    # rungs switched off, tried too often, or without a GPU to reset
    ([f(Action.RESET)], GPU0, [], policy(reset=False), Rung.REBOOT, "reset is off"),
    ([f(Action.RESET)], GPU0, [], policy(reset=False, reboot=False), Rung.REPLACE, "reboot is off"),
    ([f(Action.RESET, gpu=None)], NODE, [], policy(), Rung.REBOOT, "no single GPU to reset"),
    ([f(Action.REBOOT)], GPU0, [att("reset", "ok")], policy(), Rung.REBOOT, "starts at reboot"),
    ([f(Action.REBOOT)], GPU0, [att("reboot", "cancelled")], policy(attempts=2), Rung.REPLACE, "after a reboot"),
    ([f(Action.REBOOT)], GPU0, [att("reboot", "ok"), att("reboot", "ok")], policy(attempts=2), Rung.REPLACE,
     "after a reboot"),
    ([f(Action.RESET)], GPU0, [att("reset", "started")], policy(attempts=2), Rung.REBOOT, "after a reset"),
])
def test_choose_folds_the_attempts_on_record(findings, gpus, attempts, policy, rung, why):
    choice = ladder.choose(findings, gpus, attempts, policy, NOW, "row remap on GPU 0")
    assert choice is not None and choice.rung is rung
    assert why in choice.why and choice.why.startswith("row remap on GPU 0: ")


@pytest.mark.parametrize("attempts,tries,rung", [
    # each rung tried up to [repair] attempts times per GPU within the window, then the next
    ([], 1, Rung.RESET),
    ([att("reset", "failed")], 2, Rung.REBOOT),  # a reset on record starts one rung above it
    ([att("reboot", "failed")], 2, Rung.REPLACE),
    ([att("reboot", "failed", age=90_000)], 1, Rung.RESET),  # outside the window: forgotten
    ([att("replace", "ok")], 1, Rung.REPLACE),
])
def test_choose_for_a_reset_class_fault_at_every_rung(attempts, tries, rung):
    choice = ladder.choose([f(Action.RESET)], GPU0, attempts, policy(attempts=tries), NOW, "s")
    assert choice.rung is rung


@pytest.mark.parametrize("policy,allowed", [
    (policy(), {Rung.RESET, Rung.REBOOT, Rung.REPLACE}),
    (policy(reset=False), {Rung.REBOOT, Rung.REPLACE}),
    (policy(reboot=False), {Rung.RESET, Rung.REPLACE}),
    (policy(reset=False, reboot=False), {Rung.REPLACE}),  # replace cannot be switched off
])
def test_the_policy_allows_each_rung_but_replace_by_its_own_key(policy, allowed):
    assert {r for r in Rung if policy.allows(r)} == allowed


def test_the_policy_reads_the_repair_section():
    repair = config.parse("[repair]\nwindow = 3600\nattempts = 2\nreboot_timeout = 60\nreset = false\n").repair
    policy = Policy.from_config(repair)
    assert policy == Policy(3600.0, 2, 60.0, False, True)
    assert (type(policy.window), type(policy.reboot_timeout)) == (float, float)  # as the section keeps them


@pytest.mark.parametrize("state,jobs,waits", [
    (RepairState(), (), False),
    (RepairState(), ("job",), True),
    (RepairState(validating=Validating()), ("job",), True),
    (RepairState(replaced=Replaced()), ("job",), True),
    (RepairState(active=Active()), ("job",), False),  # our reboot: Slurm waits for the jobs, not us
    (RepairState(stopped=Stopped(("x",))), ("job",), False),  # services down: restore them now
])
def test_the_ladder_waits_for_jobs_unless_a_repair_is_under_way(state, jobs, waits):
    assert ladder.waits_for_jobs(state, jobs) is waits


def test_choose_has_nothing_for_no_finding_or_one_no_rung_mends():
    assert ladder.choose([], GPU0, [], policy(), NOW, "s") is None
    assert ladder.choose([f(Action.RESET), f(Action.DRAIN)], GPU0, [], policy(), NOW, "s") is None


def test_a_repeat_offender_goes_to_replace_and_the_policy_is_not_asked_at_the_top():
    asked = []

    def offender(attempts, ids, now):
        asked.append(ids)
        return "repeat offender: GPU-0"

    choice = ladder.choose([f(Action.RESET)], GPU0, [], policy(), NOW, "s", offender=offender)
    assert choice.rung is Rung.REPLACE and choice.why.endswith("; repeat offender: GPU-0") and asked == [["GPU-0"]]
    asked.clear()
    assert ladder.choose([f(Action.REPLACE)], GPU0, [], policy(), NOW, "s", offender=offender).rung is Rung.REPLACE
    assert asked == []


def report(*findings):
    return Report("n1", Context.CHECK, tuple(findings), 0.0)


REBOOTING = RepairState(active=Active(NOW - 60, "boot-1"))
LATE = RepairState(active=Active(NOW - 5000, "boot-1"))
RUNNING, UNVERIFIED = Validating(result="running"), Validating(result="unverified")


@pytest.mark.parametrize("state,flags,jobs,boot,rep,decision", [
    # nothing under way
    (RepairState(), (), (), "", report(), Decision.NONE),
    (RepairState(), (), (), "", report(f(Action.RESET)), Decision.WORK),
    (RepairState(), (), ("job",), "", report(f(Action.RESET)), Decision.NONE),  # after the last job
    (RepairState(), (), (), "", report(f(Action.DRAIN)), Decision.NONE),  # a person decides
    # a reboot under way: wait for it (pending, or the same boot) within reboot_timeout
    (REBOOTING, ("REBOOT_REQUESTED",), (), "boot-2", report(), Decision.WAIT),
    (REBOOTING, (), (), "boot-1", report(), Decision.WAIT),
    (REBOOTING, (), ("job",), "boot-1", report(), Decision.WAIT),  # jobs do not end our reboot
    (REBOOTING, (), (), "boot-2", report(), Decision.WORK),  # back on a new boot: judge it
    (LATE, (), (), "boot-1", report(), Decision.WORK),  # no reboot within reboot_timeout
    # validating: a worker runs it; unverified: a person
    (RepairState(validating=RUNNING), (), (), "", report(), Decision.WORK),
    (RepairState(validating=UNVERIFIED), (), (), "", report(), Decision.WAIT),
    # stopped services: the worker comes even with jobs on the node
    (RepairState(stopped=Stopped(("x",))), (), ("job",), "", report(f(Action.RESET)), Decision.WORK),
    # replaced: a new fault is weighed against the attempts on record (the hook held the node before)
    (RepairState(replaced=Replaced(1)), (), (), "", report(), Decision.NONE),
    (RepairState(replaced=Replaced(1)), (), (), "", report(f(Action.REPLACE)), Decision.WORK),
    # the attempts on record do not stop a due rung: the top one is still one to run
    (RepairState(attempts=(att("reset"), att("reboot"))), (), (), "", report(f(Action.RESET)), Decision.WORK),
])
def test_decide_for_every_phase(state, flags, jobs, boot, rep, decision):
    assert ladder.decide(state, node(flags), jobs, boot, rep, now=NOW, policy=policy(reboot_timeout=900.0),
                         gpus=GPU0, summary="s") is decision


@pytest.mark.parametrize("state,phase", [
    (RepairState(), Phase.IDLE),
    (RepairState(active=Active(1)), Phase.REBOOTING),
    (RepairState(active=Active(1), validating=RUNNING), Phase.REBOOTING),
    (RepairState(validating=RUNNING), Phase.VALIDATING),
    (RepairState(validating=UNVERIFIED), Phase.UNVERIFIED),
    (RepairState(validating=RUNNING, replaced=Replaced(1)), Phase.VALIDATING),
    (RepairState(replaced=Replaced(1)), Phase.REPLACED),
    (RepairState(stopped=Stopped(("x",))), Phase.IDLE),
])
def test_the_phase_follows_the_records_in_the_order_the_ladder_weighs_them(state, phase):
    assert state.phase is phase


@pytest.mark.parametrize("before,attempt,after", [
    (RepairState(), Attempt("reset", NOW, "started", ("GPU-0",)), 1),
    (RepairState(attempts=(Attempt("reset", NOW, "ok"),)), Attempt("reboot", NOW, "refused"), 2),
])
def test_an_attempt_is_added_to_a_new_state_the_old_unchanged(before, attempt, after):
    new = before.with_attempt(attempt)
    assert len(new.attempts) == after and new.attempts[-1] == attempt and len(before.attempts) == after - 1
    with pytest.raises(AttributeError):
        new.attempts = ()  # frozen
