"""The watcher: react to an XID within seconds instead of at the next health check.

Sources deliver :class:`XidEvent` objects: NVML XID events on real nodes (the
kernel log's ``NVRM: Xid`` lines where the driver has no event sets), on AMD
nodes the amdgpu driver's kernel lines with amdsmi's events beside them, the sim
backend's injected events in tests and rehearsals. A critical XID runs the same
remediation as the health check. Each event is acted on once: its key is
remembered in the XID history, which survives restarts; events that arrived
while the watcher was down are handled at start. A remediation that failed for a
transient reason (slurmctld down) stays pending on disk; a retry thread finishes
it with backoff while the watcher goes on judging new events.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TYPE_CHECKING, Callable, Protocol

from slurm_hooks.errors import SlurmHooksError
from slurm_hooks.hooks import healthcheck
from slurm_hooks.models import Action, Context, Urgency, XidEvent
from slurm_hooks.remedy import pending
from slurm_hooks.remedy.wiring import Wiring
from slurm_hooks.severity import UNKNOWN_XID, Rule, xid_rule_key
from slurm_hooks.xid import catalog as xid_catalog

if TYPE_CHECKING:
    from slurm_hooks.hooks.nodehealth import Service
    from slurm_hooks.models import Report
    from slurm_hooks.observe.notify import Notifier
    from slurm_hooks.xid.catalog import XidInfo
    from slurm_hooks.xid.history import XidHistory

OnEvent = Callable[[XidEvent], None]


def _to_stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class Source(Protocol):
    def backlog(self) -> list[XidEvent]: ...

    def follow(self, stop: threading.Event, on_event: OnEvent) -> None: ...


class SimSource:
    """Polls the node's sim state file (each injected XID has a sequence number) and its kernel log."""

    def __init__(self, sim_dir: str, node: str, poll: float):
        self.sim_dir, self.node, self.poll = sim_dir, node, poll
        self._delivered: set[str] = set()

    def _events(self) -> list[XidEvent]:
        from slurm_hooks.probes import sim

        try:
            state = sim.read(self.sim_dir, self.node)
        except SlurmHooksError:
            return []
        out = [event for gpu in state["gpus"] for event in sim.events_of(gpu)]
        try:  # the driver's lines in the sim's kernel log (an AMD node's faults), once each
            once: dict[str, XidEvent] = {}
            for events in sim.kernel_events(self.sim_dir, self.node, state).values():
                for e in events:
                    once.setdefault(e.key, e)
            out += once.values()
        except (OSError, SlurmHooksError):
            pass  # the health check's probe says the log is unread
        return sorted(out, key=lambda e: e.seq or 0)

    def backlog(self) -> list[XidEvent]:
        events = self._events()
        self._delivered.update(e.key for e in events)
        return events

    def follow(self, stop: threading.Event, on_event: OnEvent) -> None:
        while not stop.wait(self.poll):
            for event in self._events():
                if event.key not in self._delivered:
                    self._delivered.add(event.key)
                    on_event(event)


class KmsgSource:
    """The kernel log's XIDs, each tied to its GPU here, as the health check's probe ties them, so
    that one line is one event under one key everywhere; a burst of lines is one event.

    The PCI bus id -> GPU map comes from the identities the probe keeps for this boot (``gpu_map``,
    probes.identity: a GPU fallen off the bus keeps its address there), else from NVML itself
    (``ask_nvml``), read again when a line names a bus id the map lacks.
    """

    def __init__(self, path: str, poll: float, gpu_map: str = "",
                 ask_nvml: Callable[[], dict[str, tuple[int, str]]] | None = None):
        from slurm_hooks.probes import kmsg

        self.path, self.poll, self.gpu_map = path, poll, gpu_map
        self._ask_nvml = ask_nvml
        self._coalescer = kmsg.Coalescer()
        self._gpus: dict[str, tuple[int, str]] = {}

    def _assign(self, events: list[XidEvent]) -> list[XidEvent]:
        from slurm_hooks.probes import kmsg

        if any(e.pci_bus_id and kmsg.normalize_pci(e.pci_bus_id) not in self._gpus for e in events):
            from slurm_hooks.probes.identity import bus_map

            self._gpus = (bus_map(self.gpu_map) if self.gpu_map else {}) or self._nvml_map()
        return kmsg.assign_gpus(events, self._gpus)

    def _nvml_map(self) -> dict[str, tuple[int, str]]:
        if self._ask_nvml is None:
            from slurm_hooks.probes.nvml import read_gpu_map

            self._ask_nvml = read_gpu_map
        return self._ask_nvml()

    def backlog(self) -> list[XidEvent]:
        from slurm_hooks.probes import kmsg

        return self._assign(kmsg.read_xids(self.path, coalescer=self._coalescer))

    def follow(self, stop: threading.Event, on_event: OnEvent) -> None:
        from slurm_hooks.probes import kmsg

        kmsg.follow(self.path, stop, lambda event: on_event(self._assign([event])[0]), poll=self.poll,
                    coalescer=self._coalescer)


class FirstWorking:
    """NVML events where the driver supports them, else the kernel log: one source, never both,
    so that one XID is never seen twice under two keys."""

    def __init__(self, primary: Source, fallback: Source, log: Callable[[str], None]):
        self.primary, self.fallback, self.log = primary, fallback, log
        self._use_fallback = False

    def backlog(self) -> list[XidEvent]:
        """What happened while nobody listened: NVML keeps no history, the kernel log does."""
        return self.primary.backlog() + self.fallback.backlog()

    def follow(self, stop: threading.Event, on_event: OnEvent) -> None:
        if not self._use_fallback:
            try:
                self.primary.follow(stop, on_event)
                return
            except SlurmHooksError as exc:
                if not _unsupported(exc):
                    raise
                self.log(f"slurm-hooks watch: NVML XID events unavailable ({exc}); reading the kernel log")
                self._use_fallback = True
        self.fallback.follow(stop, on_event)


def _unsupported(exc: SlurmHooksError) -> bool:
    from slurm_hooks.probes import nvml_errors

    return isinstance(exc, (nvml_errors.NotSupported, nvml_errors.NoPermission))


#: How long the side source waits before it listens again after a failure.
BESIDE_RETRY_S = 10.0


class Alongside:
    """The kernel log (``main``) and, beside it in a thread of its own, a GPU library's events that
    are not the kernel's lines (``beside``: amdsmi's). The kernel log is the one that must not
    stop: the side source failing is said (once per failure) and retried every
    :data:`BESIDE_RETRY_S`; one that cannot work here at all (``unavailable``) is said once and
    left, the kernel log alone telling the driver's events. What "cannot work here" is the side
    source's ``unavailable`` (an exception class)."""

    def __init__(self, main: Source, beside: Source, log: Callable[[str], None], retry_s: float = BESIDE_RETRY_S):
        self.main, self.beside, self.log = main, beside, log
        self.unavailable: type[Exception] | tuple[()] = getattr(beside, "unavailable", ())
        self.retry_s = retry_s
        self._thread: threading.Thread | None = None
        self.gave_up = False

    def backlog(self) -> list[XidEvent]:
        return self.main.backlog() + self.beside.backlog()

    def follow(self, stop: threading.Event, on_event: OnEvent) -> None:
        if not self.gave_up and (self._thread is None or not self._thread.is_alive()):
            self._thread = threading.Thread(target=self._listen, args=(stop, on_event), name="gpu-events",
                                            daemon=True)
            self._thread.start()
        self.main.follow(stop, on_event)

    def _listen(self, stop: threading.Event, on_event: OnEvent) -> None:
        said = ""
        while not stop.is_set():
            try:
                self.beside.follow(stop, on_event)
                return
            except self.unavailable as exc:
                self.log(f"slurm-hooks watch: GPU library events unavailable ({exc}); the kernel log alone")
                self.gave_up = True
                return
            except Exception as exc:  # noqa: BLE001 - the side source must never end the watcher
                text = f"slurm-hooks watch: GPU library events failed: {type(exc).__name__}: {exc}; retrying"
                if text != said:
                    self.log(text)
                said = text
            stop.wait(self.retry_s)

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)


def default_source(w: Wiring, log: Callable[[str], None] | None = None) -> Source:
    """The sim's events; else the GPU library's events with the kernel log: NVML's XID events in its
    place where they work, a library whose events are not the kernel's lines (amdsmi's) beside it."""
    cfg = w.config
    poll = cfg.watch.poll_interval
    if cfg.gpu.backend == "sim":
        return SimSource(cfg.gpu.sim_dir, w.node, poll)
    from slurm_hooks import probes
    from slurm_hooks.probes.identity import store_path

    kernel = KmsgSource(cfg.watch.kmsg, poll, gpu_map=store_path(cfg.state.dir, w.node))
    library, beside = probes.library_events(cfg, poll)
    if beside:
        return Alongside(kernel, library, log or _to_stderr)
    return FirstWorking(library, kernel, log or _to_stderr)


#: How often the retry thread looks for a pending action (one failed ``open`` when there is none).
RETRY_POLL_S = 1.0
#: How long a stopping watcher waits for a retry under way (every Slurm call in it is bounded;
#: systemd's stop timeout, 90 s by default, is well above).
RETRY_JOIN_S = 30.0
#: How often the watcher reads the InfiniBand ports' state (a port down is seen within this).
LINK_POLL_S = 1.0
#: How often the watcher asks Slurm about its node while our drain holds it (a person's resume is
#: seen within this): one ``scontrol show node`` per node held, none on a node we do not hold. At
#: 5 s, 100 nodes held at once cost slurmctld 20 such RPCs a second; a fleet's quiet hours, none.
RESUME_POLL_S = 5.0
#: A node seen back in service is looked at again this much later with our drain's record unchanged:
#: our own resume (the health check's, the repair's) lets go of the record right after it resumes.
RESUME_CONFIRM_S = 0.5


def _went_down(last: dict[str, str], now: dict[str, str]) -> list[str]:
    """Ports up at the last poll that are now down, or gone (an adapter lost: the check counts the
    ports against what is expected); a state that could not be read ("/...") is not a port down."""
    up = "ACTIVE/LinkUp"
    return sorted(p for p, s in last.items() if s.startswith(up)
                  and (p not in now or not (now[p].startswith("/") or now[p].startswith(up))))


class Watcher:
    """``history`` (this node's XID history) and ``catalog`` (the XID catalogue's lookup) are
    seams for tests; each event reads the history once, looks its code up once, and goes
    through the engine at most once."""

    def __init__(self, w: Wiring, source: Source, log: Callable[[str], None] | None = None,
                 retry_poll: float = RETRY_POLL_S, history: XidHistory | None = None,
                 catalog: Callable[[int], XidInfo | None] = xid_catalog.lookup, resume_poll: float = RESUME_POLL_S):
        self.w = w
        self.source = source
        self.history = history if history is not None else healthcheck.xid_history(w)
        self.catalog = catalog
        self.log = log or _to_stderr
        self.retry_poll = retry_poll
        self.resume_poll = resume_poll
        self._lock = threading.Lock()
        #: Set once the port poller has its first reading (what a port "went down" from).
        self.polling_links = threading.Event()
        #: The node-health answer NVRx asks ([interop] nvrx_socket), while it is served.
        self.health: Service | None = None

    def handle(self, event: XidEvent) -> None:
        """Act on one event unless it was acted on before (by this or an earlier run)."""
        with self._lock:
            state = self.history.load()
            if state.error:
                self.log(f"slurm-hooks watch: {state.error}")
            if state.seen(event.key) or event.key in state.acked():
                return
            # A driver event with a row of its own (``rule``: an amdgpu line) is no XID: no catalogue.
            info = self.catalog(event.code) if not event.rule else None
            rule = self._rule(event, info)
            action = rule.action or Action.WARN
            where = f"GPU {event.gpu}" if event.gpu is not None else (event.pci_bus_id or "node")
            what = event.rule or f"XID {event.code}"
            self.log(f"slurm-hooks watch: {what} on {where} -> {action.value} ({rule.urgency.value})")
            if action.takes_node_out and rule.urgency is not Urgency.WATCH:
                started = time.monotonic()

                def lookup(code: int) -> XidInfo | None:
                    return info if code == event.code else self.catalog(code)

                report, outcome = healthcheck.run(self.w, context=Context.WATCH, follow="thread", events=[event],
                                                  history=state, xid_lookup=lookup)
                self._judged(report)
                said = {"rule": event.rule} if event.rule else {"xid": event.code}
                self.w.audit.write("watch", node=self.w.node, **said, gpu=event.gpu, event=event.key,
                                   drained=outcome.drained, requeued=outcome.requeued, signalled=outcome.signalled,
                                   failed=outcome.failed,
                                   duration_s=round(time.monotonic() - started, 4))
            state.mark_seen([event.key])
            try:
                state.save()  # the events judged and this one seen, in one write
            except SlurmHooksError as exc:
                self.log(f"slurm-hooks watch: {exc}")

    def _judged(self, report: Report) -> None:
        """A run of ours judged the node: the answer NVRx asks for starts from it."""
        if self.health is not None:
            self.health.verdicts.offer(report, "watch")

    def start_node_health(self) -> Service | None:
        """Answer NVRx's node health check on ``[interop] nvrx_socket`` (:mod:`.nodehealth`), when set."""
        from slurm_hooks.hooks import nodehealth

        self.health = nodehealth.start(self.w, lambda: nodehealth.judge_node(self.w, self.history.load), self.log)
        return self.health

    def _rule(self, event: XidEvent, info: XidInfo | None) -> Rule:
        """The event's row of the severity table, with the admin's override; XID 154 takes the
        driver's verdict its text names."""
        from slurm_hooks.checks.recovery import VERDICTS, verdict_from_text
        from slurm_hooks.checks.xid import RECOVERY_XID

        severities = self.w.config.severities
        if event.rule:
            return severities.rule(event.rule)
        if event.code == RECOVERY_XID and verdict_from_text(event.message) in VERDICTS:
            return severities.rule(VERDICTS[verdict_from_text(event.message)][0])
        base = Rule(info.scope, info.urgency, info.action) if info is not None else UNKNOWN_XID
        return severities.over(xid_rule_key(event.code), base)

    def retry_pending(self) -> str | None:
        """Finish the node's pending action if its retry is due (see :func:`healthcheck.finish_pending`)."""
        with self._lock:
            result = healthcheck.finish_pending(self.w, follow="thread", respect_backoff=True)
        if result:
            self.log(f"slurm-hooks watch: pending action: {result}")
        return result

    def _retry_loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.retry_pending()
                rec = pending.load(self.w.config.state.dir, self.w.node)
            except Exception as exc:  # noqa: BLE001 - the retry thread must outlive any one failure
                self.log(f"slurm-hooks watch: retrying a pending action failed: {type(exc).__name__}: {exc}")
                rec = None
            stop.wait(min(rec.wait_s(), self.retry_poll) if rec else self.retry_poll)

    def _link_loop(self, stop: threading.Event, interval: float = LINK_POLL_S) -> None:
        """Poll the InfiniBand/RoCE ports' state (a few small reads a port): a port that goes down
        (or away) is judged at once, as an XID is, instead of at the next health check. Never dies
        of one failure; a failure that repeats is said once."""
        from slurm_hooks.probes import ib

        root: str | None = None
        last: dict[str, str] | None = None
        said = ""
        while not stop.is_set():
            try:
                if root is None:
                    root = ib.from_config(self.w.config, self.w.node).root
                now = ib.port_states(root)
                went_down = _went_down(last, now) if last is not None else []
                # A state that could not be read ("/...") is no news: the port keeps its last known one.
                last = {p: (last.get(p, s) if last is not None and s.startswith("/") else s) for p, s in now.items()}
                self.polling_links.set()
                if went_down:
                    self.log(f"slurm-hooks watch: IB {', '.join(went_down)} down")
                    started = time.monotonic()
                    with self._lock:
                        report, outcome = healthcheck.run(self.w, context=Context.WATCH, follow="thread")
                    self._judged(report)
                    self.w.audit.write("watch", node=self.w.node, links=went_down, drained=outcome.drained,
                                       requeued=outcome.requeued, failed=outcome.failed,
                                       duration_s=round(time.monotonic() - started, 4))
                said = ""
            except Exception as exc:  # noqa: BLE001 - the link poller must outlive any one failure
                said = self._say_failure("polling the IB ports", exc, said)
            stop.wait(interval)

    def _resume_loop(self, stop: threading.Event) -> None:
        """While our drain holds the node (its record on disk: a stat, and no Slurm call otherwise), ask
        Slurm for the node every :attr:`resume_poll` seconds. A node back in service that we did not
        resume is a person's resume: the health check's judgement runs now, as the next check would
        (the incident closes as resumed by a person, the XIDs drained for are acknowledged, a fault
        still there drains it again), instead of at the next HealthCheckInterval. Never dies of one
        failure; a failure that repeats is said once."""
        said = ""
        while not stop.wait(self.resume_poll):
            try:
                if self._resumed_by_someone_else(stop):
                    self.log(f"slurm-hooks watch: {self.w.node} is back in service and we did not resume it: "
                             "a person did; checking it now")
                    with self._lock:
                        report, _ = healthcheck.run(self.w, context=Context.CHECK, follow="thread")
                    self._judged(report)
                said = ""
            except Exception as exc:  # noqa: BLE001 - the resume poller must outlive any one failure
                said = self._say_failure("looking for a resume", exc, said)

    def _say_failure(self, what: str, exc: Exception, said: str) -> str:
        """Log a poller's failure unless it is the one ``said`` last; what is said now."""
        text = f"slurm-hooks watch: {what} failed: {type(exc).__name__}: {exc}"
        if text != said:
            self.log(text)
        return text

    def _resumed_by_someone_else(self, stop: threading.Event) -> bool:
        """Our drain's record is there, and Slurm shows the node in service (no drain, not down, no
        reboot pending) now and :data:`RESUME_CONFIRM_S` later with the record unchanged."""
        import os

        def record() -> tuple[int, int] | None:
            try:
                st = os.stat(self.w.drained_marker())
            except FileNotFoundError:
                return None
            return (st.st_ino, st.st_mtime_ns)

        def in_service() -> bool:
            info = self.w.slurm.node(self.w.node)
            return not (info.out_of_service or info.reboot_pending)

        before = record()
        if before is None or not in_service() or stop.wait(RESUME_CONFIRM_S):
            return False
        return record() == before and in_service()

    def start_notifier(self, stop: threading.Event) -> Notifier | None:
        """Deliver what the audit log has to tell ([notify]) from a daemon thread, when a receiver
        is configured; the health check then leaves delivery to it."""
        from slurm_hooks.observe.notify import Notifier, NotifySettings

        ns = NotifySettings.from_config(self.w.config)
        if not ns.configured:
            return None
        notifier = Notifier(ns, log=lambda msg: self.log(f"slurm-hooks watch: notify: {msg}"))
        threading.Thread(target=notifier.run, args=(stop,), name="notify", daemon=True).start()
        return notifier

    def run(self, stop: threading.Event) -> None:
        self.w.audit.write("watch", node=self.w.node, message="watcher started")
        retry = threading.Thread(target=self._retry_loop, args=(stop,), name="pending-retry", daemon=True)
        retry.start()
        links = threading.Thread(target=self._link_loop, args=(stop,), name="ib-ports", daemon=True)
        links.start()
        resumes = threading.Thread(target=self._resume_loop, args=(stop,), name="resumes", daemon=True)
        resumes.start()
        notifier = self.start_notifier(stop)
        health = self.start_node_health()
        try:
            self._watch(stop)
        finally:
            if health is not None:
                health.stop()  # first: an asker now finds no socket, which NVRx counts as no check
            # A retry under way finishes, audit line included, before the process ends with its
            # daemon threads (a pending record cleared but never closed in the log is lost history).
            # The watcher is ending, on a stop or an error: no new retry begins.
            stop.set()
            # So does a check the port poller started (a drain with its requeues and its audit line).
            until = time.monotonic() + RETRY_JOIN_S
            for thread in (retry, links, resumes):
                thread.join(max(until - time.monotonic(), 0.0))
            beside = getattr(self.source, "join", None)  # a side source's event under way (Alongside)
            if beside is not None:
                beside(max(until - time.monotonic(), 0.0))
            if notifier is not None:
                notifier.stopped()  # the process ends with its daemon threads: say so before

    def _watch(self, stop: threading.Event) -> None:
        try:
            for event in self.source.backlog():
                self.handle(event)
        except SlurmHooksError as exc:
            self.log(f"slurm-hooks watch: cannot read earlier events: {exc}")
        while not stop.is_set():
            try:
                self.source.follow(stop, self.handle)
            except SlurmHooksError as exc:
                # NVML or kmsg hiccup: say so, wait, and keep watching.
                self.log(f"slurm-hooks watch: {exc}; retrying")
                stop.wait(2.0)
