"""Which node breaks collectives: the search, as a pure function of a test runner.

A rank that hangs in a collective, a slow node or a dropped link reports no XID: the job
fails on the node where the library gave up, not on the culprit. We find it by running
multi-node collective tests on groups of the suspected nodes, in waves of parallel tests
(:func:`search`). A test fails when it did not complete, or when its bus bandwidth is under
the *bar*: the absolute ``floor`` (``[isolate] min_busbw_gbps``), or ``ratio`` of the
reference when that is higher. The reference is the median of the upper half of the tests
that passed the floor, so that slow groups do not set it. A test that *could not run* (not
submitted, never started, the wrong rank count, no bandwidth printed) says nothing about its
nodes: neither a pass nor a failure.

``bisect`` (Azure's): a first wave of 4 groups (8 above 32 nodes); a failing group of more
than 4 nodes is split in halves, recursively; each member of a failing group of 4 or fewer is a
*suspect*. ``pairwise`` (gcm's ``--pairwise-quick``): the first wave is disjoint pairs; the
members of a failing pair are suspects.

How no healthy node is drained:

- A node serves as a partner only after it passed a test at the bar (so against the floor).
- A suspect is tested in pairs with partners, one partner per test, itself not rank 0. Its first
  failure asks for :data:`CONFIRMATIONS` - 1 more, each with a different partner, in one wave.
  It is a culprit only when :data:`CONFIRMATIONS` tests with different partners failed: one
  partner that died, one job that never started, one transient dip cannot name it.
- A suspect that passed once and never failed is cleared; one that failed and passed is tested
  again until it passes ``repeats`` times (cleared) or fails with enough partners (culprit),
  at most ``CONFIRMATIONS + repeats`` tests; then it stays *unconfirmed*.
- The run is ``found`` when it names a culprit; ``inconclusive`` when a suspect stays
  unconfirmed, the search stopped early, or a failed screen is explained by no culprit (every
  suspect of it was cleared: a fault that does not reproduce in pairs); ``ok`` only when every
  test passed. :attr:`Result.unexplained` says which screen failed and with what figures.
- A run *started because jobs failed* (``started_by``: the failed jobs, or the suspects they
  made) never ends ``ok``: when every test passed, the failure did not reproduce, and the run is
  ``inconclusive`` and says so. Unless a culprit was found, a node those jobs point at
  (``suspected``) is not cleared by the screen it passed: it is tested in ``repeats`` pairs with
  different partners first, and cleared only when they all pass (a node that hangs in 30% of its
  tests passes one screen 70% of the time, a screen and two pairs 34%).

Bounded: ``max_tests`` and ``time_left`` are looked at before each wave; a search cut short
names its unconfirmed suspects. :class:`Fabric` simulates a cluster's fabric for tests and
``bench/bench_isolate.py``.
"""

from __future__ import annotations

import random
import re
import statistics
from collections.abc import Sequence
from typing import Callable

from slurm_hooks.values import dataclass, field

MODES = ("bisect", "pairwise")
#: A failing group this small (or smaller) has each member confirmed instead of being split.
CONFIRM_AT = 4
#: Failed tests, each with a different partner that passed, that name a culprit. Two would do
#: against one bad partner; the third keeps a healthy suspect's two transient dips (2% of tests
#: each) from draining it: 8 in a million per suspect instead of 4 in ten thousand.
CONFIRMATIONS = 3
VERDICTS = ("ok", "found", "inconclusive")
#: isolate's reservation and test jobs are named with this (a running or killed run is found by it).
ISOLATE_PREFIX = "slurm-hooks-isolate"
#: An older run's name, ``slurm-hooks-isolate-<start time>``, and how long such a run could last.
_LEGACY_RUN = r"^" + ISOLATE_PREFIX + r"-(\d+)$"
_RUN = r"^" + ISOLATE_PREFIX + r"-(?P<host>[A-Za-z0-9_-]+)-(?P<pid>\d+)-(?P<until>\d+)$"
LEGACY_RUN_S = 4 * 3600.0


@dataclass(frozen=True)
class Outcome:
    """What one collective test job gave: it completed or not, its bus bandwidth (GB/s in isolate).
    ``ran`` False: the test could not run, and says nothing about its nodes."""

    completed: bool
    bandwidth: float | None = None
    detail: str = ""
    job: str = ""
    ran: bool = True


@dataclass(frozen=True)
class Test:
    nodes: tuple[str, ...]
    outcome: Outcome
    passed: bool
    why: str
    wave: int
    purpose: str  # "screen", "split", "retry" (of one that could not run), "rotate", "mix" or "confirm"
    #: False: it could not run, and is neither a pass nor a failure of its nodes
    ran: bool = True


@dataclass
class Result:
    #: node -> the evidence that named it ("bandwidth 12% of peers; failed with n1, n2, n7")
    culprits: dict[str, str] = field(default_factory=dict)
    #: node -> why it is no longer a suspect (passed with its partners)
    cleared: dict[str, str] = field(default_factory=dict)
    #: node -> why it stays a suspect (no partner left, mixed results, budget)
    unconfirmed: dict[str, str] = field(default_factory=dict)
    passed: list[str] = field(default_factory=list)
    tests: list[Test] = field(default_factory=list)
    waves: int = 0
    reference: float | None = None
    floor: float = 0.0
    #: failed screens no culprit explains: "n1,n2,n3,n4 (screen, wave 1): bandwidth 21% of peers"
    unexplained: list[str] = field(default_factory=list)
    #: why the search stopped early ("" when it ran to its end)
    stopped: str = ""
    #: what started the run ("jobs 101, 102 failed on n4"): "" for a plain (preflight) run
    started_by: str = ""

    @property
    def jobs(self) -> int:
        return len(self.tests)

    @property
    def verdict(self) -> str:
        """``found`` (a culprit), ``inconclusive`` (something failed that the search could not pin
        on a node, it could not finish, or the failure that started it did not reproduce) or ``ok``
        (every test of a plain run passed)."""
        if self.culprits:
            return "found"
        if self.unconfirmed or self.stopped or self.unexplained or self.started_by:
            return "inconclusive"
        return "ok"

    @property
    def reproduced(self) -> bool:
        """Did any test that ran fail (whatever came of it)?"""
        return any(t.ran and not t.passed for t in self.tests)

    def line(self) -> str:
        found = ", ".join(f"{n} ({why})" for n, why in sorted(self.culprits.items())) or "no culprit"
        extra = ""
        if self.unconfirmed:
            extra += "; unconfirmed: " + ", ".join(f"{n} ({why})" for n, why in sorted(self.unconfirmed.items()))
        if self.unexplained:
            extra += "; failed, no culprit found: " + "; ".join(self.unexplained)
        if self.stopped:
            extra += f"; stopped: {self.stopped}"
        if self.started_by and not self.culprits:
            if self.reproduced:
                relapsed = sorted({t.nodes[-1] for t in self.tests if t.purpose == "confirm" and t.ran and not t.passed}
                                  & set(self.cleared))
                if relapsed:
                    extra += "; failed once, then passed: " + ", ".join(f"{n} ({self.cleared[n]})" for n in relapsed)
                extra += f"; started by {self.started_by}"
            else:
                extra += (f"; the failure did not reproduce in {self.jobs} test(s): started by {self.started_by}, "
                          "its suspects stay recorded")
        return f"{found}{extra} ({self.jobs} test job(s) in {self.waves} wave(s))"


Runner = Callable[[Sequence[tuple[str, ...]]], Sequence[Outcome]]


def run_name(host: str, pid: int, until: float) -> str:
    """One isolate run's reservation and test jobs: ``slurm-hooks-isolate-<host>-<pid>-<until>``,
    ``until`` the epoch second by which the run is over whatever happens (its reservation ends then)."""
    return f"{ISOLATE_PREFIX}-{_host(host)}-{pid}-{int(until)}"


def _host(host: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", host.split(".")[0])[:40] or "host"


def abandoned(name: str, now: float, host: str, alive: Callable[[int], bool], legacy_s: float = LEGACY_RUN_S) -> str:
    """Why the run that named a reservation (and its jobs) ``name`` is provably over ("" when it may
    still run, or the name is not an isolate's): its end time passed, or it ran on ``host`` (this
    one) and its process is gone. Another host's run is never judged by a process this host cannot
    see; a reused pid only keeps a dead run's leftovers until their end time. An older run's name
    carries its start alone: it is over ``legacy_s`` after it."""
    legacy = re.match(_LEGACY_RUN, name)
    if legacy:
        started = int(legacy.group(1))
        return f"an older isolate's, started {now - started:.0f}s ago" if now - started > legacy_s else ""
    run = re.match(_RUN, name)
    if not run:
        return ""
    until = int(run.group("until"))
    if now > until:
        return f"its run ended {now - until:.0f}s ago"
    if run.group("host") == _host(host) and not alive(int(run.group("pid"))):
        return f"its run (pid {run.group('pid')} on this host) is gone"
    return ""


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


def reference(tests: Sequence[Test], pending: Sequence[Outcome] = (), floor: float = 0.0) -> float | None:
    """The peers' bandwidth: the median of the upper half of the tests that completed at or above
    ``floor`` (up to half the tests may be slow without pulling it down; one fast outlier does not
    set it; a test under the floor never does)."""
    values = sorted(o.bandwidth for o in [*(t.outcome for t in tests), *pending]
                    if o.ran and o.completed and o.bandwidth is not None and o.bandwidth >= floor)
    if not values:
        return None
    return statistics.median(values[len(values) // 2:])


def judge(outcome: Outcome, ref: float | None, ratio: float, floor: float = 0.0) -> tuple[bool | None, str]:
    """(passed, why): None when the test could not run (no bandwidth counts as that); False when it
    did not complete or its bandwidth is under the bar, ``max(floor, ratio x ref)``."""
    if not outcome.ran:
        return None, "could not run" + (f": {outcome.detail}" if outcome.detail else "")
    if not outcome.completed:
        return False, "did not complete" + (f": {outcome.detail}" if outcome.detail else "")
    bw = outcome.bandwidth
    if bw is None:
        return None, "could not run: no bandwidth in its output"
    bar = max(floor, ratio * ref if ref else 0.0)
    figures = []
    if ref:
        figures.append(f"bandwidth {100 * bw / ref:.0f}% of peers")
    if floor and (bw < floor or not ref):
        figures.append(f"busbw {bw:.3g} {'<' if bw < floor else '>='} floor {floor:g}")
    return bw >= bar, ", ".join(figures) or f"busbw {bw:.3g}"


@dataclass
class _Suspect:
    fails: dict[str, str] = field(default_factory=dict)  # partner -> why
    passes: list[str] = field(default_factory=list)
    tried: list[str] = field(default_factory=list)  # every partner it was paired with, could-not-run included
    pending: int = 0
    #: a node the failed jobs that started the run point at: ``repeats`` passes clear it, never one
    watched: bool = False


def search(nodes: Sequence[str], run_wave: Runner, *, mode: str = "bisect", ratio: float = 0.5, floor: float = 0.0,
           repeats: int = 2, max_tests: int = 0, time_left: Callable[[], float] | None = None,
           started_by: str = "", suspected: Sequence[str] = ()) -> Result:
    """Find the nodes that break collectives among ``nodes``; see the module docstring.

    ``run_wave(groups)`` runs one test per group, all at once, and returns their outcomes in order.
    ``floor``: the absolute bar (0: none, the relative bar alone); ``repeats``: passes a suspect
    that once failed, or a ``suspected`` node, needs to be cleared. ``max_tests``: at most this many
    test jobs (0: no bound); ``time_left()``: seconds left of the run's budget (a wave is not
    started with none left). ``started_by``: what failed and started the run ("" for a plain run,
    which alone may end ``ok``); ``suspected``: the nodes of ``nodes`` that failure points at.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    nodes = list(dict.fromkeys(nodes))
    result = Result(floor=floor, started_by=started_by)
    watch = [n for n in dict.fromkeys(suspected) if n in nodes]
    if len(nodes) < 2:
        result.stopped = "fewer than 2 nodes: no collective to test"
        return result
    repeats = max(1, repeats)
    good: list[str] = []
    suspects: dict[str, _Suspect] = {}
    todo: list[tuple[tuple[str, ...], str]] = [(g, "screen") for g in first_wave(nodes, mode)]
    failed_groups: list[tuple[str, ...]] = []  # failing groups that were not split: what a mix re-pairs
    mixed = rotated = rechecked = False
    while True:
        wave = list(todo)
        todo = []
        wave += _confirmations(suspects, good, result, repeats, rechecked)
        if not wave and not suspects and not rotated:
            rotated = True
            wave = _rotation(nodes, result.tests, good)
        if not wave and not rechecked:
            rechecked = True
            if result.culprits:  # a culprit explains the failed jobs: one pass clears, as it does any suspect
                for s, st in suspects.items():
                    if st.watched and st.passes and not st.fails and _open(s, suspects, result):
                        result.cleared[s] = f"passed with {', '.join(st.passes)}"
                        good.append(s)
            else:
                for n in watch:  # passed its screen: not cleared until it passes ``repeats`` pairs
                    if n in good and n not in suspects:
                        good.remove(n)
                        suspects[n] = _Suspect(watched=True)
                wave = _confirmations(suspects, good, result, repeats, rechecked)
        if not wave:
            undecided = [s for s in suspects if _open(s, suspects, result)]
            if undecided and not good and not mixed:
                mixed = True
                wave = [(g, "mix") for g in _mix(failed_groups, undecided)]
            if not wave:
                for s in undecided:
                    st = suspects[s]
                    result.unconfirmed[s] = (f"failed with {len(st.fails)} partner(s), passed with {len(st.passes)}; "
                                             "no other node passed to test it with")
                break
        why_stop = _out_of_budget(result, len(wave), max_tests, time_left)
        if why_stop:
            result.stopped = why_stop
            for group, purpose in wave:
                for n in (group[-1:] if purpose == "confirm" else group):
                    result.unconfirmed.setdefault(n, f"not tested to the end ({why_stop})")
            for s in suspects:
                if _open(s, suspects, result):
                    result.unconfirmed.setdefault(s, f"not tested to the end ({why_stop})")
            break
        result.waves += 1
        outcomes = list(run_wave([g for g, _ in wave]))
        if len(outcomes) != len(wave):
            raise ValueError(f"run_wave returned {len(outcomes)} outcome(s) for {len(wave)} test(s)")
        ref = reference(result.tests, outcomes, floor)
        for (group, purpose), outcome in zip(wave, outcomes):
            passed, why = judge(outcome, ref, ratio, floor)
            result.tests.append(Test(group, outcome, bool(passed), why, result.waves, purpose, passed is not None))
            if purpose == "confirm":
                _confirmed(suspects, result, good, group, passed, why, repeats)
            elif passed:
                good.extend(n for n in group if n not in good)
                for n in group:  # a suspect in a group split further, or re-paired, that passed at the bar
                    if _open(n, suspects, result) and not suspects[n].watched:
                        result.cleared[n] = f"passed in {','.join(group)} ({why})"
            elif passed is None:
                if purpose != "retry":
                    todo.append((group, "retry"))
                else:
                    for n in group:
                        result.unconfirmed.setdefault(n, f"not tested: {why}")
            elif purpose == "rotate":  # the nodes only ever measured as rank 0 are suspects now
                failed_groups.append(group)
                for n in group[1:]:
                    suspects.setdefault(n, _Suspect(watched=n in watch))
                    good.remove(n)
            elif len(group) <= CONFIRM_AT or mode == "pairwise":
                failed_groups.append(group)
                for n in group:
                    suspects.setdefault(n, _Suspect(watched=n in watch))
            else:
                half = (len(group) + 1) // 2
                todo += [(group[:half], "split"), (group[half:], "split")]
        # A suspect with no partner yet, while every other test failed: split its group further.
        if not todo and not good and any(len(g) > 2 for g in failed_groups) and mode == "bisect":
            for g in [g for g in failed_groups if len(g) > 2]:
                failed_groups.remove(g)
                half = (len(g) + 1) // 2
                todo += [(g[:half], "split"), (g[half:], "split")]
    result.reference = reference(result.tests, floor=floor)
    result.passed = [n for n in nodes if n in good and n not in result.culprits]
    for node in list(result.cleared):
        if node in result.culprits:
            del result.cleared[node]
    for t in result.tests:
        if not t.passed and t.ran and t.purpose != "confirm" and not set(t.nodes) & set(result.culprits):
            result.unexplained.append(f"{','.join(t.nodes)} ({t.purpose}, wave {t.wave}): {t.why}")
    return result


def _open(node: str, suspects: dict[str, _Suspect], result: Result) -> bool:
    return node in suspects and node not in result.culprits and node not in result.cleared \
        and node not in result.unconfirmed


def _confirmations(suspects: dict[str, _Suspect], good: list[str], result: Result, repeats: int,
                   final: bool) -> list[tuple[tuple[str, ...], str]]:
    """This wave's pair tests: each open suspect with partners it has not been paired with, the
    partners least used in this wave first (tests sharing a node queue behind each other). A
    suspected node that passed its pair and never failed one waits for the ``final`` waves, where
    no culprit was found: its other ``repeats`` - 1 pairs, all at once."""
    wave: list[tuple[tuple[str, ...], str]] = []
    load = {n: 0 for n in good}
    for s, st in suspects.items():
        if not _open(s, suspects, result):
            continue
        if st.fails and not st.passes:
            want = CONFIRMATIONS - len(st.fails)
        elif st.watched and not st.fails:
            want = repeats - len(st.passes) if final else 1 - len(st.passes)
        else:
            want = 1
        free = sorted((p for p in good if p != s and p not in st.tried and p not in result.culprits
                       and not _open(p, suspects, result)), key=lambda p: load[p])
        for partner in free[:max(0, want)]:
            load[partner] += 1
            st.tried.append(partner)
            st.pending += 1
            wave.append(((partner, s), "confirm"))
    return wave


def _confirmed(suspects: dict[str, _Suspect], result: Result, good: list[str], group: tuple[str, ...],
               passed: bool | None, why: str, repeats: int) -> None:
    partner, s = group
    st = suspects[s]
    st.pending -= 1
    if passed:
        st.passes.append(partner)
    elif passed is False:
        st.fails[partner] = why
    if s in result.culprits or s in result.cleared or st.pending:
        return
    if len(st.fails) >= CONFIRMATIONS:
        first = next(iter(st.fails.values()))
        result.culprits[s] = f"{first}; failed with {', '.join(st.fails)}"
    elif len(st.passes) >= (repeats if st.fails or st.watched else 1):
        result.cleared[s] = f"passed with {', '.join(st.passes)}" + (
            f" (failed with {', '.join(st.fails)})" if st.fails else "")
        if s not in good:
            good.append(s)
    elif len(st.tried) >= CONFIRMATIONS + repeats:
        result.unconfirmed[s] = (f"failed with {', '.join(st.fails) or 'none'}, passed with "
                                 f"{', '.join(st.passes) or 'none'}: neither reproduced")


def _rotation(nodes: Sequence[str], tests: Sequence[Test], good: Sequence[str]) -> list[tuple[tuple[str, ...], str]]:
    """Before a clean run ends ``ok``: one test of the nodes that were only ever rank 0 (a group's
    first), behind a node that was not, so that no node passes on a measurement that ranks skew
    (a star's root, or a slow link seen only from one side)."""
    first_only = [n for n in nodes if n in good and all(t.nodes[0] == n for t in tests if n in t.nodes)]
    lead = [n for n in good if n not in first_only]
    if not first_only or not lead:
        return []
    return [((lead[0], *first_only), "rotate")]


def _mix(failed: Sequence[tuple[str, ...]], undecided: Sequence[str]) -> list[tuple[str, ...]]:
    """New pairs for suspects whose groups all failed: each group's first member with the next
    group's last, so that a pair without a bad node passes and gives partners."""
    groups = [g for g in failed if set(g) & set(undecided)]
    if len(groups) < 2:
        return []
    return [(groups[k][0], groups[(k + 1) % len(groups)][-1]) for k in range(len(groups))]


def _out_of_budget(result: Result, wanted: int, max_tests: int, time_left: Callable[[], float] | None) -> str:
    if max_tests and result.jobs + wanted > max_tests:
        return f"test budget of {max_tests} job(s) spent"
    if time_left is not None and time_left() <= 0:
        return "time budget spent"
    return ""


# -- a simulated fabric, for tests and bench --------------------------------------------------


class Fabric:
    """Nodes, some with a fault, and the queue of exclusive test jobs on them.

    Faults: ``hang`` (the test runs to its time limit), ``drop`` (it fails at once), ``slow F`` (its
    bandwidth divided by F), ``slow-peer F`` (slow F unless it is rank 0, the group's first: a
    star's root), ``flaky P`` (hangs in a share P of its tests). A test completes at the base
    bandwidth (with noise) divided by the slowest member's factor; with ``transient`` a share of all
    tests dips to ``dip`` x that on healthy nodes too.

    Tests of one wave that share a node run one after another, in order, as Slurm runs exclusive
    jobs; ``timeout_from`` "start" times each from its start (as isolate does), "submit" from the
    wave's start, so a job queued behind a hung one is cancelled. Counts jobs, waves and the
    simulated wall time (in test lengths; a hung test lasts ``timeout`` of them)."""

    def __init__(self, nodes: Sequence[str], faults: dict[str, str], *, base: float = 100.0,
                 noise: float = 0.15, seed: int = 0, transient: float = 0.0, dip: float = 0.25,
                 timeout: float = 4.0, timeout_from: str = "start"):
        self.nodes = list(nodes)
        self.faults = dict(faults)
        self.base = base
        self.noise = noise
        self.transient, self.dip = transient, dip
        self.timeout, self.timeout_from = timeout, timeout_from
        self.rng = random.Random(seed)
        self.jobs = 0
        self.waves = 0
        self.wall = 0.0

    def test(self, group: Sequence[str]) -> tuple[Outcome, float]:
        """One test's outcome and how long it held its nodes."""
        self.jobs += 1
        factor = 1.0
        for rank, node in enumerate(group):
            kind = self.faults.get(node, "").split()
            if not kind:
                continue
            if kind[0] == "hang" or (kind[0] == "flaky" and self.rng.random() < float(kind[1])):
                return Outcome(False, None, "time limit reached (a rank hung)"), self.timeout
            if kind[0] == "drop":
                return Outcome(False, None, "exit 1 (connection reset by peer)"), 0.5
            if kind[0] == "slow" or (kind[0] == "slow-peer" and rank > 0):
                factor = max(factor, float(kind[1]))
        bw = self.base / factor * (1 + self.rng.uniform(-self.noise, self.noise))
        if self.transient and self.rng.random() < self.transient:
            bw *= self.dip
        return Outcome(True, bw), 1.0

    def run_wave(self, groups: Sequence[tuple[str, ...]]) -> list[Outcome]:
        self.waves += 1
        free: dict[str, float] = {}
        out, end = [], 0.0
        for g in groups:
            start = max((free.get(n, 0.0) for n in g), default=0.0)
            outcome, took = self.test(g)
            if self.timeout_from == "submit" and start + took > self.timeout:
                outcome = Outcome(False, None, f"cancelled {self.timeout:g} after submission (queued {start:g})")
                took = max(0.0, self.timeout - start)
            for n in g:
                free[n] = start + took
            end = max(end, start + took)
            out.append(outcome)
        self.wall += end
        return out


def random_faults(nodes: Sequence[str], bad: int, rng: random.Random, kinds: Sequence[str] = ()) -> dict[str, str]:
    """``bad`` nodes with a fault each: one of ``kinds``, or hang, drop, or slow by 4 to 20 times."""
    out = {}
    for node in rng.sample(list(nodes), bad):
        if kinds:
            out[node] = rng.choice(list(kinds))
            continue
        kind = rng.choice(("hang", "slow", "drop"))
        out[node] = f"slow {rng.randint(4, 20)}" if kind == "slow" else kind
    return out
