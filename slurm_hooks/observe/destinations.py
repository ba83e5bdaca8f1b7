"""Where a message goes: syslog, a webhook (Slack or JSON), Alertmanager. One class per kind, each
with its own ``send()``; every one raises :class:`DeliveryError` (permanent or not, with the
receiver's ``Retry-After``) and never prints a URL (a webhook's path is its credential).
"""

from __future__ import annotations

import hashlib
import json
import os
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
Getter = Callable[[str, dict, float], bytes]
SyslogSender = Callable[[int, str], None]


# --- sending ------------------------------------------------------------------------------------


class DeliveryError(Exception):
    """A request that did not deliver. ``permanent``: the receiver refused this message for what it is
    (:data:`REFUSED_MESSAGE`), trying again will not help; anything else (the receiver's credentials,
    its address, its health, the network) is an outage of the receiver: held back and retried.
    ``retry_after``: seconds the receiver asked us to wait."""

    def __init__(self, message: str, permanent: bool = False, retry_after: float | None = None,
                 status: int | None = None):
        super().__init__(message)
        self.permanent = permanent
        self.retry_after = retry_after
        #: The HTTP status, when the receiver answered.
        self.status = status


#: Answers about the message itself (malformed, too large, unprocessable): that message goes to
#: ``failed/``. Every other answer (401/403 an expired token, 404/410 a webhook moved or deleted,
#: 5xx, 408/429) says nothing about the message: the receiver is out, every message waits.
REFUSED_MESSAGE = frozenset({400, 413, 422})
#: Answers that mean the receiver's credentials or address are wrong, worth saying so.
_ADMIN_ANSWERS = {**dict.fromkeys((301, 302, 303, 307, 308), "it redirects: set its URL to where it points; a "
                                   "redirected POST is re-sent as a GET without the message, or its token to "
                                   "another host"),
                  401: "check its credentials", 403: "check its credentials",
                  404: "check its URL (the webhook may have been deleted)", 410: "check its URL (the webhook was deleted)"}


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
    hint = f" ({_ADMIN_ANSWERS[code]})" if code in _ADMIN_ANSWERS else ""
    return DeliveryError(f"HTTP {code}{' ' + _no_url(reason) if reason else ''}{hint}", code in REFUSED_MESSAGE,
                         _retry_after(retry_after), code)


def http_post(url: str, body: bytes, headers: dict, timeout: float) -> int:
    """POST with the stdlib; the status code, or :class:`DeliveryError` (never naming the URL)."""
    return _request("POST", url, body, headers, timeout)[0]


def http_get(url: str, headers: dict, timeout: float) -> bytes:
    """GET with the stdlib; the body of a 2xx, or :class:`DeliveryError` (never naming the URL)."""
    return _request("GET", url, None, headers, timeout)[1]


def _request(method: str, url: str, body: bytes | None, headers: dict, timeout: float) -> tuple[int, bytes]:
    """Every exception a request can raise, caught by its class: an HTTP answer (:func:`status_error`);
    a URL urllib refuses (``ValueError``, ``http.client.InvalidURL``, whose text holds the URL: only
    the class is said); a broken exchange (``http.client.HTTPException``: ``BadStatusLine``,
    ``RemoteDisconnected``, ``IncompleteRead``); the network (``OSError``, ``URLError``)."""
    import http.client
    import urllib.error
    import urllib.request

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, req, fp, code, msg, hdrs, newurl):  # noqa: ANN001, ANN202 - urllib's
            return None  # the 3xx is an HTTPError: an outage, said, never a delivery

    try:
        request = urllib.request.Request(url, data=body, headers=headers, method=method)
        opener = urllib.request.build_opener(NoRedirect)
        with opener.open(request, timeout=timeout) as response:  # noqa: S310 - http(s) only, checked in config
            data = response.read(1 << 20)
            return int(response.status), data
    except urllib.error.HTTPError as exc:
        raise status_error(exc.code, str(exc.reason or ""), exc.headers.get("Retry-After") if exc.headers else None) \
            from None
    except http.client.InvalidURL as exc:
        raise DeliveryError(f"{type(exc).__name__}: {_NOT_SENDABLE}") from None
    except http.client.HTTPException as exc:
        raise DeliveryError(f"{type(exc).__name__}: the receiver broke off the exchange") from None
    except urllib.error.URLError as exc:
        reason = exc.reason
        text = reason.strerror if isinstance(reason, OSError) and reason.strerror else str(reason)
        raise DeliveryError(f"{type(reason).__name__}: {_no_url(text)}") from None
    except OSError as exc:  # before ValueError: ssl's certificate error is both
        raise DeliveryError(f"{type(exc).__name__}: {_no_url(exc.strerror or str(exc))}") from None
    except ValueError as exc:
        raise DeliveryError(f"{type(exc).__name__}: {_NOT_SENDABLE}") from None


_NOT_SENDABLE = "the URL or a header is not one urllib can send (not shown: a secret; slurm-hooks validate checks it)"


def _no_url(text: str) -> str:
    """An error text with any URL in it cut to its scheme and host."""
    return re.sub(r"[a-z][a-z0-9+.-]*://\S+", lambda m: url_origin(m.group(0)), text)


def scrub(text: str, url: str | None) -> str:
    """``text`` without ``url`` or its path (what a sender we did not write may have put in an error)."""
    if url:
        origin = url_origin(url)
        text = text.replace(url, origin)
        scheme, _, after = url.partition("://")
        authority = re.split(r"[/?#]", after, maxsplit=1)[0]
        rest = after[len(authority):]
        if len(rest) > 1:
            text = text.replace(rest, "/<secret>")
        if "@" in authority:  # user:password@host: the credentials go too
            text = text.replace(authority.rsplit("@", 1)[0], "<secret>")
    return _no_url(text)


#: Where syslog(3) writes; without it ``syslog.syslog`` drops the line without a word.
DEV_LOG = "/dev/log"


def syslog_send(priority: int, text: str) -> None:
    import syslog

    syslog.openlog("slurm-hooks", syslog.LOG_PID, syslog.LOG_DAEMON)
    syslog.syslog(priority, text)


@dataclass(frozen=True)
class Delivery:
    """What one send needs besides the message: a request timeout, the clock, and lines to add
    (``note``: messages this receiver lost while the outbox was full or too old; ``late``: how late
    this message is and what happened since, ``late_s`` its seconds)."""

    timeout: float
    now: float
    note: str = ""
    late: str = ""
    late_s: float = 0.0

    def lines(self) -> str:
        """The added lines as one text ("" when none)."""
        return " ".join(x for x in (self.late, self.note) if x)


class Destination:
    """A receiver. ``name`` is stable across restarts and config edits that keep the receiver."""

    kinds: frozenset[str] = _NEWS | {REMINDER}
    name = ""
    where = ""

    def accepts(self, kind: str) -> bool:
        return kind in self.kinds

    def send(self, entry_id: str, kind: str, message: dict[str, Any], d: Delivery) -> int | None:
        """Deliver, or raise :class:`DeliveryError`; the HTTP status where there is one."""
        raise NotImplementedError

    def scrub(self, text: str) -> str:
        """``text`` safe to print or keep (a receiver's URL is a secret)."""
        return _no_url(text)


def _source_name(prefix: str, table: dict[str, str]) -> str:
    """A name from where the URL comes from (the file or the variable, else the URL itself), hashed:
    a message queued for a receiver later removed from the config is never sent elsewhere."""
    source = next((f"{k}:{table[k]}" for k in ("url_file", "url_env", "url") if table.get(k)), "")
    return f"{prefix}-{hashlib.sha256(source.encode()).hexdigest()[:10]}"


class Syslog(Destination):
    """syslog(3) through ``socket`` (``/dev/log``): a line written with no socket there is lost without
    an error from libc, so a missing socket is a failed delivery (retried), never a delivered one."""

    name = where = "syslog"

    def __init__(self, send: SyslogSender | None = None, socket: str | None = None):
        self._send = send or syslog_send
        self.socket = socket if socket is not None else (DEV_LOG if send is None else "")

    def send(self, entry_id: str, kind: str, message: dict[str, Any], d: Delivery) -> None:
        import stat
        import syslog

        if self.socket:
            try:
                ok = stat.S_ISSOCK(os.stat(self.socket).st_mode)
            except OSError:
                ok = False
            if not ok:
                raise DeliveryError(f"no syslog socket at {self.socket} (is rsyslog or journald running?)")
        priority = {OPENED: syslog.LOG_CRIT, ESCALATED: syslog.LOG_CRIT, BREAKER: syslog.LOG_CRIT,
                    REMINDER: syslog.LOG_WARNING, BRIDGE: syslog.LOG_ERR,
                    MONITOR: syslog.LOG_WARNING}.get(kind, syslog.LOG_NOTICE)
        try:
            self._send(priority, message["text"] + (f" {d.lines()}" if d.lines() else ""))
        except ValueError as exc:  # an embedded NUL: this message, not the log
            raise DeliveryError(f"syslog refused the line: {exc}", permanent=True) from None
        except OSError as exc:
            raise DeliveryError(f"syslog: {exc.strerror or exc}") from None


class _Http(Destination):
    def __init__(self, table: dict[str, str], url: str | None, post: Sender | None, prefix: str, problem: str = ""):
        """``problem``: why ``url`` is None (its file, its variable), never the URL."""
        self.table, self.url, self.post = table, url, post or http_post
        self.problem = problem
        self.name = _source_name(prefix, table)
        self.where = table.get("name") or (url_origin(url) if url else self.name)

    def unreadable(self) -> DeliveryError:
        return DeliveryError(f"its URL could not be read: {self.problem}" if self.problem
                             else "its URL could not be read")

    def _post(self, body: dict[str, Any], headers: dict[str, str], d: Delivery) -> int:
        if not self.url:
            raise self.unreadable()
        try:
            status = self.post(self.url, json.dumps(body).encode(), {"Content-Type": "application/json",
                                                                      "User-Agent": "slurm-hooks", **headers}, d.timeout)
        except DeliveryError as exc:
            raise DeliveryError(scrub(str(exc), self.url), exc.permanent, exc.retry_after, exc.status) from None
        if not 200 <= status < 300:
            raise status_error(status)
        return status

    def scrub(self, text: str) -> str:
        return scrub(text, self.url)


#: What a message carries for Alertmanager only (the JSON webhook gets the rest).
_ALERTMANAGER_ONLY = ("alerts", "ended_alerts", "resolved_ts", "hold_s", "end_node")


class Webhook(_Http):
    """An incoming webhook: Slack's shape, or the message as one JSON object."""

    def __init__(self, table: dict[str, str], url: str | None, post: Sender | None = None, problem: str = ""):
        super().__init__(table, url, post, "webhook", problem)
        self.format = table.get("format", "json")

    def send(self, entry_id: str, kind: str, message: dict[str, Any], d: Delivery) -> int:
        if self.format == "slack":
            body = slack_payload(message, d.note, d.late)
        else:
            body = {k: v for k, v in message.items() if k not in _ALERTMANAGER_ONLY}
            if d.note:
                body["dropped"] = d.note
            if d.late:
                body["late"], body["late_s"] = d.late, round(d.late_s, 1)
        return self._post(body, {"Idempotency-Key": entry_id}, d)


class Alertmanager(_Http):
    """Prometheus Alertmanager's ``POST /api/v2/alerts``: each open finding an alert, posted again
    while open (``endsAt`` ahead by ``hold``, or the message's own hold), resolved with ``endsAt`` at
    the node's return. A message with ``end_node`` (the bridge saw a node return that cannot say so
    itself) also ends every alert Alertmanager holds for that node, as it holds them."""

    kinds = _NEWS | {FIRING}

    def __init__(self, table: dict[str, str], url: str | None, post: Sender | None = None, hold: float = 240.0,
                 auth: str = "", get: Getter | None = None, problem: str = ""):
        super().__init__(table, url, post, "alertmanager", problem)
        if self.url:
            base = self.url.rstrip("/")
            self.url = base if base.endswith("/api/v2/alerts") else base + "/api/v2/alerts"
        self.hold, self.auth, self.get = hold, auth, get or http_get

    def send(self, entry_id: str, kind: str, message: dict[str, Any], d: Delivery) -> int:
        headers = {"Authorization": self.auth} if self.auth else {}
        body = alerts(message, kind, d.now, self.hold, d.note, d.late)
        if message.get("end_node"):
            body += self._node_alerts(str(message["end_node"]), str(message.get("cluster") or ""), headers, d)
        return self._post(body, headers, d) if body else 200

    def _node_alerts(self, node: str, cluster: str, headers: dict[str, str], d: Delivery) -> list[dict[str, Any]]:
        """What Alertmanager holds for ``node`` (ours, not the bridge's standing ones), ended ``now``."""
        from urllib.parse import quote

        if not self.url:
            raise self.unreadable()
        wanted = [f'node="{node}"'] + ([f'cluster="{cluster}"'] if cluster else [])
        query = "&".join(f"filter={quote(f)}" for f in wanted) + "&active=true&silenced=true&inhibited=true"
        try:
            held = json.loads(self.get(f"{self.url}?{query}", {"Accept": "application/json", **headers}, d.timeout))
        except DeliveryError as exc:
            # Reading is refused where posting is not (a proxy that lets only POST through): this
            # message cannot be said there; the node's alerts end by their hold. Kept in failed/.
            unreadable = exc.status in (404, 405, 501)
            raise DeliveryError(scrub(str(exc), self.url) + (" (GET /api/v2/alerts: the alerts of the node cannot be "
                                                             "read to end them; they end by their hold)"
                                                             if unreadable else ""),
                                exc.permanent or unreadable, exc.retry_after, exc.status) from None
        except ValueError:
            raise DeliveryError("Alertmanager's alert list is not JSON", permanent=True) from None
        out = []
        for a in held if isinstance(held, list) else ():
            labels = a.get("labels") if isinstance(a, dict) else None
            if not isinstance(labels, dict) or labels.get("node") != node:
                continue
            name = str(labels.get("alertname", ""))
            if not name.startswith("SlurmHooks") or name in STANDING_ALERTS:
                continue
            out.append({"labels": labels, "annotations": a.get("annotations") or {},
                        "startsAt": a.get("startsAt") or _iso(d.now), "endsAt": _iso(d.now)})
        return out

    def identify(self, timeout: float) -> str:
        """What Alertmanager says of itself (``GET /api/v2/status``): its version. A server that
        takes a POST to ``/api/v2/alerts`` is not one for that (a plain web server, a proxy's catch-all,
        a webhook receiver): :class:`DeliveryError` (permanent) when the answer is not Alertmanager's."""
        if not self.url:
            raise self.unreadable()
        headers = {"Accept": "application/json", **({"Authorization": self.auth} if self.auth else {})}
        status_url = self.url[: -len("alerts")] + "status"
        try:
            data = json.loads(self.get(status_url, headers, timeout))
        except DeliveryError as exc:
            raise DeliveryError(f"not an Alertmanager (GET /api/v2/status: {scrub(str(exc), self.url)})",
                                exc.permanent or exc.status is not None, exc.retry_after, exc.status) from None
        except ValueError:
            raise DeliveryError("not an Alertmanager (GET /api/v2/status did not answer JSON)", True) from None
        info = data.get("versionInfo") if isinstance(data, dict) else None
        if not isinstance(info, dict) or not isinstance(data.get("cluster"), dict):
            raise DeliveryError("not an Alertmanager (GET /api/v2/status has no versionInfo and cluster)", True)
        return str(info.get("version") or "?")


#: The bridge's alerts that stay true until the bridge says otherwise (its breaker, a permission):
#: a node's return does not end them.
STANDING_ALERTS = frozenset({"SlurmHooksBreakerTripped", "SlurmHooksBridgePermissionMissing",
                             "SlurmHooksBridgeHeldTooLong"})


def read_auth(path: str) -> str:
    """The Authorization header from ``auth_file``: its line as written when it names a scheme
    ("Bearer ...", "Basic ..."), else the line as a bearer token. ``OSError`` when it cannot be read,
    ``ValueError`` when it is empty, not text, or more than one line (a header urllib would refuse)."""
    with open(path, encoding="utf-8") as fh:
        value = fh.read(8192).strip()  # UnicodeDecodeError is a ValueError
    if not value or any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ValueError("it must hold one line, the token (its content is not shown: it is a secret)")
    return value if value.split(" ", 1)[0] in ("Bearer", "Basic") else f"Bearer {value}"


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def alerts(message: dict[str, Any], kind: str, now: float, hold: float, note: str = "",
           late: str = "") -> list[dict[str, Any]]:
    """The request body: the message's alerts, firing until ``now + hold`` or resolved at the node's
    return; an escalation also ends the alerts of the action it replaced. A message may ask a longer
    hold (``hold_s``: a node gone to reboot cannot post again until it is back)."""
    out = []
    hold = max(hold, float(message.get("hold_s") or 0.0))
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
        if late:
            annotations["late"] = late
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


def slack_payload(message: dict[str, Any], note: str = "", late: str = "") -> dict[str, Any]:
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
    context = [x for x in (late, note, message.get("runbook")) if x]
    if context:
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": fit_text(slack_escape(str(x)),
                                                                                          SLACK_FIELD_MAX)}
                                                       for x in context]})
    return {"text": head, "blocks": blocks[:SLACK_BLOCKS_MAX]}
