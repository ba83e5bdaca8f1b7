"""The watcher's answer to a job that asks whether this node is fit: NVIDIA Resiliency Extension's
``ft_launcher`` asks before each rendezvous (``--ft-node-health-check-endpoint``, the contract in
:mod:`slurm_hooks.interop.nvhcd`), so that a job healing itself in place leaves a node we judge
faulty instead of restarting its ranks on it.

What the answer says, from the node's current verdict:

- **Our drain** (its record on disk, one read): a node we took out is unhealthy, in our reason's
  words, whatever the asker's GPUs (unless the latest verdict, newer than the drain, puts every
  fault on GPUs the asker does not hold).
- **The latest verdict**: the watcher's own runs (an XID, a port down) and, when that is older than
  ``[interop] nvrx_max_age``, a judgement made for the asker: one snapshot judged by the checks the
  watcher runs on an event (XIDs, lost GPUs, ECC, row remapping, the driver's recovery action),
  without the node-wide readings that count across runs (links, hysteresis: the health check's),
  and none while a repair worker holds the GPUs. A finding that would take the node out is
  unhealthy, unless it was judged against a configured value (``[expect]``: a wrong value there
  fails every node at once, which the drain guard exists to catch; our drain still counts) or the
  node side is monitor-only (``[check] drain = false``: the answer says what it would have said).
- **The asker's GPUs**, where the request names them (``--gpus 0,1`` as NVML indexes or GPU UUIDs,
  or ``--job <id>``: the GPUs Slurm gave that job here): only faults on those GPUs, and the
  node's own, count. ft_launcher names none, so it hears about the whole node.

Bounded: an answer waits for a new judgement at most ``[interop] nvrx_wait`` seconds and never
past the asker's own deadline (less a reserve for the reply); then it answers from the last
verdict and says how old that is. No verdict at all, and no drain of ours, is a healthy answer
that says so: a node is never refused for want of an answer (NVRx itself counts a service that
cannot answer as healthy).
"""

from __future__ import annotations

import threading
import time

from slurm_hooks.errors import SlurmHooksError
from slurm_hooks.interop import nvhcd
from slurm_hooks.models import Context, Finding, Report
from slurm_hooks.remedy import gpumap, repairs
from slurm_hooks.remedy.drain import drain_reason
from slurm_hooks.remedy.ownership import DrainMarker, MarkerUnreadable, load_marker
from slurm_hooks.remedy.requeue import findings_on
from slurm_hooks.remedy.wiring import Wiring
from slurm_hooks.values import dataclass, replace

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from slurm_hooks.xid.history import XidState

#: What an answer keeps of the asker's deadline for itself (the reply, one audit line): a quarter
#: of it, at most this.
RESERVE_S = 1.5


@dataclass(frozen=True)
class Verdict:
    """One judgement of the whole node, and when it was made."""

    report: Report
    #: ``time.time()`` when the judgement began.
    at: float
    #: ``"asked"`` (judged for an asker) or ``"watch"`` (the watcher's own run).
    source: str


class Verdicts:
    """The node's latest verdict; one older than ``max_age`` is judged again, one judgement at a
    time, in a thread of its own (an asker waits for it only as long as it can)."""

    def __init__(self, judge: Callable[[], Report | None], max_age: float,
                 log: Callable[[str], None] = lambda _: None, clock: Callable[[], float] = time.time):
        self.judge, self.max_age, self.log, self.clock = judge, max_age, log, clock
        self._lock = threading.Lock()
        self._latest: Verdict | None = None
        self._done: threading.Event | None = None
        self._said = ""

    def latest(self) -> Verdict | None:
        return self._latest

    def offer(self, report: Report, source: str, at: float | None = None) -> None:
        """Keep ``report`` as the verdict unless a later one is already kept."""
        verdict = Verdict(report, self.clock() if at is None else at, source)
        with self._lock:
            if self._latest is None or verdict.at >= self._latest.at:
                self._latest = verdict

    def fresh(self, wait: float) -> Verdict | None:
        """The latest verdict, judged again first when it is older than ``max_age`` and the new
        judgement ends within ``wait`` seconds; else the last one, however old."""
        latest = self._latest
        if latest is not None and self.clock() - latest.at <= self.max_age:
            return latest
        self.refresh().wait(max(wait, 0.0))
        return self._latest

    def refresh(self) -> threading.Event:
        """Start a judgement unless one is under way; the event is set when it ends."""
        with self._lock:
            if self._done is not None and not self._done.is_set():
                return self._done
            done = self._done = threading.Event()
        threading.Thread(target=self._judge, args=(done,), name="nvhcd-judge", daemon=True).start()
        return done

    def _judge(self, done: threading.Event) -> None:
        started = self.clock()
        try:
            report = self.judge()
            if report is not None:
                self.offer(report, "asked", at=started)
            self._said = ""
        except Exception as exc:  # noqa: BLE001 - an asker gets the last verdict; the next ask tries again
            text = f"slurm-hooks watch: judging the node for NVRx failed: {type(exc).__name__}: {exc}"
            if text != self._said:
                self.log(text)
            self._said = text
        finally:
            done.set()


def judge_node(w: Wiring, history: Callable[[], XidState]) -> Report | None:
    """The judgement an asker gets when the last verdict is old (see the module's docstring);
    ``None`` while a repair worker holds the GPUs (its reset must not meet our probe)."""
    from slurm_hooks.hooks import healthcheck

    if repairs.repair_under_way(w):
        return None
    return healthcheck.judge(w, Context.WATCH, acknowledge=False, history=history(), node_wide=False)


@dataclass(frozen=True)
class Asked:
    """What a request names of the asker: its job, or its GPUs (NVML indexes or UUIDs)."""

    job: str = ""
    gpus: tuple[str, ...] = ()

    @classmethod
    def parse(cls, args: Sequence[str]) -> Asked:
        """``--job ID`` / ``--job=ID`` and ``--gpus A,B`` / ``--gpus=A,B``; anything else (NVRx's own
        ``--no-slurm --group prolog ...``) is not ours to read."""
        found: dict[str, str] = {}
        it = iter(args)
        for arg in it:
            name, eq, value = arg.partition("=")
            if name in ("--job", "--gpus"):
                found[name] = value if eq else next(it, "")
        gpus = tuple(t.strip() for t in found.get("--gpus", "").split(",") if t.strip())
        return cls(job=found.get("--job", "").strip(), gpus=gpus)


class NodeHealth:
    """Answers ``RunHealthCheck`` for this node (``answer`` is what :func:`nvhcd.serve` calls)."""

    def __init__(self, w: Wiring, verdicts: Verdicts, clock: Callable[[], float] = time.time):
        self.w, self.verdicts, self.clock = w, verdicts, clock

    def answer(self, args: list[str], left: float | None) -> nvhcd.Answer:
        cfg = self.w.config.interop
        budget = cfg.nvrx_wait if left is None else max(0.0, min(cfg.nvrx_wait, left - min(left / 4, RESERVE_S)))
        until = time.monotonic() + budget
        verdict = self.verdicts.fresh(budget)
        gpus, scope = self._gpus(Asked.parse(args), verdict, until)
        try:
            marker: DrainMarker | None = load_marker(self.w)
        except MarkerUnreadable as exc:
            marker = DrainMarker(reason=f"slurm-hooks: our drain's record is unreadable ({exc})")
        said = decide(self.w.node, verdict, marker, gpus, scope, monitor_only=self.w.policy.monitor_only,
                      now=self.clock(), max_age=cfg.nvrx_max_age)
        if not said.healthy:
            self.w.audit.write("nvrx", node=self.w.node, healthy=False, reason=said.message, scope=scope,
                               failed_checks=list(said.failed_checks), verdict_age_s=said.details.get("verdict_age_s"),
                               message=f"answered NVRx: unhealthy ({scope}): {said.message}")
        return said

    def _gpus(self, asked: Asked, verdict: Verdict | None, until: float) -> tuple[tuple[int, ...] | None, str]:
        """The asker's GPUs as NVML indexes (``None``: the whole node) and how the answer names them."""
        if asked.gpus:
            snap = verdict.report.snapshot if verdict is not None else None
            by_uuid = {g.uuid.lower(): g.index for g in snap.gpus if g.uuid} if snap is not None else {}
            out = []
            for token in asked.gpus:
                index = int(token) if token.isdigit() else by_uuid.get(token.lower())
                if index is None:
                    return None, f"node (GPU {token} unknown here)"
                out.append(index)
            return tuple(sorted(set(out))), f"GPUs {_fmt(out)}"
        if asked.job:
            if time.monotonic() >= until:
                return None, f"node (no time left to ask Slurm for job {asked.job}'s GPUs)"
            try:
                held = self.w.slurm.bounded(until).job_gpus(asked.job, self.w.node)
            except SlurmHooksError as exc:
                return None, f"node (job {asked.job}'s GPUs unknown: {exc})"
            gmap = gpumap.cached(self.w) if held else None
            if held is None or gmap is None or not gmap.known:
                return None, f"node (job {asked.job}'s GPUs unknown)"
            nvml = tuple(gpumap.nvml_of(gmap, held))
            return nvml, f"job {asked.job} (GPUs {_fmt(nvml)})"
        return None, "node"


def decide(node: str, verdict: Verdict | None, marker: DrainMarker | None, gpus: tuple[int, ...] | None,
           scope: str, *, monitor_only: bool, now: float, max_age: float) -> nvhcd.Answer:
    """The answer (see the module's docstring): a pure function of what was gathered."""
    age = None if verdict is None else max(0.0, now - verdict.at)
    details = {"node": node, "scope": scope, "verdict_age_s": None if age is None else round(age, 1),
               "verdict_source": None if verdict is None else verdict.source}
    stale = "" if age is None or age <= max_age else f" (verdict {age:.0f} s old: a new judgement did not finish in time)"
    at_fault = _at_fault(verdict, gpus)
    if marker is not None:
        if (gpus is not None and verdict is not None and verdict.at >= marker.ts
                and verdict.report.drain_findings() and not at_fault):
            return nvhcd.Answer(True, f"{node} is drained by us ({marker.reason}), not for {scope}{stale}",
                                details={**details, "drained": marker.reason})
        checks = tuple(f.line() for f in at_fault) or (marker.reason,)
        return nvhcd.Answer(False, marker.reason + stale, checks, {**details, "drained": marker.reason})
    if at_fault:
        reason = drain_reason(replace(verdict.report, findings=at_fault)) if verdict is not None else ""
        if monitor_only:
            return nvhcd.Answer(True, f"monitor-only ([check] drain = false): would be unhealthy: {reason}{stale}",
                                details=details)
        return nvhcd.Answer(False, reason + stale, tuple(f.line() for f in at_fault), details)
    if verdict is None:
        return nvhcd.Answer(True, f"{node}: no verdict yet, and no drain of ours", details=details)
    return nvhcd.Answer(True, f"{node}: no fault found ({scope}){stale}", details=details)


def _at_fault(verdict: Verdict | None, gpus: tuple[int, ...] | None) -> tuple[Finding, ...]:
    if verdict is None:
        return ()
    return tuple(f for f in findings_on(verdict.report, gpus) if not f.config_based)


def _fmt(gpus: Sequence[int]) -> str:
    return ",".join(str(g) for g in sorted(set(gpus))) or "none"


class Service:
    """The answer served on its socket, with the verdicts the watcher's runs add to."""

    def __init__(self, server: nvhcd.Server, verdicts: Verdicts):
        self.server, self.verdicts = server, verdicts

    def stop(self) -> None:
        self.server.stop()


def start(w: Wiring, judge: Callable[[], Report | None], log: Callable[[str], None]) -> Service | None:
    """Serve the answer on ``[interop] nvrx_socket``; ``None`` when that is "" (off), or when it
    cannot be served (said in one line: the watcher runs on without it)."""
    cfg = w.config.interop
    if not cfg.nvrx_socket:
        return None
    try:
        nvhcd.require()
    except nvhcd.Unavailable as exc:
        log(f"slurm-hooks watch: [interop] nvrx_socket is set, but {exc}: running without the NVRx health answer")
        return None
    verdicts = Verdicts(judge, cfg.nvrx_max_age, log=log)
    health = NodeHealth(w, verdicts)
    try:
        server = nvhcd.serve(cfg.nvrx_socket, health.answer, cfg.nvrx_group, on_error=log)
    except SlurmHooksError as exc:
        log(f"slurm-hooks watch: cannot serve the NVRx health answer: {exc}: running without it")
        return None
    verdicts.refresh()  # the first verdict, before anyone asks
    log(f"slurm-hooks watch: answering NVRx's node health check on {cfg.nvrx_socket}")
    return Service(server, verdicts)
