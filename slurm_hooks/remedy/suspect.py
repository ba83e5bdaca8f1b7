"""Suspects from failed multi-node jobs: the failures that report no XID.

A rank that hangs in a collective, a slow node or a dropped link fails a multi-node job with
nothing for our checks to find. The epilog of such a job (it ended with a non-zero exit code,
so failed, timed out or NODE_FAIL, and our checks found nothing on the node) records a
*suspect* on its node: an audit action ``suspect`` naming the job, its nodes and its exit
code. No drain: a user's bug fails jobs too.

The same nodes suspected again, by another job, within ``[isolate] window`` is a pattern: with
``[isolate] auto = true`` (off by default) the first node of the job's list starts ``slurm-hooks
isolate`` on them, detached, once (a trigger is not repeated within the window); it waits until
the nodes are idle, adds idle peers of their partition to confirm against, and drains only a
confirmed culprit. A job's nodes come from the epilog's own environment (SLURM_NODELIST): every
node of the job sees the same list, so exactly one of them starts it, without asking slurmctld.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from slurm_hooks import fsutil

if TYPE_CHECKING:
    from slurm_hooks.remedy.wiring import Wiring

#: Idle peers of the partition added to an automatic isolate, to confirm suspects against.
AUTO_PEERS = 2
#: How long an automatic isolate waits for the suspected nodes to be idle.
AUTO_WAIT_IDLE_S = 1800.0


def job_nodes(env: Mapping[str, str]) -> list[str]:
    from slurm_hooks.slurm import hostlist

    text = (env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "").strip()
    try:
        return hostlist.expand(text) if text else []
    except ValueError:
        return []


def after_job(w: Wiring, env: Mapping[str, str], jid: str | None) -> str:
    """The epilog's look at a job our checks found nothing on: record a suspect when the job
    spanned nodes and failed; start an isolate when the pattern repeats. Returns what it did ("" for
    nothing: the healthy path costs a few dict lookups). Never raises: an epilog that fails drains
    the node ("Epilog error"), and a suspect is no reason to."""
    code = env.get("SLURM_JOB_EXIT_CODE", "").strip()
    if not jid or code in ("", "0"):
        return ""
    try:
        return _after_failed_job(w, env, jid, code)
    except Exception as exc:  # noqa: BLE001 - see above
        return f"suspect not recorded: {type(exc).__name__}: {exc}"


def _after_failed_job(w: Wiring, env: Mapping[str, str], jid: str, code: str) -> str:
    nodes = job_nodes(env)
    if len(nodes) < 2:
        return ""
    if _requeued(w, env, jid):
        return ""
    status = env.get("SLURM_JOB_EXIT_CODE2", "").strip() or code
    detail = (f"job {jid} on {len(nodes)} nodes ended with exit code {status} and no finding of ours: "
              "a suspect (no drain)")
    w.audit.write("action", node=w.node, action="suspect", target=w.node, result="recorded", jobs=[jid],
                  detail=detail, nodes=nodes, exit_code=status, partition=env.get("SLURM_JOB_PARTITION", ""))
    return remember(w, jid, nodes, status, env.get("SLURM_JOB_PARTITION", ""))


def remember(w: Wiring, jid: str, nodes: list[str], status: str, partition: str) -> str:
    """Add a suspect on this node to its history (``nodes``: the job's); the same nodes suspected
    again by another job within the window start an isolate under ``[isolate] auto``. Returns
    what came of it."""
    cfg = w.config.isolate
    now = time.time()
    path = w.state_path("suspects.json")
    with fsutil.locked(path):
        history = _load(path)
        history = {"suspects": [s for s in history.get("suspects", []) if now - s.get("ts", 0) < cfg.window],
                   "triggers": [t for t in history.get("triggers", []) if now - t.get("ts", 0) < cfg.window]}
        # Entries name their node: the testbed's nodes share one state dir, a site's each have their own.
        again = [s for s in history["suspects"] if s.get("node", w.node) == w.node and s.get("job") != jid
                 and sorted(s.get("nodes", [])) == sorted(nodes)]
        history["suspects"].append({"ts": now, "node": w.node, "job": jid, "nodes": nodes, "exit_code": status})
        fired = any(sorted(t.get("nodes", [])) == sorted(nodes) for t in history["triggers"])
        trigger = bool(again) and cfg.auto and not fired and w.node == nodes[0]
        if trigger:
            history["triggers"].append({"ts": now, "job": jid, "nodes": nodes})
        _save(path, history)
    if not again:
        return "suspect recorded"
    if not cfg.auto:
        return f"suspected again (jobs {', '.join(s['job'] for s in again)} and {jid}); [isolate] auto is off"
    if w.node != nodes[0]:
        return f"suspected again; {nodes[0]} starts isolate"
    if not trigger:
        return "suspected again; isolate already started for these nodes within the window"
    return _start_isolate(w, nodes, partition, jid, [s["job"] for s in again])


def _requeued(w: Wiring, env: Mapping[str, str], jid: str) -> bool:
    """The job ends here to start again (our requeue of a fault found on another of its nodes, or
    its own): slurmctld already counts one more restart than this run started with."""
    from slurm_hooks.errors import SlurmHooksError

    try:
        info = w.slurm.job(jid)
    except SlurmHooksError:
        return False
    try:
        started_as = int(env.get("SLURM_JOB_RESTART_COUNT", "0") or 0)
    except ValueError:
        started_as = 0
    return info.restarts > started_as or info.pending


def _start_isolate(w: Wiring, nodes: list[str], partition: str, jid: str, earlier: list[str]) -> str:
    from slurm_hooks.runner import python_argv, spawn_detached

    args = ["isolate", "--nodes", ",".join(nodes), "--wait-idle", f"{AUTO_WAIT_IDLE_S:g}",
            "--peers", str(AUTO_PEERS)]
    if partition:
        args += ["--partition", partition]
    if w.config.path:
        args += ["--config", w.config.path]
    output = w.state_path("isolate", f"auto-{jid}.log")
    os.makedirs(os.path.dirname(output), mode=0o700, exist_ok=True)
    spawned = spawn_detached(python_argv("slurm_hooks.entry", *args), output=output)
    result = "ok" if spawned.started else "failed"
    w.audit.write("action", node=w.node, action="isolate-start", target=",".join(nodes), result=result, jobs=[jid],
                  detail=f"suspected by jobs {', '.join(earlier)} and {jid} within the window: isolate started "
                         f"(log {output})", error=spawned.error)
    return f"isolate started on {', '.join(nodes)}" if spawned.started else f"isolate did not start: {spawned.error}"


def _load(path: str) -> dict:
    data = fsutil.read_json(path, missing={}, error={})
    return data if isinstance(data, dict) else {}


def _save(path: str, data: dict) -> None:
    try:
        fsutil.atomic_write(path, json.dumps(data), mode=0o600)
    except OSError:
        pass
