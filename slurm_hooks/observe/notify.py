"""Tell people what happened: Alertmanager, webhooks (Slack or JSON) and syslog, from the audit log.

Nothing here is on the path of a drain. The hooks write the audit log as they
always do; a :class:`Notifier` (a thread of ``slurm-hooks watch`` or of the bridge, or a
short ``slurm-hooks notify flush``) reads what is new from a saved cursor, turns
incidents into messages (:mod:`slurm_hooks.observe.incidents`: one per incident, a
follow-up when the node is back or the action escalates, a reminder while it
stays out; for Alertmanager, each finding an alert posted again while open),
writes each message to an on-disk outbox (:mod:`slurm_hooks.observe.outbox`), and
delivers the outbox through its receivers (:mod:`slurm_hooks.observe.destinations`).

Nothing lost, nothing sent twice: a message is a file (0600, written atomically)
before the cursor moves past the records it came from; a delivered message is
noted in a ledger and then removed, so a restart at any point neither drops nor
repeats one. Message ids are derived from the incident, so reading the same
records again gives the same ids; every webhook request carries the id as
``Idempotency-Key`` for receivers that dedupe a request retried after a lost
answer. One lock makes the watcher's thread and a ``flush`` take turns.

Bounded, for a fleet: each receiver has its own pace (``rate`` requests per second
with a small burst; a failure holds it back with capped, jittered backoff, or for as
long as its ``Retry-After`` says), the outbox its caps (see :mod:`~slurm_hooks.observe.outbox`).
At fleet scale one message per node is a storm no chat channel takes: Alertmanager
groups them.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import random
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from slurm_hooks import fsutil
from slurm_hooks.observe import destinations as dst
from slurm_hooks.observe import incidents, receivers
from slurm_hooks.observe.destinations import (
    BREAKER,
    BRIDGE,
    ESCALATED,
    FIRING,
    MONITOR,
    OPENED,
    REBOOT,
    REMINDER,
    REPLACE,
    RESOLVED,
    Alertmanager,
    Delivery,
    DeliveryError,
    Destination,
    Getter,
    Sender,
    Syslog,
    SyslogSender,
    Webhook,
)
from slurm_hooks.observe.incidents import Incident, duration
from slurm_hooks.observe.outbox import Entry, Outbox
from slurm_hooks.values import dataclass

#: At most this much of the log is read per pass (a huge backlog is taken in steps).
READ_CHUNK = 4 << 20
#: On the very first pass (no cursor), events older than this are tracked but not announced.
BACKFILL_S = 3600.0
BACKOFF_FIRST_S = 1.0
#: The backoff's exponent stops here (2 ** 20 s is past any retry_max): no overflow, ever.
BACKOFF_EXP_MAX = 20
#: A receiver's ``Retry-After`` is honoured up to this long (or ``retry_max`` if longer): a proxy
#: answering "Retry-After: 99999999" must not silence a receiver for ever (the hold is kept on disk).
RETRY_AFTER_MAX_S = 3600.0
#: The outbox is swept for messages past ``max_age`` at most this often.
EXPIRE_EVERY_S = 60.0
#: Requests a receiver may take at once before its rate applies (a few incidents at the same moment).
BURST = 5
POLL_S = 1.0
#: The watcher's notifier touches its heartbeat at each pass; older than this, nobody delivers.
HEARTBEAT_S = 30.0
#: A firing alert's ``endsAt`` is at least this far ahead of its post: a node without the watcher posts
#: again only when its health check runs (HealthCheckInterval, 5 min on the Slinky values), and its
#: alerts must not resolve in between. An explicit resolution ends them at once.
ALERT_HOLD_MIN_S = 900.0
#: Jobs named in a message's text at most (the JSON carries them all; Slack shows what fits).
TEXT_JOBS_MAX = 20
#: Findings named in a message's text at most (the alerts carry every one).
TEXT_FINDINGS_MAX = 8
#: A node waiting for a new GPU may be powered off for its repair: its alerts are held this long.
REPLACE_HOLD_S = 86400.0


#: Fields the incidents read as text. A record with another type there (a hand edit, another version)
#: is skipped: it raised in every pass, the cursor never moved, and every message waited for ever.
_TEXT_FIELDS = ("kind", "node", "action", "result", "reason", "context", "check", "message", "user", "stage")


def _sane(r: dict[str, Any]) -> bool:
    ts = r.get("ts", 0)
    if isinstance(ts, bool) or not isinstance(ts, (int, float)):
        return False
    return all(isinstance(r.get(k), (str, type(None))) for k in _TEXT_FIELDS)


def _seconds(value: str | None) -> float:
    try:
        return float(value) if value else 0.0
    except ValueError:
        return 0.0


@dataclass(frozen=True)
class NotifySettings:
    """What the notifier needs: ``[notify]`` as configured (:class:`slurm_hooks.config.NotifySection`),
    where the audit log and the outbox are, and what is found out at start."""

    audit: str
    dir: str
    notify: Any  # slurm_hooks.config.NotifySection (observe depends on no config)
    #: The ``cluster`` label: ``[notify] cluster``, else $SLURM_CLUSTER_NAME, else slurm.conf's ClusterName.
    cluster: str = ""
    #: How long a reboot may keep a node silent (Slurm's ``ResumeTimeout``, or ``[repair] reboot_timeout``
    #: when longer): a node's alerts are held that much longer while it reboots.
    resume_timeout: float = 0.0
    #: ``[metrics] textfile_dir``: where the receivers' state is written for node_exporter ("" = not).
    textfile_dir: str = ""

    @classmethod
    def from_config(cls, cfg: Any, directory: str | None = None) -> NotifySettings:
        n = cfg.notify
        from slurm_hooks.slurm.conffile import global_values

        conf = global_values(("ClusterName", "ResumeTimeout"))
        cluster = n.cluster or os.environ.get("SLURM_CLUSTER_NAME", "") or conf.get("clustername", "")
        resume = max(_seconds(conf.get("resumetimeout")), cfg.repair.reboot_timeout)
        return cls(cfg.log.audit, n.outbox or directory or os.path.join(cfg.state.dir, "notify"), n, cluster, resume,
                   cfg.metrics.textfile_dir)

    @property
    def hold(self) -> float:
        """A firing alert's ``endsAt`` ahead of its post (see :data:`ALERT_HOLD_MIN_S`)."""
        return max(4 * self.notify.alert_repost, ALERT_HOLD_MIN_S)

    def hold_for(self, action: str) -> float:
        """The hold of a node's alerts while its action is ``action``: a node sent to reboot (or to a
        person for a new GPU, powered off) posts nothing until it is back, and its alert must not
        resolve in between; only its real return (a resolution) ends it sooner."""
        if action == "reboot":
            return self.hold + self.resume_timeout
        if action == "replace":
            return max(self.hold + self.resume_timeout, REPLACE_HOLD_S)
        return self.hold

    @property
    def configured(self) -> bool:
        return bool(self.notify.syslog or self.notify.webhook or self.notify.alertmanager)

    def destinations(self, send: Sender | None = None, syslog: SyslogSender | None = None,
                     problem: Callable[[str], None] | None = None, environ: Mapping[str, str] | None = None,
                     get: Getter | None = None) -> dict[str, Destination]:
        """Name -> receiver. A URL that cannot be read (its file, its variable) leaves the receiver in
        place without one: its messages wait, each failure says why, and ``problem`` hears it once
        (never the URL). ``environ``: where ``url_env`` is read (this process's environment unless given)."""
        from slurm_hooks.errors import ConfigError
        from slurm_hooks.urlsecret import resolve_url

        def url_of(kind: str, n: int, table: dict[str, str]) -> tuple[str | None, str]:
            try:
                return resolve_url(table, f"[[notify.{kind}]] #{n + 1}", environ), ""
            except ConfigError as exc:
                (problem or (lambda m: None))(str(exc))
                return None, str(exc)

        out: dict[str, Destination] = {}

        def add(dest: Destination) -> None:
            # Two tables with one source of their URL (a copied table) stay two receivers: the second
            # and later get a suffix, so that neither silently replaces the other.
            base, k = dest.name, 1
            while dest.name in out:
                k += 1
                dest.name = f"{base}-{k}"
            out[dest.name] = dest

        if self.notify.syslog:
            add(Syslog(syslog))
        for n, table in enumerate(self.notify.webhook):
            url, why = url_of("webhook", n, table)
            add(Webhook(table, url, send, problem=why))
        for n, table in enumerate(self.notify.alertmanager):
            auth = ""
            if table.get("auth_file"):
                try:
                    auth = dst.read_auth(table["auth_file"])
                except OSError as exc:
                    (problem or (lambda m: None))(f"[[notify.alertmanager]] #{n + 1} auth_file "
                                                  f"{table['auth_file']}: cannot read: {exc.strerror}")
                except ValueError as exc:
                    why = "not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else str(exc)
                    (problem or (lambda m: None))(f"[[notify.alertmanager]] #{n + 1} auth_file "
                                                  f"{table['auth_file']}: {why}")
            url, why = url_of("alertmanager", n, table)
            add(Alertmanager(table, url, send, hold=self.hold, auth=auth, get=get, problem=why))
        return out


# --- messages --------------------------------------------------------------------------


@dataclass(frozen=True)
class Message:
    id: str
    kind: str
    text: str
    data: dict[str, Any]
    #: The incident it is about ("" for the bridge's own news).
    incident: str = ""


def _gpu_words(f: incidents.Finding) -> str:
    """`` on GPU 3 (GPU-8f2c..., serial 1652...)``: the index Slurm's reason uses, and what an RMA needs."""
    uuid, serial = str(getattr(f, "uuid", "") or ""), str(getattr(f, "serial", "") or "")
    if f.gpu is None and not (uuid or serial):
        return ""
    ids = ", ".join(x for x in (uuid, f"serial {serial}" if serial else "") if x)
    return f" on GPU {f.gpu if f.gpu is not None else '?'}" + (f" ({ids})" if ids else "")


def _jobs_words(inc: Incident, most: int = TEXT_JOBS_MAX) -> str:
    """``requeued: job 4242 (alice, train), job 4243 (bob)``: whose jobs, never a bare number."""
    def named(how: str) -> str:
        jobs = [j.words + _checkpoint_words(j) for j in inc.jobs.values() if j.how == how]
        more = f" and {len(jobs) - most} more" if len(jobs) > most else ""
        return ", ".join(jobs[:most]) + more

    words = [f"{label}: {jobs}" for label, jobs in (("requeued", named("requeued")),
                                                   ("refused at its start (Slurm requeues it)", named("refused")))
             if jobs]
    if not words:
        words = ["no job requeued"]
    on_it = named("")  # named by a finding, not requeued: whose they are is still news
    return "; ".join(words + ([f"running on it: {on_it}"] if on_it else []))


def _next_words(inc: Incident) -> str:
    """`` Next: a person must replace GPU 0 (serial ...) on n2 ... Evidence: <dir> (on n2).``: who acts
    next and what they do, and where the evidence is; "" when nothing is left to do."""
    who, what = incidents.next_step(inc)
    out = ""
    if who:
        out = f" Next: {who} must {what}." if who == incidents.PERSON else f" Next: {who} {what}."
    if inc.evidence and (who == incidents.PERSON or inc.action in ("reboot", "replace")):
        out += f" Evidence: {', '.join(inc.evidence)} (on {inc.node})."
    return out


def _reason_words(reason: str) -> str:
    """Our reason as a person reads it: no prefix, no Slurm suffix, no counter tag (``[reboot 1/1]``)."""
    text = reason.replace("slurm-hooks: ", "", 1).split(" : ", 1)[0].strip()
    if text.endswith("]") and "[" in text:
        text = text[: text.rfind("[")].rstrip()
    return text


def _checkpoint_words(job: incidents.Job) -> str:
    """`` [USR2@90: requeued itself 3.1s after the fault]`` for a job that got its own signal first."""
    if not job.signal:
        return ""
    took = f" {job.requeue_s:g}s after the fault" if job.requeue_s is not None else ""
    if job.requeued_by == "self":
        return f" [{job.signal}: requeued itself{took}]"
    if job.requeued_by == "ours":
        return f" [{job.signal}: no checkpoint: requeued after the grace{took}]"
    return f" [{job.signal} sent: in its grace]"


def _what(inc: Incident, most: int = TEXT_FINDINGS_MAX) -> str:
    """Every finding, the one behind the harshest action first (a second GPU's fault is news too)."""
    main = inc.main_finding()
    if main is None:
        return inc.reason.replace("slurm-hooks: ", "", 1) or "a fault"
    named: list[str] = []
    for f in [main, *(g for g in inc.findings if g is not main)]:
        words = f"{f.message}{_gpu_words(f)}"
        if words not in named:
            named.append(words)
    more = f"; and {len(named) - most} more" if len(named) > most else ""
    return "; ".join(named[:most]) + more


def _severity(action: str) -> str:
    return "critical" if incidents.action_rank(action) >= incidents.action_rank("reboot") else "warning"


def incident_alerts(inc: Incident, cluster: str, runbook: str, action: str | None = None) -> list[dict[str, Any]]:
    """One Alertmanager alert per finding (per GPU and check), labelled as the issue asks:
    alertname, node, gpu, xid or check, action, severity, cluster."""
    action = action or inc.action
    jobs = _jobs_words(inc)
    following = _next_words(inc).strip()
    found = inc.findings or [incidents.Finding(check="drain", message=_what(inc), action=action)]
    out: dict[tuple, dict[str, Any]] = {}
    for f in found:
        labels = {"alertname": "SlurmHooksXid" if f.xid is not None else "SlurmHooksCheckFailed", "node": inc.node,
                  "gpu": "" if f.gpu is None else str(f.gpu), "action": action, "severity": _severity(action),
                  "cluster": cluster}
        labels.update({"xid": str(f.xid)} if f.xid is not None else {"check": f.check or "drain"})
        labels = {k: v for k, v in labels.items() if v}
        summary = f"{inc.node} drained [{action}]: {f.message}{_gpu_words(f)}"
        out.setdefault(tuple(sorted(labels.items())), {
            "labels": labels, "starts_at": inc.opened_at,
            "annotations": {"summary": summary, "jobs": jobs, "incident": inc.id,
                            **({"next": following} if following else {}),
                            "runbook": runbook or _RUNBOOK.format(node=inc.node)}})
    return list(out.values())


def _held_words(inc: Incident, brief: bool = False) -> str:
    """`` Held for a person: 5 remediations within 7d (limit 5): <each>. To do: ...`` for a node held
    as a repeat offender ("" for any other); ``brief``: without the history."""
    if not inc.held:
        return ""
    if brief:
        return f" Held for a person: {inc.held}."
    return f" Held for a person: {inc.held}: {incidents.history_text(inc.history)}. To do: {inc.todo}."


_RUNBOOK = ("slurm-hooks events --node {node} shows what was seen and done; the node returns by itself after a "
            "passing check once repaired (scontrol update NodeName={node} State=RESUME only after a repair)")


def compose(inc: Incident, kind: str, now: float, n: int = 0, cluster: str = "", runbook: str = "",
            previous_action: str = "", hold: float = 0.0) -> Message:
    """One message about one incident; link-free text that reads alone in a channel or a log."""
    data = incidents.summary(inc)
    after = _next_words(inc)
    if kind == OPENED:
        headline = f"{inc.node} drained [{inc.action}]: {_what(inc)}."
        text = f"{inc.node} drained [{inc.action}]: {_what(inc)}; {_jobs_words(inc)}."
        if inc.contexts:
            headline = headline[:-1] + f". Seen by {', '.join(inc.contexts)}."
            text += f" Seen by {', '.join(inc.contexts)}."
        headline += _held_words(inc, brief=True)
        text += _held_words(inc)
        mid = f"{inc.id}/opened"
    elif kind == ESCALATED:
        headline = text = (f"{inc.node} escalated to [{inc.action}]: {_reason_words(inc.reason)}."
                           + (f" Found: {_what(inc)}." if inc.findings else ""))
        mid = f"{inc.id}/escalated-{inc.action}"
    elif kind == RESOLVED:
        marked = inc.still_marked
        if inc.resolved_by == incidents.US:
            who = ("by slurm-hooks on new hardware, validated" if inc.closed_by == "new hardware"
                   else "by slurm-hooks after a passing check")
        else:
            who = f"by {inc.resolved_by or incidents.PERSON}"
        if marked:
            headline = text = (f"{inc.node} returned to service {who} after {duration(inc.mttr or 0.0)} with "
                               f"{incidents.gpu_list(marked)} still marked for replacement; it was out for: "
                               f"{_what(inc)}.")
        else:
            headline = text = (f"{inc.node} back in service after {duration(inc.mttr or 0.0)} (resumed {who}); "
                               f"it was out for: {_what(inc)}.")
        mid = f"{inc.id}/resolved"
    elif kind == REMINDER:
        headline = text = (f"{inc.node} still out of service after {duration(now - inc.opened_at)} "
                           f"[{inc.action}]: {_what(inc)}.") + _held_words(inc)
        mid = f"{inc.id}/reminder-{n}"
    elif kind == FIRING:
        headline = text = f"{inc.node} still out of service [{inc.action}]: {_what(inc)}."
        mid = f"{inc.id}/firing-{n}"
    else:
        raise ValueError(kind)
    text += after
    headline += after
    text += f" Incident {inc.id}."
    headline += f" Incident {inc.id}."
    data.update({"id": mid, "kind": kind, "text": text, "headline": headline, "cluster": cluster or None,
                 "runbook": runbook or None, "alerts": incident_alerts(inc, cluster, runbook)})
    if hold:
        data["hold_s"] = hold
    if previous_action and previous_action != inc.action:
        data["ended_alerts"] = incident_alerts(inc, cluster, runbook, previous_action)
    if inc.resolved_at is not None:
        data["resolved_ts"] = inc.resolved_at
    return Message(mid, kind, text, data, inc.id)


#: The bridge's problems a person must act on: audit kind -> (alertname, what to do).
_BRIDGE_PROBLEMS = {
    "bridge_permission_missing": ("SlurmHooksBridgePermissionMissing",
                                  "grant the bridge's ServiceAccount what `slurm-hooks render --only rbac` lists"),
    "bridge_drain_timeout": ("SlurmHooksBridgeDrainTimeout",
                             "look at the PodDisruptionBudgets of the pods named; the replacement was requested anyway"),
    "bridge_held_too_long": ("SlurmHooksBridgeHeldTooLong",
                             "look at the repair backend: the machine stays cordoned until its replacement is done"),
}


def standing_key(r: dict[str, Any]) -> str:
    """The bridge's problem a record tells of that stays true until the bridge says it ended (its
    breaker, one node's missing permission): the key its alert is held under; "" for any other."""
    kind = r.get("kind")
    if kind == "bridge_breaker_tripped":
        return "breaker"
    if kind == "bridge_permission_missing":
        return f"permission-missing-{r.get('node') or '?'}"
    if kind == "bridge_held_too_long":
        return f"held-too-long-{r.get('node') or '?'}"
    return ""


def bridge_message(r: dict[str, Any], cluster: str = "", runbook: str = "") -> Message | None:
    """The bridge's own news from its audit records: a circuit-breaker trip, a replacement or a reboot
    asked of Kubernetes, a missing permission, a drain that timed out, and a node back in service
    (closed by the bridge: on Slinky the node's own outbox went with its machine, so the bridge says
    "back in service" and ends the node's alerts). ``None`` for any other record (and for a dry run)."""
    source = str(r.get("kind"))
    if source == "bridge_incident_closed" and not r.get("dry_run"):
        return _bridge_closed(r, cluster, runbook)
    kind = {"bridge_breaker_tripped": BREAKER, "bridge_replace": REPLACE,
            **{k: BRIDGE for k in _BRIDGE_PROBLEMS}}.get(source)
    if kind is None or r.get("dry_run"):
        return None
    ts = float(r.get("ts", 0))
    node, kube_node = r.get("slurm_node") or "?", r.get("node") or "?"
    labelled = {"node": str(node), "kube_node": str(kube_node)}
    if kind == BREAKER:
        mid = f"bridge-breaker-{int(round(ts * 1000))}"
        at = f" at node {kube_node}" + (f" (Slurm {node})" if node != "?" else "") if kube_node != "?" else ""
        text = (f"Kubernetes bridge circuit breaker tripped{at}: {r.get('reason', '')}. "
                f"{r.get('message') or 'No new nodes will be taken.'}")
        alertname, action = "SlurmHooksBreakerTripped", "none"
        todo = "slurm-hooks bridge reset-breaker once the cause is understood"
        labelled = {}  # one breaker per bridge: its alert is the same whichever node tripped it
    elif kind == BRIDGE:
        alertname, todo = _BRIDGE_PROBLEMS[source]
        mid = f"{source.replace('_', '-')}-{kube_node}-{int(round(ts * 1000))}"
        text = f"Kubernetes bridge, node {kube_node}" + (f" (Slurm {node})" if node != "?" else "") \
            + f": {r.get('message') or r.get('error') or source}."
        action = "none"
    else:
        kind = REBOOT if r.get("action") == "reboot" else REPLACE
        mid = f"bridge-{kind}-{node}-{int(round(ts * 1000))}"
        what = "a reboot" if kind == REBOOT else "a replacement"
        text = (f"Kubernetes bridge asked for {what} of node {kube_node} (Slurm {node}) through "
                f"{r.get('backend', '?')}: {r.get('requested', '')}.")
        alertname, action = ("SlurmHooksNodeReboot" if kind == REBOOT else "SlurmHooksNodeReplacement"), kind
        todo = "the node returns to Slurm by itself after a passing check"
    labels = {k: v for k, v in {"alertname": alertname, **labelled,
                                "action": action, "severity": "critical" if kind in (BREAKER, BRIDGE) else "warning",
                                "cluster": cluster}.items() if v and v != "?"}
    data = {"id": mid, "kind": kind, "text": text, "headline": text, "node": r.get("slurm_node"),
            "kube_node": r.get("node"), "reason": r.get("reason"), "action": action,
            "urgency": "high" if kind in (BREAKER, BRIDGE) else "normal", "at": incidents.utc(ts),
            "cluster": cluster or None, "runbook": runbook or None,
            "alerts": [{"labels": labels, "starts_at": ts, "annotations": {"summary": text,
                                                                          "runbook": runbook or todo}}]}
    key = standing_key(r)
    return Message(mid, kind, text, data, f"bridge-{key}" if key else "")


def _bridge_closed(r: dict[str, Any], cluster: str, runbook: str) -> Message:
    ts = float(r.get("ts", 0))
    node = str(r.get("node") or "?")
    back_on = f" on {r['back_on']}" if r.get("back_on") else ""
    why = str(r.get("reason") or "").replace("slurm-hooks: ", "", 1)
    mid = f"bridge-closed-{node}-{int(round(ts * 1000))}"
    text = (f"{node} back in service{back_on} (seen by the Kubernetes bridge in Slurm)"
            + (f"; it was out for: {why}" if why else "") + ".")
    data = {"id": mid, "kind": RESOLVED, "text": text, "headline": text, "node": node,
            "kube_node": r.get("kube_node"), "back_on": r.get("back_on"), "reason": r.get("reason"),
            "resolved_by": "bridge", "at": incidents.utc(ts), "resolved_at": incidents.utc(ts),
            "cluster": cluster or None, "runbook": runbook or None, "alerts": [], "end_node": node}
    return Message(mid, RESOLVED, text, data)


def monitor_message(r: dict[str, Any], cluster: str = "", runbook: str = "") -> Message | None:
    """Monitor-only (``[check] drain = false``): what a hook found and would have drained the node
    for, not acted on; from its ``drain``/``monitor-only`` audit record. Once a day per node and
    reason (the message id carries both): a check every few minutes tells it once. ``None`` for
    any other record."""
    if not (r.get("kind") == "action" and r.get("action") == "drain" and r.get("result") == "monitor-only"):
        return None
    ts = float(r.get("ts", 0))
    node, reason = str(r.get("node") or "?"), str(r.get("reason") or "")
    day = time.strftime("%Y%m%d", time.gmtime(ts))
    mid = f"monitor-{node}-{hashlib.sha256(reason.encode()).hexdigest()[:10]}-{day}"
    seen = f" (seen by {r['context']})" if r.get("context") else ""
    text = (f"{node}: {reason.replace('slurm-hooks: ', '', 1)}{seen}; not acted on: monitor-only "
            f"([check] drain = false), the node stays in service. It would have been drained: \"{reason}\".")
    labels = {k: v for k, v in {"alertname": "SlurmHooksMonitorOnly", "node": node, "action": "none",
                                "severity": "info", "cluster": cluster}.items() if v and v != "?"}
    data = {"id": mid, "kind": MONITOR, "text": text, "headline": text, "node": node, "reason": reason,
            "action": "none", "acted": False, "urgency": "low", "at": incidents.utc(ts), "cluster": cluster or None,
            "runbook": runbook or None,
            "alerts": [{"labels": labels, "starts_at": ts,
                        "annotations": {"summary": text, "runbook": runbook or f"slurm-hooks events --node {node}"}}]}
    return Message(mid, MONITOR, text, data)


# --- the notifier -----------------------------------------------------------------------


class Pace:
    """Each receiver's pace, kept in ``<dir>/pace.json`` (the watcher and a flush share it): a token
    bucket of ``rate`` requests per second (burst :data:`BURST`), and a hold after a failure (capped
    exponential backoff with jitter, or the receiver's ``Retry-After``)."""

    def __init__(self, path: str, rate: float, cap: float, rng: random.Random):
        self.path, self.rate, self.cap, self.rng = path, rate, cap, rng
        self.state: dict[str, dict[str, Any]] = {}
        self.changed = False
        #: An outage began or ended since the last save: that save reaches the disk.
        self.durable = False
        #: The last :meth:`failed` started an outage.
        self.began = False

    def load(self) -> None:
        data = fsutil.read_json(self.path, missing={}, error={})
        self.state = {k: v for k, v in data.items() if isinstance(v, dict)} if isinstance(data, dict) else {}
        self.changed = self.durable = self.began = False

    def save(self) -> None:
        if self.changed:
            # Lost, it is a fresh pace; but an outage's start and end are kept, so that its end is told.
            fsutil.atomic_write(self.path, json.dumps(self.state), mode=0o600, durable=self.durable)
            self.changed = self.durable = False

    def _of(self, dest: str, now: float) -> dict[str, float]:
        p = self.state.setdefault(dest, {"tokens": float(BURST), "at": now, "hold": 0.0, "fails": 0})
        p["tokens"] = min(float(BURST), float(p.get("tokens", BURST)) + max(0.0, now - float(p.get("at", now))) * self.rate)
        p["at"] = now
        return p

    def may_send(self, dest: str, now: float) -> bool:
        p = self._of(dest, now)
        return now >= float(p.get("hold", 0.0)) and p["tokens"] >= 1.0

    def sent(self, dest: str, now: float) -> dict[str, Any] | None:
        """A delivery: the receiver's hold ends. Returns the outage it ends (``out_since``, ``error``,
        ``fails``), or None when it was not out."""
        p = self._of(dest, now)
        p["tokens"] -= 1.0
        return self.released(dest, now)

    def released(self, dest: str, now: float) -> dict[str, Any] | None:
        """The receiver answered (a delivery, a ``notify test``): no hold, no failure counted. Returns
        the outage it ends, as :meth:`sent`."""
        p = self._of(dest, now)
        ended = None
        if "out_since" in p:
            ended = {"out_since": p.pop("out_since"), "error": p.pop("error", ""), "fails": int(p.get("fails", 0))}
            self.durable = True
        p["fails"], p["hold"] = 0, 0.0
        self.changed = True
        return ended

    def may_try(self, dest: str, now: float) -> bool:
        """:meth:`may_send` with no regard to its hold (a ``notify flush`` by hand tries now)."""
        return self._of(dest, now)["tokens"] >= 1.0

    def failed(self, dest: str, now: float, retry_after: float | None, error: str = "") -> float:
        """Hold the receiver back; returns until when. The first failure after a delivery starts
        an outage (``out_since``; :attr:`began` says so to the caller)."""
        p = self._of(dest, now)
        if "out_since" not in p:
            p["out_since"], self.began = now, True
            self.durable = True
        p["error"] = error
        p["fails"] = int(p.get("fails", 0)) + 1
        wait = backoff(int(p["fails"]), self.cap, self.rng)
        if retry_after is not None:
            asked = min(retry_after, max(self.cap, RETRY_AFTER_MAX_S))
            wait = max(wait, asked * (1.0 + self.rng.uniform(0.0, 0.2)))
        p["hold"] = now + wait
        self.changed = True
        return p["hold"]


def backoff(attempts: int, cap: float, rng: random.Random) -> float:
    """Seconds before try ``attempts + 1``: doubling from :data:`BACKOFF_FIRST_S`, the exponent capped
    at :data:`BACKOFF_EXP_MAX`, at most ``cap``, with "equal jitter" (half fixed, half random) so that
    a fleet's notifiers do not come back in step."""
    full = min(cap, BACKOFF_FIRST_S * 2.0 ** min(max(attempts, 1) - 1, BACKOFF_EXP_MAX))
    return full / 2.0 + rng.uniform(0.0, full / 2.0)


class Notifier:
    """Reads the audit log from its cursor into the outbox, and delivers the outbox.

    ``run(stop)`` is the watcher's thread (a pass every second); :meth:`flush` one
    bounded pass for the health check. ``send`` and ``syslog`` are how a message
    leaves (stdlib urllib and syslog unless given); ``clock`` and ``rng`` are time and
    chance, ``monotonic`` what a pass's deadline is measured on, ``sleep`` how a flush waits out an
    incident's settle time (tests pass their own, and move their clocks in it: nothing here sleeps
    on the clock). Only the wait for another process's turn (the lock) is on real time.
    """

    def __init__(self, settings: NotifySettings, send: Sender | None = None, syslog: SyslogSender | None = None,
                 clock: Callable[[], float] = time.time, log: Callable[[str], None] | None = None,
                 rng: random.Random | None = None, sleep: Callable[[float], None] = time.sleep,
                 monotonic: Callable[[], float] = time.monotonic, environ: Mapping[str, str] | None = None,
                 get: Getter | None = None):
        """``environ``: where a ``url_env`` is read (``notify test`` gives the installed programs')."""
        from slurm_hooks.observe.audit import AuditLog

        self.s = settings
        self.clock, self.sleep, self.monotonic = clock, sleep, monotonic
        self.log = log or (lambda msg: print(f"slurm-hooks notify: {msg}", file=sys.stderr, flush=True))
        self._said: set[str] = set()
        self.dests = settings.destinations(send, syslog, problem=self._say_once, environ=environ, get=get)
        #: Where a receiver's outage is told (its start and its end).
        self.audit = AuditLog(settings.audit)
        self.host = os.uname().nodename.split(".")[0]
        #: The receivers' textfile as last written by this process.
        self._prom_text: str | None = None
        self.outbox = Outbox(settings.dir, settings.notify.max_queued, settings.notify.max_age)
        self.pace = Pace(os.path.join(settings.dir, "pace.json"), settings.notify.rate, settings.notify.retry_max,
                         rng or random.Random())
        self.state_path = os.path.join(settings.dir, "cursor.json")
        self.standing_path = os.path.join(settings.dir, "standing.json")
        #: cursor.json as last read or written by this process.
        self._state_text: str | None = None
        self.heartbeat_path = os.path.join(settings.dir, "delivering")
        #: When the next held-back message (an incident within its settle time) becomes due (clock time).
        self._settling: float | None = None
        self._expired_at = float("-inf")
        self._wake = threading.Event()

    # -- one pass

    def flush(self, timeout: float, wait_settle: bool = False, now_all: bool = False) -> dict[str, int]:
        """Read what is new and deliver what is due, within ``timeout`` seconds (the health check's call).

        ``wait_settle``: an incident that opened a moment ago is announced only once its settle time
        has passed; wait for that (and read again) when it ends with at least half of ``timeout`` left
        for delivery, so that a health check with no watcher tells its own drain now, not at its next run.
        ``now_all``: receivers held back after a failure are tried now, once (``notify flush`` by hand).
        """
        deadline = self.monotonic() + timeout
        with self._turn(timeout) as mine:
            if not mine:
                return {"queued": 0, "sent": 0, "waiting": self.outbox.waiting(), "busy": 1}
            self._settling = None
            queued = self.collect()
            if wait_settle and self._settling is not None:
                wait = self._settling - self.clock()
                if 0 < wait <= (deadline - self.monotonic()) / 2:
                    self.sleep(wait)
                    queued += self.collect()
            sent = self.deliver(deadline, now_all=now_all)
        return {"queued": queued, "sent": sent, "waiting": self.outbox.waiting(), "busy": 0}

    def has_work(self) -> bool:
        """Cheap (a listing, a stat, a small file): something waits in the outbox, the audit log grew or
        was replaced since the cursor, or an incident is open (a follow-up or a reminder may be due)."""
        with contextlib.suppress(OSError):
            if any(n.endswith(".json") and not n.startswith(".") for n in os.listdir(self.outbox.box)):
                return True
        try:
            st = os.stat(self.s.audit)
        except OSError:
            return False
        state = self._load_state()
        cursor = state.get("cursor") or {}
        if cursor.get("inode") != st.st_ino or int(cursor.get("offset", 0)) != st.st_size:
            return True
        return bool((state.get("tracker") or {}).get("open"))

    def run(self, stop: threading.Event, poll: float = POLL_S) -> None:
        """The watcher daemon's loop: a pass every ``poll`` seconds until ``stop`` is set; never raises.
        Each pass touches the heartbeat (:meth:`delivering`); a clean stop removes it."""
        while not stop.is_set():
            try:
                self._beat()
                with self._turn(0.0) as mine:
                    if mine:
                        self.collect()
                        self.deliver(self.monotonic() + max(poll, self.s.notify.timeout * 2))
            except Exception as exc:  # noqa: BLE001 - a notifier bug must not stop the watcher
                self._say_once(f"pass failed: {type(exc).__name__}: {exc}")
            self._wake.wait(poll)
            self._wake.clear()
        self.stopped()

    def poke(self, *_: Any) -> None:
        """Something to tell was just written to the log (the bridge's ``Reconciler(notify=...)``): the
        running loop makes its next pass now, not at its next poll."""
        self._wake.set()

    def standing(self, records: Any) -> None:
        """The bridge's problems that are true now, given every pass (each as the audit record that told
        it: ``bridge_breaker_tripped``, ``bridge_permission_missing``; any other is ignored). While true,
        its alert is posted again every ``alert_repost`` (Alertmanager honours ``endsAt``: an alert not
        posted again resolves); one that is no longer given is ended, said once. Cheap: one small file,
        read by the next pass (which this wakes)."""
        true = {}
        for r in records or ():
            key = standing_key(r) if isinstance(r, dict) else ""
            if key and not r.get("dry_run"):
                true[key] = {k: v for k, v in r.items() if isinstance(v, (str, int, float, bool, type(None)))}
        os.makedirs(self.s.dir, mode=0o700, exist_ok=True)
        fsutil.atomic_write(self.standing_path, json.dumps({"at": self.clock(), "true": true}), mode=0o600,
                            durable=False)
        self.poke()

    def _standing(self, told: dict[str, Any], now: float) -> list[Message]:
        """Re-posts of the bridge's problems still true, and the end of those that are not (``told``:
        what was posted, by key; updated)."""
        told_true = fsutil.read_json(self.standing_path, missing={}, error={})
        true = told_true.get("true") if isinstance(told_true, dict) else None
        if not isinstance(true, dict):
            return []  # never told (a node's notifier): nothing to hold or end
        out: list[Message] = []
        for key, r in true.items():
            m = bridge_message(r, self.s.cluster, self.s.notify.runbook) if isinstance(r, dict) else None
            if m is None:
                continue
            t = told.setdefault(key, {"since": now, "n": 0})
            t["record"] = r
            n = int((now - float(t["since"])) // self.s.notify.alert_repost)
            if self.s.notify.alertmanager and n > int(t.get("n", 0)):
                t["n"] = n
                mid = f"bridge-{key}-{int(float(t['since']) * 1000)}-firing-{n}"
                out.append(Message(mid, FIRING, m.text, {**m.data, "id": mid, "kind": FIRING}, f"bridge-{key}"))
        for key in [k for k in told if k not in true]:
            t = told.pop(key)
            m = bridge_message(t.get("record") or {}, self.s.cluster, self.s.notify.runbook)
            if m is None:
                continue
            mid = f"bridge-{key}-{int(float(t['since']) * 1000)}-resolved"
            text = f"No longer true (the bridge's pass at {incidents.utc(now)}): {m.text}"
            out.append(Message(mid, RESOLVED, text, {**m.data, "id": mid, "kind": RESOLVED, "text": text,
                                                     "headline": text, "resolved_ts": now, "urgency": "normal"},
                               f"bridge-{key}"))
        return out

    def _beat(self) -> None:
        os.makedirs(self.s.dir, mode=0o700, exist_ok=True)
        fsutil.atomic_write(self.heartbeat_path, f"{os.getpid()}\n", mode=0o600, durable=False)

    def stopped(self) -> None:
        """No more passes from this process: take the heartbeat away (the health check delivers again)."""
        with contextlib.suppress(OSError):
            os.unlink(self.heartbeat_path)

    def delivering(self) -> bool:
        """A live process's notifier made a pass within :data:`HEARTBEAT_S` (it will deliver what is new)."""
        try:
            with open(self.heartbeat_path, encoding="utf-8") as fh:
                if time.time() - os.fstat(fh.fileno()).st_mtime >= HEARTBEAT_S:
                    return False
                pid = int(fh.read(32).strip() or 0)
        except (OSError, ValueError):
            return False
        if pid <= 0:
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False  # killed without a clean stop
        except PermissionError:
            pass  # alive, someone else's
        return True

    @contextlib.contextmanager
    def _turn(self, wait: float):
        os.makedirs(self.s.dir, mode=0o700, exist_ok=True)
        fd = os.open(os.path.join(self.s.dir, "lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            give_up = time.monotonic() + wait
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= give_up:
                        yield False
                        return
                    time.sleep(0.02)
            self.outbox.forget()  # another process may have delivered since
            self.pace.load()
            yield True
        finally:
            os.close(fd)

    # -- the log into the outbox

    def collect(self) -> int:
        """New audit records -> incidents -> messages in the outbox; then the cursor moves. Returns messages queued."""
        state = self._load_state()
        first = not state
        records, cursor = self._read(state.get("cursor") or {})
        tracker = incidents.Tracker.from_dict(state.get("tracker") or {})
        tracker.feed(records)
        now = self.clock()
        quiet_before = now - BACKFILL_S if first else float("-inf")
        messages: list[Message] = []
        for r in records:
            if float(r.get("ts", 0)) >= quiet_before:
                m = bridge_message(r, self.s.cluster, self.s.notify.runbook) or monitor_message(r, self.s.cluster,
                                                                                       self.s.notify.runbook)
                if m is not None:
                    messages.append(m)
        for inc in [*tracker.closed, *tracker.open.values()]:
            messages.extend(self._due(inc, now, quiet_before))
        standing = state.get("standing") if isinstance(state.get("standing"), dict) else {}
        messages.extend(self._standing(standing, now))
        queued = 0
        for m in messages:
            for name, dest in self.dests.items():
                if dest.accepts(m.kind):
                    queued += self.outbox.put(m.id, m.kind, m.data, m.incident, name, now)
        self._report_moved()
        if queued:
            self.outbox.sync()  # the new files' names on disk before the cursor moves past their records
        # Closed incidents are done once told; open ones stay with what was told about them.
        state = {"cursor": cursor, "tracker": tracker.to_dict(), **({"standing": standing} if standing else {})}
        text = json.dumps(state)
        if text != self._state_text:  # a quiet pass (the watcher's, every second) writes nothing
            fsutil.atomic_write(self.state_path, text, mode=0o600)
            self._state_text = text
        return queued

    def _due(self, inc: Incident, now: float, quiet_before: float) -> list[Message]:
        told = inc.told
        out: list[Message] = []
        c, rb = self.s.cluster, self.s.notify.runbook
        hold = self.s.hold_for(inc.action)
        if inc.opened_at < quiet_before and not told.opened:
            told.opened = told.backfilled = True
            told.escalated = [a for _, a in inc.escalations]
        if not told.opened:
            if inc.open and now < inc.opened_at + self.s.notify.settle:
                due = inc.opened_at + self.s.notify.settle
                self._settling = due if self._settling is None else min(self._settling, due)
                return out  # let the hooks finish writing (requeued jobs) before the one message
            out.append(compose(inc, OPENED, now, cluster=c, runbook=rb, hold=hold))
            told.opened, told.opened_at, told.alert_action = True, now, inc.action
            told.escalated = [a for _, a in inc.escalations]
        for ts, action in inc.escalations:
            if action not in told.escalated:
                if inc.open and now < ts + self.s.notify.settle:
                    # As the opening: the hooks write what follows within moments (the ladder's
                    # [replace] with the GPU's RMA ids and its evidence) and the page tells it.
                    due = ts + self.s.notify.settle
                    self._settling = due if self._settling is None else min(self._settling, due)
                    break
                snapshot = Incident.from_dict({**inc.to_dict(), "action": action})
                out.append(compose(snapshot, ESCALATED, now, cluster=c, runbook=rb, previous_action=told.alert_action,
                                   hold=self.s.hold_for(action)))
                told.escalated.append(action)
                told.alert_action = action
        if not inc.open:
            if not told.resolved and not told.backfilled:
                out.append(compose(inc, RESOLVED, now, cluster=c, runbook=rb))
            told.resolved = True
            return out
        if self.s.notify.reminder_after > 0:
            n = int((now - inc.opened_at) // self.s.notify.reminder_after)
            if n > told.reminders:
                out.append(compose(inc, REMINDER, now, n, cluster=c, runbook=rb))
                told.reminders = n
        if self.s.notify.alertmanager and not told.backfilled:
            n = int((now - (told.opened_at if told.opened_at is not None else now)) // self.s.notify.alert_repost)
            if n > told.reposts:
                out.append(compose(inc, FIRING, now, n, cluster=c, runbook=rb, hold=hold))
                told.reposts = n
        return out

    def _load_state(self) -> dict[str, Any]:
        self._state_text = None
        try:
            with open(self.state_path, encoding="utf-8") as fh:
                text = fh.read()
            data = json.loads(text)
            if isinstance(data, dict):
                self._state_text = text
                return data
            return {}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            self._say_once(f"cannot read {self.state_path} ({exc}); starting from the start of the log")
            return {}

    def _read(self, cursor: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Whole lines after the cursor. A new file (rotated: another inode; truncated; another first line)
        is read from its start."""
        try:
            fh = open(self.s.audit, "rb")
        except FileNotFoundError:
            return [], cursor
        with fh:
            st = os.fstat(fh.fileno())
            head = fh.read(64)
            offset = int(cursor.get("offset", 0))
            if (cursor.get("inode") != st.st_ino or st.st_size < offset
                    or head[: len(cursor.get("head", ""))] != cursor.get("head", "").encode("latin-1")):
                offset = 0
            fh.seek(offset)
            data = fh.read(READ_CHUNK)
        end = data.rfind(b"\n") + 1
        records = []
        for line in data[:end].splitlines():
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if isinstance(r, dict) and _sane(r):
                records.append(r)
        return records, {"inode": st.st_ino, "offset": offset + end, "head": head.decode("latin-1")}

    # -- the outbox out

    def deliver(self, deadline: float, now_all: bool = False) -> int:
        """Send what is due until ``deadline`` (on ``monotonic``), newest incident first, each receiver at its
        own pace. Returns how many were delivered. One entry that fails never stops the others.
        ``now_all``: a receiver held back after a failure is tried now (``notify flush`` by hand), once:
        a failure holds it again."""
        sent = 0
        now = self.clock()
        if not now_all and not any(self.pace.may_send(name, now) for name in self.dests):
            self._write_textfile()
            return 0  # every receiver held back (an outage): not even a look at the outbox
        if now >= self._expired_at + EXPIRE_EVERY_S:
            self._expired_at = now
            if self.outbox.expire(now):
                self._say_once("messages older than [notify] max_age were dropped (said in the next message)")
        held: set[str] = set()
        #: (receiver, incident) with a message not yet sent: the incident's later ones wait behind it.
        behind: set[tuple[str, str]] = set()
        later: dict[tuple[str, str], list[Entry]] | None = None
        for entry in self.outbox.in_order():
            if self.monotonic() >= deadline:
                break
            now = self.clock()
            due = now_all or entry.next_at <= now
            if entry.dest in held or not due or (entry.dest, entry.incident or entry.id) in behind:
                behind.add((entry.dest, entry.incident or entry.id))
                continue
            if self.outbox.was_delivered(entry):
                self.outbox.discard(entry)
                continue
            dest = self.dests.get(entry.dest)
            if dest is None:
                self.outbox.give_up(entry, "destination no longer configured")
                self.log(f"message {entry.id} kept in {self.outbox.failed}: its receiver is no longer configured")
                continue
            if not (self.pace.may_try(entry.dest, now) if now_all else self.pace.may_send(entry.dest, now)):
                held.add(entry.dest)
                behind.add((entry.dest, entry.incident or entry.id))
                continue
            dropped = self.outbox.dropped(entry.dest)
            note = (f"{dropped} older message(s) for this receiver were dropped while it could not be reached "
                    f"(the outbox keeps {self.s.notify.max_queued} for {duration(self.s.notify.max_age)}).") \
                    if dropped else ""
            late_s, late = now - entry.created, ""
            if entry.attempts or late_s >= receivers.LATE_S:
                if later is None:
                    later = self._later()
                out = self.pace.state.get(entry.dest, {}).get("out_since")
                late = receivers.late_words(late_s, out if isinstance(out, (int, float)) else None,
                                            [e.message for e in later.get((entry.dest, entry.incident), ())
                                             if entry.incident and e.order > entry.order], now)
            try:
                dest.send(entry.id, entry.kind, entry.message,
                          Delivery(max(0.1, min(self.s.notify.timeout, deadline - self.monotonic())), now, note,
                                   late, late_s if late else 0.0))
            except DeliveryError as exc:
                error = dest.scrub(str(exc))
                if exc.permanent:
                    self.outbox.give_up(entry, error)
                    self.log(f"message {entry.id} refused by {dest.where}: {error}; kept in {self.outbox.failed}")
                else:
                    # The receiver is out (its credentials, its address, its health, the network): every
                    # message waits, in order, until it answers again; none is thrown away for it.
                    until = self._failed(dest, now, exc.retry_after, error)
                    self.outbox.retry(entry, error, max(until, now + backoff(entry.attempts + 1, self.s.notify.retry_max,
                                                                             self.pace.rng)))
                    held.add(entry.dest)
                    behind.add((entry.dest, entry.incident or entry.id))
                    self._say_once(f"cannot deliver to {dest.where}: {error}; retrying with backoff")
                continue
            except Exception as exc:  # noqa: BLE001 - a message we cannot even build must not block the rest
                error = dest.scrub(f"{type(exc).__name__}: {exc}")
                self.outbox.give_up(entry, error)
                self.log(f"message {entry.id} could not be sent ({error}); kept in {self.outbox.failed}")
                continue
            self._back(dest, self.pace.sent(entry.dest, now), now)
            if dropped:
                self.outbox.count_dropped(entry.dest, -dropped)
            self.outbox.delivered(entry)
            self._said = {m for m in self._said if dest.where not in m}
            sent += 1
        self.pace.save()
        self._report_moved()
        self._write_textfile()
        return sent

    def _later(self) -> dict[tuple[str, str], list[Entry]]:
        """(receiver, incident) -> its entries waiting, in order: what a late message says happened since."""
        out: dict[tuple[str, str], list[Entry]] = {}
        for e in self.outbox.entries():
            if e.incident:
                out.setdefault((e.dest, e.incident), []).append(e)
        return out

    def _failed(self, dest: Destination, now: float, retry_after: float | None, error: str) -> float:
        """Hold ``dest`` back; the first failure after a delivery is the start of an outage, told."""
        self.pace.began = False
        until = self.pace.failed(dest.name, now, retry_after, error)
        if self.pace.began:
            self.audit.write(receivers.KIND, node=self.host, **receivers.out_record(dest.name, dest.where, now, error))
            self.log(f"receiver {dest.where} ({dest.name}) is out: {error}; its messages wait")
        return until

    def _back(self, dest: Destination, ended: dict[str, Any] | None, now: float) -> None:
        """``dest`` answered: an outage it ends is told (how long, how many tries failed)."""
        if ended is None:
            return
        waiting = sum(1 for e in self.outbox.entries() if e.dest == dest.name)
        self.audit.write(receivers.KIND, node=self.host,
                         **receivers.back_record(dest.name, dest.where, float(ended["out_since"]), now,
                                                 int(ended["fails"]), waiting))
        self.log(f"receiver {dest.where} ({dest.name}) is back after {duration(now - float(ended['out_since']))}")

    def _write_textfile(self) -> None:
        """The receivers' state for node_exporter ([metrics] textfile_dir), when it changed."""
        if not self.s.textfile_dir:
            return
        waiting: dict[str, int] = {}
        for e in self.outbox.entries():
            waiting[e.dest] = waiting.get(e.dest, 0) + 1
        text = receivers.render({name: d.where for name, d in self.dests.items()}, self.pace.state, waiting)
        if text != self._prom_text:
            if receivers.write_textfile(self.s.textfile_dir, text) is None:
                self._say_once(f"cannot write {receivers.textfile_path(self.s.textfile_dir)}")
                return
            self._prom_text = text

    # -- a test, through the senders' own path

    def test(self, message: dict[str, Any], wait: float) -> list[Answer]:
        """``notify test``: ``message`` to each receiver through the outbox (a file in it, delivered from
        it, noted in the ledger: the path the watcher and the health check take), within the notifier's
        lock (``wait`` seconds for it). An Alertmanager must say it is one first (``GET /api/v2/status``).
        A receiver that takes it is released: its hold ends (an outage it ends is told) and its waiting
        messages are due now."""
        out: list[Answer] = []
        try:
            with self._turn(wait) as mine:
                if not mine:
                    return [Answer("", "", False, f"another notifier held {self.s.dir}/lock for {wait:g}s: try again")]
                now = self.clock()
                for name, dest in self.dests.items():
                    out.append(self._test_one(name, dest, message, now))
                self.pace.save()
                self._write_textfile()
        except OSError as exc:
            return [Answer("", "", False, f"cannot use the notifier's directory {self.s.dir} "
                                          f"({exc.strerror or exc}): the senders cannot queue a message there either")]
        return out

    def _test_one(self, name: str, dest: Destination, message: dict[str, Any], now: float) -> Answer:
        version = ""
        if isinstance(dest, (Webhook, Alertmanager)) and not dest.url:
            return Answer(name, dest.where, False, f"not sent: {dest.unreadable()}")
        try:
            if isinstance(dest, Alertmanager):
                version = f"Alertmanager {dest.identify(self.s.notify.timeout)}, "
            if not self.outbox.put(message["id"], "test", message, "", name, now):
                return Answer(name, dest.where, False, "the test message is in the outbox already")
        except DeliveryError as exc:
            kind = "is not one to send to" if exc.permanent else "could not be reached"
            return Answer(name, dest.where, False, f"{kind}: {dest.scrub(str(exc))}")
        except OSError as exc:
            return Answer(name, dest.where, False, f"cannot write the outbox {self.outbox.box} ({exc.strerror}): "
                                                   "the senders could not queue a message either")
        [entry] = [e for e in self.outbox.entries() if e.id == message["id"] and e.dest == name]
        try:
            status = dest.send(entry.id, "test", entry.message, Delivery(self.s.notify.timeout, now))
        except DeliveryError as exc:
            self.outbox.discard(entry)
            kind = "refused this message" if exc.permanent else "could not be reached"
            return Answer(name, dest.where, False, f"{kind}: {dest.scrub(str(exc))}")
        except Exception as exc:  # noqa: BLE001 - a test reports what any receiver did
            self.outbox.discard(entry)
            return Answer(name, dest.where, False, dest.scrub(f"{type(exc).__name__}: {exc}"))
        self.outbox.delivered(entry)
        held = float(self.pace.state.get(name, {}).get("hold", 0.0) or 0.0) > now
        self._back(dest, self.pace.released(name, now), now)
        released = self.outbox.release(name, now)
        said = version + (f"delivered (HTTP {status})" if status else "delivered")
        if held or released:
            said += f"; its hold is lifted: {released} waiting message(s) go now"
        return Answer(name, dest.where, True, said)

    def _report_moved(self) -> None:
        while self.outbox.moved_aside:
            path = self.outbox.moved_aside.pop()
            self._say_once(f"unreadable outbox file {os.path.basename(path)} moved to {self.outbox.bad}")

    def _say_once(self, message: str) -> None:
        if message not in self._said:
            self._said.add(message)
            self.log(message)


@dataclass(frozen=True)
class Answer:
    """What one receiver answered to ``notify test``."""

    name: str
    where: str
    ok: bool
    said: str


def send_test(settings: NotifySettings, send: Sender | None = None, syslog: SyslogSender | None = None,
              clock: Callable[[], float] = time.time, host: str = "", environ: Mapping[str, str] | None = None,
              get: Getter | None = None) -> list[Answer]:
    """One marked message to each receiver, by the path the senders take (:meth:`Notifier.test`: the
    outbox, the ledger, each receiver's hold; ``environ``: the senders' environment, where a
    ``url_env`` is read). For Alertmanager, after it says it is one, an ``info`` alert,
    ``SlurmHooksTest``, that ends by itself after a few minutes."""
    import socket

    problems: list[str] = []
    notifier = Notifier(settings, send, syslog, clock=clock, log=lambda m: None, environ=environ, get=get)
    now = clock()
    host = host or socket.gethostname()
    mid = f"test-{host}-{int(now * 1000)}"
    text = (f"slurm-hooks test message from {host} at {incidents.utc(now)}: this receiver is reached; "
            "no action needed.")
    labels = {k: v for k, v in {"alertname": "SlurmHooksTest", "node": host, "severity": "info",
                                "cluster": settings.cluster}.items() if v}
    message = {"id": mid, "kind": "test", "test": True, "text": text, "headline": text, "node": host,
               "cluster": settings.cluster or None, "at": incidents.utc(now),
               "alerts": [{"labels": labels, "starts_at": now, "ends_at": now + 300.0,
                           "annotations": {"summary": text}}]}
    settings.destinations(problem=problems.append, environ=environ)
    out = notifier.test(message, max(2.0, 2 * settings.notify.timeout + 1.0))
    said = " ".join(a.said for a in out)
    out += [Answer("", "", False, p) for p in problems if p not in said]
    return out


def receivers_held(settings: NotifySettings, now: float | None = None) -> list[str]:
    """One line per receiver held back after failed tries (for ``notify status``): an outage, its
    messages waiting; never its URL."""
    import datetime

    pace = Pace(os.path.join(settings.dir, "pace.json"), settings.notify.rate, settings.notify.retry_max, random.Random())
    pace.load()
    now = time.time() if now is None else now
    names = {d.name: d.where for d in settings.destinations(problem=lambda m: None).values()}
    out = []
    for name, p in sorted(pace.state.items()):
        fails, hold = int(p.get("fails", 0) or 0), float(p.get("hold", 0.0) or 0.0)
        if fails and hold > now:
            until = datetime.datetime.fromtimestamp(hold, tz=datetime.timezone.utc).strftime("%H:%M:%SZ")
            out.append(f"{names.get(name, name)} ({name}): out, {fails} failed tr{'y' if fails == 1 else 'ies'} in a "
                       f"row, next try after {until}; its messages wait")
    return out


def pending(entries: list[Entry]) -> list[str]:
    """One line per waiting message (for ``notify status``)."""
    return [f"{e.id} -> {e.dest}: {e.attempts} attempt(s)" + (f", last error: {e.last_error}" if e.last_error else "")
            for e in entries]
