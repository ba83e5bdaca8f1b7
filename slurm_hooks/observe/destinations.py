"""Where a message goes: syslog, a webhook (Slack or JSON), Alertmanager. One class per kind, each
with its own ``send()``; every one raises :class:`DeliveryError` (permanent or not, with the
receiver's ``Retry-After``) and never prints a URL (a webhook's path is its credential).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from slurm_hooks.urlsecret import url_origin
from slurm_hooks.values import dataclass

#: What the notifier makes (``Message.kind``). Reminders and Alertmanager re-posts are state, not
#: news: only the latest one of an incident waits in the outbox.
OPENED, ESCALATED, RESOLVED, REMINDER, FIRING = "opened", "escalated", "resolved", "reminder", "firing"
BREAKER, REPLACE, REBOOT, BRIDGE = "breaker", "replace", "reboot", "bridge"
#: Monitor-only ([check] drain = false): a fault found and not acted on.
MONITOR = "monitor"
COALESCED = frozenset({REMINDER, FIRING})
_NEWS = frozenset({OPENED, ESCALATED, RESOLVED, BREAKER, REPLACE, REBOOT, BRIDGE, MONITOR})

#: Slack's documented limits (api.slack.com/reference/block-kit/blocks: a section's text 3000
#: characters, at most 10 fields of 2000, 50 blocks; chat.postMessage: text truncated past 40000).
SLACK_SECTION_MAX = 3000
SLACK_FIELD_MAX = 2000
SLACK_FIELDS_MAX = 10
SLACK_BLOCKS_MAX = 50
SLACK_TEXT_MAX = 40000

Sender = Callable[[str, bytes, dict, float], int]
SyslogSender = Callable[[int, str], None]


# --- sending ------------------------------------------------------------------------------------


class DeliveryError(Exception):
    """A request that did not deliver. ``permanent``: the receiver refused this message (a 4xx other
    than 408/429), trying again will not help; ``retry_after``: seconds the receiver asked us to wait."""

    def __init__(self, message: str, permanent: bool = False, retry_after: float | None = None):
        super().__init__(message)
        self.permanent = permanent
        self.retry_after = retry_after


def _retry_after(value: str | None) -> float | None:
    """``Retry-After`` in seconds (RFC 9110: seconds, or an HTTP date); ``None`` when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        from email.utils import parsedate_to_datetime

        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - datetime.now(tz=timezone.utc).timestamp())


def status_error(code: int, reason: str = "", retry_after: str | None = None) -> DeliveryError:
    """One rule for every HTTP answer that is not 2xx."""
    permanent = 400 <= code < 500 and code not in (408, 429)
    return DeliveryError(f"HTTP {code}{' ' + reason if reason else ''}", permanent, _retry_after(retry_after))


def http_post(url: str, body: bytes, headers: dict, timeout: float) -> int:
    """POST with the stdlib; the status code, or :class:`DeliveryError` (never naming the URL)."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - http(s) only, checked in config
            response.read(65536)
            return int(response.status)
    except urllib.error.HTTPError as exc:
        raise status_error(exc.code, str(exc.reason or ""), exc.headers.get("Retry-After") if exc.headers else None) \
            from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise DeliveryError(f"{type(reason).__name__}: {_no_url(str(reason))}") from None


def _no_url(text: str) -> str:
    """An error text with any URL in it cut to its scheme and host."""
    return re.sub(r"[a-z][a-z0-9+.-]*://\S+", lambda m: url_origin(m.group(0)), text)


def syslog_send(priority: int, text: str) -> None:
    import syslog

    syslog.openlog("slurm-hooks", syslog.LOG_PID, syslog.LOG_DAEMON)
    syslog.syslog(priority, text)


@dataclass(frozen=True)
class Delivery:
    """What one send needs besides the message: a request timeout, the clock, and a line to add
    (``note``: messages this receiver lost while the outbox was full or too old)."""

    timeout: float
    now: float
    note: str = ""


class Destination:
    """A receiver. ``name`` is stable across restarts and config edits that keep the receiver."""

    kinds: frozenset[str] = _NEWS | {REMINDER}
    name = ""
    where = ""

    def accepts(self, kind: str) -> bool:
        return kind in self.kinds

    def send(self, entry_id: str, kind: str, message: dict[str, Any], d: Delivery) -> None:
        raise NotImplementedError


def _source_name(prefix: str, table: dict[str, str]) -> str:
    """A name from where the URL comes from (the file or the variable, else the URL itself), hashed:
    a message queued for a receiver later removed from the config is never sent elsewhere."""
    source = next((f"{k}:{table[k]}" for k in ("url_file", "url_env", "url") if table.get(k)), "")
    return f"{prefix}-{hashlib.sha256(source.encode()).hexdigest()[:10]}"


class Syslog(Destination):
    name = where = "syslog"

    def __init__(self, send: SyslogSender | None = None):
        self._send = send or syslog_send

    def send(self, entry_id: str, kind: str, message: dict[str, Any], d: Delivery) -> None:
        import syslog

        priority = {OPENED: syslog.LOG_CRIT, ESCALATED: syslog.LOG_CRIT, BREAKER: syslog.LOG_CRIT,
                    REMINDER: syslog.LOG_WARNING, BRIDGE: syslog.LOG_ERR,
                    MONITOR: syslog.LOG_WARNING}.get(kind, syslog.LOG_NOTICE)
        self._send(priority, message["text"] + (f" {d.note}" if d.note else ""))


class _Http(Destination):
    def __init__(self, table: dict[str, str], url: str | None, post: Sender | None, prefix: str):
        self.table, self.url, self.post = table, url, post or http_post
        self.name = _source_name(prefix, table)
        self.where = table.get("name") or (url_origin(url) if url else self.name)

    def _post(self, body: dict[str, Any], headers: dict[str, str], d: Delivery) -> None:
        if not self.url:
            raise DeliveryError("its URL could not be read (see the error above)")
        status = self.post(self.url, json.dumps(body).encode(), {"Content-Type": "application/json",
                                                                  "User-Agent": "slurm-hooks", **headers}, d.timeout)
        if not 200 <= status < 300:
            raise status_error(status)


#: What a message carries for Alertmanager only (the JSON webhook gets the rest).
_ALERTMANAGER_ONLY = ("alerts", "ended_alerts", "resolved_ts")


class Webhook(_Http):
    """An incoming webhook: Slack's shape, or the message as one JSON object."""

    def __init__(self, table: dict[str, str], url: str | None, post: Sender | None = None):
        super().__init__(table, url, post, "webhook")
        self.format = table.get("format", "json")

    def send(self, entry_id: str, kind: str, message: dict[str, Any], d: Delivery) -> None:
        if self.format == "slack":
            body = slack_payload(message, d.note)
        else:
            body = {k: v for k, v in message.items() if k not in _ALERTMANAGER_ONLY}
            if d.note:
                body["dropped"] = d.note
        self._post(body, {"Idempotency-Key": entry_id}, d)


class Alertmanager(_Http):
    """Prometheus Alertmanager's ``POST /api/v2/alerts``: each open finding an alert, posted again
    while open (``endsAt`` ahead by ``hold``), resolved with ``endsAt`` at the node's return."""

    kinds = _NEWS | {FIRING}

    def __init__(self, table: dict[str, str], url: str | None, post: Sender | None = None, hold: float = 240.0,
                 auth: str = ""):
        super().__init__(table, url, post, "alertmanager")
        if self.url:
            base = self.url.rstrip("/")
            self.url = base if base.endswith("/api/v2/alerts") else base + "/api/v2/alerts"
        self.hold, self.auth = hold, auth

    def send(self, entry_id: str, kind: str, message: dict[str, Any], d: Delivery) -> None:
        self._post(alerts(message, kind, d.now, self.hold, d.note),
                   {"Authorization": self.auth} if self.auth else {}, d)


def read_auth(path: str) -> str:
    """The Authorization header from ``auth_file``: its line as written when it names a scheme
    ("Bearer ...", "Basic ..."), else the line as a bearer token."""
    with open(path, encoding="utf-8") as fh:
        value = fh.read(8192).strip()
    return value if value.split(" ", 1)[0] in ("Bearer", "Basic") else f"Bearer {value}"


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def alerts(message: dict[str, Any], kind: str, now: float, hold: float, note: str = "") -> list[dict[str, Any]]:
    """The request body: the message's alerts, firing until ``now + hold`` or resolved at the node's
    return; an escalation also ends the alerts of the action it replaced."""
    out = []
    for alert in message.get("alerts") or ():
        if kind == RESOLVED:
            ends = float(message.get("resolved_ts") or now)
        elif alert.get("ends_at") is not None:
            ends = float(alert["ends_at"])
        else:
            ends = now + hold
        annotations = dict(alert.get("annotations") or {})
        if note:
            annotations["dropped"] = note
        out.append({"labels": alert["labels"], "annotations": annotations,
                    "startsAt": _iso(float(alert["starts_at"])), "endsAt": _iso(max(ends, float(alert["starts_at"])))})
    for alert in message.get("ended_alerts") or ():
        out.append({"labels": alert["labels"], "annotations": dict(alert.get("annotations") or {}),
                    "startsAt": _iso(float(alert["starts_at"])), "endsAt": _iso(now)})
    return out


# --- Slack ------------------------------------------------------------------------------------

_SLACK_EMOJI = {OPENED: ":rotating_light:", ESCALATED: ":rotating_light:", RESOLVED: ":white_check_mark:",
                REMINDER: ":hourglass:", BREAKER: ":no_entry:", REPLACE: ":recycle:", REBOOT: ":arrows_counterclockwise:",
                BRIDGE: ":warning:", MONITOR: ":eyes:"}


def slack_escape(text: str) -> str:
    """Slack's three control characters (api.slack.com: "Escaping text"): ``<!channel>`` in a job's
    name must not ping a channel."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def fit_items(head: str, items: list[str], limit: int, sep: str = ", ") -> str:
    """``head`` and as many ``items`` as fit in ``limit`` characters, then "... and N more"."""
    text = head + sep.join(items)
    if len(text) <= limit:
        return text
    kept: list[str] = []
    for n, item in enumerate(items):
        tail = f" ... and {len(items) - n - 1} more"
        candidate = head + sep.join([*kept, item])
        if len(candidate) + len(tail) > limit:
            break
        kept.append(item)
    more = f" ... and {len(items) - len(kept)} more"
    text = head + sep.join(kept) + more
    return text if len(text) <= limit else fit_text(head, limit)


def fit_text(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    keep = limit - len(f" ... and {len(text)} more characters")
    return text[:keep].rstrip() + f" ... and {len(text) - keep} more characters"


def slack_payload(message: dict[str, Any], note: str = "") -> dict[str, Any]:
    """Slack's incoming-webhook body, escaped, each part within Slack's limits."""
    kind = str(message.get("kind", ""))
    headline = slack_escape(str(message.get("headline") or message.get("text") or ""))
    head = fit_text(f"{_SLACK_EMOJI.get(kind, '')} {headline}".strip(), SLACK_SECTION_MAX)
    blocks: list[dict[str, Any]] = [{"type": "section", "text": {"type": "mrkdwn", "text": head}}]
    for how, label in (("requeued", "Jobs requeued"), ("refused", "Jobs refused at start (Slurm requeues them)")):
        jobs = [slack_escape(j["job_id"] + (f" ({j['user']})" if j.get("user") else ""))
                for j in message.get("jobs") or () if j.get("how") == how]
        if jobs:
            blocks.append({"type": "section",
                           "text": {"type": "mrkdwn", "text": fit_items(f"*{label}* ({len(jobs)}): ", jobs,
                                                                        SLACK_SECTION_MAX)}})
    fields = []
    for label, key in (("Node", "node"), ("Action", "action"), ("Incident", "incident")):
        if message.get(key):
            fields.append({"type": "mrkdwn",
                           "text": fit_text(f"*{label}*\n{slack_escape(str(message[key]))}", SLACK_FIELD_MAX)})
    if fields:
        blocks.append({"type": "section", "fields": fields[:SLACK_FIELDS_MAX]})
    context = [x for x in (note, message.get("runbook")) if x]
    if context:
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": fit_text(slack_escape(str(x)),
                                                                                          SLACK_FIELD_MAX)}
                                                       for x in context]})
    return {"text": head, "blocks": blocks[:SLACK_BLOCKS_MAX]}
