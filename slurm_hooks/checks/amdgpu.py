"""The amdgpu driver's events (its kernel lines, :mod:`slurm_hooks.probes.amdgpu_log`), judged by
their rows of the severity table, in the driver's own words.

One finding per (GPU, row, block or ring), as the XID check gives one per (GPU, code): its
action is its row's in the severity table (``amdgpu-*``), its summary what
the drain reason says (``uncorrectable ECC in UMC block on GPU 2``, ``GPU 2 reset failed``).
Each event counts once: in the epilog, the lines the prolog already saw are not the job's; an
event an admin dealt with (acknowledged, as XIDs are) is no reason to act again.

How a healthy GPU is kept from being drained: the driver prints an uncorrectable-error line for
new errors only (the ``detected in total`` lines that repeat a standing count, and correctable
errors, "no user action is needed", are no events); a reset, VRAM wiped by it, a deferred error
and a ring timeout are only recorded; a line tied to no GPU of the node is the node's.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from slurm_hooks.models import Action, CheckInput, Context, Finding, GpuSnapshot, Severity, XidEvent

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
        yield from _judge(gpu.index, [e for e in gpu.xids if e.rule], known, _name(inp, gpu))
    yield from _judge(None, [e for e in inp.snapshot.node_xids if e.rule], known)


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


def _judge(gpu: int | None, events: Iterable[XidEvent], known: frozenset[str], name: str = "") -> Iterator[Finding]:
    groups: dict[tuple[str, str, str], dict[str, XidEvent]] = {}
    for e in events:
        where = "" if gpu is not None else (e.pci_bus_id or "")
        groups.setdefault((e.rule, e.subject, where), {})[e.key] = e
    for (rule, subject, bus), current in sorted(groups.items()):
        new = [e for key, e in current.items() if key not in known]
        if new:
            yield _finding(gpu, name, rule, subject, bus, new)


def _finding(gpu: int | None, name: str, rule: str, subject: str, bus: str, new: list[XidEvent]) -> Finding:
    where = name if gpu is not None else (f"PCI {bus}" if bus else "node")
    action, words = ROWS.get(rule, (Action.WARN, rule + " on {where}"))
    summary = " ".join(words.format(where=where, where_cap=where if gpu is not None or bus else "a GPU",
                                    block=subject.upper(), ring=subject).split())  # amdsmi's RING_HANG names no ring
    severity = Severity.FAIL if action.takes_node_out else Severity.WARN
    message = f"{summary}: {new[-1].message}" + (f" ({len(new)} times)" if len(new) > 1 else "")
    return Finding("amdgpu", severity, action, message, gpu, summary, rule=rule, subject=subject)
