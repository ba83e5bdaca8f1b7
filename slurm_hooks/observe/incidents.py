"""Incidents from the audit log: the node taken out, what for, what was done, when it came back.

One incident is one time a node was taken out of service by us: it opens at our
drain, gathers what every hook wrote about it (the alerts that led to it, the
jobs requeued, a harsher action wherever it is recorded: a later drain, a reboot
started, a ``[replace]``), and closes when the node is back in service (our resume
after a passing check, a person's resume the health check saw, new hardware
validated). Several hooks seeing one fault make one incident.

Its lifecycle (:class:`slurm_hooks.observe.records.Stage`): opened -> acting (which
step, since when) -> waiting (for jobs to leave, a reboot, validation, or a person:
why, and what to do) -> closed (by whom). The record kinds it reads are declared in
:mod:`slurm_hooks.observe.records`.

Records are grouped per node with :func:`slurm_hooks.observe.events.incidents` (the same
grouping ``slurm-hooks events`` shows); a :class:`Tracker` carries what is still
open from one batch of records to the next, so the notifier can feed it the log a
few lines at a time and the fleet report all at once.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, fields
from datetime import datetime, timezone
from typing import Any

from slurm_hooks.observe import events, records
from slurm_hooks.observe.records import ACTIONS, ClosedBy, Stage, WaitingFor, action_rank, reason_action
from slurm_hooks.values import dataclass, field

__all__ = ["ACTIONS", "Fleet", "Incident", "Tracker", "action_rank", "build", "duration", "fold", "next_step",
           "reason_action", "summary", "utc"]

_XID = re.compile(r"\bXID (\d+)\b")
_TAKE_OUT_RESULTS = ("ok", "already")
#: What a person does for a node that waits for them, by why it waits.
_TODO_RESUME = "mend it, then resume it: scontrol update NodeName={node} State=RESUME"
_TODO_VALIDATE = "run `slurm-hooks repair --validate` on {node} (or resume it by hand once mended)"
_TODO_HELD = ("look at its history (slurm-hooks events --node {node}) and mend what keeps failing, then resume it: "
              "scontrol update NodeName={node} State=RESUME (the count starts afresh)")


def incident_id(node: str, ts: float) -> str:
    """Stable and readable: the node and the time of the drain, to the millisecond."""
    stamp = datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y%m%dT%H%M%S")
    return f"{node}-{stamp}.{int(round(ts * 1000)) % 1000:03d}Z"


@dataclass
class Finding:
    check: str
    message: str
    action: str = ""
    severity: str = ""
    gpu: int | None = None
    uuid: str = ""
    serial: str = ""
    xid: int | None = None

    @property
    def gpu_key(self) -> str | None:
        """A GPU's identity across nodes and repairs: serial, else UUID; ``None`` for the node."""
        return self.serial or self.uuid or None


@dataclass
class Job:
    job_id: str
    user: str = ""
    #: Its name, bounded and printable (:func:`records.job_name`).
    name: str = ""
    requeued_at: float | None = None
    #: Made eligible again (``StartTime=now``, the follower's ``start_now``): not yet running.
    restarted_at: float | None = None
    #: Seen running again on another node (the follower's look; sacct in the report).
    running_at: float | None = None
    #: Refused by the prolog (Slurm requeues it: it never ran here).
    refused_at: float | None = None
    #: Its own checkpoint signal, as sent first (``USR2@90``; "" when it had none).
    signal: str = ""
    #: Who requeued it: "self" (on its signal, after checkpointing) or "ours".
    requeued_by: str = ""
    #: Seconds from the fault to its requeue.
    requeue_s: float | None = None
    #: The GPUs it held on the node as Slurm numbers them (its SLURM_JOB_GPUS; hooks.gpumap ties
    #: them to the finding's NVML index).
    gpus: list[int] = field(default_factory=list)

    @property
    def how(self) -> str:
        """"requeued" (by us, from under the fault), "refused" (at its start), or "" (only named)."""
        return "requeued" if self.requeued_at is not None else "refused" if self.refused_at is not None else ""

    @property
    def words(self) -> str:
        """``job 4242 (alice, train)``: whose job it is, as a person reads it."""
        who = ", ".join(x for x in (self.user, self.name) if x)
        return f"job {self.job_id}" + (f" ({who})" if who else "")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Job:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass
class Told:
    """What the notifier has said about an incident (its bookkeeping; the report ignores it)."""

    opened: bool = False
    #: Opened before the notifier's first pass: counted as told (never announced), so never resolved aloud.
    backfilled: bool = False
    #: When the opening was told (the notifier's clock): Alertmanager re-posts count from here.
    opened_at: float | None = None
    #: Each harsher action told, in order.
    escalated: list[str] = field(default_factory=list)
    #: The ``action`` label of the alerts last posted (an escalation ends them).
    alert_action: str = ""
    resolved: bool = False
    reminders: int = 0
    reposts: int = 0

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Told:
        data = dict(data or {})
        opened = data.pop("opened", False)
        if isinstance(opened, str):  # saved before Told existed: "before this notifier"
            data["backfilled"] = True
        known = {f.name for f in fields(cls)}
        return cls(opened=bool(opened), **{k: v for k, v in data.items() if k in known})


@dataclass
class Incident:
    id: str
    node: str
    #: The first record of the run that ended in our drain (the first alert: when it was seen).
    first_seen: float
    #: Our drain.
    opened_at: float
    reason: str = ""
    action: str = "drain"
    contexts: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    jobs: dict[str, Job] = field(default_factory=dict)
    #: (ts, action) of each harsher action, wherever recorded (a drain, a reboot started, a [replace]).
    escalations: list[list[Any]] = field(default_factory=list)
    resolved_at: float | None = None
    #: Who put it back: "slurm-hooks", or the person (their user name, "a person" when unknown).
    resolved_by: str = ""
    #: How it closed (:class:`records.ClosedBy`).
    closed_by: str = ""
    #: The step under way (a rung, "drain") and since when.
    step: str = "drain"
    step_since: float | None = None
    #: What it waits for (:class:`records.WaitingFor`; "" while we act), why, and what to do.
    waiting_for: str = ""
    why: str = ""
    todo: str = ""
    #: GPUs put on the RMA list: {index, uuid, serial, pci_bus_id}.
    rma: list[dict[str, Any]] = field(default_factory=list)
    #: Where the repair kept its evidence before a reboot or [replace].
    evidence: list[str] = field(default_factory=list)
    #: Held for a person: too many remediations on the node (why), and each of them
    #: (``{t, what, action, gpus, subjects, context}``, oldest first).
    held: str = ""
    history: list[dict[str, Any]] = field(default_factory=list)
    #: The GPUs of ``rma`` still marked for replacement: until new hardware replaces them or a person
    #: clears the mark (``slurm-hooks rma clear``); a person's resume leaves them marked.
    marked: list[dict[str, Any]] = field(default_factory=list)
    #: The last time any record named the node during the incident (a repeat's last one too).
    last_seen: float | None = None
    told: Told = field(default_factory=Told)

    @property
    def open(self) -> bool:
        return self.resolved_at is None

    @property
    def stage(self) -> Stage:
        if not self.open:
            return Stage.CLOSED
        return Stage.WAITING if self.waiting_for else Stage.ACTING

    @property
    def waits_for_person(self) -> bool:
        return self.open and self.waiting_for == WaitingFor.PERSON.value

    @property
    def time_to_drain(self) -> float:
        return max(0.0, self.opened_at - self.first_seen)

    @property
    def mttr(self) -> float | None:
        """Seconds from the drain until the node was back in service; ``None`` while open."""
        return None if self.resolved_at is None else max(0.0, self.resolved_at - self.opened_at)

    @property
    def time_to_job_eligible(self) -> float | None:
        """Seconds from the drain until the first requeued job was made eligible to start elsewhere
        (``StartTime=now``); ``None`` without one. Not when it ran: see :attr:`time_to_job_running`."""
        starts = [j.restarted_at for j in self.jobs.values() if j.restarted_at is not None]
        return None if not starts else max(0.0, min(starts) - self.opened_at)

    @property
    def time_to_job_running(self) -> float | None:
        """Seconds from the drain until a requeued job was seen running again; ``None`` until one was."""
        runs = [j.running_at for j in self.jobs.values() if j.running_at is not None]
        return None if not runs else max(0.0, min(runs) - self.opened_at)

    @property
    def still_marked(self) -> list[dict[str, Any]]:
        """Closed by a person's resume with GPUs still marked for replacement: those GPUs."""
        return [] if self.open or self.closed_by != ClosedBy.PERSON.value else list(self.marked)

    def gpus(self) -> list[Finding]:
        """One finding per GPU named (the first one seen for it)."""
        out: dict[tuple, Finding] = {}
        for f in self.findings:
            if f.gpu is not None or f.gpu_key:
                out.setdefault((f.gpu, f.gpu_key), f)
        return list(out.values())

    def main_finding(self) -> Finding | None:
        """The finding behind the harshest action (the first such one)."""
        if not self.findings:
            return None
        return max(self.findings, key=lambda f: action_rank(f.action))  # max keeps the first of equals

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Incident:
        data = dict(data)
        data["findings"] = [Finding(**f) for f in data.get("findings", [])]
        data["jobs"] = {k: Job.from_dict(v) for k, v in data.get("jobs", {}).items()}
        data["told"] = Told.from_dict(data.get("told") or {})
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def takes_out(r: dict[str, Any]) -> bool:
    """Our drain of the node (done now, or found done by an earlier run of ours)."""
    return r.get("kind") == "action" and r.get("action") == "drain" and r.get("result") in _TAKE_OUT_RESULTS


def resolution(r: dict[str, Any]) -> str:
    """Who put the node back in service, when this record says so; "" otherwise."""
    return closing(r)[0]


def closing(r: dict[str, Any]) -> tuple[str, str]:
    """(who, how: :class:`records.ClosedBy`) when this record closes the node's incident; ("", "") else."""
    kind = r.get("kind")
    if kind == records.Kind.INCIDENT.value:
        rec = records.parse(r)
        if isinstance(rec, records.Lifecycle) and rec.stage == Stage.CLOSED.value:
            by = rec.by or ClosedBy.PERSON.value
            return (rec.user or "a person") if by == ClosedBy.PERSON.value else by, by
        return "", ""
    if kind == "bridge_incident_closed" and not r.get("dry_run"):
        return ClosedBy.BRIDGE.value, ClosedBy.BRIDGE.value
    if kind != "action" or r.get("result") != "ok":
        return "", ""
    if r.get("action") == "resume":
        return ClosedBy.US.value, ClosedBy.US.value
    if r.get("action") == "ack-xids":
        return "a person", ClosedBy.PERSON.value
    return "", ""


def record_person_resume(audit: Any, node: str, user: str = "", reason: str = "", state: str = "",
                         at: float | None = None) -> None:
    """The incident of ``node`` closed by a person's resume (the health check saw the node back in
    service with our drain gone, not by our resume): one ``incident`` record, stage closed. ``at``:
    when the resume happened as Slurm or the watcher saw it, where known (the check runs minutes
    later: its own clock would count those minutes as time out of service)."""
    detail = f"node {state or 'in service'}: resumed by {user or 'a person'}, not by slurm-hooks"
    audit.write(records.Kind.INCIDENT.value, node=node,
                **records.lifecycle(Stage.CLOSED, by=ClosedBy.PERSON.value, user=user, reason=reason, detail=detail,
                                    at=at))


def record_waiting(audit: Any, node: str, waiting_for: WaitingFor, why: str, todo: str) -> None:
    """The incident of ``node`` waits (for a person, say): why, and what to do."""
    audit.write(records.Kind.INCIDENT.value, node=node,
                **records.lifecycle(Stage.WAITING, waiting_for=waiting_for.value, why=why, todo=todo))


def finding_of(r: dict[str, Any]) -> Finding:
    message = str(r.get("message") or "")
    m = _XID.search(message)
    xid = r.get("xid")
    return Finding(
        check=str(r.get("check") or ""), message=message, action=str(r.get("action") or ""),
        severity=str(r.get("severity") or ""), gpu=r.get("gpu"),
        uuid=str(r.get("uuid") or r.get("gpu_uuid") or ""), serial=str(r.get("serial") or r.get("gpu_serial") or ""),
        xid=int(xid) if isinstance(xid, int) else (int(m.group(1)) if m else None),
    )


class Tracker:
    """Turns audit records into incidents, batch after batch.

    ``open`` holds the incident of each node still out of service; ``pending`` the
    alerts of each node not yet followed by a drain (they lead to the next one).
    ``closed`` collects incidents as they close; the caller empties it.
    """

    def __init__(self, open_: dict[str, Incident] | None = None, pending: dict[str, list[dict]] | None = None,
                 marked: dict[str, dict[str, Any]] | None = None):
        self.open: dict[str, Incident] = open_ or {}
        self.pending: dict[str, list[dict]] = pending or {}
        self.closed: list[Incident] = []
        #: Nodes back in service by a person's resume with GPUs still marked for replacement: node ->
        #: {node, gpus, incident, since, resumed_at, resumed_by} (:func:`marked_in_service`).
        self.marked: dict[str, dict[str, Any]] = marked or {}

    def feed(self, records: Iterable[dict[str, Any]]) -> None:
        fresh = [r for r in records if r.get("node") and isinstance(r.get("ts"), (int, float))]
        if not fresh:
            return
        carried = [r for rs in self.pending.values() for r in rs]
        self.pending = {}
        batch = events.select(carried + fresh)
        for run in events.incidents(batch):
            self._apply(run)
        last = max(float(r["ts"]) for r in batch)
        for node in list(self.pending):
            kept = [r for r in self.pending[node] if last - float(r["ts"]) <= events.INCIDENT_GAP_S]
            if kept:
                self.pending[node] = kept[-50:]
            else:
                del self.pending[node]

    def _apply(self, run: list[dict[str, Any]]) -> None:
        node = str(run[0]["node"])
        inc = self.open.get(node)
        waiting: list[dict[str, Any]] = []
        for r in run:
            self._unmark(node, inc, r)
            if inc is None:
                if takes_out(r):
                    ts = float(r["ts"])
                    inc = Incident(id=incident_id(node, ts), node=node, first_seen=float((waiting or [r])[0]["ts"]),
                                   opened_at=ts, reason=str(r.get("reason") or ""),
                                   action=reason_action(str(r.get("reason") or "")), step_since=ts)
                    self.open[node] = inc
                    for w in waiting:
                        _absorb(inc, w)
                    waiting = []
                    _absorb(inc, r)
                elif _evidence(r):
                    waiting.append(r)
                continue
            who, how = closing(r)
            if who:
                inc.resolved_at, inc.resolved_by = _when(r, inc), who
                inc.last_seen = max(inc.last_seen or 0.0, float(r["ts"]))
                if how == ClosedBy.US.value and inc.closed_by == ClosedBy.HARDWARE.value:
                    how = ClosedBy.HARDWARE.value  # new hardware, validated, resumed by us
                inc.closed_by, inc.waiting_for = how, ""
                if how == ClosedBy.BRIDGE.value:
                    inc.told.resolved = True  # the bridge's own record is its message (notify.bridge_message)
                if inc.still_marked:
                    self.marked[node] = {"node": node, "gpus": list(inc.marked), "incident": inc.id,
                                         "since": inc.step_since or inc.opened_at, "resumed_at": inc.resolved_at,
                                         "resumed_by": who, "evidence": list(inc.evidence)}
                self.closed.append(self.open.pop(node))
                inc = None
                continue
            _absorb(inc, r)
        if waiting:
            self.pending.setdefault(node, []).extend(waiting)

    def _unmark(self, node: str, inc: Incident | None, r: dict[str, Any]) -> None:
        """A GPU's mark for replacement ends with new hardware or a person's ``rma clear``, wherever
        the record falls (in an incident, or while the node runs jobs)."""
        if r.get("kind") != "action":
            return
        rec = records.parse(r)
        if not isinstance(rec, records.Action):
            return
        if rec.action == "rma-clear" and rec.result == "ok":
            gone = {_gpu_key(g) for g in rec.gpu_ids if isinstance(g, dict)}
        elif rec.action == "repair-replace" and rec.result == "ended" and "hardware was replaced" in rec.detail:
            gone = None  # every GPU the [replace] named is out of the node
        else:
            return
        held = self.marked.get(node)
        for marks in ([held["gpus"]] if held else []) + ([inc.marked] if inc is not None else []):
            marks[:] = [g for g in marks if gone is not None and _gpu_key(g) not in gone]
        if held is not None and not held["gpus"]:
            del self.marked[node]

    def to_dict(self) -> dict[str, Any]:
        return {"open": {n: i.to_dict() for n, i in self.open.items()}, "pending": self.pending,
                **({"marked": self.marked} if self.marked else {})}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Tracker:
        return cls({n: Incident.from_dict(i) for n, i in data.get("open", {}).items()},
                   {n: list(rs) for n, rs in data.get("pending", {}).items()},
                   {n: dict(m) for n, m in (data.get("marked") or {}).items() if isinstance(m, dict)})


def _gpu_key(g: dict[str, Any]) -> str:
    """A marked GPU's identity: serial, else UUID, else its index."""
    return str(g.get("serial") or g.get("uuid") or f"gpu{g.get('index', g.get('gpu'))}")


def _when(r: dict[str, Any], inc: Incident) -> float:
    """When a closing record's event happened: its source's time (``at``: Slurm's, the watcher's) where it
    gives one within the incident, else the record's own."""
    ts, at = float(r["ts"]), r.get("at")
    if isinstance(at, (int, float)) and not isinstance(at, bool) and inc.opened_at <= at <= ts:
        return float(at)
    return ts


def _evidence(r: dict[str, Any]) -> bool:
    """An alert, or the watcher's account of a driver event (not its "watcher started")."""
    return r.get("kind") == "alert" or (r.get("kind") == "watch" and (r.get("xid") is not None or bool(r.get("rule"))))


def _absorb(inc: Incident, r: dict[str, Any]) -> None:
    rec = records.parse(r)
    ts = rec.ts
    inc.last_seen = max(inc.last_seen or ts, rec.last_ts or ts)
    if isinstance(rec, records.Lifecycle):
        if rec.stage == Stage.WAITING.value:
            inc.step_since = ts if inc.waiting_for != rec.waiting_for else inc.step_since
            inc.waiting_for, inc.why, inc.todo = rec.waiting_for, rec.why, rec.todo
        return
    context = rec.context or ("watch" if isinstance(rec, records.Watch) else "")
    if context and context not in inc.contexts and (not isinstance(rec, records.Watch) or rec.xid is not None):
        inc.contexts.append(context)
    if isinstance(rec, records.Alert):
        f = finding_of(r)
        if not any((g.check, g.gpu, g.message) == (f.check, f.gpu, f.message) for g in inc.findings):
            inc.findings.append(f)
        if rec.job is not None:
            _job(inc, rec.job, rec)
    elif isinstance(rec, records.Watch) and rec.xid is not None:
        if rec.gpu is not None:
            for f in inc.findings:
                if f.gpu == rec.gpu and f.xid is None:
                    f.xid = int(rec.xid)
        for job_id in rec.requeued:
            job = _job(inc, job_id, rec)
            job.requeued_at = job.requeued_at or ts
    elif isinstance(rec, records.Action):
        _absorb_action(inc, rec)


def _absorb_action(inc: Incident, rec: records.Action) -> None:
    action, result, ts = rec.action, rec.result, rec.ts
    if action == "drain" and result in _TAKE_OUT_RESULTS and rec.context == "prolog" and rec.job is not None:
        job = _job(inc, rec.job, rec)  # the prolog exits 1: Slurm requeues the job
        job.refused_at = job.refused_at or ts
    harsher = records.escalates_to(rec)
    if action_rank(harsher) > action_rank(inc.action):
        inc.escalations.append([ts, harsher])
        inc.action, inc.reason = harsher, rec.reason or inc.reason
    _step(inc, rec)
    if action == "signal" and result == "ok":
        for job_id in records.targets(rec):
            _job(inc, job_id, rec).signal = rec.signal
    elif action == "requeue" and result in ("ok", "already", "self"):
        for job_id in records.targets(rec):
            job = _job(inc, job_id, rec)
            job.requeued_at = job.requeued_at or ts
            if rec.gpus and not job.gpus:
                job.gpus = [int(g) for g in rec.gpus if isinstance(g, int)]
            if rec.requeued_by and not job.requeued_by:
                job.requeued_by = rec.requeued_by
                job.requeue_s = rec.seconds_from_fault
    elif action in ("start_now", "release") and result == "ok":
        for job_id in records.targets(rec):
            job = _job(inc, job_id, rec)
            if action == "start_now":
                job.restarted_at = job.restarted_at or ts
    elif action == "running" and result == "ok":
        for job_id in records.targets(rec):
            job = _job(inc, job_id, rec)
            job.running_at = job.running_at or ts


def _step(inc: Incident, rec: records.Action) -> None:
    """Where the incident stands after this action record: acting (on which step) or waiting (for what)."""
    action, result, ts = rec.action, rec.result, rec.ts
    node = inc.node

    def now(step: str, waiting: WaitingFor | None = None, why: str = "", todo: str = "") -> None:
        if step != inc.step or (waiting.value if waiting else "") != inc.waiting_for:
            inc.step_since = ts
        inc.step, inc.waiting_for, inc.why, inc.todo = step, waiting.value if waiting else "", why, todo

    if action == "drain" and result == "ok" and rec.held:
        inc.held, inc.history = rec.held, [dict(h) for h in rec.history if isinstance(h, dict)]
        now("drain", WaitingFor.PERSON, f"held for a person: {rec.held}", _TODO_HELD.format(node=node))
    elif inc.held:
        pass  # a person acts next, whatever else is written meanwhile (a resume refused, a repeat)
    elif action == "drain" and result == "ok":
        if records.at_job_end(rec.reason):
            now("drain", WaitingFor.JOBS, "the fault is not urgent: the node is drained, its jobs run to their end")
        elif inc.waiting_for == WaitingFor.REBOOT.value and reason_action(rec.reason) == "replace":
            # A check on the new boot drained it [replace]: the reboot is over and did not mend it.
            now("replace", WaitingFor.PERSON, rec.reason, replace_todo(node, _replace_gpus(inc)))
        elif inc.step in ("drain", ""):
            now("drain")
    elif action == "repair-reset" and result == "start":
        now("reset")
    elif action == "repair-reboot" and result == "start":
        now("reboot", WaitingFor.REBOOT, rec.detail or "rebooted through Slurm (scontrol reboot ASAP nextstate=DOWN)")
    elif action == "repair-validate" and result == "start":
        now("validate", WaitingFor.VALIDATION, rec.detail)
    elif action.startswith("repair-") and result == "unverified":
        now("validate", WaitingFor.PERSON, rec.detail or "the diagnostic did not run in full",
            _TODO_VALIDATE.format(node=node))
    elif action == "repair-replace" and result == "ok":
        _rma(inc, rec)
        now("replace", WaitingFor.PERSON, rec.why or rec.reason, replace_todo(node, inc.rma))
    elif action == "repair-replace" and result == "ended":
        if "hardware was replaced" in rec.detail:
            inc.closed_by = ClosedBy.HARDWARE.value
            now("validate", WaitingFor.VALIDATION, rec.detail)
    elif action == "resume" and result == "skipped" and ("by hand" in rec.detail or "not ours" in rec.detail):
        if inc.marked:  # our [replace] stands under someone else's drain: the GPU still waits for its swap
            now("replace", WaitingFor.PERSON, f"{rec.detail}; our [replace] stands", replace_todo(node, inc.marked))
        else:
            now("drain", WaitingFor.PERSON, rec.detail, _TODO_RESUME.format(node=node))
    if rec.evidence and rec.evidence not in inc.evidence:
        inc.evidence.append(rec.evidence)


def _replace_gpus(inc: Incident) -> list[dict[str, Any]]:
    """The GPUs the findings say to replace, as the RMA list names them (before the ladder's own list)."""
    out: dict[int, dict[str, Any]] = {}
    for f in inc.findings:
        if f.action == "replace" and f.gpu is not None:
            out.setdefault(f.gpu, {"index": f.gpu, "uuid": f.uuid, "serial": f.serial})
    return list(out.values())


def history_line(h: dict[str, Any]) -> str:
    """``2026-11-04 12:00Z XID 79 on GPU 0 [reboot]``: one remediation of a held node, as said to people."""
    ts = h.get("t")
    when = datetime.fromtimestamp(float(ts), tz=timezone.utc).strftime("%Y-%m-%d %H:%MZ") \
        if isinstance(ts, (int, float)) else "?"
    return f"{when} {h.get('what') or '?'}" + (f" [{h['action']}]" if h.get("action") else "")


def history_text(history: Iterable[dict[str, Any]]) -> str:
    """A held node's remediations on one line, oldest first (`` | `` between them)."""
    return " | ".join(history_line(h) for h in history)


def _rma(inc: Incident, rec: records.Action) -> None:
    """The GPUs a [replace] names, kept on the incident and lent to its findings (UUID, serial)."""
    for g in rec.gpu_ids:
        if not isinstance(g, dict):
            continue
        key = g.get("serial") or g.get("uuid")
        if not any((e.get("serial") or e.get("uuid")) == key for e in inc.rma):
            inc.rma.append(dict(g))
        if not any(_gpu_key(e) == _gpu_key(g) for e in inc.marked):
            inc.marked.append(dict(g))
        for f in inc.findings:
            if f.gpu is not None and f.gpu == g.get("index"):
                f.uuid = f.uuid or str(g.get("uuid") or "")
                f.serial = f.serial or str(g.get("serial") or "")


def gpu_list(gpus: Iterable[dict[str, Any]]) -> str:
    """``GPU 0 (GPU-8f2c..., serial 1652...)``: what an RMA needs, for GPUs as the RMA list names them."""
    words = []
    for g in gpus:
        index = g.get("index", g.get("gpu"))
        ids = ", ".join(x for x in (str(g.get("uuid") or ""), f"serial {g['serial']}" if g.get("serial") else "") if x)
        words.append(f"GPU {'?' if index is None else index}" + (f" ({ids})" if ids else ""))
    return ", ".join(words) or "the faulty hardware"


def clear_command(node: str, gpus: Iterable[dict[str, Any]]) -> str:
    """The command that clears GPUs' marks for replacement (one per GPU)."""
    indexes = [g.get("index", g.get("gpu")) for g in gpus]
    return "; ".join(f"slurm-hooks rma clear --node {node} --gpu {i}" for i in indexes if i is not None) \
        or f"slurm-hooks rma clear --node {node} --gpu <index>"


def replace_todo(node: str, gpus: Iterable[dict[str, Any]]) -> str:
    """What a person does for a node we left ``[replace]``: which board to swap and send back, and
    how the node returns (by itself on new hardware; by hand, with the mark kept)."""
    gpus = list(gpus)
    return (f"replace {gpu_list(gpus)} on {node} and send it back for RMA; new hardware is validated and "
            f"returns the node to service by itself. Resumed by hand instead, the node runs jobs with the GPU "
            f"still marked for replacement until `{clear_command(node, gpus)}`")


#: Who acts next, as every line a person reads says it.
PERSON, US, SLURM, JOBS = "a person", "slurm-hooks", "Slurm", "its jobs"


def next_step(inc: Incident) -> tuple[str, str]:
    """(who acts next, what they do) for an incident, in the words every page, reminder, ``status``
    and report line uses; ("", "") for an incident that is over with nothing left to do."""
    if not inc.open:
        marked = inc.still_marked
        if marked:
            return PERSON, (f"replace {gpu_list(marked)} on {inc.node} at its next maintenance (it runs jobs "
                            f"meanwhile), or clear the mark: {clear_command(inc.node, marked)}")
        return "", ""
    if inc.waits_for_person:
        return PERSON, inc.todo or f"look at {inc.node}: {inc.why or 'the repair stopped'}"
    if inc.waiting_for == WaitingFor.JOBS.value:
        return JOBS, f"run to their end on {inc.node}; then slurm-hooks repairs it"
    if inc.waiting_for == WaitingFor.REBOOT.value:
        return SLURM, f"reboots {inc.node} (RebootProgram) once idle; slurm-hooks checks it on the new boot"
    if inc.waiting_for == WaitingFor.VALIDATION.value:
        return US, f"validates {inc.node} (GPU diagnostic) before it returns to service"
    step = inc.step if inc.step not in ("", "drain") else ""
    return US, (f"{step}s {inc.node} now" if step else
                f"checks {inc.node} again: it returns to service after a passing check")


def _job(inc: Incident, job_id: Any, rec: records.Record) -> Job:
    key = str(job_id)
    job = inc.jobs.setdefault(key, Job(key))
    user = rec.users.get(key) if rec.users else rec.user
    if user and not job.user:
        job.user = records.job_name(str(user))
    name = rec.names.get(key) if rec.names else ""
    if name and not job.name:
        job.name = records.job_name(str(name))
    return job


def summary(inc: Incident) -> dict[str, Any]:
    """The incident as a notification's JSON and the fleet report carry it."""
    f = inc.main_finding()
    who, what = next_step(inc)
    return {
        "incident": inc.id,
        "node": inc.node,
        "gpus": [{"index": g.gpu, "uuid": g.uuid or None, "serial": g.serial or None} for g in inc.gpus()],
        "finding": None if f is None else {"check": f.check, "message": f.message, "xid": f.xid,
                                           "severity": f.severity or None},
        "scope": "gpu" if inc.gpus() else "node",
        "action": inc.action,
        "urgency": "high" if action_rank(inc.action) >= action_rank("reboot") else "normal",
        "reason": inc.reason,
        "seen_by": list(inc.contexts),
        "jobs": [{"job_id": j.job_id, "user": j.user or None, "name": j.name or None, "how": j.how,
                  **_checkpoint(j), **({"gpus": j.gpus} if j.gpus else {})}
                 for j in inc.jobs.values() if j.how],
        "time_to_job_eligible_s": None if inc.time_to_job_eligible is None else round(inc.time_to_job_eligible, 3),
        "time_to_job_running_s": None if inc.time_to_job_running is None else round(inc.time_to_job_running, 3),
        "opened_at": utc(inc.opened_at),
        "resolved_at": utc(inc.resolved_at) if inc.resolved_at is not None else None,
        "resolved_by": inc.resolved_by or None,
        "time_to_drain_s": round(inc.time_to_drain, 3),
        "out_of_service_s": None if inc.mttr is None else round(inc.mttr, 3),
        "stage": inc.stage.value,
        "step": inc.step,
        "step_since": utc(inc.step_since) if inc.step_since is not None else None,
        "waiting_for": inc.waiting_for or None,
        "why": inc.why or None,
        "todo": inc.todo or None,
        "next": {"who": who or None, "todo": what or None},
        "closed_by": inc.closed_by or None,
        "held": inc.held or None,
        "history": [dict(h) for h in inc.history],
        "rma": [dict(g) for g in inc.rma],
        "still_marked": inc.still_marked,
        "evidence": list(inc.evidence),
    }


def _checkpoint(job: Job) -> dict[str, Any]:
    """What a job's own checkpoint signal came to: its signal, who requeued it and when (only for a
    job that got one)."""
    if not job.signal:
        return {}
    return {"signal": job.signal, "requeued_by": job.requeued_by or None,
            "requeue_s": None if job.requeue_s is None else round(float(job.requeue_s), 3),
            "checkpoint": ("requeued itself" if job.requeued_by == "self" else
                           "no checkpoint: requeued after the grace" if job.requeued_by == "ours" else "in its grace")}


def utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def build(records: Iterable[dict[str, Any]]) -> list[Incident]:
    """Every incident in these records, closed and open, oldest first."""
    return fold(records).incidents


@dataclass
class Fleet:
    """What the audit log says stands: every incident, and the nodes in service with GPUs still marked
    for replacement. ``status`` and the report both read this, so they cannot disagree."""

    incidents: list[Incident]
    marked: dict[str, dict[str, Any]]

    def for_a_person(self, now: float) -> list[dict[str, Any]]:
        """What waits for a person, one entry per node: an open incident waiting for one, or a node a
        person returned to service with a GPU still marked for replacement."""
        out = []
        for inc in self.incidents:
            if inc.waits_for_person:
                since = inc.step_since or inc.opened_at
                who, what = next_step(inc)
                out.append({"node": inc.node, "incident": inc.id, "action": inc.action, "in_service": False,
                            "since": since, "waited_s": round(max(0.0, now - since), 1), "who": who, "todo": what,
                            "why": inc.why or None, "evidence": list(inc.evidence), "gpus": list(inc.marked)})
        for node, m in sorted(self.marked.items()):
            if any(e["node"] == node for e in out):
                continue
            since = float(m.get("resumed_at") or m.get("since") or now)
            by = m.get("resumed_by") or PERSON
            out.append({"node": node, "incident": m.get("incident"), "action": "replace", "in_service": True,
                        "since": since, "waited_s": round(max(0.0, now - since), 1), "who": PERSON,
                        "todo": (f"replace {gpu_list(m['gpus'])} on {node} at its next maintenance (it runs jobs "
                                 f"meanwhile), or clear the mark: {clear_command(node, m['gpus'])}"),
                        "why": f"returned to service by {by} at {utc(since)} with {gpu_list(m['gpus'])} still "
                               "marked for replacement",
                        "evidence": list(m.get("evidence") or []), "gpus": list(m["gpus"])})
        out.sort(key=lambda e: e["node"])
        return out


def fold(records: Iterable[dict[str, Any]]) -> Fleet:
    """The records folded into incidents (oldest first) and the marks still standing."""
    tracker = Tracker()
    tracker.feed(records)
    out = tracker.closed + list(tracker.open.values())
    out.sort(key=lambda i: i.opened_at)
    return Fleet(out, tracker.marked)


def duration(seconds: float) -> str:
    """``45s``, ``12m 05s``, ``3h 02m``, ``2d 4h``."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"
