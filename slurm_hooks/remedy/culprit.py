"""Which node breaks collectives: the search, as a pure function of a test runner.

A rank that hangs in a collective, a slow node or a dropped link reports no XID: the job
fails on the node where the library gave up, not on the culprit. We find it by running
multi-node collective tests on groups of the suspected nodes, in waves of parallel tests
(:func:`search`), and judging each against its peers: a test that did not complete failed;
one whose bandwidth is under ``ratio`` of the reference (the median of the upper half of
every completed test so far, so that slow groups do not set it) failed too.

``bisect`` (Azure's): a first wave of 4 groups (8 above 32 nodes); a failing group of more
than 4 nodes is split in halves, recursively; the members of a failing group of 4 or fewer
are each *confirmed*: tested in a pair with a node that passed. ``pairwise`` (gcm's
``--pairwise-quick``): the first wave is every pair; the members of a failing pair are
confirmed the same way. A confirmation far under the bar is firm; one only just under it, or one
that did not complete (a job that never started, a partner that died), is tried once more with
another partner, and names the node only if it fails again. Only a confirmed node is a culprit; a
suspect that passes its confirmation, or that had no passed node to be tested against, is not.

Bounded: ``max_tests`` and ``time_left`` are looked at before each wave; a search cut short
names its unconfirmed suspects. :class:`Fabric` simulates a cluster's fabric for tests and
``bench/bench_isolate.py``.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence
from typing import Callable

from slurm_hooks.values import dataclass, field

MODES = ("bisect", "pairwise")
#: A failing group this small (or smaller) has each member confirmed instead of being split.
CONFIRM_AT = 4
#: A confirmation under this share of the bar (``ratio`` of the reference) is firm; one between
#: it and the bar, or one that did not complete, is tested once more with another partner, so that
#: noise or one failed job never drains a node.
FIRM = 0.6


@dataclass(frozen=True)
class Outcome:
    """What one collective test job gave: it completed or not, its bus bandwidth (any unit)."""

    completed: bool
    bandwidth: float | None = None
    detail: str = ""
    job: str = ""


@dataclass(frozen=True)
class Test:
    nodes: tuple[str, ...]
    outcome: Outcome
    passed: bool
    why: str
    wave: int
    purpose: str  # "screen", "split" or "confirm"


@dataclass
class Result:
    #: node -> the evidence line that confirmed it ("bandwidth 12% of peers", "did not complete: ...")
    culprits: dict[str, str] = field(default_factory=dict)
    #: node -> why it stays a mere suspect (passed its confirmation, nothing to confirm against, budget)
    cleared: dict[str, str] = field(default_factory=dict)
    unconfirmed: dict[str, str] = field(default_factory=dict)
    passed: list[str] = field(default_factory=list)
    tests: list[Test] = field(default_factory=list)
    waves: int = 0
    reference: float | None = None
    #: why the search stopped early ("" when it ran to its end)
    stopped: str = ""

    @property
    def jobs(self) -> int:
        return len(self.tests)

    def line(self) -> str:
        found = ", ".join(f"{n} ({why})" for n, why in sorted(self.culprits.items())) or "no culprit"
        extra = ""
        if self.unconfirmed:
            extra += "; unconfirmed: " + ", ".join(f"{n} ({why})" for n, why in sorted(self.unconfirmed.items()))
        if self.stopped:
            extra += f"; stopped: {self.stopped}"
        return f"{found}{extra} ({self.jobs} test job(s) in {self.waves} wave(s))"


Runner = Callable[[Sequence[tuple[str, ...]]], Sequence[Outcome]]


def chunks(nodes: Sequence[str], count: int) -> list[tuple[str, ...]]:
    """``nodes`` cut into ``count`` near-equal groups of at least 2 (fewer groups when short)."""
    count = max(1, min(count, len(nodes) // 2))
    size, extra = divmod(len(nodes), count)
    out, at = [], 0
    for k in range(count):
        n = size + (1 if k < extra else 0)
        out.append(tuple(nodes[at:at + n]))
        at += n
    return out


def first_wave(nodes: Sequence[str], mode: str) -> list[tuple[str, ...]]:
    if mode == "pairwise" or len(nodes) < 8:
        return chunks(nodes, len(nodes) // 2)
    return chunks(nodes, 4 if len(nodes) <= 32 else 8)


def reference(tests: Sequence[Test], pending: Sequence[Outcome] = ()) -> float | None:
    """The peers' bandwidth: the median of the upper half of every completed test's (up to half
    the tests may be slow without pulling it down; one fast outlier does not set it)."""
    values = sorted(o.bandwidth for o in [*(t.outcome for t in tests), *pending]
                    if o.completed and o.bandwidth is not None)
    if not values:
        return None
    return statistics.median(values[len(values) // 2:])


def judge(outcome: Outcome, ref: float | None, ratio: float) -> tuple[bool, str]:
    """(passed, why): not completed, or bandwidth under ``ratio`` of the reference, fails."""
    if not outcome.completed:
        return False, "did not complete" + (f": {outcome.detail}" if outcome.detail else "")
    if ref and outcome.bandwidth is not None and outcome.bandwidth < ratio * ref:
        return False, f"bandwidth {100 * outcome.bandwidth / ref:.0f}% of peers"
    return True, "passed" if outcome.bandwidth is None or not ref else \
        f"bandwidth {100 * outcome.bandwidth / ref:.0f}% of peers"


def search(nodes: Sequence[str], run_wave: Runner, *, mode: str = "bisect", ratio: float = 0.5,
           max_tests: int = 0, time_left: Callable[[], float] | None = None) -> Result:
    """Find the nodes that break collectives among ``nodes``; see the module docstring.

    ``run_wave(groups)`` runs one test per group, all at once, and returns their outcomes in order.
    ``max_tests``: at most this many test jobs (0: no bound); ``time_left()``: seconds left of the
    run's budget (a wave is not started with none left).
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    nodes = list(dict.fromkeys(nodes))
    result = Result()
    if len(nodes) < 2:
        result.stopped = "fewer than 2 nodes: no collective to test"
        return result
    good: list[str] = []
    todo: list[tuple[tuple[str, ...], str]] = [(g, "screen") for g in first_wave(nodes, mode)]
    suspects: list[str] = []
    retry: dict[str, str] = {}  # suspect -> the partner of its first, marginal, confirmation
    while todo or suspects:
        # Suspects are confirmed against nodes that passed; without one yet, they wait for the rest.
        wave = list(todo)
        todo = []
        partners = [n for n in good if n not in suspects]
        if suspects and partners:
            for k, s in enumerate(suspects):
                others = [p for p in partners if p != retry.get(s)] or partners
                wave.append(((s, others[k % len(others)]), "confirm"))
            suspects = []
        elif suspects and not wave:
            for s in suspects:
                result.unconfirmed[s] = "no node passed a test to confirm it against"
            break
        why_stop = _out_of_budget(result, len(wave), max_tests, time_left)
        if why_stop:
            result.stopped = why_stop
            for group, purpose in wave:
                for n in (group[:1] if purpose == "confirm" else group):
                    result.unconfirmed.setdefault(n, f"not tested to the end ({why_stop})")
            for s in suspects:
                result.unconfirmed.setdefault(s, f"not tested to the end ({why_stop})")
            break
        result.waves += 1
        outcomes = list(run_wave([g for g, _ in wave]))
        if len(outcomes) != len(wave):
            raise ValueError(f"run_wave returned {len(outcomes)} outcome(s) for {len(wave)} test(s)")
        ref = reference(result.tests, outcomes)
        for (group, purpose), outcome in zip(wave, outcomes):
            passed, why = judge(outcome, ref, ratio)
            result.tests.append(Test(group, outcome, passed, why, result.waves, purpose))
            if passed:
                good.extend(n for n in group if n not in good)
                if purpose == "confirm":
                    result.cleared[group[0]] = f"passed with {group[1]} ({why})"
            elif purpose == "confirm" and (group[0] in retry or _firm(outcome, ref, ratio)):
                result.culprits[group[0]] = why
            elif purpose == "confirm":  # just under the bar, or not completed: once more, with another partner
                retry[group[0]] = group[1]
                suspects.append(group[0])
            elif len(group) <= CONFIRM_AT or mode == "pairwise":
                suspects.extend(n for n in group if n not in suspects)
            else:
                half = (len(group) + 1) // 2
                todo += [(group[:half], "split"), (group[half:], "split")]
    result.reference = reference(result.tests)
    result.passed = [n for n in nodes if n in good and n not in result.culprits]
    for node in list(result.cleared):
        if node in result.culprits:
            del result.cleared[node]
    return result


def _firm(outcome: Outcome, ref: float | None, ratio: float) -> bool:
    """A failure no noise explains: a bandwidth measured under ``FIRM`` of the bar. A test that did
    not complete is never firm alone: a job can fail to start, or its partner die after passing, so
    the suspect is tested once more with another partner before it is named."""
    if not outcome.completed:
        return False
    return not ref or outcome.bandwidth is None or outcome.bandwidth < FIRM * ratio * ref


def _out_of_budget(result: Result, wanted: int, max_tests: int, time_left: Callable[[], float] | None) -> str:
    if max_tests and result.jobs + wanted > max_tests:
        return f"test budget of {max_tests} job(s) spent"
    if time_left is not None and time_left() <= 0:
        return "time budget spent"
    return ""


# -- a simulated fabric, for tests and bench --------------------------------------------------


class Fabric:
    """Nodes, some with a fault (``hang``, ``drop``, ``slow FACTOR``): a collective test over a
    group completes unless a member hangs or drops, at the base bandwidth (with noise) divided
    by the slowest member's factor. Counts the test jobs it ran."""

    def __init__(self, nodes: Sequence[str], faults: dict[str, str], *, base: float = 100.0,
                 noise: float = 0.15, seed: int = 0):
        self.nodes = list(nodes)
        self.faults = dict(faults)
        self.base = base
        self.noise = noise
        self.rng = random.Random(seed)
        self.jobs = 0
        self.waves = 0

    def test(self, group: Sequence[str]) -> Outcome:
        self.jobs += 1
        kinds = [self.faults.get(n, "").split() for n in group]
        if any(k and k[0] == "hang" for k in kinds):
            return Outcome(False, None, "time limit reached (a rank hung)")
        if any(k and k[0] == "drop" for k in kinds):
            return Outcome(False, None, "exit 1 (connection reset by peer)")
        factor = max([float(k[1]) for k in kinds if k and k[0] == "slow"], default=1.0)
        return Outcome(True, self.base / factor * (1 + self.rng.uniform(-self.noise, self.noise)))

    def run_wave(self, groups: Sequence[tuple[str, ...]]) -> list[Outcome]:
        self.waves += 1
        return [self.test(g) for g in groups]


def random_faults(nodes: Sequence[str], bad: int, rng: random.Random) -> dict[str, str]:
    """``bad`` nodes with a fault each: hang, drop, or slow by 4 to 20 times."""
    out = {}
    for node in rng.sample(list(nodes), bad):
        kind = rng.choice(("hang", "slow", "drop"))
        out[node] = f"slow {rng.randint(4, 20)}" if kind == "slow" else kind
    return out
