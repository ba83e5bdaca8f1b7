"""``slurm-hooks isolate``: find the node that breaks collectives, through Slurm, and drain it.

The worst multi-node failures report no XID (a rank hangs in a collective, a node is slow, a
link drops): the job fails where the library gave up, not on the culprit. ``isolate`` takes the
suspected nodes out of scheduling in one maintenance reservation of its own (as the sweep does:
``Flags=MAINT``, which Slurm refuses while a job holds a node; busy nodes are skipped and named),
runs waves of multi-node collective test jobs there as root, lets
:func:`slurm_hooks.remedy.culprit.search` pick the groups and judge them, and drains only a
confirmed culprit, ``slurm-hooks: collective test failed on n5 (bandwidth 12% of peers; failed
with n1, n2, n7) [isolate]``, with every test in the evidence file.

A test job holds every GPU of its nodes: its step asks for them (``srun --gres=gpu:G``, G from
the nodes' GRES; a step of an ``--exclusive`` job gets none it does not ask for) and runs one
rank per GPU, with ``NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1`` so that every test's traffic
crosses the NICs (the same in screens and pairs: one bar judges both). The command is nccl-tests'
``all_reduce_perf`` where installed, launched through Slurm's MPI plugin (``[isolate] mpi``),
else the all-reduce of :mod:`slurm_hooks.hooks.collective`, or ``[isolate] command``. Its output
must name as many ranks as nodes x GPUs (nccl-tests' ``# Rank`` lines, or ``ranks=N``) and a
bus bandwidth: a test that does not could not run, and counts neither for nor against its nodes.

A run started because jobs failed (``--job``, ``--after-jobs``, or nodes this host's epilogs
suspected) never ends ok: when every test passed it is inconclusive, "the failure did not
reproduce in N test(s)", naming what started it; the suspects stay recorded, and the nodes
suspected are tested in ``[isolate] repeats`` pairs before they are cleared. Only a plain run
(no failure behind it) ends ok.

Bounded: each test job is cancelled ``test_timeout`` after it *started* (a job queued behind
another on a shared partner is not cut short; its ``--time`` is the backstop), one never started
by the end of the budget is cancelled as could-not-run; the search starts no wave past
``budget`` and runs at most ``max_tests`` jobs. The reservation is deleted whatever happens
(failure, SIGINT/SIGTERM). A run's reservation and test jobs carry its name,
``slurm-hooks-isolate-<host>-<pid>-<until>`` (``until``: when the run is over whatever happens,
and its reservation ends): a run on another host may be live, so a run deletes only leftovers
that are provably abandoned, past their end time or of a process of this host that is gone
(:func:`slurm_hooks.remedy.culprit.abandoned`), never another live run's. A per-host lock keeps
two runs of one host from overlapping.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import socket
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from slurm_hooks import REASON_PREFIX, fsutil
from slurm_hooks.errors import EXIT_INCONCLUSIVE, EXIT_OK, EXIT_UNHEALTHY, SlurmHooksError
from slurm_hooks.hooks import sweep as sweeping
from slurm_hooks.remedy import culprit, suspect
from slurm_hooks.slurm import JobState
from slurm_hooks.values import dataclass, field

if TYPE_CHECKING:
    from slurm_hooks.remedy.wiring import Wiring

#: Our reservations and test jobs are named with this, then the run's host, pid and end
#: (:func:`slurm_hooks.remedy.culprit.run_name`); a killed run's leftovers are found by it.
PREFIX = culprit.ISOLATE_PREFIX
#: What a test job may take beyond its time limit to be queued and started in our reservation.
START_MARGIN_S = 15.0
POLL_S = 0.5
_BUSBW = (re.compile(r"\bbusbw=([0-9.]+)"), re.compile(r"Avg bus bandwidth\s*:\s*([0-9.]+)"))
#: nccl-tests list every rank of the run (``#  Rank  3 Group  0 Pid 1234 on node2 device  1 ...``);
#: the built-in test says ``ranks=N``.
_RANK_LINE = re.compile(r"^(?:\[[^]]*\]<\w+>:)?#\s*Rank\s+(\d+)\s", re.M)
_RANKS = re.compile(r"\branks=(\d+)")
#: What every test's ranks get: NVLink and shared memory off, so that the traffic crosses the NICs (gcm's).
NCCL_ENV = ("NCCL_P2P_DISABLE=1", "NCCL_SHM_DISABLE=1")
#: What srun and slurmstepd say when a task exits and the step is ended (``--kill-on-bad-exit``):
#: after the rank's own last words, which are what a failed test's why quotes.
_LAUNCHER_LINE = re.compile(r"srun: |slurmstepd(-\S+)?: error: \*\*\* STEP \S+ ON \S+ CANCELLED AT ")


class IsolateBusy(SlurmHooksError):
    """Another isolate holds the lock."""


def reason(node: str, why: str) -> str:
    return f"{REASON_PREFIX} collective test failed on {node} ({why}) [isolate]"


@dataclass
class Summary:
    nodes: list[str]
    skipped: dict[str, str] = field(default_factory=dict)
    result: culprit.Result = field(default_factory=culprit.Result)
    drained: dict[str, str] = field(default_factory=dict)
    not_drained: dict[str, str] = field(default_factory=dict)
    evidence: str = ""
    seconds: float = 0.0

    @property
    def verdict(self) -> str:
        """``ok``, ``found`` or ``inconclusive`` (:attr:`slurm_hooks.remedy.culprit.Result.verdict`)."""
        return self.result.verdict

    @property
    def ok(self) -> bool:
        return self.verdict == "ok"

    def exit_code(self) -> int:
        return {"ok": EXIT_OK, "found": EXIT_UNHEALTHY}.get(self.verdict, EXIT_INCONCLUSIVE)

    def line(self) -> str:
        parts = [f"isolate: {len(self.nodes)} node(s), {self.verdict}: {self.result.line()}"]
        if self.drained:
            parts.append("drained " + ", ".join(sorted(self.drained)))
        if self.not_drained:
            parts.append("not drained: " + ", ".join(f"{n} ({why})" for n, why in sorted(self.not_drained.items())))
        if self.skipped:
            parts.append("skipped: " + ", ".join(f"{n} ({why})" for n, why in sorted(self.skipped.items())))
        return "; ".join(parts) + f" in {self.seconds:.1f}s"

    def to_dict(self) -> dict[str, Any]:
        r = self.result
        return {"nodes": self.nodes, "verdict": self.verdict, "started_by": r.started_by,
                "skipped": self.skipped, "culprits": r.culprits,
                "drained": self.drained, "unexplained": r.unexplained, "floor": r.floor,
                "not_drained": self.not_drained, "unconfirmed": r.unconfirmed, "cleared": r.cleared,
                "stopped": r.stopped, "jobs": r.jobs, "waves": r.waves, "reference": r.reference,
                "seconds": round(self.seconds, 2), "evidence": self.evidence,
                "tests": [{"nodes": list(t.nodes), "wave": t.wave, "purpose": t.purpose, "passed": t.passed, "ran": t.ran,
                           "why": t.why, "job": t.outcome.job, "completed": t.outcome.completed,
                           "bandwidth": t.outcome.bandwidth, "detail": t.outcome.detail} for t in r.tests]}


def test_argv(w: Wiring, test_timeout: float) -> list[str]:
    """One rank's argv: ``[isolate] command``, else all_reduce_perf where installed (one GPU per
    rank), else the built-in all-reduce (which gives up on a peer a little before the job is cancelled)."""
    cfg = w.config.isolate
    if cfg.command:
        return list(cfg.command)
    perf = w.config.sweep.all_reduce_perf
    if os.access(perf, os.X_OK):
        return [perf, "-b", "8M", "-e", "256M", "-f", "2", "-g", "1"]
    from slurm_hooks.hooks import collective

    return [cfg.python, os.path.abspath(collective.__file__), "--timeout", f"{max(2.0, test_timeout * 0.8):g}"]


def gres_gpus(gres: str) -> int:
    """The GPUs in a node's ``Gres=`` (``gpu:8``, ``gpu:h100:4(S:0-1),shard:16``): 0 when none."""
    total = 0
    for item in re.sub(r"\([^)]*\)", "", gres or "").split(","):
        parts = item.strip().split(":")
        if parts[0] == "gpu" and len(parts) >= 2 and parts[-1].isdigit():
            total += int(parts[-1])
    return total


def step_argv(argv: Sequence[str], gpus: int, mpi: str, order: Sequence[str] = ()) -> list[str]:
    """The test's step: every GPU of each node asked for, one rank per GPU (one per node without
    GPUs), NVLink and shared memory off; all_reduce_perf through Slurm's MPI plugin ``mpi``.

    ``order``: the group's nodes as the search means them, its first holding rank 0 (a suspect is
    never rank 0, whose bandwidth all_reduce_perf reports and whose store every rank waits on).
    Slurm lays a job's tasks out in its own node order (slurm.conf's), whatever order sbatch's
    ``--nodelist`` names them in; ``--distribution=arbitrary`` with a ``--nodelist`` that names each
    task's node, in order, keeps ours (srun's man page: the tasks are laid out in the list's order)."""
    per = max(1, gpus)
    if order:
        step = ["srun", "--kill-on-bad-exit=1", f"--ntasks={per * len(order)}", "--distribution=arbitrary",
                "--nodelist=" + ",".join(n for n in order for _ in range(per))]
    else:
        step = ["srun", "--kill-on-bad-exit=1", f"--ntasks-per-node={per}"]
    if gpus:
        step += [f"--gres=gpu:{gpus}", "--gpus-per-task=1"]
    if argv and os.path.basename(argv[0]) == "all_reduce_perf" and mpi:
        step.append(f"--mpi={mpi}")
    return [*step, "--export=ALL," + ",".join(NCCL_ENV), *argv]


def isolate(w: Wiring, nodes: Sequence[str], *, mode: str, ratio: float, test_timeout: float, budget: float,
            max_tests: int, argv: Sequence[str] | None = None, drain: bool = True, progress: Any = None,
            started_by: str = "", suspected: Sequence[str] = ()) -> Summary:
    """Find and drain the nodes among ``nodes`` that break collectives; see the module docstring.
    Never raises for a node; always deletes its reservation. :class:`IsolateBusy` when another runs.
    ``started_by``: the failed jobs (or suspects) behind the run, "" for a plain run; ``suspected``:
    the nodes they point at."""
    say = progress or (lambda line: None)
    t0 = time.monotonic()
    summary = Summary(list(dict.fromkeys(nodes)))
    summary.result.started_by = started_by
    if not hasattr(w.slurm, "jobs_named"):
        raise IsolateBusy(f"isolate runs its test jobs through Slurm's commands: set [slurm] backend = \"scontrol\" "
                          f"(this config's is {getattr(w.slurm, 'name', '?')})")
    lock = w.state_path("isolate.lock")
    with fsutil.try_locked(lock, dir_mode=0o700) as mine:
        if not mine:
            raise IsolateBusy(f"another isolate is running (it holds {lock})")
        cleanup_leftovers(w, say, legacy_s=max(culprit.LEGACY_RUN_S, lifetime(budget, test_timeout)))
        previous = signal.signal(signal.SIGTERM, sweeping.raise_interrupted)
        try:
            _run(w, summary, mode=mode, ratio=ratio, test_timeout=test_timeout, budget=budget, t0=t0,
                 max_tests=max_tests, argv=list(argv or test_argv(w, test_timeout)), drain=drain, say=say,
                 suspected=list(suspected))
        finally:
            signal.signal(signal.SIGTERM, previous)
    summary.seconds = time.monotonic() - t0
    if started_by:
        suspect.isolate_ended(w, summary.nodes, summary.verdict)
    w.audit.write("action", node=w.node, action="isolate", target=",".join(summary.nodes),
                  result=summary.verdict,
                  duration_s=round(summary.seconds, 4), detail=summary.line(), evidence=summary.evidence)
    return summary


def wait_idle(w: Wiring, nodes: Sequence[str], timeout: float, say: Any = None) -> list[str]:
    """Wait until no job holds any of ``nodes`` (a failed job's epilogs still running, the next
    job of the queue): returns those still busy after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        busy = []
        for node in nodes:
            try:
                if any(j.active for j in w.slurm.jobs_on_node(node)):
                    busy.append(node)
            except SlurmHooksError:
                busy.append(node)
        if not busy or time.monotonic() > deadline:
            return busy
        if say:
            say(f"waiting for {', '.join(busy)} to be idle")
        time.sleep(max(POLL_S, 2.0))


def idle_peers(w: Wiring, partition: str, exclude: Sequence[str], count: int) -> list[str]:
    """Up to ``count`` idle, in-service nodes of ``partition`` not in ``exclude``: references the
    suspects are confirmed against (two suspects alone cannot tell which of them is bad)."""
    if count <= 0 or not partition:
        return []
    try:
        candidates = w.slurm.partition_nodes(partition)
    except SlurmHooksError:
        return []
    out = []
    for node in candidates:
        if node in exclude:
            continue
        try:
            if not sweeping.node_busy(w, node, w.slurm.node(node)):
                out.append(node)
        except SlurmHooksError:
            continue
        if len(out) >= count:
            break
    return out


def lifetime(budget: float, test_timeout: float) -> float:
    """How long a run lasts at most: no wave after ``budget``, whose jobs may wait until
    ``budget + test_timeout`` to start and then run ``test_timeout`` and the margin; a minute to drain."""
    return budget + 2 * test_timeout + START_MARGIN_S + 60.0


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # someone else's (EPERM): alive
    return True


def cleanup_leftovers(w: Wiring, say: Any, *, legacy_s: float = culprit.LEGACY_RUN_S, host: str = "",
                      now: float | None = None) -> list[str]:
    """Cancel the test jobs and delete the reservation of every isolate run that is provably over
    (:func:`slurm_hooks.remedy.culprit.abandoned`); a run that may be live, on this host or another,
    keeps both. Test jobs named after an older run's bare prefix are cancelled only while no such
    older run may be live. Returns the reservations deleted."""
    host = host or socket.gethostname()
    now = time.time() if now is None else now
    deleted = []
    try:
        runs = [r for r in w.slurm.reservations() if r.startswith(PREFIX + "-")]
        over = {r: why for r in runs for why in [culprit.abandoned(r, now, host, pid_alive, legacy_s)] if why}
        names = list(over)
        if not any(r[len(PREFIX) + 1:].isdigit() for r in runs if r not in over):
            names.append(PREFIX)  # an older run's jobs carry the prefix alone
        left = {name: w.slurm.jobs_named(name) for name in names}
        jobs = [j for js in left.values() for j in js]
        for job in jobs:
            sweeping.cancel_quietly(w, job)
        if jobs:
            say(f"cancelled test job(s) {', '.join(jobs)}, left by an earlier isolate")
            deadline = time.monotonic() + 30.0
            while time.monotonic() < deadline and any(w.slurm.jobs_named(n) for n in left if left[n]):
                time.sleep(POLL_S)
        for name, why in over.items():
            w.slurm.delete_reservation(name)
            deleted.append(name)
            say(f"deleted {name}, left by an earlier isolate ({why})")
    except SlurmHooksError as exc:
        say(f"could not look for leftover reservations: {exc}")
    return deleted


def _run(w: Wiring, summary: Summary, *, mode: str, ratio: float, test_timeout: float, budget: float, t0: float,
         max_tests: int, argv: list[str], drain: bool, say: Any, suspected: list[str]) -> None:
    usable, gpus = [], {}
    for node in summary.nodes:
        try:
            info = w.slurm.node(node)
            busy = sweeping.node_busy(w, node, info)
        except SlurmHooksError as exc:
            busy = f"cannot read the node: {exc}"
        if busy:
            summary.skipped[node] = busy
        else:
            usable.append(node)
            gpus[node] = gres_gpus(info.gres)
    if len(usable) < 2:
        summary.result.stopped = f"{len(usable)} idle node(s): a collective test needs 2"
        return
    life = lifetime(budget, test_timeout)
    name = culprit.run_name(socket.gethostname(), os.getpid(), time.time() + life)
    try:
        _reserve(w, name, usable, math.ceil(life / 60.0))
    except SlurmHooksError as exc:
        summary.result.stopped = f"no maintenance reservation: {exc}"
        return
    say(f"reserved {', '.join(usable)} ({name})")
    waves = _Waves(w, name, argv, test_timeout, _output_dir(w), say, gpus, deadline=t0 + budget + test_timeout)
    try:
        summary.result = culprit.search(usable, waves.run_wave, mode=mode, ratio=ratio, max_tests=max_tests,
                                        floor=w.config.isolate.min_busbw_gbps, repeats=w.config.isolate.repeats,
                                        time_left=lambda: budget - (time.monotonic() - t0),
                                        started_by=summary.result.started_by, suspected=suspected)
    except KeyboardInterrupt:
        waves.cancel_running()
        raise
    finally:
        try:
            w.slurm.delete_reservation(name)
        except SlurmHooksError as exc:
            say(f"could not delete reservation {name}: {exc} (the next isolate deletes it)")
    summary.evidence = _write_evidence(w, summary)
    for node, why in summary.result.culprits.items():
        _drain(w, summary, node, why, drain, say)


def _reserve(w: Wiring, name: str, nodes: list[str], minutes: int) -> None:
    """One MAINT reservation of ``nodes`` for root (Slurm refuses it while a job holds one of them)."""
    w.slurm.create_reservation(name, nodes, max(1, minutes))


class _Waves:
    """Runs one wave of test jobs (one per group) in the reservation and turns each into an Outcome."""

    def __init__(self, w: Wiring, reservation: str, argv: list[str], test_timeout: float, out_dir: str, say: Any,
                 gpus: dict[str, int], deadline: float):
        self.w, self.reservation, self.argv, self.test_timeout = w, reservation, argv, test_timeout
        self.out_dir, self.say, self.gpus, self.deadline = out_dir, say, gpus, deadline
        self.running: list[str] = []

    def run_wave(self, groups: Sequence[tuple[str, ...]]) -> list[culprit.Outcome]:
        submitted: list[str | culprit.Outcome] = []
        for group in groups:
            try:
                job = self._submit(group)
            except SlurmHooksError as exc:
                submitted.append(culprit.Outcome(False, None, f"not submitted: {exc}", ran=False))
                continue
            self.running.append(job)
            submitted.append(job)
        self.say(f"wave: {'; '.join(','.join(g) for g in groups)}")
        done: dict[str, str] = {}
        waiting = {s for s in submitted if isinstance(s, str)}
        started: dict[str, float] = {}
        cut: dict[str, str] = {}
        while waiting:
            try:
                infos = {j.ref: j for j in self.w.slurm.jobs(sorted(waiting))}
            except SlurmHooksError:
                infos = {}
            now = time.monotonic()
            for job in sorted(waiting):
                info = infos.get(job)
                if info is not None and info.finished:
                    done[job] = info.base_state
                elif info is not None and not info.pending:
                    started.setdefault(job, now)  # its limit runs from here, not from its submission
                    if now - started[job] <= self.test_timeout + START_MARGIN_S:
                        continue
                    cut[job] = f"still running {self.test_timeout:g}s after it started: cancelled"
                elif now > self.deadline:
                    cut[job] = "never started within the run's budget: cancelled"
                else:
                    continue
                if job in cut:
                    sweeping.cancel_quietly(self.w, job)
                    done[job] = JobState.TIMEOUT
                waiting.discard(job)
            if waiting:
                time.sleep(POLL_S)
        self.running = []
        out = []
        for group, s in zip(groups, submitted):
            if isinstance(s, culprit.Outcome):
                out.append(s)
                continue
            outcome = self._outcome(s, done[s], cut.get(s, ""), self._ranks(group), started.get(s) is not None)
            self.say(f"  {','.join(group)}: job {s} {'completed' if outcome.completed else 'failed'}"
                     + (f", busbw {outcome.bandwidth:g}" if outcome.bandwidth is not None else "")
                     + (f": {outcome.detail}" if outcome.detail else ""))
            out.append(outcome)
        return out

    def _gpus(self, group: Sequence[str]) -> int:
        return min(self.gpus.get(n, 0) for n in group)

    def _ranks(self, group: Sequence[str]) -> int:
        return len(group) * max(1, self._gpus(group))

    def _submit(self, group: tuple[str, ...]) -> str:
        gpus = self._gpus(group)
        return self.w.slurm.submit(step_argv(self.argv, gpus, self.w.config.isolate.mpi, group), name=self.reservation,
                                   node=list(group), reservation=self.reservation,
                                   minutes=math.ceil(self.test_timeout / 60.0), ntasks_per_node=max(1, gpus),
                                   gpus_per_node=gpus,
                                   chdir=self.out_dir, output=os.path.join(self.out_dir, PREFIX + "-%j.out"))

    def _outcome(self, job: str, state: str, cut: str, ranks: int, started: bool) -> culprit.Outcome:
        text = ""
        path = os.path.join(self.out_dir, f"{PREFIX}-{job}.out")
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                text = fh.read()[-200000:]
        except OSError:
            pass
        if cut:
            return culprit.Outcome(False, None, cut, job, ran=started)
        if state != JobState.COMPLETED:
            return culprit.Outcome(False, None, ended_why(state, text), job)
        return judge_output(text, ranks, job)

    def cancel_running(self) -> None:
        for job in self.running:
            sweeping.cancel_quietly(self.w, job)


def ended_why(state: str, text: str) -> str:
    """A test job that ended unsuccessfully, in its ranks' last words: the last line of its output
    that srun or slurmstepd did not write (they speak last, once one rank's exit ended the step)."""
    lines = [x.strip() for x in text.splitlines() if x.strip() and not _LAUNCHER_LINE.match(x)]
    return f"ended {state}" + (f": {lines[-1][:160]}" if lines else "")


def judge_output(text: str, ranks: int, job: str = "") -> culprit.Outcome:
    """A completed test's output: its rank count must be ``ranks`` (nccl-tests run without MPI are N
    one-node runs, each printing its own ranks and its NVLink bandwidth), then its bus bandwidth.
    Anything else could not run: it is no evidence about the nodes."""
    listed = [int(r) for r in _RANK_LINE.findall(text)]
    said = [int(r) for r in _RANKS.findall(text)]
    if listed:
        if len(set(listed)) != len(listed) or len(listed) != ranks:
            return culprit.Outcome(True, None, f"could not run: {len(set(listed))} rank(s) listed "
                                               f"{len(listed)} time(s), expected {ranks}", job, ran=False)
    elif said:
        if said[-1] != ranks:
            return culprit.Outcome(True, None, f"could not run: ranks={said[-1]}, expected {ranks}", job, ran=False)
    else:
        return culprit.Outcome(True, None, f"could not run: no rank count in its output (expected {ranks})", job,
                               ran=False)
    for pattern in _BUSBW:
        found = pattern.findall(text)
        if found:
            return culprit.Outcome(True, float(found[-1]), "", job)
    return culprit.Outcome(True, None, "could not run: no bandwidth in its output", job, ran=False)


def _output_dir(w: Wiring) -> str:
    path = w.config.isolate.output_dir or w.state_path("isolate")
    os.makedirs(path, mode=0o755, exist_ok=True)
    return path


def _write_evidence(w: Wiring, summary: Summary) -> str:
    path = os.path.join(_output_dir(w), f"run-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.json")
    try:
        fsutil.atomic_write(path, json.dumps(summary.to_dict(), indent=1), mode=0o644)
    except OSError:
        return ""
    return path


def _drain(w: Wiring, summary: Summary, node: str, why: str, drain: bool, say: Any) -> None:
    text = reason(node, why)
    started = time.monotonic()
    if not drain or not w.policy.may_drain:
        summary.not_drained[node] = "monitor-only ([check] drain = false)" if drain else "--no-drain"
        w.audit.write("action", node=node, action="drain", target=node, result="not-acted", reason=text,
                      detail=summary.not_drained[node], evidence=summary.evidence, why="isolate")
        return
    try:
        w.slurm.drain(node, text)
    except SlurmHooksError as exc:
        summary.not_drained[node] = str(exc)
        w.audit.write("action", node=node, action="drain", target=node, result="skipped", reason=text,
                      error=str(exc), evidence=summary.evidence, why="isolate")
        say(f"{node}: not drained: {exc}")
        return
    summary.drained[node] = text
    w.audit.write("action", node=node, action="drain", target=node, result="ok", reason=text,
                  duration_s=round(time.monotonic() - started, 4), evidence=summary.evidence, why="isolate",
                  detail="; ".join(f"{','.join(t.nodes)}: {t.why}" for t in summary.result.tests if node in t.nodes))
    say(f"{node}: drained: {text}")
