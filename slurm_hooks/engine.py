"""Probe once, run every check for the context, never raise, respect one deadline."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Sequence
from typing import Callable

from slurm_hooks import checks as registry
from slurm_hooks.models import (
    Action,
    CheckInput,
    Context,
    DcgmResult,
    Expectations,
    Finding,
    NodeSnapshot,
    Report,
    Severity,
    XidEvent,
)
from slurm_hooks.probes import Probe

DcgmRunner = Callable[[int, float], DcgmResult]

#: Check id of the finding for a node whose GPUs could not be read at all (NVML down, driver
#: mismatch mid-rollout, a hung probe): the node stops taking jobs, but its running jobs,
#: which may be fine, are not requeued for it.
PROBE_FAILED = "gpu-probe"


def take_snapshot(probe: Probe, node: str, timeout: float) -> NodeSnapshot:
    """Run the probe in a worker thread; a hung driver becomes a finding, not a hang."""
    box: list = []

    def failed(error: str) -> NodeSnapshot:
        return NodeSnapshot(node, getattr(probe, "name", "?"), taken_at=time.time(), error=error)

    def work() -> None:
        try:
            box.append(probe.snapshot())
        except Exception as exc:  # the probe must not take the engine down
            box.append(failed(f"{type(exc).__name__}: {exc}"))

    worker = threading.Thread(target=work, name="gpu-probe", daemon=True)
    worker.start()
    worker.join(max(timeout, 0.0))
    return box[0] if box else failed(f"GPU probe did not answer within {timeout:g}s (driver hung?)")


def select_gpus(snap: NodeSnapshot, tokens: Sequence[int | str]) -> tuple[tuple[int, ...], list[str]]:
    """Map a job's GPUs (indexes, or ``GPU-`` UUIDs as newer Slurm sets them) to indexes."""
    by_uuid = {g.uuid.lower(): g.index for g in snap.gpus if g.uuid}
    present = {g.index for g in snap.gpus}
    indexes: list[int] = []
    missing: list[str] = []
    for token in tokens:
        text = str(token).strip()
        if not text:
            continue
        if text.lower().startswith("mig-"):
            # A MIG instance does not name its parent GPU here: judge every GPU rather than guess.
            return tuple(sorted(present)), []
        if text.lower().startswith("gpu-"):
            index = by_uuid.get(text.lower())
        elif text.isdigit():
            index = int(text) if int(text) in present else None
        else:
            index = None
        if index is None:
            missing.append(text)
        elif index not in indexes:
            indexes.append(index)
    return tuple(indexes), missing


def parse_gpu_list(value: str | None) -> list[str] | None:
    """``"0,1"`` or ``"GPU-ab..,GPU-cd.."`` from SLURM_JOB_GPUS / CUDA_VISIBLE_DEVICES."""
    if value is None or value.strip() in ("", "NoDevFiles"):
        return None
    return [part.strip() for part in value.split(",") if part.strip()]


def snapshot_xids(snap: NodeSnapshot) -> list[XidEvent]:
    """Every XID in the snapshot once: each GPU's (named by that GPU's index and UUID, as the
    history and escalation count them), then those tied to no GPU."""
    out: dict[str, XidEvent] = {}
    for g in snap.gpus:
        for x in g.xids:
            if x.gpu != g.index or (g.uuid and x.uuid != g.uuid):
                x = dataclasses.replace(x, gpu=g.index, uuid=g.uuid or x.uuid)
            out.setdefault(x.key, x)
    for x in snap.node_xids:
        out.setdefault(x.key, x)
    return list(out.values())


def _history(lookup, snap: NodeSnapshot) -> dict[str, tuple[str, int, float]]:
    """Earlier XIDs on this node (for escalation); an unreadable history counts as none."""
    if lookup is None:
        return {}
    try:
        return dict(lookup(snap))
    except Exception:
        return {}


def dcgm_level(context: Context, expect: Expectations, job_failed: bool = False) -> int:
    """Quick in the prolog (launch path), deeper in the epilog of a job that failed."""
    level = {
        Context.PROLOG: expect.dcgm_level_prolog,
        Context.EPILOG: expect.dcgm_level_epilog,
        Context.CHECK: expect.dcgm_level_check,
    }.get(context, 0)
    if job_failed and context is Context.EPILOG:
        level = max(level, expect.dcgm_level_after_failure)
    return level


def run(
    probe: Probe,
    node: str,
    expect: Expectations,
    context: Context,
    *,
    deadline_s: float,
    probe_timeout_s: float | None = None,
    gpus: Sequence[int | str] | None = None,
    baseline: NodeSnapshot | None = None,
    xid_history: Callable[[NodeSnapshot], dict[str, tuple[str, int, float]]] | None = None,
    dcgm: DcgmRunner | None = None,
    acked_xids: frozenset[str] = frozenset(),
    job_failed: bool = False,
    on_check_error: Action = Action.DRAIN,
    checks: Sequence[registry.Check] | None = None,
) -> Report:
    start = time.monotonic()
    deadline = start + deadline_s
    snap = take_snapshot(probe, node, min(probe_timeout_s or deadline_s, deadline_s))
    if snap.error is not None:
        # One finding for a node we could not read, not one per check.
        failed = Finding(PROBE_FAILED, Severity.FAIL, Action.DRAIN, f"cannot read GPUs: {snap.error}",
                         summary="GPU probe failed")
        return Report(node, context, (failed,), time.monotonic() - start, snap)
    dcgm_result = None
    level = dcgm_level(context, expect, job_failed)
    if dcgm is not None and level > 0:
        remaining = deadline - time.monotonic()
        try:
            dcgm_result = dcgm(level, max(remaining - 1.0, 1.0))
        except Exception as exc:
            dcgm_result = DcgmResult(level, True, False, (), f"dcgmi failed: {exc}")
    selected, missing = (None, []) if gpus is None else select_gpus(snap, gpus)
    inp = CheckInput(
        snapshot=snap,
        expect=expect,
        context=context,
        gpus=selected,
        baseline=baseline,
        xid_history=_history(xid_history, snap),
        dcgm=dcgm_result,
        acked_xids=acked_xids,
        now=time.time(),
    )
    findings = [Finding("gpu-count", Severity.FAIL, Action.REBOOT, f"job GPU {token} is not visible on this node",
                        summary=f"GPU {token} missing") for token in missing]
    for check in checks if checks is not None else registry.for_context(context):
        if time.monotonic() > deadline:
            findings.append(Finding(check.name, Severity.FAIL, on_check_error,
                                    f"not run: deadline of {deadline_s:g}s passed", summary="health check deadline"))
            continue
        try:
            findings.extend(check.fn(inp))
        except Exception as exc:
            findings.append(Finding(check.name, Severity.FAIL, on_check_error,
                                    f"check crashed: {type(exc).__name__}: {exc}", summary=f"check {check.name} crashed"))
    return Report(node, context, tuple(findings), time.monotonic() - start, snap)


def drain_summary(report: Report) -> str:
    """``XID 79 on GPU 3; ECC ...``: the drain-worthy findings, worst first, deduplicated."""
    parts: list[str] = []
    for f in sorted(report.drain_findings(), key=lambda f: -f.action.rank):
        text = f.summary or f.message
        if text not in parts:
            parts.append(text)
    return "; ".join(parts)
