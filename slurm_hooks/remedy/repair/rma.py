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


def marked_on(w: Wiring, uuids: list[str]) -> list[dict[str, Any]]:
    """The RMA list's GPUs of this node with these UUIDs, as audit records name them: index, UUID,
    serial, PCI bus id (a UUID the list lacks is named by its UUID alone)."""
    entries = {e.get("uuid"): e for e in read_rma(rma_path(w)) if e.get("node") == w.node}
    out = []
    for uuid in uuids:
        e = entries.get(uuid, {})
        out.append({"index": e.get("gpu"), "uuid": uuid, "serial": str(e.get("serial") or ""),
                    "pci_bus_id": str(e.get("pci_bus_id") or "")})
    return out


def clear(w: Wiring, gpu: int, user: str) -> list[dict[str, Any]]:
    """A person's ``slurm-hooks rma clear``: GPU ``gpu`` of this node is no longer marked for
    replacement. Its RMA entry goes (its history stays in the audit log, with who cleared it), and
    the repair ladder forgets its [replace] and its attempts on that GPU, so a fault on it climbs
    from the foot again. Returns the GPUs cleared ([]: none of this node's marked GPUs has that index)."""
    from dataclasses import replace

    from slurm_hooks.remedy.repair.store import Ledger

    path = rma_path(w)
    with fsutil.locked(path):
        entries = read_rma(path)
        gone = [e for e in entries if e.get("node") == w.node and e.get("gpu") == gpu]
        if gone:
            kept = [e for e in entries if e not in gone]
            fsutil.atomic_write(path, json.dumps({"version": VERSION, "gpus": kept}, indent=1), mode=0o600)
    ledger = Ledger(w)
    replaced = ledger.state.replaced
    uuids = {str(e.get("uuid")) for e in gone}
    cleared = [{"index": e.get("gpu"), "uuid": str(e.get("uuid") or ""), "serial": str(e.get("serial") or ""),
                "pci_bus_id": str(e.get("pci_bus_id") or "")} for e in gone]
    if replaced is not None and not gone and replaced.recalled:
        cleared = [{"index": gpu, "uuid": "", "serial": "", "pci_bus_id": ""}]  # taken from Slurm's reason
        ledger.update(replaced=None)
    elif replaced is not None and uuids & set(replaced.gpus):
        left = tuple(g for g in replaced.gpus if g not in uuids)
        ledger.update(replaced=replace(replaced, gpus=left) if left else None,
                      attempts=tuple(a for a in ledger.state.attempts if not set(a.gpus) & uuids))
    if cleared:
        w.audit.write("action", node=w.node, action="rma-clear", target=w.node, result="ok", duration_s=0.0,
                      user=user, gpu_ids=cleared, reason=str(gone[0].get("reason") or ""),
                      detail=f"mark for replacement cleared by {user or 'a person'}")
    return cleared


def is_uuid(ident: str) -> bool:
    return ident.startswith(("GPU-", "MIG-"))
