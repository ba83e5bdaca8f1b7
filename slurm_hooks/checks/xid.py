"""XIDs: the driver's own error reports, judged by NVIDIA's catalogue.

One finding per (GPU, code), with the catalogue's action. A fault that keeps
coming back after resets is the hardware: the same code on the same GPU (by UUID,
so it survives reboots and renumbering) seen ``xid_repeat_count`` times within
``xid_repeat_window_s`` turns a drain, reset or reboot into replace. What counts
is events, not log lines (the kernel-log reader folds a burst into one event),
and every event once: those recorded by earlier runs (``CheckInput.xid_history``)
and those in this snapshot not recorded yet. Acknowledged and baseline events are
no reason to act again, but they did happen, so they still count.

XID 13 and 31 (graphics exception, memory page fault) are the application's as a
rule, and NVIDIA's catalogue drains for neither. NVSentinel's rules tell them apart
(``xid.history.APP_OR_HARDWARE``): lines of one code on one GPU closer than a burst
window (31: 3 minutes, 13: 15 s) are one burst, one fault of one job; two bursts on
the same GPU within 24 h are the GPU's, reset like hardware; the code on two GPUs
within 24 h is the application's, said and acted on never. The two are judged
apart: a GPU that keeps failing is reset even while a job also failed on another.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from slurm_hooks.checks.gpus import lost_summary
from slurm_hooks.checks.recovery import verdict_finding, verdict_from_text
from slurm_hooks.models import KERNEL_LOG, Action, CheckInput, Context, Finding, Severity, XidEvent, gpu_identity
from slurm_hooks.values import replace
from slurm_hooks.xid.history import APP_OR_HARDWARE_XIDS, Verdict, app_or_hardware, when

TYPE_CHECKING = False
if TYPE_CHECKING:
    from slurm_hooks.xid.catalog import XidInfo

#: "GPU Recovery Action Changed": informational, but its text names the driver's new verdict.
RECOVERY_XID = 154


def _catalog_lookup(code: int) -> XidInfo | None:
    """NVIDIA's catalogue, imported when a code is first looked up (a table of ~200 entries: a healthy
    node, with no XID, never builds it)."""
    from slurm_hooks.xid.catalog import lookup

    return lookup(code)


def check_xids(inp: CheckInput) -> Iterator[Finding]:
    unread = inp.snapshot.unread(KERNEL_LOG)
    if unread is not None:
        # No event seen in a log that could not be read is no verdict: said, never acted on (either vendor).
        yield Finding("xid", Severity.WARN, Action.WARN, f"kernel log unreadable: GPU driver events not seen ({unread})",
                      summary="kernel log unreadable", rule=KERNEL_LOG)
    known = _baseline_keys(inp) | inp.acked_xids
    # Other drivers' events (``rule`` set: an amdgpu line) are judged by their own check.
    for gpu in inp.selected():
        found = _judge(inp, gpu.index, gpu_identity(gpu.uuid, gpu.index, gpu.pci_bus_id),
                       [e for e in gpu.xids if not e.rule], known)
        # A lost GPU's XIDs are its loss in the driver's words: said with it, once (``GPU 3 lost (XID 79)``).
        yield from (replace(f, summary=lost_summary(gpu)) for f in found) if gpu.lost else found
    unmapped: dict[str, list[XidEvent]] = {}
    for event in inp.snapshot.node_xids:
        if not event.rule:
            unmapped.setdefault(event.gpu_id, []).append(event)
    for ident, events in unmapped.items():
        yield from _judge(inp, None, ident, events, known)


def _baseline_keys(inp: CheckInput) -> frozenset[str]:
    """In the epilog, XIDs the prolog already saw are not the job's doing."""
    base = inp.baseline
    if inp.context is not Context.EPILOG or base is None:
        return frozenset()
    return frozenset(e.key for g in base.gpus for e in g.xids) | {e.key for e in base.node_xids}


def _judge(inp: CheckInput, gpu: int | None, ident: str, events: Iterable[XidEvent],
           known: frozenset[str]) -> Iterator[Finding]:
    # One MIG instance's fault (``GPU-I:`` in its line) is its own finding: it touches that instance's jobs.
    by_code: dict[tuple[int, int], dict[str, XidEvent]] = {}
    for e in events:
        by_code.setdefault((e.code, -1 if e.instance is None else e.instance), {})[e.key] = e
    for code, instance in sorted(by_code):
        current = by_code[(code, instance)]
        new = [e for key, e in current.items() if key not in known]
        if new:
            verdict = _app_or_hardware(inp, ident, code) if code in APP_OR_HARDWARE_XIDS and gpu is not None else None
            total = verdict.bursts if verdict is not None else _occurrences(inp, ident, code, current)
            found = _finding(inp, gpu, code, len(new), total, verdict)
            if instance >= 0 and gpu is not None:
                found = replace(found, instance=instance, summary=f"{found.summary} instance {instance}")
            yield found
        if code == RECOVERY_XID and new and instance < 0:
            verdict = verdict_from_text(new[-1].message)
            if verdict not in (None, "none"):
                yield verdict_finding("xid", verdict, gpu, f"XID {code}")


def _app_or_hardware(inp: CheckInput, ident: str, code: int) -> Verdict:
    """``app_or_hardware`` over the recorded history and this snapshot's events of ``code`` not
    recorded yet (on every GPU of the node, not only the job's: a spread is told by the others), those
    at the time they happened where known, else as now."""
    merged = dict(inp.xid_history)
    for g in inp.snapshot.gpus:
        other = gpu_identity(g.uuid, g.index, g.pci_bus_id)
        merged.update({e.key: (other, e.code, when(e, inp.now)) for e in g.xids
                       if e.code == code and e.key not in merged})
    return app_or_hardware(merged, ident, code, inp.now)


def _finding(inp: CheckInput, gpu: int | None, code: int, current: int, total: int,
             verdict: Verdict | None = None) -> Finding:
    info = (inp.xid_lookup or _catalog_lookup)(code)
    if info is None:
        action, severity, what = Action.WARN, Severity.WARN, "unknown XID"
    else:
        action, severity = info.action, info.severity
        what = info.description if info.description != "Unused" else f"{info.mnemonic}, unused"
    message = f"XID {code} ({what})"
    window = _span(inp.expect.xid_repeat_window_s)
    hardware = verdict is not None and verdict.hardware
    if hardware:
        action, severity = max(action, Action.RESET, key=lambda a: a.rank), Severity.FAIL
    limit = inp.expect.xid_repeat_count
    if Action.DRAIN.rank <= action.rank < Action.REPLACE.rank and 0 < limit <= total:
        action, severity = Action.REPLACE, Severity.FAIL
        message += f", {_ordinal(total)} time in {window} -> hardware"
        hardware = True
    elif verdict is not None:
        rule = verdict.rule
        if current > 1:
            message += f", {current} lines"
        if hardware:
            message += (f", {verdict.bursts} bursts on this GPU within {_span(rule.window_s)} "
                        f"(a burst: lines less than {_span(rule.burst_s)} apart) -> hardware")
    elif current > 1:
        message += f", {current} times"
    if verdict is not None and verdict.application:
        message += (f"{'; also' if hardware else ','} on {len(verdict.others)} other GPU(s) within "
                    f"{_span(verdict.rule.window_s)} -> the application" + ("" if hardware else ", not this GPU"))
    summary = f"XID {code} on GPU {gpu}" if gpu is not None else f"XID {code} on node"
    return Finding("xid", severity, action, message, gpu, summary, rule=f"xid.{code}")


def _occurrences(inp: CheckInput, ident: str, code: int, current: dict[str, XidEvent]) -> int:
    """Distinct events of ``code`` on this GPU within the window: recorded ones by when they were
    recorded, the snapshot's unrecorded ones as happening now."""
    since = inp.now - inp.expect.xid_repeat_window_s
    recorded = {key for key, (gpu, c, t) in inp.xid_history.items()
                if gpu == ident and c == code and since <= t <= inp.now}
    return len(recorded | {key for key in current if key not in inp.xid_history})


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
