"""``slurm-hooks sweep``: deep validation of idle nodes through Slurm itself.

Faults that only a long diagnostic finds (a GPU that answers NVML but fails DCGM's memory or
PCIe tests) stay in service until a job dies on them; no hook has the time to look. The sweep
takes idle nodes out of scheduling one wave at a time, in a maintenance reservation of its own
(``scontrol create reservation ... Flags=MAINT``, which Slurm refuses on a node with a job),
and runs the validation there as a root job (:func:`validate_here`, ``slurm-hooks
sweep-node``): ``dcgmi diag -r LEVEL``, and nvbandwidth / nccl-tests' ``all_reduce_perf`` on
the node where installed, and the per-node fabric tests (:mod:`slurm_hooks.hooks.nodefabric`:
all_reduce_perf through the NICs, ib_write_bw GPU-direct loopback per HCA) against their
floors; one with a floor set that could not run leaves the node ``unverified``, never passed. The job drains a failing node itself, with our reason and the
failing test's action (``slurm-hooks: DCGM diag L2 failed on GPU 3 [reset]``), so the node's
own hooks and the repair ladder know the drain; a passing node simply gets its reservation
back. The job writes its verdict into its AdminComment (accounting keeps it); the sweep reads
it there. Its reservations are deleted whatever happens (failure, timeout, SIGINT/SIGTERM),
and a lock keeps two sweeps from overlapping (safe from cron or a systemd timer).
"""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from slurm_hooks import REASON_PREFIX, fsutil
from slurm_hooks.errors import PermanentError, SlurmHooksError
from slurm_hooks.models import Action, Finding, Severity
from slurm_hooks.values import dataclass, field

if TYPE_CHECKING:
    from slurm_hooks.remedy.wiring import Wiring

#: Our reservations and jobs are named with this (a crashed sweep's leftovers are found by it).
PREFIX = "slurm-hooks-sweep"
#: The verdict line a validation job leaves in its AdminComment.
COMMENT = f"{REASON_PREFIX} sweep"
#: How often the sweep looks at its jobs.
POLL_S = 1.0
#: What the sweep waits beyond a job's time limit before it gives up on it.
MARGIN_S = 60.0
VERDICTS = ("passed", "failed", "unverified", "skipped")


@dataclass
class NodeResult:
    node: str
    verdict: str
    detail: str = ""
    job: str = ""
    seconds: float = 0.0

    def line(self) -> str:
        took = f" in {self.seconds:.1f}s" if self.seconds else ""
        job = f" (job {self.job})" if self.job else ""
        return f"{self.node}: {self.verdict}{took}{job}" + (f": {self.detail}" if self.detail else "")


@dataclass
class Summary:
    level: int
    nodes: list[NodeResult] = field(default_factory=list)
    seconds: float = 0.0

    def of(self, verdict: str) -> list[NodeResult]:
        return [r for r in self.nodes if r.verdict == verdict]

    def line(self) -> str:
        parts = []
        for verdict in VERDICTS:
            found = self.of(verdict)
            names = ", ".join(r.node + (f": {r.detail}" if verdict in ("failed", "skipped") else "") for r in found)
            parts.append(f"{len(found)} {verdict}" + (f" ({names})" if names else ""))
        return f"sweep L{self.level}: {len(self.nodes)} node(s): " + ", ".join(parts) + f" in {self.seconds:.1f}s"

    def to_dict(self) -> dict[str, Any]:
        return {"level": self.level, "seconds": round(self.seconds, 2),
                "counts": {v: len(self.of(v)) for v in VERDICTS},
                "nodes": [dataclasses.asdict(r) for r in self.nodes]}

    @property
    def ok(self) -> bool:
        """Every node validated passed, and at least one was validated: a sweep that validated
        nothing (every node skipped, a typo in ``--nodes``) is not a success."""
        return bool(self.of("passed")) and not self.of("failed") and not self.of("unverified")


class SweepBusy(SlurmHooksError):
    """Another sweep holds the lock."""


class Interrupted(KeyboardInterrupt):
    """SIGTERM (a systemd timer's stop, a cron kill): handled as Ctrl-C is."""


def parallel(share: str, chosen: int) -> int:
    """How many nodes at once: a count, or a share of the nodes chosen (at least one)."""
    from slurm_hooks.config import parse_share

    value, percent = parse_share(share)
    return max(1, math.floor(chosen * value / 100)) if percent else value


def sweep(w: Wiring, nodes: Sequence[str], *, level: int, max_parallel: str, job_timeout: float,
          progress: Any = None, partition: str = "") -> Summary:
    """Validate ``nodes`` (idle ones; the others are skipped and named) in waves; never raises for
    a node, always deletes its reservations. :class:`SweepBusy` when another sweep runs.
    ``partition``: the validation jobs go there (else to Slurm's default partition, which may not
    hold the nodes: then every job is refused)."""
    say = progress or (lambda line: None)
    t0 = time.monotonic()
    summary = Summary(level)
    lock = w.state_path("sweep.lock")
    with fsutil.try_locked(lock, dir_mode=0o700) as mine:
        if not mine:
            raise SweepBusy(f"another sweep is running (it holds {lock})")
        _cleanup_leftovers(w, say)
        previous = signal.signal(signal.SIGTERM, raise_interrupted)
        try:
            width = parallel(max_parallel, len(nodes))
            todo = list(dict.fromkeys(nodes))
            while todo:
                wave, todo = todo[:width], todo[width:]
                for result in _wave(w, wave, level, job_timeout, say, partition):
                    summary.nodes.append(result)
                    say(result.line())
        finally:
            signal.signal(signal.SIGTERM, previous)
    summary.seconds = time.monotonic() - t0
    w.audit.write("action", node=w.node, action="sweep", target=",".join(nodes), result="ok" if summary.ok else
                  "failed", duration_s=round(summary.seconds, 4), level=level, detail=summary.line())
    return summary


def raise_interrupted(signum: int, frame: Any) -> None:
    """A SIGTERM handler: the run stops as on Ctrl-C (its ``finally`` cancels and deletes what it made)."""
    raise Interrupted(f"signal {signum}")


def _cleanup_leftovers(w: Wiring, say: Any) -> None:
    """Reservations a killed sweep (SIGKILL, a crash) left: under the lock, none is in use."""
    try:
        for name in w.slurm.reservations():
            if name.startswith(PREFIX + "-"):
                w.slurm.delete_reservation(name)
                say(f"deleted {name}, left by an earlier sweep")
    except SlurmHooksError as exc:
        say(f"could not look for leftover reservations: {exc}")


def _wave(w: Wiring, nodes: list[str], level: int, job_timeout: float, say: Any,
          partition: str = "") -> Iterator[NodeResult]:
    started: dict[str, tuple[str, str, float]] = {}  # node -> (reservation, job, t0)
    results: dict[str, NodeResult] = {}
    try:
        for node in nodes:
            outcome = _start(w, node, level, job_timeout, partition)
            if isinstance(outcome, NodeResult):
                results[node] = outcome
            else:
                started[node] = outcome
                say(f"{node}: validating (job {outcome[1]} in reservation {outcome[0]})")
        deadline = time.monotonic() + job_timeout + MARGIN_S
        waiting = dict(started)
        while waiting:
            for node, (_, job, t0) in list(waiting.items()):
                done = _finished(w, job)
                if done is not None:
                    results[node] = _judge(w, node, job, done, time.monotonic() - t0)
                    del waiting[node]
            if not waiting:
                break
            if time.monotonic() > deadline:
                for node, (_, job, t0) in waiting.items():
                    cancel_quietly(w, job)
                    results[node] = NodeResult(node, "unverified", f"validation job still running after "
                                               f"{job_timeout + MARGIN_S:g}s: cancelled", job, time.monotonic() - t0)
                break
            time.sleep(POLL_S)
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (Interrupted)
        for node, (_, job, t0) in started.items():
            if node not in results:
                cancel_quietly(w, job)
                results[node] = NodeResult(node, "unverified", "sweep interrupted: job cancelled", job,
                                           time.monotonic() - t0)
        raise
    finally:
        for node, (reservation, _, _) in started.items():
            try:
                w.slurm.delete_reservation(reservation)
            except SlurmHooksError as exc:
                say(f"{node}: could not delete reservation {reservation}: {exc}")
    for node in nodes:
        yield results[node]


def _start(w: Wiring, node: str, level: int, job_timeout: float,
           partition: str = "") -> NodeResult | tuple[str, str, float]:
    """Reserve an idle node and submit its validation job; a NodeResult when it is skipped."""
    t0 = time.monotonic()
    try:
        info = w.slurm.node(node)
        busy = node_busy(w, node, info)
        if busy:
            return NodeResult(node, "skipped", busy)
        reservation = f"{PREFIX}-{node}-{int(time.time())}"
        minutes = math.ceil((job_timeout + MARGIN_S) / 60.0)
        try:
            w.slurm.create_reservation(reservation, node, minutes)
        except SlurmHooksError as exc:
            return NodeResult(node, "skipped", f"no maintenance reservation: {exc}")
        jobs = [j.ref for j in w.slurm.jobs_on_node(node) if j.active]
        if jobs:  # a job started between our look and the reservation
            w.slurm.delete_reservation(reservation)
            return NodeResult(node, "skipped", f"running job(s) {', '.join(jobs)}")
        argv = _job_argv(w, level, job_timeout)
        minutes, own = math.ceil(job_timeout / 60.0), partition or _partitions(info)
        try:
            try:
                job = w.slurm.submit(argv, name=PREFIX, node=node, reservation=reservation, minutes=minutes,
                                     partition=own)
            except PermanentError:  # Slurm refused it (not: did not answer)
                if partition or not own:
                    raise
                # One of the node's partitions refuses us (AllowAccounts, ...) and Slurm rejects the whole
                # list: Slurm's default partition, which may well hold the node.
                job = w.slurm.submit(argv, name=PREFIX, node=node, reservation=reservation, minutes=minutes)
        except SlurmHooksError as exc:
            w.slurm.delete_reservation(reservation)
            return NodeResult(node, "unverified", f"validation job not submitted: {exc}")
    except SlurmHooksError as exc:
        return NodeResult(node, "skipped", f"cannot read the node: {exc}")
    return reservation, job, t0


def _partitions(info: Any) -> str:
    """The node's own partitions (``Partitions=gpu,debug``), for a sweep given ``--nodes``: Slurm's
    default partition may not hold the node, and a job sent there is refused. "" when Slurm does not say."""
    return ",".join(p.strip() for p in str(info.extra.get("Partitions") or "").split(",") if p.strip())


def node_busy(w: Wiring, node: str, info: Any) -> str:
    """Why a node is not ours to take ("" when it is idle and in service)."""
    jobs = [j.ref for j in w.slurm.jobs_on_node(node) if j.active]
    if jobs:
        return f"running job(s) {', '.join(jobs)}"
    if info.drained or info.reason:
        return f"not in service ({info.state}{': ' + info.reason if info.reason else ''})"
    if not info.idle:
        return f"not idle ({info.state})"
    return ""


def _job_argv(w: Wiring, level: int, job_timeout: float) -> list[str]:
    from slurm_hooks.runner import python_argv

    args = ["sweep-node", "--level", str(level), "--timeout", f"{job_timeout:g}"]
    if w.config.path:
        args += ["--config", w.config.path]
    return python_argv("slurm_hooks.entry", *args)


def _finished(w: Wiring, job: str) -> str | None:
    """The job's final state, or None while it is queued or runs."""
    try:
        found = w.slurm.jobs([job])
    except SlurmHooksError:
        return None
    if not found:
        return "GONE"
    info = found[0]
    return info.base_state if info.finished else None


def _judge(w: Wiring, node: str, job: str, state: str, seconds: float) -> NodeResult:
    """The job's verdict from its AdminComment; a job that left none did not validate anything."""
    comment = ""
    try:
        comment = w.slurm.admin_comment(job)
    except SlurmHooksError:
        pass
    for line in reversed(comment.split(";")):
        line = line.strip()
        if line.startswith(COMMENT):
            verdict, _, detail = line[len(COMMENT):].strip().partition(": ")
            verdict = verdict.split()[-1] if verdict else ""
            if verdict in ("passed", "failed", "unverified"):
                return NodeResult(node, verdict, detail, job, seconds)
    return NodeResult(node, "unverified", f"validation job ended {state} without a verdict", job, seconds)


def cancel_quietly(w: Wiring, job: str) -> None:
    """Cancel one of our jobs; one Slurm no longer knows (or cannot cancel now) is not an error."""
    try:
        w.slurm.cancel(job)
    except SlurmHooksError:
        pass


# -- on the node, in the validation job ------------------------------------------------


def validate_here(w: Wiring, level: int, timeout: float, job: str = "") -> tuple[str, str]:
    """Run the validation on this node (inside the sweep's job): the GPU diagnostic at ``level``, then
    nvbandwidth and all_reduce_perf where installed, each recorded in the audit log. A failing
    node is drained with our reason. Returns (verdict, detail) and leaves them in the job's
    AdminComment."""
    from slurm_hooks.hooks import healthcheck
    from slurm_hooks.models import Context
    from slurm_hooks.remedy import drain, repair
    from slurm_hooks.remedy.outcome import Outcome

    w.start_deadline(timeout)
    t0 = time.monotonic()
    report = healthcheck.judge(w, Context.CHECK, acknowledge=False, dcgm_level=level,
                               dcgm_timeout=max(1.0, w.time_left(timeout) - 10.0))
    from slurm_hooks import probes

    name, command = probes.diagnostic(w.config, w.node)
    verdict, detail = repair.verdict(report, level, name)
    verdict = "passed" if verdict == "ok" else verdict
    _record(w, f"{command} {level}", verdict, time.monotonic() - t0, detail, job)
    extra: list[Finding] = []
    for name, argv in _extra_tests(w):
        t1 = time.monotonic()
        result, text = _run_extra(argv, max(1.0, w.time_left(timeout) - 5.0))
        _record(w, name, result, time.monotonic() - t1, text, job)
        if result == "failed":
            extra.append(Finding("sweep", Severity.FAIL, Action.DRAIN, f"{name} failed: {text}",
                                 summary=f"{name} failed"))
    missed = []
    if w.config.sweep.fabric_tests:
        from slurm_hooks.hooks import nodefabric

        t1 = time.monotonic()
        for test in nodefabric.run_tests(w, max(1.0, min(300.0, w.time_left(timeout) - 5.0))):
            _record(w, test.name, test.result, time.monotonic() - t1, test.detail, job,
                    **({"figure": test.figure, "unit": test.unit} if test.figure is not None else {}))
            t1 = time.monotonic()
            if test.result == "failed":
                extra.append(Finding("sweep", Severity.FAIL, Action.DRAIN, f"{test.name} failed: {test.detail}",
                                     summary=f"{test.name} below its floor"))
            elif test.result == "not-run" and test.floor > 0:  # a floor set and no figure: not a pass
                missed.append(f"{test.name} not run: {test.detail}")
    if extra:
        report = dataclasses.replace(report, findings=report.findings + tuple(extra))
        verdict, detail = "failed", "; ".join(f.message for f in extra) if verdict != "failed" else detail
    elif missed and verdict == "passed":
        verdict, detail = "unverified", "; ".join(missed)
    if verdict == "failed":
        outcome = Outcome()
        if not w.policy.may_drain:  # monitor-only: found, recorded, not acted on
            drain.not_acted(w, report, outcome, job=job)
            detail = f"not drained ([check] drain = false): {drain.drain_reason(report)}"
        else:
            drain.drain(w, report, outcome, job=job)
        if outcome.drained:
            detail = f"drained: {drain.drain_reason(report)}"
    if job:
        line = f"{COMMENT} L{level} {verdict}: {detail}"[:400]
        try:
            from slurm_hooks.slurm import join_admin_comment

            joined = join_admin_comment(w.slurm.admin_comment(job), line.replace(";", ","))
            if joined is not None:
                w.slurm.set_admin_comment(job, joined)
        except SlurmHooksError as exc:
            detail += f" (verdict not written to the job's AdminComment: {exc})"
    return verdict, detail


def _record(w: Wiring, test: str, result: str, seconds: float, detail: str, job: str, **more: Any) -> None:
    w.audit.write("action", node=w.node, action="sweep-test", target=w.node, result=result,
                  duration_s=round(seconds, 4), test=test, detail=detail, **({"jobs": [job]} if job else {}), **more)


def _extra_tests(w: Wiring) -> list[tuple[str, list[str]]]:
    cfg = w.config.sweep
    tests = []
    if os.access(cfg.nvbandwidth, os.X_OK):
        tests.append(("nvbandwidth", [cfg.nvbandwidth]))
    if os.access(cfg.all_reduce_perf, os.X_OK):
        tests.append(("all_reduce_perf", [cfg.all_reduce_perf, "-b", "8", "-e", "256M", "-f", "2", "-g",
                                          str(max(1, w.config.expectations_for(w.node).gpus or 1))]))
    return tests


def _run_extra(argv: list[str], timeout: float) -> tuple[str, str]:
    from slurm_hooks.errors import CommandError, CommandTimeout
    from slurm_hooks.runner import run_command

    try:
        done = run_command(argv, timeout, check=False)
    except CommandTimeout:
        return "unverified", f"did not finish within {timeout:g}s"
    except CommandError as exc:
        return "unverified", f"could not run: {exc}"
    if done.returncode != 0:
        lines = [x for x in (done.stderr or done.stdout).splitlines() if x.strip()]
        return "failed", f"exit {done.returncode}" + (f": {lines[-1].strip()[:200]}" if lines else "")
    return "passed", "exit 0"
