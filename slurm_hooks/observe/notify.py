"""Tell people what happened: webhooks (Slack or JSON) and syslog, from the audit log.

Nothing here is on the path of a drain. The hooks write the audit log as they
always do; a :class:`Notifier` (a thread of ``slurm-hooks watch``, or a short
``slurm-hooks notify flush``) reads what is new from a saved cursor, turns
incidents into messages (:mod:`slurm_hooks.observe.incidents`: one per incident, a
follow-up when the node is back or the action escalates, a reminder while it
stays out), writes each message to an on-disk outbox, and delivers the outbox
with retries, exponential backoff and a timeout per request.

Nothing lost, nothing sent twice: a message is a file (0600, written atomically)
before the cursor moves past the records it came from; a delivered message is
noted in a ledger and then removed, so a restart at any point neither drops nor
repeats one. Message ids are derived from the incident, so reading the same
records again gives the same ids; every webhook request carries the id as
``Idempotency-Key`` for receivers that dedupe a request retried after a lost
answer. One lock makes the watcher's thread and a ``flush`` take turns.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from slurm_hooks import fsutil
from slurm_hooks.observe import incidents
from slurm_hooks.observe.incidents import Incident, duration
from slurm_hooks.values import dataclass

#: At most this much of the log is read per pass (a huge backlog is taken in steps).
READ_CHUNK = 4 << 20
#: On the very first pass (no cursor), events older than this are tracked but not announced.
BACKFILL_S = 3600.0
#: Delivered message ids remembered (far more than a flood of incidents produces between restarts).
LEDGER_SIZE = 5000
BACKOFF_FIRST_S = 1.0
POLL_S = 1.0
#: The watcher's notifier touches its heartbeat at each pass; older than this, nobody delivers.
HEARTBEAT_S = 30.0

Sender = Callable[[str, bytes, dict, float], int]
SyslogSender = Callable[[int, str], None]


@dataclass(frozen=True)
class Settings:
    """What the notifier needs from ``[notify]`` (and where the log and the state are)."""

    audit: str
    dir: str
    webhooks: tuple[dict[str, str], ...] = ()
    syslog: bool = False
    settle: float = 2.0
    reminder_after: float = 14400.0
    timeout: float = 5.0
    retry_max: float = 300.0

    @classmethod
    def from_config(cls, cfg: Any) -> Settings:
        n = cfg.notify
        return cls(audit=cfg.log.audit, dir=n.outbox or os.path.join(cfg.state.dir, "notify"),
                   webhooks=tuple(n.webhook), syslog=bool(n.syslog), settle=float(n.settle),
                   reminder_after=float(n.reminder_after), timeout=float(n.timeout), retry_max=float(n.retry_max))

    @property
    def destinations(self) -> dict[str, dict[str, str]]:
        """Destination name -> how to reach it. A webhook's name holds a hash of its URL, so a
        message queued for a receiver that is later removed from the config is never sent elsewhere."""
        out: dict[str, dict[str, str]] = {}
        if self.syslog:
            out["syslog"] = {"format": "text"}
        for hook in self.webhooks:
            digest = hashlib.sha256(hook["url"].encode()).hexdigest()[:10]
            out[f"webhook-{digest}"] = hook
        return out


# --- messages --------------------------------------------------------------------------


@dataclass(frozen=True)
class Message:
    id: str
    kind: str  # opened | escalated | resolved | reminder | breaker
    text: str
    data: dict[str, Any]


def _gpu_words(f: incidents.Finding) -> str:
    if f.gpu is None and not f.gpu_key:
        return ""
    ids = ", ".join(x for x in (f.uuid, f"serial {f.serial}" if f.serial else "") if x)
    return f" on GPU {f.gpu if f.gpu is not None else '?'}" + (f" ({ids})" if ids else "")


def _jobs_words(inc: Incident) -> str:
    def named(how: str) -> str:
        return ", ".join(j.job_id + (f" ({j.user})" if j.user else "") for j in inc.jobs.values() if j.how == how)

    words = [f"{label}: {jobs}" for label, jobs in (("jobs requeued", named("requeued")),
                                                   ("jobs refused at start (Slurm requeues them)", named("refused")))
             if jobs]
    return "; ".join(words) or "no job requeued"


def _what(inc: Incident) -> str:
    f = inc.main_finding()
    if f is None:
        return inc.reason.replace("slurm-hooks: ", "", 1) or "a fault"
    return f"{f.message}{_gpu_words(f)}"


def compose(inc: Incident, kind: str, now: float, n: int = 0) -> Message:
    """One message about one incident; link-free text that reads alone in a channel or a log."""
    data = incidents.summary(inc)
    if kind == "opened":
        text = f"{inc.node} drained [{inc.action}]: {_what(inc)}; {_jobs_words(inc)}."
        if inc.contexts:
            text += f" Seen by {', '.join(inc.contexts)}."
        mid = f"{inc.id}/opened"
    elif kind == "escalated":
        text = f"{inc.node} escalated to [{inc.action}]: {inc.reason.replace('slurm-hooks: ', '', 1)}."
        mid = f"{inc.id}/escalated-{inc.action}"
    elif kind == "resolved":
        who = "by slurm-hooks after a passing check" if inc.resolved_by == "slurm-hooks" else "by an admin"
        text = (f"{inc.node} back in service after {duration(inc.mttr or 0.0)} (resumed {who}); "
                f"it was out for: {_what(inc)}.")
        mid = f"{inc.id}/resolved"
    elif kind == "reminder":
        text = f"{inc.node} still out of service after {duration(now - inc.opened_at)} [{inc.action}]: {_what(inc)}."
        mid = f"{inc.id}/reminder-{n}"
    else:
        raise ValueError(kind)
    text += f" Incident {inc.id}."
    return Message(mid, kind, text, {"id": mid, "kind": kind, "text": text, **data})


def breaker_message(r: dict[str, Any]) -> Message:
    """The bridge's ``bridge_breaker_tripped`` record: no more nodes are being taken in Kubernetes."""
    ts = float(r.get("ts", 0))
    mid = f"bridge-breaker-{int(round(ts * 1000))}"
    text = (f"Kubernetes bridge circuit breaker tripped at node {r.get('node', '?')}"
            f" (Slurm {r.get('slurm_node', '?')}): {r.get('reason', '')}. "
            f"{r.get('message') or 'No new nodes will be taken.'}")
    data = {"id": mid, "kind": "breaker", "text": text, "node": r.get("slurm_node"), "kube_node": r.get("node"),
            "reason": r.get("reason"), "urgency": "high", "at": incidents.utc(ts)}
    return Message(mid, "breaker", text, data)


_SLACK_EMOJI = {"opened": ":rotating_light:", "escalated": ":rotating_light:", "resolved": ":white_check_mark:",
                "reminder": ":hourglass:", "breaker": ":no_entry:"}


def payload(message: dict[str, Any], fmt: str) -> dict[str, Any]:
    """The request body for a receiver: Slack's incoming-webhook shape, or the message as JSON."""
    if fmt == "slack":
        text = f"{_SLACK_EMOJI.get(message['kind'], '')} {message['text']}".strip()
        fields = []
        for label, key in (("Node", "node"), ("Action", "action"), ("Incident", "incident")):
            if message.get(key):
                fields.append({"type": "mrkdwn", "text": f"*{label}*\n{message[key]}"})
        blocks: list[dict[str, Any]] = [{"type": "section", "text": {"type": "mrkdwn", "text": text}}]
        if fields:
            blocks.append({"type": "section", "fields": fields})
        return {"text": text, "blocks": blocks}
    return message


# --- delivery ----------------------------------------------------------------------------


class DeliveryError(Exception):
    def __init__(self, message: str, permanent: bool = False):
        super().__init__(message)
        self.permanent = permanent


def http_post(url: str, body: bytes, headers: dict, timeout: float) -> int:
    """POST with the stdlib; the status code, or DeliveryError (permanent for a 4xx other than 408/429)."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - http(s) only, checked in config
            response.read(65536)
            return int(response.status)
    except urllib.error.HTTPError as exc:
        permanent = 400 <= exc.code < 500 and exc.code not in (408, 429)
        raise DeliveryError(f"HTTP {exc.code} {exc.reason}", permanent) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise DeliveryError(f"{type(reason).__name__}: {reason}") from None


def syslog_send(priority: int, text: str) -> None:
    import syslog

    syslog.openlog("slurm-hooks", syslog.LOG_PID, syslog.LOG_DAEMON)
    syslog.syslog(priority, text)


def _priority(kind: str) -> int:
    import syslog

    return {"opened": syslog.LOG_CRIT, "escalated": syslog.LOG_CRIT, "breaker": syslog.LOG_CRIT,
            "reminder": syslog.LOG_WARNING}.get(kind, syslog.LOG_NOTICE)


class Outbox:
    """One file per (message, destination) in ``<dir>/outbox``; a ledger of what was delivered."""

    def __init__(self, directory: str):
        self.dir = directory
        self.box = os.path.join(directory, "outbox")
        self.failed = os.path.join(directory, "failed")
        self.ledger_path = os.path.join(directory, "delivered.json")
        self._ledger: list[str] | None = None

    def _name(self, mid: str, dest: str) -> str:
        safe = "".join(c if c.isalnum() or c in "-._" else "_" for c in mid)
        return os.path.join(self.box, f"{safe}--{dest}.json")

    def ledger(self) -> list[str]:
        if self._ledger is None:
            try:
                with open(self.ledger_path, encoding="utf-8") as fh:
                    data = json.load(fh)
                self._ledger = [str(x) for x in data] if isinstance(data, list) else []
            except (OSError, ValueError):
                self._ledger = []
        return self._ledger

    def put(self, message: Message, dest: str, now: float) -> bool:
        """Queue ``message`` for ``dest`` unless it is queued or was delivered already."""
        path = self._name(message.id, dest)
        if f"{message.id}@{dest}" in self.ledger() or os.path.exists(path):
            return False
        entry = {"id": message.id, "dest": dest, "kind": message.kind, "message": message.data,
                 "created": now, "attempts": 0, "next_at": now, "last_error": ""}
        os.makedirs(self.box, mode=0o700, exist_ok=True)
        fsutil.atomic_write(path, json.dumps(entry), mode=0o600)
        return True

    def entries(self) -> list[tuple[str, dict[str, Any]]]:
        try:
            names = sorted(n for n in os.listdir(self.box) if n.endswith(".json") and not n.startswith("."))
        except FileNotFoundError:
            return []
        out = []
        for name in names:
            path = os.path.join(self.box, name)
            try:
                with open(path, encoding="utf-8") as fh:
                    out.append((path, json.load(fh)))
            except (OSError, ValueError):
                continue
        out.sort(key=lambda e: (float(e[1].get("created", 0)), e[0]))
        return out

    def delivered(self, path: str, entry: dict[str, Any]) -> None:
        """Note it in the ledger first, then remove the file: a crash in between sends nothing again."""
        ledger = self.ledger()
        ledger.append(f"{entry['id']}@{entry['dest']}")
        del ledger[:-LEDGER_SIZE]
        fsutil.atomic_write(self.ledger_path, json.dumps(ledger), mode=0o600)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)

    def was_delivered(self, entry: dict[str, Any]) -> bool:
        return f"{entry['id']}@{entry['dest']}" in self.ledger()

    def retry(self, path: str, entry: dict[str, Any], error: str, now: float, cap: float) -> None:
        entry["attempts"] = int(entry.get("attempts", 0)) + 1
        entry["next_at"] = now + min(cap, BACKOFF_FIRST_S * 2 ** (entry["attempts"] - 1))
        entry["last_error"] = error
        fsutil.atomic_write(path, json.dumps(entry), mode=0o600)

    def give_up(self, path: str, entry: dict[str, Any], error: str) -> None:
        entry["last_error"] = error
        os.makedirs(self.failed, mode=0o700, exist_ok=True)
        fsutil.atomic_write(os.path.join(self.failed, os.path.basename(path)), json.dumps(entry), mode=0o600)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


# --- the notifier -----------------------------------------------------------------------


class Notifier:
    """Reads the audit log from its cursor into the outbox, and delivers the outbox.

    ``run(stop)`` is the watcher's thread (a pass every second); :meth:`flush` one
    bounded pass for the health check. ``send`` and ``syslog`` are how a message
    leaves (stdlib urllib and syslog unless given).
    """

    def __init__(self, settings: Settings, send: Sender | None = None, syslog: SyslogSender | None = None,
                 clock: Callable[[], float] = time.time, log: Callable[[str], None] | None = None):
        self.s = settings
        self.send = send or http_post
        self.syslog = syslog or syslog_send
        self.clock = clock
        self.log = log or (lambda msg: print(f"slurm-hooks notify: {msg}", file=sys.stderr, flush=True))
        self.outbox = Outbox(settings.dir)
        self.state_path = os.path.join(settings.dir, "cursor.json")
        self.heartbeat_path = os.path.join(settings.dir, "delivering")
        self._said: set[str] = set()
        #: When the next held-back message (an incident within its settle time) becomes due (clock time).
        self._settling: float | None = None

    # -- one pass

    def flush(self, timeout: float, wait_settle: bool = False) -> dict[str, int]:
        """Read what is new and deliver what is due, within ``timeout`` seconds (the health check's call).

        ``wait_settle``: an incident that opened a moment ago is announced only once its settle time
        has passed; wait for that (and read again) when it ends with at least half of ``timeout`` left
        for delivery, so that a health check with no watcher tells its own drain now, not at its next run.
        """
        deadline = time.monotonic() + timeout
        with self._turn(timeout) as mine:
            if not mine:
                return {"queued": 0, "sent": 0, "waiting": len(self.outbox.entries()), "busy": 1}
            self._settling = None
            queued = self.collect()
            if wait_settle and self._settling is not None:
                wait = self._settling - self.clock()
                if 0 < wait <= (deadline - time.monotonic()) / 2:
                    time.sleep(wait)
                    queued += self.collect()
            sent = self.deliver(deadline)
        return {"queued": queued, "sent": sent, "waiting": len(self.outbox.entries()), "busy": 0}

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
                        self.deliver(time.monotonic() + max(poll, self.s.timeout * 2))
            except Exception as exc:  # noqa: BLE001 - a notifier bug must not stop the watcher
                self._say_once(f"pass failed: {type(exc).__name__}: {exc}")
            stop.wait(poll)
        self.stopped()

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
            self.outbox._ledger = None  # another process may have delivered since
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
            if r.get("kind") == "bridge_breaker_tripped" and not r.get("dry_run") and float(r.get("ts", 0)) >= quiet_before:
                messages.append(breaker_message(r))
        for inc in [*tracker.closed, *tracker.open.values()]:
            messages.extend(self._due(inc, now, quiet_before))
        queued = 0
        dests = self.s.destinations
        for m in messages:
            for dest in dests:
                queued += self.outbox.put(m, dest, now)
        # Closed incidents are done once told; open ones stay with what was told about them.
        state = {"cursor": cursor, "tracker": tracker.to_dict()}
        fsutil.atomic_write(self.state_path, json.dumps(state), mode=0o600)
        return queued

    def _due(self, inc: Incident, now: float, quiet_before: float) -> list[Message]:
        told = inc.told
        out: list[Message] = []
        if inc.opened_at < quiet_before:
            told.setdefault("opened", "before this notifier")
            told.setdefault("escalated", [a for _, a in inc.escalations])
        if not told.get("opened"):
            if inc.open and now < inc.opened_at + self.s.settle:
                due = inc.opened_at + self.s.settle
                self._settling = due if self._settling is None else min(self._settling, due)
                return out  # let the hooks finish writing (requeued jobs) before the one message
            out.append(compose(inc, "opened", now))
            told["opened"] = True
            told["escalated"] = [a for _, a in inc.escalations]
        for _, action in inc.escalations:
            if action not in told.setdefault("escalated", []):
                snapshot = Incident.from_dict({**inc.to_dict(), "action": action})
                out.append(compose(snapshot, "escalated", now))
                told["escalated"].append(action)
        if not inc.open:
            if not told.get("resolved") and told["opened"] is True:
                out.append(compose(inc, "resolved", now))
            told["resolved"] = True
        elif self.s.reminder_after > 0:
            n = int((now - inc.opened_at) // self.s.reminder_after)
            if n > int(told.get("reminders", 0)):
                out.append(compose(inc, "reminder", now, n))
                told["reminders"] = n
        return out

    def _load_state(self) -> dict[str, Any]:
        try:
            with open(self.state_path, encoding="utf-8") as fh:
                data = json.load(fh)
            return data if isinstance(data, dict) else {}
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
            if isinstance(r, dict):
                records.append(r)
        return records, {"inode": st.st_ino, "offset": offset + end, "head": head.decode("latin-1")}

    # -- the outbox out

    def deliver(self, deadline: float) -> int:
        """Send what is due until ``deadline`` (monotonic). Returns how many were delivered."""
        dests = self.s.destinations
        sent = 0
        for path, entry in self.outbox.entries():
            if time.monotonic() >= deadline:
                break
            now = self.clock()
            if float(entry.get("next_at", 0)) > now:
                continue
            if self.outbox.was_delivered(entry):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                continue
            dest = dests.get(str(entry.get("dest")))
            if dest is None:
                self.outbox.give_up(path, entry, "destination no longer configured")
                self.log(f"message {entry.get('id')} kept in {self.outbox.failed}: its receiver is no longer configured")
                continue
            try:
                self._send(entry, dest, max(0.1, min(self.s.timeout, deadline - time.monotonic())))
            except DeliveryError as exc:
                if exc.permanent:
                    self.outbox.give_up(path, entry, str(exc))
                    self.log(f"message {entry['id']} refused by {_where(dest)}: {exc}; kept in {self.outbox.failed}")
                else:
                    self.outbox.retry(path, entry, str(exc), now, self.s.retry_max)
                    self._say_once(f"cannot deliver to {_where(dest)}: {exc}; retrying with backoff")
                continue
            self.outbox.delivered(path, entry)
            self._said = {m for m in self._said if _where(dest) not in m}
            sent += 1
        return sent

    def _send(self, entry: dict[str, Any], dest: dict[str, str], timeout: float) -> None:
        message = entry["message"]
        if dest.get("format") == "text":
            self.syslog(_priority(entry.get("kind", "")), message["text"])
            return
        body = json.dumps(payload(message, dest.get("format", "json"))).encode()
        headers = {"Content-Type": "application/json", "User-Agent": "slurm-hooks",
                   "Idempotency-Key": entry["id"]}
        status = self.send(dest["url"], body, headers, timeout)
        if not 200 <= status < 300:
            raise DeliveryError(f"HTTP {status}", permanent=400 <= status < 500 and status not in (408, 429))

    def _say_once(self, message: str) -> None:
        if message not in self._said:
            self._said.add(message)
            self.log(message)


def _where(dest: dict[str, str]) -> str:
    if dest.get("format") == "text":
        return "syslog"
    url = dest.get("url", "")
    host = url.split("://", 1)[-1].split("/", 1)[0]
    return dest.get("name") or host


def pending(entries: Iterable[tuple[str, dict[str, Any]]]) -> list[str]:
    """One line per waiting message (for ``notify status``)."""
    return [f"{e.get('id')} -> {e.get('dest')}: {e.get('attempts', 0)} attempt(s)"
            + (f", last error: {e['last_error']}" if e.get("last_error") else "") for _, e in entries]
