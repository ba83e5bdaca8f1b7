"""Evidence kept before a repair that wipes it (a reboot, a [replace]): the NVML snapshot, the
kernel log's tail, ``nvidia-smi -q``, bounded in time and size."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable

from slurm_hooks import fsutil
from slurm_hooks.errors import SlurmHooksError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from slurm_hooks.models import Report
    from slurm_hooks.remedy.wiring import Wiring

#: The evidence kept before a reboot or a [replace]: at most this long (never past the rung's
#: budget), this many bytes per file, this many bundles per node (the oldest go).
EVIDENCE_S = 10.0
EVIDENCE_FILE_MAX = 256 * 1024
EVIDENCE_KEEP = 10


def evidence_dir(w: Wiring) -> str:
    return w.state_path("evidence", w.node)


def keep_evidence(w: Wiring, report: Report | None, rung: str) -> str:
    """Before a reboot or a [replace]: keep the NVML snapshot, the kernel log's tail and
    ``nvidia-smi -q`` (where present) in ``<state dir>/evidence/<node>/<time>-<rung>/``, each file at
    most EVIDENCE_FILE_MAX bytes, the whole at most EVIDENCE_S (and never past what is left of the
    rung's budget), the oldest bundles beyond EVIDENCE_KEEP removed. Returns the directory ("" when
    nothing could be kept); never raises."""
    t0 = time.monotonic()
    budget = min(EVIDENCE_S, w.time_left(EVIDENCE_S) / 4)
    now = time.time()
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + f".{int(now * 1000) % 1000:03d}Z"
    manifest: dict[str, Any] = {"node": w.node, "rung": rung, "at": stamp, "files": {}, "skipped": {}}
    path = os.path.join(evidence_dir(w), f"{stamp}-{rung}")
    try:
        os.makedirs(evidence_dir(w), mode=0o700, exist_ok=True)
        for n in range(2, 100):
            try:
                os.mkdir(path, 0o700)
                break
            except FileExistsError:
                path = os.path.join(evidence_dir(w), f"{stamp}-{rung}-{n}")
    except OSError as exc:
        print(f"slurm-hooks: repair: cannot keep evidence in {path}: {exc.strerror}", file=sys.stderr)
        return ""
    parts: list[tuple[str, Callable[[float], str]]] = [
        ("snapshot.json", lambda _left: _snapshot_text(report)),
        ("kernel-log.txt", lambda left: _kernel_tail(w, left)),
        ("nvidia-smi-q.txt", lambda left: _nvidia_smi_q(left)),
    ]
    for name, gather in parts:
        left = budget - (time.monotonic() - t0)
        if left <= 0.1:
            manifest["skipped"][name] = "out of time"
            continue
        try:
            text = gather(left)
        except (SlurmHooksError, OSError, ValueError) as exc:
            manifest["skipped"][name] = str(exc)[:200]
            continue
        if not text:
            manifest["skipped"][name] = "nothing to keep"
            continue
        data = text.encode("utf-8", "replace")[-EVIDENCE_FILE_MAX:]
        with contextlib.suppress(OSError):
            fsutil.atomic_write(os.path.join(path, name), data, mode=0o600, durable=False)
            manifest["files"][name] = len(data)
    manifest["seconds"] = round(time.monotonic() - t0, 3)
    with contextlib.suppress(OSError):
        fsutil.atomic_write(os.path.join(path, "manifest.json"), json.dumps(manifest, indent=1), mode=0o600,
                            durable=False)
    _prune_evidence(evidence_dir(w))
    return path


def _snapshot_text(report: Report | None) -> str:
    snap = report.snapshot if report is not None else None
    return "" if snap is None else json.dumps(dataclasses.asdict(snap), indent=1, default=str)


def _kernel_tail(w: Wiring, left: float) -> str:
    """The kernel log's tail: the configured file where it is one (a container's copy, a test's), else ``dmesg``."""
    from slurm_hooks.runner import run_command

    path = w.config.watch.kmsg
    if path and os.path.isfile(path):
        with open(path, "rb") as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - EVIDENCE_FILE_MAX))
            return fh.read().decode("utf-8", "replace")
    return run_command(["dmesg", "--time-format", "iso"], timeout=left).stdout


def _nvidia_smi_q(left: float) -> str:
    import shutil

    from slurm_hooks.runner import run_command

    if shutil.which("nvidia-smi") is None:
        return ""
    return run_command(["nvidia-smi", "-q"], timeout=left, check=False).stdout


def _prune_evidence(root: str) -> None:
    import shutil

    try:
        bundles = sorted(os.listdir(root))
    except OSError:
        return
    for old in bundles[:-EVIDENCE_KEEP]:
        shutil.rmtree(os.path.join(root, old), ignore_errors=True)
