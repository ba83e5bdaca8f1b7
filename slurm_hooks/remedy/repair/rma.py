"""The RMA list, ``<state dir>/rma.json``: the GPUs the ladder left for replacement, with their
identity, history and evidence."""

from __future__ import annotations

import json
import time

from slurm_hooks import fsutil
from slurm_hooks.remedy.repair.store import VERSION

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from slurm_hooks.models import Report
    from slurm_hooks.remedy.repair.planner import Plan
    from slurm_hooks.remedy.repair.state import RepairState
    from slurm_hooks.remedy.wiring import Wiring


def rma_path(w: Wiring) -> str:
    return w.state_path("rma.json")


def read_rma(path: str) -> list[dict[str, Any]]:
    data = fsutil.read_json(path, missing={}, error={})
    return [e for e in data.get("gpus", []) if isinstance(e, dict)] if isinstance(data, dict) else []


def add_to_rma(w: Wiring, p: Plan, report: Report, state: RepairState, evidence: str = "") -> list[str]:
    """Put the plan's GPUs on the RMA list (UUID, serial, PCI bus id, history, the evidence kept);
    returns their UUIDs."""
    snap = report.snapshot
    path = rma_path(w)
    added = []
    with fsutil.locked(path):
        entries = read_rma(path)
        for index, ident in p.gpus:
            gpu = snap.gpu(index) if snap is not None and index is not None else None
            entry = {"uuid": gpu.uuid if gpu else ident, "serial": gpu.serial if gpu else "",
                     "pci_bus_id": gpu.pci_bus_id if gpu else "", "node": w.node, "gpu": index,
                     "reason": p.why, "added": time.time(), **({"evidence": evidence} if evidence else {}),
                     "history": [a.to_json() for a in state.attempts if ident in a.gpus]}
            entries = [e for e in entries if e.get("uuid") != entry["uuid"]] + [entry]
            added.append(entry["uuid"])
        fsutil.atomic_write(path, json.dumps({"version": VERSION, "gpus": entries}, indent=1), mode=0o600)
    return added


def gpu_ids(report: Report | None, p: Plan) -> list[dict[str, Any]]:
    """The plan's GPUs as the audit record and the RMA list name them: index, UUID, serial, PCI bus id."""
    from slurm_hooks.remedy.audit import gpu_fields

    return [{"index": index, "uuid": ident if is_uuid(ident) else "", "serial": "", "pci_bus_id": "",
             **gpu_fields(report, index)} for index, ident in p.gpus if index is not None]


def is_uuid(ident: str) -> bool:
    return ident.startswith(("GPU-", "MIG-"))
