"""XIDs: the driver's own error reports, judged by NVIDIA's catalogue.

One finding per (GPU, code), with the catalogue's action. A fault that keeps
coming back after resets is the hardware: the same code seen
``xid_repeat_count`` times within ``xid_repeat_window_s`` (earlier occurrences
from ``CheckInput.xid_history`` plus the events in this snapshot) turns a
drain, reset or reboot into replace. ``xid_history`` must not already hold the
snapshot's own events (see ``XidHistory.occurrences(exclude=...)``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator

from slurm_hooks.models import Action, CheckInput, Context, Finding, Severity, XidEvent
from slurm_hooks.xid_catalog import lookup


def check_xids(inp: CheckInput) -> Iterator[Finding]:
    known = _baseline_keys(inp) | inp.acked_xids
    for gpu in inp.selected():
        yield from _judge(inp, gpu.index, gpu.xids, known)
    yield from _judge(inp, None, inp.snapshot.node_xids, known)


def _baseline_keys(inp: CheckInput) -> frozenset[str]:
    """In the epilog, XIDs the prolog already saw are not the job's doing."""
    base = inp.baseline
    if inp.context is not Context.EPILOG or base is None:
        return frozenset()
    return frozenset(e.key for g in base.gpus for e in g.xids) | {e.key for e in base.node_xids}


def _judge(inp: CheckInput, gpu: int | None, events: Iterable[XidEvent], known: frozenset[str]) -> Iterator[Finding]:
    counts = Counter(e.code for e in events if e.key not in known)
    for code in sorted(counts):
        yield _finding(inp, gpu, code, counts[code])


def _finding(inp: CheckInput, gpu: int | None, code: int, current: int) -> Finding:
    info = lookup(code)
    if info is None:
        action, severity, what = Action.WARN, Severity.WARN, "unknown XID"
    else:
        action, severity = info.action, info.severity
        what = info.description if info.description != "Unused" else f"{info.mnemonic}, unused"
    message = f"XID {code} ({what})"
    total = current + _earlier(inp, code)
    limit = inp.expect.xid_repeat_count
    if Action.DRAIN.rank <= action.rank < Action.REPLACE.rank and 0 < limit <= total:
        action, severity = Action.REPLACE, Severity.FAIL
        message += f", {_ordinal(total)} time in {_span(inp.expect.xid_repeat_window_s)} -> hardware"
    elif current > 1:
        message += f", {current} times"
    summary = f"XID {code} on GPU {gpu}" if gpu is not None else f"XID {code} on node"
    return Finding("xid", severity, action, message, gpu, summary)


def _earlier(inp: CheckInput, code: int) -> int:
    since = inp.now - inp.expect.xid_repeat_window_s
    return sum(1 for t in inp.xid_history.get(code, ()) if since <= t <= inp.now)


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _span(seconds: float) -> str:
    s = int(seconds)
    if s % 86400 == 0 and s > 86400:
        return f"{s // 86400}d"
    if s % 3600 == 0:
        return f"{s // 3600}h"
    if s % 60 == 0:
        return f"{s // 60}min"
    return f"{s}s"
