"""Prometheus metrics for node_exporter's textfile collector.

Every run (check, prolog, epilog, watch) calls :func:`write`. The check, the
prolog and the watcher run at different times, and node_exporter reads one
file, so the last result of each context (per node: a testbed runs several
slurmd on one host) is kept in a small JSON file under
``[state] dir`` (with the remediation counters, which must survive restarts)
and the whole ``slurm_hooks.prom`` is rendered from it each time. The file is
replaced atomically (temp file in the same directory, then rename), as the
textfile collector requires; its temp files do not end in ``.prom``.

Series (``context`` is check, prolog, epilog or watch)::

    slurm_hooks_check_status{node,context}                   1 healthy, 0 not
    slurm_hooks_findings{node,context,check,severity}        findings in the last run
    slurm_hooks_gpu_healthy{node,context,gpu}                1 / 0 per GPU index
    slurm_hooks_last_run_timestamp_seconds{node,context}
    slurm_hooks_last_run_duration_seconds{node,context}
    slurm_hooks_remediations_total{node,action}              counter, persisted
    slurm_hooks_pending_actions{node}                        remediation steps waiting for a retry
    slurm_hooks_requeue_seconds{node,kind}                   summary: fault -> requeue, by who requeued
                                                             (self: the job on its checkpoint signal; ours)

``slurm-hooks status --textfile DIR`` writes the fleet's lifecycle to ``slurm_hooks_status.prom``::

    slurm_hooks_node_held_seconds{node,tag,next}             a node we hold: how long at its step
    slurm_hooks_waiting_for_person{node}                     1 while it waits for a person
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Iterable
from enum import Enum
from typing import Any

from slurm_hooks import fsutil
from slurm_hooks.models import Report, Severity

PROM_FILE = "slurm_hooks.prom"
STATE_FILE = "metrics.json"
_VERSION = 1

#: name -> (type, help). Rendered in this order.
FAMILIES = (
    ("slurm_hooks_check_status", "gauge", "1 when the last run in this context found the node healthy, 0 when not."),
    ("slurm_hooks_findings", "gauge", "Findings of the last run in this context, per check and severity."),
    ("slurm_hooks_gpu_healthy", "gauge", "1 when the last run in this context found no failure on this GPU, 0 when it did."),
    ("slurm_hooks_last_run_timestamp_seconds", "gauge", "Unix time the last run in this context finished."),
    ("slurm_hooks_last_run_duration_seconds", "gauge", "Seconds the last run in this context took."),
    ("slurm_hooks_remediations_total", "counter", "Remediations performed on this node (drain, requeue, resume, ...)."),
    ("slurm_hooks_pending_actions", "gauge",
     "Remediation steps (drain, requeue) that failed for a transient reason and wait for a retry."),
    ("slurm_hooks_requeue_seconds", "summary",
     "Seconds from a fault to a touched job's requeue, by kind: self (the job requeued itself on its "
     "checkpoint signal) or ours (requeued by slurm-hooks)."),
)


def write(textfile_dir: str, node: str, report: Report | None, *, state_dir: str,
          remediations: Iterable[str | Enum] = (), pending: int | None = None, now: float | None = None,
          requeue_seconds: Iterable[tuple[str, float]] = ()) -> str | None:
    """Record ``report`` (and count ``remediations``) and rewrite ``<textfile_dir>/slurm_hooks.prom``.

    A no-op returning None when ``textfile_dir`` is "". ``report`` may be None to
    count remediations alone (the bridge-free resume path, a watcher action). ``pending``:
    how many remediation steps wait for a retry on ``node`` now (None: unchanged).
    ``requeue_seconds``: (kind, seconds from the fault) of each job requeued now.
    Never raises for I/O: metrics must not fail a hook; a failure is one line on
    stderr and None. Returns the path written.
    """
    if not textfile_dir:
        return None
    state_path = os.path.join(state_dir, STATE_FILE)
    prom_path = os.path.join(textfile_dir, PROM_FILE)
    try:
        with fsutil.locked(state_path):
            state = _read_state(state_path)
            if report is not None:
                state["runs"].setdefault(report.node, {})[report.context.value] = _summarise(report, now if now is not None else time.time())
            counters = state["remediations"].setdefault(node, {})
            for action in remediations:
                name = action.value if isinstance(action, Enum) else str(action)
                counters[name] = int(counters.get(name, 0)) + 1
            if pending is not None:
                state.setdefault("pending", {})[node] = int(pending)
            for kind, seconds in requeue_seconds:
                total = state.setdefault("requeue_seconds", {}).setdefault(node, {}).setdefault(kind, [0.0, 0])
                total[0], total[1] = float(total[0]) + max(0.0, float(seconds)), int(total[1]) + 1
            fsutil.atomic_write(state_path, json.dumps(state, sort_keys=True), mode=0o644)
            write_textfile(textfile_dir, PROM_FILE, render(state))
    except OSError as exc:
        print(f"slurm-hooks: metrics not written to {prom_path}: {exc}", file=sys.stderr)
        return None
    return prom_path


def record(config: Any, node: str, report: Report | None, remediations: Iterable[str | Enum] = (),
           pending: int | None = None, requeue_seconds: Iterable[tuple[str, float]] = ()) -> str | None:
    """:func:`write` with ``[metrics] textfile_dir`` and ``[state] dir`` from the config."""
    return write(config.metrics.textfile_dir, node, report, state_dir=config.state.dir, remediations=remediations,
                 pending=pending, requeue_seconds=requeue_seconds)


def _summarise(report: Report, now: float) -> dict[str, Any]:
    counts: dict[tuple[str, str], int] = {}
    failed_gpus = set()
    for f in report.findings:
        key = (f.check, f.severity.value)
        counts[key] = counts.get(key, 0) + 1
        if f.severity is Severity.FAIL and f.gpu is not None:
            failed_gpus.add(f.gpu)
    gpus = {}
    if report.snapshot is not None:
        for g in report.snapshot.gpus:
            gpus[g.index] = 0 if (g.lost or g.index in failed_gpus) else 1
    for index in failed_gpus:
        gpus[index] = 0
    return {
        "healthy": report.healthy,
        "timestamp": now,
        "duration": report.duration_s,
        "findings": sorted([check, sev, n] for (check, sev), n in counts.items()),
        "gpus": sorted([i, ok] for i, ok in gpus.items()),
    }


def _empty() -> dict[str, Any]:
    return {"version": _VERSION, "runs": {}, "remediations": {}}


def _afresh(message: str) -> dict[str, Any]:
    print(message, file=sys.stderr)
    return _empty()


def _read_state(path: str) -> dict[str, Any]:
    state = fsutil.read_json(path, missing=_empty(), error=_afresh,
                             message="slurm-hooks: {path}: unreadable metrics state, starting afresh: {reason}")
    if (not isinstance(state, dict) or state.get("version") != _VERSION
            or not isinstance(state.get("runs"), dict) or not isinstance(state.get("remediations"), dict)):
        print(f"slurm-hooks: {path}: unexpected metrics state, starting afresh", file=sys.stderr)
        return _empty()
    return state


def render(state: dict[str, Any]) -> str:
    """The exposition text for a state as kept by :func:`write`."""
    samples: dict[str, list[str]] = {name: [] for name, _, _ in FAMILIES}
    runs = [(node, context, c) for node, by_context in state["runs"].items() for context, c in by_context.items()]
    for node, context, c in sorted(runs, key=lambda r: (r[0], r[1])):
        base = {"node": node, "context": context}
        samples["slurm_hooks_check_status"].append(sample("slurm_hooks_check_status", base, 1 if c["healthy"] else 0))
        for check, severity, n in c["findings"]:
            labels = {**base, "check": check, "severity": severity}
            samples["slurm_hooks_findings"].append(sample("slurm_hooks_findings", labels, n))
        for index, ok in c["gpus"]:
            samples["slurm_hooks_gpu_healthy"].append(sample("slurm_hooks_gpu_healthy", {**base, "gpu": str(index)}, ok))
        samples["slurm_hooks_last_run_timestamp_seconds"].append(
            sample("slurm_hooks_last_run_timestamp_seconds", base, c["timestamp"]))
        samples["slurm_hooks_last_run_duration_seconds"].append(
            sample("slurm_hooks_last_run_duration_seconds", base, c["duration"]))
    for node in sorted(state["remediations"]):
        for action, n in sorted(state["remediations"][node].items()):
            samples["slurm_hooks_remediations_total"].append(
                sample("slurm_hooks_remediations_total", {"node": node, "action": action}, n))
    pending = state.get("pending") if isinstance(state.get("pending"), dict) else {}
    for node in sorted(pending):
        samples["slurm_hooks_pending_actions"].append(
            sample("slurm_hooks_pending_actions", {"node": node}, int(pending[node])))
    timed = state.get("requeue_seconds") if isinstance(state.get("requeue_seconds"), dict) else {}
    for node in sorted(timed):
        for kind, (total, count) in sorted(timed[node].items()):
            labels = {"node": node, "kind": kind}
            samples["slurm_hooks_requeue_seconds"] += [sample("slurm_hooks_requeue_seconds_sum", labels, total),
                                                       sample("slurm_hooks_requeue_seconds_count", labels, count)]
    return exposition((name, kind, text, samples[name]) for name, kind, text in FAMILIES)


# --- the fleet's lifecycle, as ``slurm-hooks status --textfile`` sees it ----------------------

STATUS_FILE = "slurm_hooks_status.prom"
STATUS_FAMILIES = (
    ("slurm_hooks_node_held_seconds", "gauge",
     "Seconds a node we drained has been at its step, by our reason's tag and who acts next "
     "(a person, slurm-hooks, Slurm, its jobs)."),
    ("slurm_hooks_waiting_for_person", "gauge", "1 while a node we drained waits for a person to act."),
)


def render_status(rows: Iterable[dict[str, Any]]) -> str:
    """The exposition text for the rows of :func:`slurm_hooks.commands.status.rows`."""
    held, waiting = [], []
    for r in rows:
        held.append(sample("slurm_hooks_node_held_seconds", {"node": r["node"], "tag": r["tag"], "next": r["next"]},
                           float(r["waited_s"] or 0.0)))
        waiting.append(sample("slurm_hooks_waiting_for_person", {"node": r["node"]}, 1 if r["next"] == "a person" else 0))
    return exposition((name, kind, text, samples) for (name, kind, text), samples
                      in zip(STATUS_FAMILIES, (held, waiting)))


# --- the one Prometheus text formatter and textfile writer (the node side's and the bridge's) ----


def exposition(families: Iterable[tuple[str, str, str, Iterable[str]]]) -> str:
    """Prometheus text: for each (name, type, help, samples as :func:`sample` gives them) a HELP, a
    TYPE and its samples, in the order given."""
    lines = []
    for name, kind, text, samples in families:
        lines.append(f"# HELP {name} {_escape_help(text)}")
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(samples)
    return "\n".join(lines) + "\n"


def write_textfile(directory: str, filename: str, text: str) -> str:
    """Replace ``<directory>/<filename>`` atomically: node_exporter must never read half a file, and the
    temp file does not end in ``.prom``. Raises OSError; returns the path."""
    path = os.path.join(directory, filename)
    fsutil.atomic_write(path, text, mode=0o644)
    return path


def sample(name: str, labels: dict[str, str], value: float) -> str:
    """One sample line; no braces when there are no labels."""
    if not labels:
        return f"{name} {format_value(value)}"
    inner = ",".join(f'{k}="{escape_label(str(v))}"' for k, v in labels.items())
    return f"{name}{{{inner}}} {format_value(value)}"


def escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value: float) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))
