"""Read the audit log back as incidents: what was seen, what was done, how long it took."""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from datetime import datetime, timezone
from typing import Any

#: Records further apart than this start a new incident.
INCIDENT_GAP_S = 600.0

_REL = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(text: str, now: float | None = None) -> float:
    """``30m``, ``2h``, ``1d``, an epoch number, or an ISO-8601 time -> epoch seconds."""
    now = time.time() if now is None else now
    text = text.strip()
    m = _REL.match(text)
    if m:
        return now - float(m.group(1)) * _UNITS[m.group(2)]
    try:
        return float(text)
    except ValueError:
        pass
    if text[-1:] in ("Z", "z"):
        text = text[:-1] + "+00:00"  # fromisoformat reads a trailing Z only from Python 3.11
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"cannot read time {text!r}: use 30m, 2h, 1d, epoch seconds or ISO-8601") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()


def parse_duration(text: str) -> float:
    """``30m``, ``12h``, ``2d``, ``0`` -> seconds."""
    text = text.strip()
    if text in ("0", "0s"):
        return 0.0
    m = _REL.match(text)
    if not m:
        raise ValueError(f"cannot read duration {text!r}: use 30m, 12h, 2d or 0")
    return float(m.group(1)) * _UNITS[m.group(2)]


def select(records: Iterable[dict[str, Any]], node: str | None = None, since: float | None = None) -> list[dict[str, Any]]:
    out = [r for r in records
           if (node is None or r.get("node") == node) and (since is None or float(r.get("ts", 0)) >= since)]
    out.sort(key=lambda r: float(r.get("ts", 0)))
    return out


def incidents(records: list[dict[str, Any]], gap: float = INCIDENT_GAP_S) -> list[list[dict[str, Any]]]:
    """Records per node, a new incident after ``gap`` seconds of quiet; the records of one
    pending action (same ``pending`` id: queued, each retry, the result) stay in one incident
    however long the controller was away, and so do the repeats a ``repeat`` record counts."""
    groups: dict[str, list[list[dict[str, Any]]]] = {}
    by_pending: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        runs = groups.setdefault(str(r.get("node")), [])
        held = by_pending.get(str(r.get("pending")))
        if held is not None:
            held.append(r)
            continue
        # A repeat stands for the records from its first_ts on: a node waiting weeks stays one incident.
        if not runs or float(r.get("first_ts") or r["ts"]) - float(runs[-1][-1]["ts"]) > gap:
            runs.append([])
        runs[-1].append(r)
        if r.get("pending"):
            by_pending[str(r["pending"])] = runs[-1]
    flat = [run for runs in groups.values() for run in runs]
    flat.sort(key=lambda run: float(run[0]["ts"]))
    return flat


#: Record actions and results in the words of the docs: action -> (its word, result -> words).
_SAID: dict[str, tuple[str, dict[str, str]]] = {
    "start_now": ("start", {"ok": "made eligible to start now (StartTime=now)", "skipped": "not made eligible",
                            "failed": "could not be made eligible"}),
    "requeue": ("requeue", {"ok": "requeued", "spared": "left to run", "self": "requeued itself",
                            "already": "already requeued", "ended": "already ended"}),
    "ack-xids": ("xids", {"ok": "acknowledged"}),
    "running": ("running", {"ok": "running again"}),
    "release": ("release", {"ok": "released"}),
    "signal": ("signal", {"ok": "sent its checkpoint signal"}),
    "rma-clear": ("rma", {"ok": "mark for replacement cleared"}),
}
_ON_JOBS = frozenset({"start_now", "requeue", "running", "release", "signal", "annotate", "follow"})


def describe(r: dict[str, Any]) -> str:
    kind = r.get("kind")
    if kind == "repeat":
        of = r.get("of") if isinstance(r.get("of"), dict) else {}
        last = datetime.fromtimestamp(float(r.get("last_ts") or r.get("ts", 0)), tz=timezone.utc)
        count = r.get("count", "?")
        return (f"again   {count} more time{'' if count == 1 else 's'} until {last.strftime('%Y-%m-%d %H:%M:%S')}: "
                f"{describe(of)}")
    if kind == "incident":
        stage = r.get("stage", "")
        if stage == "closed":
            who = r.get("user") or ("a person" if r.get("by") == "person" else r.get("by", ""))
            return f"closed  resumed by {who}" + (f" ({r['detail']})" if r.get("detail") else "")
        words = [f"for {r['waiting_for']}" if r.get("waiting_for") else "", r.get("why") or "",
                 f"to do: {r['todo']}" if r.get("todo") else ""]
        return f"{stage:<7} " + "; ".join(w for w in words if w)
    if kind == "alert":
        where = f"gpu{r['gpu']}" if r.get("gpu") is not None else "node"
        seen_by = f" (seen by {r['context']})" if r.get("context") else ""
        return f"alert   {where} {r.get('check')}: {r.get('message')} -> {r.get('action')}{seen_by}"
    if kind == "watch":
        if r.get("xid") is not None or r.get("rule"):
            where = f"GPU {r['gpu']}" if r.get("gpu") is not None else "node"
            what = f"XID {r['xid']}" if r.get("xid") is not None else r["rule"]
            done = "drained" if r.get("drained") else "not drained"
            jobs = ",".join(str(j) for j in r.get("requeued") or []) or "none"
            signalled = ",".join(str(j) for j in r.get("signalled") or [])
            first = f", sent their own signal first: {signalled}" if signalled else ""
            return f"watch   {what} on {where}: {done}, jobs requeued: {jobs}{first}"
        return f"watch   {r.get('message', '')}"
    if kind == "action" and r.get("action") == "pending":
        steps = "+".join(r.get("steps") or []) or "remediation"
        if r.get("result") in ("queued", "retry"):
            what = "waits" if r.get("result") == "queued" else f"retry {r.get('attempt', '?')} failed"
            return f"pending {steps} {what}: {r.get('error', '')} ({r.get('detail', '')})"
        return f"pending {steps} {r.get('result', '')} after {r.get('attempt', '?')} attempt(s) ({r.get('detail', '')})"
    if kind == "action":
        detail = r.get("reason") or r.get("detail") or r.get("error") or ""
        action, result = str(r.get("action", "?")), str(r.get("result", ""))
        verb, said = _SAID.get(action, (action, {}))
        target = str(r.get("target", ""))
        if action in _ON_JOBS:
            users = r.get("users") if isinstance(r.get("users"), dict) else {}
            names = r.get("names") if isinstance(r.get("names"), dict) else {}
            whose = ", ".join(str(x) for x in (users.get(target), names.get(target)) if x)
            target = f"job {target}" + (f" ({whose})" if whose else "")
        return f"{verb:<7} {target} {said.get(result, result)}" + (f" ({detail})" if detail else "")
    text = r.get("message") or r.get("detail") or ""
    return f"{kind:<7} {text}"


def stamp(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
