"""A receiver's outage, told: its start and its end in the audit log, its state for ``status``,
``validate`` and node_exporter, and what a message delivered late says.

The notifier holds a receiver back after a failed delivery (:class:`slurm_hooks.observe.notify.Pace`).
The first failure after a delivery starts an outage and the first delivery after it ends it: one
``receiver`` record each (``state`` ``out``, then ``back`` with how long it lasted and how many tries
failed), written by whichever process delivers (the watcher's notifier, a ``notify flush``, a
``notify test`` that got through). While it lasts, ``pace.json`` in the notifier's directory holds
``out_since`` and the last error: the live state ``validate`` and the textfile read.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from slurm_hooks.observe.destinations import ESCALATED, RESOLVED
from slurm_hooks.observe.incidents import duration, utc
from slurm_hooks.observe.records import Kind
from slurm_hooks.values import dataclass

#: The audit record's kind (:class:`slurm_hooks.observe.records.ReceiverState`).
KIND = Kind.RECEIVER.value
OUT, BACK = "out", "back"
#: A message delivered this long after it was made says so, even without a failed try before it.
LATE_S = 30.0
#: ``status`` shows an outage that ended within this long.
RECENT_S = 3600.0
PROM_FILE = "slurm_hooks_notify.prom"


@dataclass(frozen=True)
class Outage:
    """One receiver out from ``since`` to ``until`` (None: still out)."""

    receiver: str
    where: str
    since: float
    node: str = ""
    error: str = ""
    until: float | None = None
    tries: int = 0

    @property
    def open(self) -> bool:
        return self.until is None

    def line(self, now: float) -> str:
        """One line for a person: which receiver, since when, why, and what it means."""
        on = f" (notifier on {self.node})" if self.node else ""
        if self.open:
            return (f"{self.where} ({self.receiver}){on}: out since {utc(self.since)} "
                    f"({duration(max(0.0, now - self.since))})" + (f", last error: {self.error}" if self.error else "")
                    + "; its messages wait, none is lost")
        return (f"{self.where} ({self.receiver}){on}: back at {utc(self.until or now)} after "
                f"{duration(max(0.0, (self.until or now) - self.since))} out ({self.tries} failed "
                f"tr{'y' if self.tries == 1 else 'ies'}); what waited was delivered, each late message saying so")


def out_record(receiver: str, where: str, since: float, error: str) -> dict[str, Any]:
    """The fields of the record that starts an outage."""
    return {"receiver": receiver, "where": where, "state": OUT, "since": since, "error": error,
            "message": f"{where} ({receiver}) out: {error}; its messages wait"}


def back_record(receiver: str, where: str, since: float, until: float, tries: int, waiting: int) -> dict[str, Any]:
    """The fields of the record that ends one."""
    return {"receiver": receiver, "where": where, "state": BACK, "since": since, "until": until,
            "out_s": round(max(0.0, until - since), 3), "tries": tries, "waiting": waiting,
            "message": f"{where} ({receiver}) back after {duration(max(0.0, until - since))} out, {tries} failed "
                       f"tr{'y' if tries == 1 else 'ies'}; {waiting} message(s) still to deliver"}


def fold(records: Iterable[dict[str, Any]]) -> list[Outage]:
    """Every outage the audit records tell, oldest first; one without its end is still open."""
    open_: dict[tuple[str, str], Outage] = {}
    out: list[Outage] = []
    for r in records:
        if r.get("kind") != KIND:
            continue
        key = (str(r.get("node") or ""), str(r.get("receiver") or ""))
        since = r.get("since")
        since = float(since) if isinstance(since, (int, float)) and not isinstance(since, bool) else float(r.get("ts") or 0)
        if r.get("state") == OUT:
            if key not in open_:
                open_[key] = Outage(key[1], str(r.get("where") or key[1]), since, key[0], str(r.get("error") or ""))
        elif r.get("state") == BACK:
            began = open_.pop(key, None)
            until = r.get("until")
            until = float(until) if isinstance(until, (int, float)) else float(r.get("ts") or 0)
            tries = r.get("tries") if isinstance(r.get("tries"), int) else 0
            out.append(Outage(key[1], str(r.get("where") or key[1]), began.since if began else since, key[0],
                              began.error if began else "", until, tries))
    out.extend(open_.values())
    out.sort(key=lambda o: o.since)
    return out


def shown(outages: Iterable[Outage], now: float) -> list[Outage]:
    """What ``status`` shows: every open outage, and those that ended within :data:`RECENT_S`."""
    return [o for o in outages if o.open or now - (o.until or 0.0) <= RECENT_S]


def live(pace: dict[str, Any], names: dict[str, str]) -> list[Outage]:
    """The outages ``pace.json`` holds now (``names``: receiver -> where)."""
    out = []
    for name, p in sorted(pace.items()):
        since = p.get("out_since") if isinstance(p, dict) else None
        if isinstance(since, (int, float)) and not isinstance(since, bool):
            out.append(Outage(name, names.get(name, name), float(since), error=str(p.get("error") or ""),
                              tries=int(p.get("fails", 0) or 0)))
    return out


# --- a message delivered late ------------------------------------------------------------------


def late_words(late_s: float, out_since: float | None, since: Iterable[dict[str, Any]], now: float) -> str:
    """What a message delivered late adds: how late, since when its receiver was out, and what
    happened since (``delivered 1m 44s late (its receiver was out from 10:02:05Z); since then: n1
    was back in service 30s before this was delivered.``). ``since``: the messages of the same
    incident made after it (their JSON), which still wait behind it."""
    words = f"delivered {duration(late_s)} late" + (f" (its receiver was out from {utc(out_since)})"
                                                    if out_since is not None else "")
    news = []
    for m in since:
        kind = m.get("kind")
        if kind == RESOLVED:
            back = m.get("resolved_ts")
            back = float(back) if isinstance(back, (int, float)) else now
            news.append(f"{m.get('node') or 'the node'} was back in service {duration(max(0.0, now - back))} "
                        "before this was delivered")
        elif kind == ESCALATED and m.get("action"):
            news.append(f"it escalated to [{m['action']}]")
    return words + (f"; since then: {', '.join(news)}" if news else "") + "."


# --- node_exporter -----------------------------------------------------------------------------

FAMILIES = (
    ("slurm_hooks_notify_receiver_up", "gauge", "1 while the receiver takes our messages, 0 while it is out."),
    ("slurm_hooks_notify_receiver_out_since_seconds", "gauge", "Unix time the receiver's outage began (only while out)."),
    ("slurm_hooks_notify_waiting_messages", "gauge", "Messages waiting in the outbox for the receiver."),
)


def render(names: dict[str, str], pace: dict[str, Any], waiting: dict[str, int]) -> str:
    """The exposition text of every receiver (``names``: receiver -> where)."""
    from slurm_hooks.observe.metrics import exposition, sample

    up, since, queued = [], [], []
    out = {o.receiver: o for o in live(pace, names)}
    for name in sorted(names):
        labels = {"receiver": name, "where": names[name]}
        up.append(sample(FAMILIES[0][0], labels, 0 if name in out else 1))
        if name in out:
            since.append(sample(FAMILIES[1][0], labels, out[name].since))
        queued.append(sample(FAMILIES[2][0], labels, int(waiting.get(name, 0))))
    return exposition((n, k, t, s) for (n, k, t), s in zip(FAMILIES, (up, since, queued)))


def write_textfile(directory: str, text: str) -> str | None:
    """Replace ``<directory>/slurm_hooks_notify.prom`` (None when it cannot be written: said by the caller)."""
    from slurm_hooks.observe.metrics import write_textfile as write

    try:
        return write(directory, PROM_FILE, text)
    except OSError:
        return None


def textfile_path(directory: str) -> str:
    return os.path.join(directory, PROM_FILE)
