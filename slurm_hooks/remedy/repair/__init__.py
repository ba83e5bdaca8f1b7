"""The repair ladder: GPU reset -> reboot -> replace, climbed only as far as the fault needs.

Its parts: :mod:`.state` (the ladder's memory, apart from its storage), :mod:`.ladder` (the pure
decision), :mod:`.store` (the state file, the :class:`.store.Ledger` a repair changes it through,
the lock), :mod:`.planner`, :mod:`.rungs` (each runs once and returns its result; the results the
worker climbs on), :mod:`.validation`, :mod:`.evidence`, :mod:`.rma` and :mod:`.worker`
(the one sequencer: gather, decide, run, record, climb). What the hooks and commands call is
named here.
"""

from __future__ import annotations

from slurm_hooks.remedy.repair.evidence import EVIDENCE_FILE_MAX, EVIDENCE_KEEP, EVIDENCE_S, evidence_dir, keep_evidence
from slurm_hooks.remedy.repair.planner import RUNGS, Plan, plan, start_rung
from slurm_hooks.remedy.repair.rma import add_to_rma, gpu_ids, read_rma, rma_path
from slurm_hooks.remedy.repair.rma import clear as clear_mark
from slurm_hooks.remedy.repair.rungs import restore_services
from slurm_hooks.remedy.repair.state import RepairState, RepairStateUnreadable
from slurm_hooks.remedy.repair.store import KEEP_S, VERSION, load, save, state_path
from slurm_hooks.remedy.repair.validation import (
    UNVERIFIED,
    VALIDATE_TRIES,
    VALIDATING,
    Rejudge,
    validate_on_request,
    verdict,
)
from slurm_hooks.remedy.repair.worker import (
    MODES,
    WORKER_READY_S,
    hand_off,
    new_urgent,
    note_person_resume,
    step,
    worker_lock,
)

__all__ = [
    "EVIDENCE_FILE_MAX", "EVIDENCE_KEEP", "EVIDENCE_S", "KEEP_S", "MODES", "RUNGS", "UNVERIFIED", "VALIDATE_TRIES",
    "VALIDATING", "VERSION", "WORKER_READY_S", "Plan", "Rejudge", "RepairState", "RepairStateUnreadable",
    "add_to_rma", "clear_mark", "evidence_dir", "gpu_ids", "hand_off", "keep_evidence", "load", "new_urgent", "note_person_resume",
    "plan", "read_rma", "restore_services", "rma_path", "save", "start_rung", "state_path", "step", "validate_on_request",
    "verdict", "worker_lock",
]
