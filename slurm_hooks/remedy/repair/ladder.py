"""The repair ladder's decisions, pure: which rung a fault starts at, which rung is due given the
attempts on record, and what a hook does with the node. No I/O here (a test holds it to that):
the caller gathers (state, Slurm's view, the boot id, the report) and acts on the answer.

A fold over the recorded attempts, as gpud's ``evolveHealthyState`` folds XID events: the same
attempts and the same report always give the same rung.
"""

from __future__ import annotations

from enum import Enum

from slurm_hooks.models import Action
from slurm_hooks.remedy.repair.state import Phase
from slurm_hooks.values import dataclass, field

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence
    from typing import Any

    from slurm_hooks.models import Finding, Report
    from slurm_hooks.remedy.repair.state import Attempt, RepairState


class Rung(str, Enum):
    """The ladder's rungs, lowest first; the value is how the state file and the audit name it."""

    RESET = "reset"
    REBOOT = "reboot"
    REPLACE = "replace"

    @property
    def index(self) -> int:
        return _ORDER.index(self)

    def above(self) -> Rung:
        """The next rung up; ``replace`` is the top."""
        return _ORDER[min(self.index + 1, len(_ORDER) - 1)]


_ORDER = (Rung.RESET, Rung.REBOOT, Rung.REPLACE)
RUNGS = tuple(r.value for r in _ORDER)


class Mode(str, Enum):
    """How a due rung runs: handed to a detached worker (the hooks); here, taking the repair lock
    (tests, a person's command); or here under the lock the caller holds (the worker itself)."""

    DETACHED = "detached"
    INLINE = "inline"
    HELD = "held"


class Decision(str, Enum):
    """What a hook does with the node once it holds the repair lock."""

    WORK = "work"  # a rung is due: hand the node to a worker
    WAIT = "wait"  # hold the node: a reboot under way, a node waiting for a person
    NONE = "none"  # the ladder has nothing to do: the caller drains or resumes as usual


#: XIDs whose first remedy is a reboot (NVIDIA's immediate action RESTART_BM): the GPU fell off
#: the bus. The catalogue gives XID 79 ``reboot`` itself; this keeps a finding that says
#: ``replace`` for it without being an escalation at the reboot rung.
REBOOT_FIRST_RULES = frozenset({"xid.79", "gpu-lost"})
#: How :mod:`slurm_hooks.checks.xid` marks a repeat escalated to hardware (the finding has no
#: field for it yet): such a finding starts at ``replace``.
ESCALATED = "-> hardware"


def start_rung(finding: Finding) -> Rung | None:
    """The rung a finding starts at; ``None`` for one no repair mends (a person must look)."""
    action = finding.action
    if action is Action.RESET:
        return Rung.RESET
    if action is Action.REBOOT:
        return Rung.REBOOT
    if action is Action.REPLACE:
        if finding.rule_key in REBOOT_FIRST_RULES and ESCALATED not in finding.message:
            return Rung.REBOOT
        return Rung.REPLACE
    return None


@dataclass(frozen=True)
class Policy:
    """The ``[repair]`` keys the ladder weighs (their defaults are the config's: ``config.RepairSection``)."""

    window: float
    attempts: int
    reboot_timeout: float
    reset: bool
    reboot: bool

    @classmethod
    def from_config(cls, repair: Any) -> Policy:
        return cls(repair.window, repair.attempts, repair.reboot_timeout, repair.reset, repair.reboot)

    def allows(self, rung: Rung) -> bool:
        return rung is Rung.REPLACE or bool(getattr(self, rung.value))


@dataclass(frozen=True)
class Choice:
    """The rung due for a report, and why (the reason the audit and ``--dry-run`` show)."""

    rung: Rung
    why: str
    skipped: tuple[str, ...] = field(default=())


def span(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}h" if s % 3600 == 0 else f"{s}s"


def choose(findings: Sequence[Finding], gpus: Sequence[tuple[int | None, str]],
           attempts: Iterable[Attempt], policy: Policy, now: float, summary: str,
           offender: Callable[[list[Attempt], list[str], float], str] | None = None) -> Choice | None:
    """The rung due for these drain findings on these GPUs (index, identity), given the attempts
    on record; ``None`` when nothing is to repair (no finding, or one no rung mends)."""
    if not findings:
        return None
    starts = [start_rung(f) for f in findings]
    if any(s is None for s in starts):
        return None  # a finding no rung mends (a config mismatch, firmware): a person decides
    rung: Rung = max(starts, key=lambda r: r.index)  # type: ignore[arg-type, return-value]
    why = f"{summary}: starts at {rung.value}"
    attempts = list(attempts)
    ids = {g for _, g in gpus}
    since = now - policy.window
    recent = [a for a in attempts if a.t >= since and set(a.gpus) & ids]
    if recent:
        top = Rung(max((a.rung for a in recent), key=RUNGS.index))
        higher = top.above()
        if higher.index > rung.index:
            if all(a.result == "refused" for a in recent if a.rung == top.value):
                why = (f"{summary}: {top.value} refused by Slurm (is RebootProgram set in slurm.conf?): "
                       "a person must act")
            else:
                why = f"{summary}: back on the same GPU within {span(policy.window)} after a {top.value}"
            rung = higher
    told = offender(attempts, [g for _, g in gpus], now) if offender and rung is not Rung.REPLACE else ""
    if told:  # a repeat offender goes to a person
        rung, why = Rung.REPLACE, f"{why}; {told}"
    skipped = []
    while rung is not Rung.REPLACE:
        tried = sum(1 for a in recent if a.rung == rung.value)
        if not policy.allows(rung):
            skipped.append(f"{rung.value} is off ([repair] {rung.value} = false)")
        elif rung is Rung.REBOOT and any(a.rung == "reboot" and a.result == "refused" for a in recent):
            skipped.append("reboot refused by Slurm (is RebootProgram set in slurm.conf?): a person must act")
        elif rung is Rung.RESET and not any(i is not None for i, _ in gpus):
            skipped.append("reset: no single GPU to reset (a node-wide fault)")
        elif tried >= policy.attempts:
            skipped.append(f"{rung.value} tried {tried} time(s) within {span(policy.window)}")
        else:
            break
        rung = rung.above()
    if skipped:
        why += "; " + "; ".join(skipped)
    return Choice(rung, why, tuple(skipped))


def waits_for_jobs(state: RepairState, jobs: Sequence[Any]) -> bool:
    """Jobs still run and no repair is under way: the ladder waits for the last to leave."""
    return bool(jobs) and state.active is None and state.stopped is None


def decide(state: RepairState, node: Any, jobs: Sequence[Any], boot_id: str, report: Report, *, now: float,
           policy: Policy, gpus: Sequence[tuple[int | None, str]] = (), summary: str = "") -> Decision:
    """What a hook does with the node, the repair lock free: the fold of the phase on record,
    Slurm's view of the node (its flags), the boot it runs and the report. ``boot_id`` matters
    only while a reboot is under way."""
    if waits_for_jobs(state, jobs):
        return Decision.NONE
    phase = state.phase
    if phase is Phase.REBOOTING and state.active is not None:
        pending = node.reboot_pending
        booted = boot_id != state.active.boot
        if (pending or not booted) and now - state.active.t < policy.reboot_timeout:
            return Decision.WAIT
        return Decision.WORK
    if phase is Phase.UNVERIFIED:
        return Decision.WAIT
    if phase is Phase.VALIDATING:
        return Decision.WORK
    if choose(report.drain_findings(), gpus, state.attempts, policy, now, summary) is None:
        return Decision.NONE
    return Decision.WORK
