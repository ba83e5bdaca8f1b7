"""The amdgpu driver's events (its kernel lines, :mod:`slurm_hooks.probes.amdgpu_log`), judged by
their rows of the severity table, in the driver's own words.

One finding per (GPU, row, block or ring), as the XID check gives one per (GPU, code): its
action is its row's in the severity table (``amdgpu-*``), its summary what
the drain reason says (``uncorrectable ECC in UMC block on GPU 2``, ``GPU 2 reset failed``).
Each event counts once: in the epilog, the lines the prolog already saw are not the job's; an
event an admin dealt with (acknowledged, as XIDs are) is no reason to act again.

A fault that keeps coming back after resets is the hardware, as a repeated XID is: the same row and
block (or ring) on the same GPU (by UUID, so it survives reboots and renumbering) seen
``[expect] xid_repeat_count`` times within ``xid_repeat_window_s`` turns a drain, reset or reboot
into replace. What counts is events (one per line, a burst folded into one), each once: those the
XID history keeps (``CheckInput.xid_history``, acknowledged ones included: they did happen) and
this snapshot's not recorded yet. Only rows that take the node out escalate: a reset the driver
did, a hung ring, a VM fault repeating stay records.

How a healthy GPU is kept from being drained: the driver prints an uncorrectable-error line for
new errors only (the ``detected in total`` lines that repeat a standing count, and correctable
errors, "no user action is needed", are no events); a reset, VRAM wiped by it, a deferred error
and a ring timeout are only recorded; a line tied to no GPU of the node is the node's.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from slurm_hooks.models import Action, CheckInput, Context, Finding, GpuSnapshot, Severity, XidEvent, gpu_identity
from slurm_hooks.values import replace

_A = Action
#: Row -> (the action it suggests, what it is for the reason: ``{block}``/``{ring}`` filled in,
#: ``{where}`` the GPU or node). The actions are the severity table's defaults (a test keeps them equal).
ROWS = {
    "amdgpu-ue-umc": (_A.RESET, "uncorrectable ECC in UMC block on {where}"),
    "amdgpu-ue": (_A.RESET, "uncorrectable error in {block} block on {where}"),
    "amdgpu-ue-xgmi": (_A.RESET, "uncorrectable error in {block} block on {where}"),
    "amdgpu-poison": (_A.RESET, "poison consumed on {where}"),
    "amdgpu-reset-failed": (_A.REBOOT, "{where_cap} reset failed"),
    "amdgpu-bad-pages": (_A.REPLACE, "retired pages at threshold on {where}"),
    "amdgpu-deferred": (_A.WARN, "deferred errors in {block} block on {where}"),
    "amdgpu-reset": (_A.WARN, "{where_cap} reset by the driver"),
    "amdgpu-vram-lost": (_A.WARN, "VRAM lost on {where}"),
    "amdgpu-ring-timeout": (_A.WARN, "ring {ring} timeout on {where}"),
    "amdgpu-vm-fault": (_A.WARN, "GPU page fault of a process on {where}"),
    "amdgpu-thermal-throttle": (_A.WARN, "thermal throttling on {where}"),
}


def check_events(inp: CheckInput) -> Iterator[Finding]:
    known = _baseline_keys(inp) | inp.acked_xids
    for gpu in inp.selected():
        yield from _judge(inp, gpu.index, [e for e in gpu.xids if e.rule], known, _name(inp, gpu),
                          gpu_identity(gpu.uuid, gpu.index, gpu.pci_bus_id))
    yield from _judge(inp, None, [e for e in inp.snapshot.node_xids if e.rule], known)


def _name(inp: CheckInput, gpu: GpuSnapshot) -> str:
    """``GPU 2``; a partition's line is its physical GPU's, named by all its partitions (``GPU 8-15``)
    so that one fault reads as one in the drain reason, while each partition's jobs are touched."""
    if gpu.partition is None:
        return f"GPU {gpu.index}"
    device = gpu.pci_bus_id.rsplit(".", 1)[0]  # a part may show its own PCI function
    parts = sorted(g.index for g in inp.snapshot.gpus
                   if g.partition is not None and g.pci_bus_id.rsplit(".", 1)[0] == device)
    if len(parts) > 1 and parts == list(range(parts[0], parts[-1] + 1)):
        return f"GPU {parts[0]}-{parts[-1]}"
    return "GPU " + ",".join(map(str, parts))


def _baseline_keys(inp: CheckInput) -> frozenset[str]:
    base = inp.baseline
    if inp.context is not Context.EPILOG or base is None:
        return frozenset()
    return frozenset(e.key for g in base.gpus for e in g.xids if e.rule) | {e.key for e in base.node_xids if e.rule}


def _judge(inp: CheckInput, gpu: int | None, events: Iterable[XidEvent], known: frozenset[str], name: str = "",
           ident: str = "") -> Iterator[Finding]:
    groups: dict[tuple[str, str, str], dict[str, XidEvent]] = {}
    for e in events:
        where = "" if gpu is not None else (e.pci_bus_id or "")
        groups.setdefault((e.rule, e.subject, where), {})[e.key] = e
    for (rule, subject, bus), current in sorted(groups.items()):
        new = [e for key, e in current.items() if key not in known]
        if new:
            found = _finding(gpu, name, rule, subject, bus, new)
            yield _repeated(inp, found, ident or new[-1].gpu_id, current)


def _repeated(inp: CheckInput, found: Finding, ident: str, current: dict[str, XidEvent]) -> Finding:
    """``found`` turned into a replacement when its fault is the ``[expect] xid_repeat_count``-th
    on this GPU within the window (a fault the reset did not mend: the hardware)."""
    limit = inp.expect.xid_repeat_count
    if not (Action.DRAIN.rank <= found.action.rank < Action.REPLACE.rank and limit > 0):
        return found
    from slurm_hooks.checks.xid import _ordinal, _span
    from slurm_hooks.xid.history import kind

    what = kind(next(iter(current.values())))
    since = inp.now - inp.expect.xid_repeat_window_s
    recorded = {key for key, (who, k, t) in inp.xid_history.items() if who == ident and k == what and since <= t <= inp.now}
    total = len(recorded | {key for key in current if key not in inp.xid_history})
    if total < limit:
        return found
    return replace(found, action=Action.REPLACE, severity=Severity.FAIL,
                   message=f"{found.message}, {_ordinal(total)} time in {_span(inp.expect.xid_repeat_window_s)} "
                           "-> hardware")


def _finding(gpu: int | None, name: str, rule: str, subject: str, bus: str, new: list[XidEvent]) -> Finding:
    where = name if gpu is not None else (f"PCI {bus}" if bus else "node")
    action, words = ROWS.get(rule, (Action.WARN, rule + " on {where}"))
    summary = " ".join(words.format(where=where, where_cap=where if gpu is not None or bus else "a GPU",
                                    block=subject.upper(), ring=subject).split())  # amdsmi's RING_HANG names no ring
    severity = Severity.FAIL if action.takes_node_out else Severity.WARN
    message = f"{summary}: {new[-1].message}" + (f" ({len(new)} times)" if len(new) > 1 else "")
    return Finding("amdgpu", severity, action, message, gpu, summary, rule=rule, subject=subject)
