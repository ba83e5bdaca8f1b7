"""What the ladder would do for a report (:func:`plan`): the pure choice of :mod:`.ladder` over
this node's GPUs and the attempts on record, and how an attempt is recorded."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

from slurm_hooks.engine import drain_summary
from slurm_hooks.models import Finding, Report, gpu_identity
from slurm_hooks.remedy.repair import ladder
from slurm_hooks.remedy.repair.state import Attempt, RepairStateUnreadable
from slurm_hooks.remedy.repair.store import load
from slurm_hooks.values import dataclass, field
from slurm_hooks.xid.history import repeat_offender

TYPE_CHECKING = False
if TYPE_CHECKING:
    from slurm_hooks.remedy.repair.state import RepairState
    from slurm_hooks.remedy.wiring import Wiring

RUNGS = ladder.RUNGS


def start_rung(finding: Finding) -> str | None:
    """The rung a finding starts at; ``None`` for one no repair mends (a person must look)."""
    rung = ladder.start_rung(finding)
    return None if rung is None else rung.value


@dataclass
class Plan:
    rung: str
    #: (index, identity) of the GPUs the findings name; identity "node" for node-wide findings.
    gpus: list[tuple[int | None, str]]
    why: str
    summary: str
    skipped: list[str] = field(default_factory=list)

    def text(self, node: str) -> str:
        what = {"reset": "reset GPU(s) " + ", ".join(str(i) for i, _ in self.gpus if i is not None),
                "reboot": "reboot the node through Slurm", "replace": "leave it drained for replacement [replace]"}
        return f"{node}: repair would {what[self.rung]} ({self.why})"


def plan(w: Wiring, report: Report, state: RepairState | None = None, now: float | None = None) -> Plan | None:
    """What the ladder would do for this report; ``None`` when nothing is to repair."""
    now = time.time() if now is None else now
    findings = report.drain_findings()
    if not findings:
        return None
    if state is None:
        try:
            state = load(w)
        except RepairStateUnreadable as exc:
            print(f"slurm-hooks: repair: {exc}: the ladder does nothing until it is mended or removed",
                  file=sys.stderr)
            return None
    gpus = gpus_of(report, findings)
    choice = ladder.choose(findings, gpus, state.attempts, ladder.Policy.from_config(w.config.repair), now,
                           drain_summary(report), offender=_offender)
    if choice is None:
        return None
    return Plan(choice.rung.value, gpus, choice.why, drain_summary(report), list(choice.skipped))


def gpus_of(report: Report, findings: Sequence[Finding]) -> list[tuple[int | None, str]]:
    snap = report.snapshot
    out: dict[str, int | None] = {}
    for f in findings:
        gpu = snap.gpu(f.gpu) if snap is not None and f.gpu is not None else None
        ident = gpu_identity(gpu.uuid, gpu.index, gpu.pci_bus_id) if gpu else (f"gpu{f.gpu}" if f.gpu is not None
                                                                              else "node")
        out.setdefault(ident, f.gpu)
    return [(i, g) for g, i in out.items()]


def _offender(attempts: list[Attempt], ids: list[str], now: float) -> str:
    return repeat_offender([a.to_json() for a in attempts], ids, now)


def attempt(rung: str, p: Plan, started: float, result: str) -> Attempt:
    """The attempt of a rung on the plan's GPUs, as the state file records it."""
    return Attempt(rung, started, result, tuple(g for _, g in p.gpus), p.summary)
