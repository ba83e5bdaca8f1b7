"""HealthCheckProgram: check every GPU; drain and requeue on a fault; resume when mended.

slurmd ignores this program's exit code, so it acts itself. It runs on every
node every few minutes: the healthy path is one probe, pure checks, and no
Slurm call unless this node is drained by us (or, once an hour, to find a drain
of ours whose record was lost).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from typing import Callable

from slurm_hooks import engine
from slurm_hooks.errors import SlurmHooksError
from slurm_hooks.hooks import remediate
from slurm_hooks.hooks.remediate import Outcome
from slurm_hooks.hooks.wiring import Wiring
from slurm_hooks.models import Action, Context, NodeSnapshot, Report, XidEvent
from slurm_hooks.xid_history import XidHistory


def run(w: Wiring, *, dry_run: bool = False, context: Context = Context.CHECK, follow: str = "detached",
        events: Sequence[XidEvent] = ()) -> tuple[Report, Outcome]:
    """Judge the node and act. ``events``: XIDs a source delivered (the watcher's NVML event)
    that the probe may not see, e.g. when the kernel log is unreadable in a container."""
    report = judge(w, context, events=events, acknowledge=not dry_run)
    outcome = Outcome()
    if not dry_run:
        remediate.record_alerts(w, report)
        act(w, report, outcome, follow=follow)
        remediate.finish_followed(w)  # jobs a requeue follower left waiting (it died, or could not start)
    return report, outcome


def judge(w: Wiring, context: Context, *, acknowledge: bool = True, events: Sequence[XidEvent] = (),
          **kw) -> Report:
    """:func:`evaluate`, then, if we drained this node before and an admin has resumed it since,
    acknowledge the XIDs we drained for and judge again: in every context, so that the first
    job after the resume is not refused for what the admin has mended."""
    snap = None
    if events:
        snap = _with_events(engine.take_snapshot(w.probe(), w.node, float(w.config.gpu.probe_timeout)), events)
    report = evaluate(w, context, snapshot=snap, **kw)
    if acknowledge and report.drain_findings() and _admin_resumed(w, report):
        report = evaluate(w, context, snapshot=report.snapshot, **kw)
    return report


def _with_events(snap: NodeSnapshot, events: Sequence[XidEvent]) -> NodeSnapshot:
    """Add delivered XIDs the snapshot lacks: not the same event (key), nor, from another source
    (NVML's event for a line the kernel log holds), the same code on the same GPU."""
    if snap.error is not None:
        return snap
    present = engine.snapshot_xids(snap)
    keys = {x.key for x in present}
    seen = {(x.gpu, x.code) for x in present}
    extra = [e for e in events if e.key not in keys and (e.gpu, e.code) not in seen]
    if not extra:
        return snap
    by_gpu: dict[int, list[XidEvent]] = {}
    node_level: list[XidEvent] = []
    for e in extra:
        gpu = snap.gpu(e.gpu) if e.gpu is not None else None
        if gpu is not None:
            by_gpu.setdefault(gpu.index, []).append(dataclasses.replace(e, uuid=e.uuid or gpu.uuid))
        else:
            node_level.append(e)
    gpus = tuple(dataclasses.replace(g, xids=g.xids + tuple(by_gpu[g.index])) if g.index in by_gpu else g
                 for g in snap.gpus)
    return dataclasses.replace(snap, gpus=gpus, node_xids=snap.node_xids + tuple(node_level))


def _admin_resumed(w: Wiring, report: Report) -> bool:
    """We drained this node for some XIDs and an admin has resumed it: those XIDs are dealt with.

    They stay in the kernel log until the next reboot; acknowledging exactly the
    events we drained for keeps a mended node from being drained again for them,
    while any newer XID still drains. Faults that are state (ECC counts, a lost
    GPU, remapping) are judged afresh as always.
    """
    drained_for = remediate.drained_for(w)
    if drained_for is None or report.snapshot is None:
        return False
    try:
        if w.slurm.node(w.node).drained:
            return False
        keys = sorted(set(drained_for) & set(_keys(report.snapshot)))
        if keys:
            xid_history(w).ack(keys)
            w.audit.write("action", node=w.node, action="ack-xids", target=w.node, result="ok", duration_s=0.0,
                          detail=f"node resumed by an admin after our drain; {len(keys)} XID event(s) acknowledged")
    except SlurmHooksError as exc:
        print(f"slurm-hooks: {exc}", file=sys.stderr)
        return False
    remediate.forget_drain(w)
    return True


class _Fixed:
    """A probe that returns a snapshot already taken (re-judging without probing twice)."""

    def __init__(self, snap: NodeSnapshot):
        self.name, self.snap = snap.backend, snap

    def snapshot(self) -> NodeSnapshot:
        return self.snap


def evaluate(w: Wiring, context: Context, gpus: list[str] | None = None, baseline=None,
             snapshot: NodeSnapshot | None = None, job_failed: bool = False) -> Report:
    cfg = w.config
    expect = cfg.expectations_for(w.node)
    history = xid_history(w)
    try:
        acked = history.acked()
    except SlurmHooksError:
        acked = frozenset()
    report = engine.run(
        _Fixed(snapshot) if snapshot is not None else w.probe(), w.node, expect, context,
        deadline_s=float(cfg.check.deadline),
        probe_timeout_s=float(cfg.gpu.probe_timeout),
        gpus=gpus,
        baseline=baseline,
        xid_history=lambda snap: history.recorded(),
        dcgm=_dcgm_runner(w, context, expect, job_failed),
        job_failed=job_failed,
        acked_xids=acked,
        on_check_error=Action(cfg.check.on_check_error),
    )
    if report.snapshot is not None:
        events = engine.snapshot_xids(report.snapshot)
        if events:
            try:
                history.record(events)
            except SlurmHooksError as exc:
                print(f"slurm-hooks: {exc}", file=sys.stderr)
    return report


def _keys(snap: NodeSnapshot) -> list[str]:
    return [x.key for x in engine.snapshot_xids(snap)]


def act(w: Wiring, report: Report, outcome: Outcome, follow: str = "detached") -> None:
    if report.drain_findings():
        if w.config.check.drain:
            remediate.drain(w, report, outcome)
            # Requeued onto a node that still takes jobs, a job could land right back here; and a
            # node we could not read at all says nothing about its running jobs' GPUs.
            gpu_fault = any(f.check != engine.PROBE_FAILED for f in report.drain_findings())
            if w.config.remediation.requeue and outcome.node_out and gpu_fault:
                remediate.requeue_jobs(w, outcome, follow=follow)
    elif report.healthy and report.context is Context.CHECK:
        remediate.resume_if_ours(w, outcome, report)
    _metrics(w, report, outcome)


def xid_history(w: Wiring) -> XidHistory:
    """This node's XID history, shared with the watcher."""
    return XidHistory(w.state_path(f"xid-history-{w.node}.json"))


def _dcgm_runner(w: Wiring, context: Context, expect, job_failed: bool = False) -> Callable | None:
    if engine.dcgm_level(context, expect, job_failed) <= 0:
        return None
    from slurm_hooks.probes.dcgm import make_runner

    return make_runner(w.config.dcgm.dcgmi, max_timeout=float(w.config.dcgm.timeout))


def _metrics(w: Wiring, report: Report, outcome: Outcome) -> None:
    if not w.config.metrics.textfile_dir:
        return
    from slurm_hooks import metrics

    done = ["drain"] * int(outcome.drained) + ["requeue"] * len(outcome.requeued) + ["resume"] * int(outcome.resumed)
    metrics.record(w.config, w.node, report, remediations=done)
