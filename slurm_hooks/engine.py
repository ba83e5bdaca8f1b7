"""Gather, then judge: take one snapshot within the deadline (:func:`take_snapshot`), run every
check of a :class:`JudgeRequest` on it (:func:`judge`); never raise, respect one deadline."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence

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
from slurm_hooks.severity import DEFAULT as DEFAULT_SEVERITIES
from slurm_hooks.severity import Severities
from slurm_hooks.values import compile_later, dataclass, field, replace

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing (~3 ms of each start)
if TYPE_CHECKING:
    from slurm_hooks.checks.hysteresis import Hysteresis
    from slurm_hooks.models import IbPort
    from slurm_hooks.xid.catalog import XidInfo

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


def select_gpus(snap: NodeSnapshot,
                tokens: Sequence[int | str]) -> tuple[tuple[int, ...], list[str], list[str]]:
    """Map a job's GPUs (indexes, or UUIDs: ``GPU-`` ones as newer Slurm sets them, or a probe's own
    UUIDs as the GPU map names them, amdsmi's having no prefix, or ROCm's ``GPU-<16 hex>`` from
    ROCR_VISIBLE_DEVICES) to indexes. Returns the indexes, the tokens that name a GPU this node
    does not show (missing), and the ROCm UUIDs no GPU here answers to (unnamed).

    A ROCm UUID is the ASIC's unique id, which amdsmi's UUID does not show as such: it matches the
    GPUs whose probe read that id (every partition of the board); one that matches none cannot be
    told from a GPU gone (the id unread, another kernel's form), so every GPU is judged for it,
    never a missing GPU: the GPU count check tells a GPU that is gone."""
    by_uuid = {g.uuid.lower(): g.index for g in snap.gpus if g.uuid}
    by_rocm: dict[str, list[int]] = {}
    for g in snap.gpus:
        if g.rocm_uuid:
            by_rocm.setdefault(g.rocm_uuid.lower(), []).append(g.index)
    present = {g.index for g in snap.gpus}
    indexes: list[int] = []
    missing: list[str] = []
    unnamed: list[str] = []
    for token in tokens:
        text = str(token).strip()
        if not text:
            continue
        low = text.lower()
        if low.startswith("mig-"):
            # A MIG instance does not name its parent GPU here: judge every GPU rather than guess.
            return tuple(sorted(present)), [], []
        found: list[int] | None
        if low in by_uuid:
            found = [by_uuid[low]]
        elif _ROCM_UUID.match(text):
            found = by_rocm.get(low)
            if found is None:
                unnamed.append(text)
                continue
        elif low.startswith("gpu-"):
            found = None
        elif text.isdigit():
            found = [int(text)] if int(text) in present else None
        else:
            found = None
        if found is None:
            missing.append(text)
        indexes.extend(i for i in found or () if i not in indexes)
    if unnamed:
        return tuple(sorted(present)), missing, unnamed
    return tuple(indexes), missing, unnamed


#: ROCm's name of a GPU (ROCR's HSA_AMD_AGENT_INFO_UUID, rocminfo's "Uuid:"): ``GPU-`` and the
#: ASIC's unique id in 16 hex digits, or ``GPU-XX`` for one without (NVIDIA's are 8-4-4-4-12).
_ROCM_UUID = compile_later(r"GPU-(?:[0-9a-f]{16}|XX)$", re.IGNORECASE)


def unnamed_gpu_note(snap: NodeSnapshot, token: str) -> str:
    """Why a job's ROCm GPU UUID matched no GPU, and what was judged instead (a note, never a fault)."""
    if token.upper().endswith("-XX"):
        why = "ROCm gives it no unique id"
    elif not any(g.rocm_uuid for g in snap.gpus):
        why = f"the {snap.backend or 'GPU'} probe read no ASIC unique id here, so cannot tell which GPU it is"
    else:
        why = "no GPU here has that ASIC unique id"
    return f"job GPU {token}: {why}; judging every GPU of the node instead"


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
                x = replace(x, gpu=g.index, uuid=g.uuid or x.uuid)
            out.setdefault(x.key, x)
    for x in snap.node_xids:
        out.setdefault(x.key, x)
    return list(out.values())


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


@dataclass(frozen=True)
class JudgeRequest:
    """What to judge a snapshot for, and with what: one value for every caller (the health
    check, the prolog and epilog, the watcher, the tests)."""

    expect: Expectations
    context: Context
    #: Seconds the probe and the checks may take together, counted from ``started``.
    deadline_s: float
    #: Longest the probe may take (``None``: the deadline); :func:`run` uses it.
    probe_timeout_s: float | None = None
    #: ``time.monotonic()`` when the run began (before the probe): the deadline and the report's
    #: duration count from it. ``None``: when :func:`judge` is called.
    started: float | None = None
    #: The job's GPUs (indexes, or ``GPU-`` UUIDs); ``None``: every GPU.
    gpus: tuple[int | str, ...] | None = None
    #: The job's GPUs, as Slurm numbers them, that this node does not show (hooks.gpumap).
    missing: tuple[str, ...] = ()
    #: The prolog's snapshot of the same job (the epilog's "new during the job").
    baseline: NodeSnapshot | None = None
    #: XID events recorded by earlier runs, as :meth:`XidState.recorded` gives them.
    xid_history: Mapping[str, tuple[str, int | str, float]] = field(default_factory=dict)
    acked_xids: frozenset[str] = frozenset()
    ecc_acked: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    #: Where the XID check looks a code up (``None``: NVIDIA's catalogue); the watcher passes
    #: the entry it already looked up for its event.
    xid_lookup: Callable[[int], XidInfo | None] | None = None
    dcgm: DcgmRunner | None = None
    job_failed: bool = False
    on_check_error: Action = Action.DRAIN
    #: The checks to run (``None``: the registry's for the context).
    checks: tuple[registry.Check, ...] | None = None
    #: Also judge every GPU as an idle node's (leftover processes or memory), kept apart in
    #: :attr:`Report.if_idle`: the health check resumes a node Slurm says is idle only if empty.
    if_idle: bool = False
    #: The severity table with the admin's overrides (scope and urgency of every finding).
    severities: Severities = DEFAULT_SEVERITIES
    #: The gather step of the node's InfiniBand/RoCE ports (:class:`slurm_hooks.probes.ib.LinkGatherer`),
    #: called once per judgement; ``None``: links are not looked at.
    links: Callable[[], tuple[IbPort, ...] | None] | None = None
    #: Confirms threshold findings over several runs and holds their drain until enough good
    #: readings (:mod:`slurm_hooks.checks.hysteresis`); ``None``: every reading stands alone.
    hysteresis: Hysteresis | None = None

    def __post_init__(self) -> None:
        if self.gpus is not None:
            object.__setattr__(self, "gpus", tuple(self.gpus))
        if self.checks is not None:
            object.__setattr__(self, "checks", tuple(self.checks))


#: The severity rule of a check that crashed or was not run for want of time.
CHECK_ERROR = "check-error"

#: The checks that look at the gathered links: without one of them the links are not read.
LINK_CHECKS = frozenset({"links", "link-errors", "link-flaps", "link-events"})

#: The check that :attr:`JudgeRequest.if_idle` runs.
IDLE_CHECK = "leftover"


def run(probe: Probe, node: str, request: JudgeRequest) -> Report:
    """Take a snapshot within the request's deadline, then judge it."""
    if request.started is None:
        request = replace(request, started=time.monotonic())
    timeout = min(request.probe_timeout_s or request.deadline_s, request.deadline_s)
    return judge(take_snapshot(probe, node, timeout), request)


def judge(snap: NodeSnapshot, request: JudgeRequest) -> Report:
    """Run every check of the request on a snapshot already taken; never raises. The report
    names the checks that ran."""
    start = time.monotonic() if request.started is None else request.started
    deadline = start + request.deadline_s
    context, expect = request.context, request.expect
    if snap.error is not None:
        # One finding for a node we could not read, not one per check.
        failed = request.severities.apply(Finding(PROBE_FAILED, Severity.FAIL, Action.DRAIN,
                                                  f"cannot read GPUs: {snap.error}", summary="GPU probe failed"))
        return Report(snap.node, context, (failed,), time.monotonic() - start, snap, checks_run=(PROBE_FAILED,))
    dcgm_result = None
    level = dcgm_level(context, expect, request.job_failed)
    if request.dcgm is not None and level > 0:
        remaining = deadline - time.monotonic()
        try:
            dcgm_result = request.dcgm(level, max(remaining - 1.0, 1.0))
        except Exception as exc:
            dcgm_result = DcgmResult(level, True, False, (), f"crashed: {exc}", tool="GPU diagnostic")
    selected, missing, unnamed = (None, [], []) if request.gpus is None else select_gpus(snap, request.gpus)
    checks = request.checks if request.checks is not None else registry.for_context(context)
    links, link_error = _gather_links(request.links if any(c.name in LINK_CHECKS for c in checks) else None,
                                      min(LINKS_TIMEOUT_S, max(deadline - time.monotonic(), 0.5)))
    inp = CheckInput(
        snapshot=snap,
        expect=expect,
        context=context,
        gpus=selected,
        baseline=request.baseline,
        xid_history=dict(request.xid_history),
        dcgm=dcgm_result,
        acked_xids=request.acked_xids,
        ecc_acked={gpu: dict(blocks) for gpu, blocks in request.ecc_acked.items()},
        now=time.time(),
        xid_lookup=request.xid_lookup,
        links=links,
    )
    findings = [Finding("gpu-count", Severity.FAIL, Action.REBOOT, f"job GPU {token} is not visible on this node",
                        summary=f"GPU {token} missing") for token in (*request.missing, *missing)]
    findings.extend(Finding("gpu-count", Severity.OK, Action.NONE, unnamed_gpu_note(snap, token)) for token in unnamed)
    if link_error is not None:
        findings.append(Finding("links", Severity.FAIL, request.on_check_error, f"cannot read the links: {link_error}",
                                summary="IB links unreadable", rule=CHECK_ERROR))
    ran = [PROBE_FAILED]
    for check in checks:
        if time.monotonic() > deadline:
            findings.append(Finding(check.name, Severity.FAIL, request.on_check_error,
                                    f"not run: deadline of {request.deadline_s:g}s passed",
                                    summary="health check deadline", rule=CHECK_ERROR))
            continue
        # Without a diagnostic result the dcgm check looks at nothing: it did not judge the node.
        if check.name not in ran and (check.name != "dcgm" or dcgm_result is not None):
            ran.append(check.name)
        findings.extend(_run_check(check, inp, request.on_check_error))
    if_idle: tuple[Finding, ...] = ()
    if request.if_idle:
        idle = next(c for c in registry.REGISTRY if c.name == IDLE_CHECK)
        if_idle = tuple(_run_check(idle, replace(inp, gpus=None), request.on_check_error))
    if request.hysteresis is not None:
        findings = request.hysteresis.fold(findings, inp.now)
    graded = tuple(request.severities.apply(f) for f in findings)
    return Report(snap.node, context, graded, time.monotonic() - start, snap,
                  checks_run=tuple(ran), if_idle=tuple(request.severities.apply(f) for f in if_idle))


#: Longest the links' gather may take: a counter read can hang in the firmware (gpud 1164).
LINKS_TIMEOUT_S = 5.0


def _gather_links(gather: Callable[[], tuple[IbPort, ...] | None] | None,
                  timeout: float = LINKS_TIMEOUT_S) -> tuple[tuple | None, str | None]:
    """The gathered ports, or why there are none: a gather that crashes or hangs is a finding,
    never a crashed or hung run."""
    if gather is None:
        return None, None
    box: list = []

    def work() -> None:
        try:
            box.append((gather(), None))
        except Exception as exc:  # noqa: BLE001
            box.append((None, f"{type(exc).__name__}: {exc}"))

    worker = threading.Thread(target=work, name="ib-links", daemon=True)
    worker.start()
    worker.join(max(timeout, 0.0))
    return box[0] if box else (None, f"no answer within {timeout:g}s (a hung counter read?)")


def _run_check(check: registry.Check, inp: CheckInput, on_error: Action) -> list[Finding]:
    """What the check finds; one that crashes keeps what it found before, and fails."""
    found: list[Finding] = []
    try:
        found.extend(check.fn(inp))
    except Exception as exc:
        found.append(Finding(check.name, Severity.FAIL, on_error, f"check crashed: {type(exc).__name__}: {exc}",
                             summary=f"check {check.name} crashed", rule=CHECK_ERROR))
    return found


def drain_summary(report: Report) -> str:
    """``XID 79 on GPU 3; ECC ...``: the drain-worthy findings, worst first, deduplicated."""
    parts: list[str] = []
    for f in sorted(report.drain_findings(), key=lambda f: -f.action.rank):
        text = f.summary or f.message
        if text not in parts:
            parts.append(text)
    return "; ".join(parts)
