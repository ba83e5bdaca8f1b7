"""Suspects from failed multi-node jobs: the failures that report no XID.

A rank that hangs in a collective, a slow node or a dropped link fails a multi-node job with
nothing for our checks to find. The epilog of such a job (it ended with a non-zero exit code,
so failed, timed out or NODE_FAIL, and our checks found nothing on the node) records a
*suspect* on its node: an audit action ``suspect`` naming the job, its nodes and its exit
code. No drain: a user's bug fails jobs too. A job that failed and was requeued (by itself, by
Slurm, by its owner) counts as well; one our own requeue ended (its AdminComment says
``requeued from <another node>``: a finding there explains it) does not, nor do our own test jobs
(isolate's, the sweep's: their runs judge them).

Suspicion accumulates per node: a node in ``[isolate] suspect_jobs`` (K, at least 2: once is no
pattern) distinct failed multi-node jobs within ``[isolate] window``, whatever their other nodes,
is *suspected*. With ``[isolate] auto = true`` (off by default) an epilog that makes or finds a
suspected node among its job's nodes starts ``slurm-hooks isolate`` on the suspected nodes,
detached, once per node within the window; it waits until they are idle, adds idle peers of the
partition to confirm against, and drains only a confirmed culprit. Such a run is started by the
failed jobs: when its tests all pass it ends inconclusive, never ok, and the suspects stay
recorded. When it has ended (:func:`isolate_ended`), a suspected node's next failed job starts
another.

Each node counts over the failed jobs it took part in (its ``suspects.json``; a state dir the
nodes share, as the testbed's, holds every node's records, each job counted once): its own
count is exact, another node's a lower bound. Of a job's nodes, the first one suspected in its
own count starts the isolate; nodes whose counts agree (the same failed jobs) pick the same one.
Before starting, it asks Slurm whether an isolate (its reservation or its test jobs) runs already.
Nothing is drained on suspicion alone: isolate drains only a culprit its tests confirm.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Callable

from slurm_hooks import fsutil
from slurm_hooks.remedy.culprit import CONFIRMATIONS
from slurm_hooks.values import dataclass

if TYPE_CHECKING:
    from slurm_hooks.remedy.wiring import Wiring

#: Idle peers of the partition added to an automatic isolate, to confirm suspects against: as many
#: as a culprit needs partners that passed, so that one suspect alone can be confirmed.
AUTO_PEERS = CONFIRMATIONS
#: How long an automatic isolate waits for the suspected nodes to be idle.
AUTO_WAIT_IDLE_S = 1800.0
#: Starts the isolate: (wiring, suspected nodes, partition, job, what the suspicion is) -> what it did.
Starter = Callable[["Wiring", "list[str]", str, str, str], str]
#: The names of our own test jobs (isolate's and the sweep's).
OUR_TESTS = "slurm-hooks-"
#: What our requeue writes into a job's AdminComment (remedy's take-out: ``requeued from <node>, ...``).
OUR_REQUEUE = "requeued from "


@dataclass(frozen=True)
class Failure:
    """One failed multi-node job, as the epilogs recorded it."""

    job: str
    nodes: tuple[str, ...]
    ts: float


def failures(entries: Iterable[Mapping], now: float, window: float) -> list[Failure]:
    """The distinct failed jobs among suspect records within ``window`` of ``now`` (a job recorded
    by several of its nodes counts once; its earliest record stands)."""
    seen: dict[str, Failure] = {}
    for e in entries:
        try:
            ts, job, nodes = float(e.get("ts", 0)), str(e.get("job", "")), tuple(e.get("nodes") or ())
        except (TypeError, ValueError, AttributeError):
            continue
        if not job or len(nodes) < 2 or not now - window < ts <= now + 60:
            continue
        if job not in seen or ts < seen[job].ts:
            seen[job] = Failure(job, nodes, ts)
    return sorted(seen.values(), key=lambda f: (f.ts, f.job))


def suspected(failed: Iterable[Failure], k: int) -> dict[str, tuple[str, ...]]:
    """Node -> the failed jobs it was in, for each node in at least ``k`` of them (``k`` >= 2: one
    failed job is no pattern, whatever its node count)."""
    jobs: dict[str, list[str]] = {}
    for f in failed:
        for node in dict.fromkeys(f.nodes):
            jobs.setdefault(node, []).append(f.job)
    return {n: tuple(js) for n, js in jobs.items() if len(js) >= max(2, k)}


def starter(job_nodes: Sequence[str], suspects: Mapping[str, object]) -> str | None:
    """The node of the job that starts the isolate: its first suspected node (None: none is)."""
    return next((n for n in job_nodes if n in suspects), None)


def job_nodes(env: Mapping[str, str]) -> list[str]:
    from slurm_hooks.slurm import hostlist

    text = (env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "").strip()
    try:
        return hostlist.expand(text) if text else []
    except ValueError:
        return []


def after_job(w: Wiring, env: Mapping[str, str], jid: str | None, start: Starter | None = None) -> str:
    """The epilog's look at a job our checks found nothing on: record a suspect when the job
    spanned nodes and failed; start an isolate when a node of it is suspected. Returns what it did
    ("" for nothing: the healthy path costs a few dict lookups). Never raises: an epilog that fails
    drains the node ("Epilog error"), and a suspect is no reason to. ``start``: what starts the
    isolate (:func:`start_isolate`, detached)."""
    code = env.get("SLURM_JOB_EXIT_CODE", "").strip()
    if not jid or code in ("", "0"):
        return ""
    try:
        return _after_failed_job(w, env, jid, code, start or start_isolate)
    except Exception as exc:  # noqa: BLE001 - see above
        return f"suspect not recorded: {type(exc).__name__}: {exc}"


def _after_failed_job(w: Wiring, env: Mapping[str, str], jid: str, code: str, start: Starter) -> str:
    nodes = job_nodes(env)
    if len(nodes) < 2:
        return ""
    explained = _ours(w, jid) or _our_requeue(w, jid)
    if explained:
        return f"not a suspect: {explained}"
    status = env.get("SLURM_JOB_EXIT_CODE2", "").strip() or code
    detail = (f"job {jid} on {len(nodes)} nodes ended with exit code {status} and no finding of ours: "
              "a suspect (no drain)")
    w.audit.write("action", node=w.node, action="suspect", target=w.node, result="recorded", jobs=[jid],
                  detail=detail, nodes=nodes, exit_code=status, partition=env.get("SLURM_JOB_PARTITION", ""))
    return remember(w, jid, nodes, status, env.get("SLURM_JOB_PARTITION", ""), start)


def remember(w: Wiring, jid: str, nodes: list[str], status: str, partition: str, start: Starter | None = None) -> str:
    """Add a suspect on this node to its history (``nodes``: the job's); a node in ``[isolate]
    suspect_jobs`` failed jobs within the window is suspected, and under ``[isolate] auto`` the
    first suspected node of the job starts an isolate on the suspected nodes. Returns what came of it."""
    cfg = w.config.isolate
    now = time.time()
    path = w.state_path("suspects.json")
    with fsutil.locked(path):
        history = _load(path)
        history = {"suspects": [s for s in history.get("suspects", []) if now - s.get("ts", 0) < cfg.window],
                   "triggers": [t for t in history.get("triggers", []) if now - t.get("ts", 0) < cfg.window]}
        history["suspects"].append({"ts": now, "node": w.node, "job": jid, "nodes": nodes, "exit_code": status})
        suspects = suspected(failures(history["suspects"], now, cfg.window), cfg.suspect_jobs)
        first = starter(nodes, suspects)
        targeted = _targeted(history)
        new = [n for n in suspects if n not in targeted]
        trigger = cfg.auto and first == w.node and bool(new)
        if trigger:
            history["triggers"].append({"ts": now, "job": jid, "nodes": sorted(suspects)})
        _save(path, history)
    if first is None:
        return "suspect recorded"
    said = ", ".join(f"{n} (jobs {', '.join(js)})" for n, js in sorted(suspects.items()))
    if not cfg.auto:
        return f"suspected: {said}; [isolate] auto is off"
    if first != w.node:
        return f"suspected: {said}; {first} starts isolate"
    if not trigger:
        return f"suspected: {said}; isolate already started for them within the window"
    running = _isolate_running(w)
    if running:
        w.audit.write("action", node=w.node, action="isolate-start", target=",".join(sorted(suspects)),
                      result="skipped", jobs=[jid], detail=f"suspected: {said}; not started: {running}")
        return f"suspected: {said}; not started: {running}"
    return (start or start_isolate)(w, sorted(suspects), partition, jid, said)


def _targeted(history: Mapping) -> set[str]:
    """The nodes an automatic isolate targets: one that runs, or one that ended with no failed job
    of the node recorded since (a failure after it ended starts the next)."""
    out: set[str] = set()
    for t in history.get("triggers", []):
        ended = t.get("ended")
        for node in t.get("nodes", []):
            if ended is None or not any(node in (s.get("nodes") or ()) and s.get("ts", 0) > ended
                                        for s in history.get("suspects", [])):
                out.add(node)
    return out


def recorded(w: Wiring, nodes: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """The nodes of ``nodes`` suspected in this host's records (within the window): node -> its failed jobs."""
    cfg = w.config.isolate
    history = _load(w.state_path("suspects.json"))
    found = suspected(failures(history.get("suspects", []), time.time(), cfg.window), cfg.suspect_jobs)
    return {n: found[n] for n in nodes if n in found}


def isolate_ended(w: Wiring, nodes: Sequence[str], verdict: str) -> None:
    """An isolate of ``nodes`` started by failed jobs ended (``verdict``): its triggers are done, so
    the next failed job of one of its nodes may start another; every suspect record is kept."""
    path = w.state_path("suspects.json")
    if not os.path.exists(path):
        return
    now = time.time()
    with fsutil.locked(path):
        history = _load(path)
        changed = False
        for t in history.get("triggers", []):
            if t.get("ended") is None and set(t.get("nodes", [])) & set(nodes):
                t["ended"], t["verdict"] = now, verdict
                changed = True
        if changed:
            _save(path, history)


def _ours(w: Wiring, jid: str) -> str:
    """Our own test job (isolate's, the sweep's: named ``slurm-hooks-...``): its failure is the test's
    verdict, judged by the run that submitted it, never a suspect of its own."""
    from slurm_hooks.errors import SlurmHooksError

    try:
        name = w.slurm.job(jid).name
    except SlurmHooksError:
        return ""
    return f"job {jid} is our own test ({name})" if name.startswith(OUR_TESTS) else ""


def _our_requeue(w: Wiring, jid: str) -> str:
    """Why a failure is no suspect: our own requeue ended the job for a finding on another of its
    nodes (the AdminComment our take-out writes). "" otherwise, or when Slurm cannot say."""
    from slurm_hooks.errors import SlurmHooksError

    try:
        comment = w.slurm.admin_comment(jid)
    except SlurmHooksError:
        return ""
    for part in (comment or "").split(";"):
        part = part.strip()
        if part.startswith(OUR_REQUEUE):
            origin = part[len(OUR_REQUEUE):].split(",")[0].strip()
            if origin and origin != w.node:
                return f"job {jid} was requeued for a finding on {origin}"
    return ""


def _isolate_running(w: Wiring) -> str:
    """An isolate runs already (its reservation or its test jobs are in Slurm): "" when none is seen.
    A reservation past its run's end time is a leftover (the next isolate deletes it), not a run."""
    from slurm_hooks.errors import SlurmHooksError
    from slurm_hooks.remedy.culprit import ISOLATE_PREFIX as PREFIX
    from slurm_hooks.remedy.culprit import abandoned

    if not hasattr(w.slurm, "jobs_named"):
        return ""
    now = time.time()
    try:
        held = [r for r in w.slurm.reservations()
                if r.startswith(PREFIX + "-") and not abandoned(r, now, "", lambda pid: True)]
        jobs = w.slurm.jobs_named(PREFIX)
    except SlurmHooksError:
        return ""
    if held or jobs:
        return "an isolate runs already (" + ", ".join([*held, *(f"job {j}" for j in jobs)]) + ")"
    return ""


def start_isolate(w: Wiring, nodes: list[str], partition: str, jid: str, said: str) -> str:
    """``slurm-hooks isolate`` on ``nodes`` and idle peers of ``partition``, detached (its log in the state dir)."""
    from slurm_hooks.runner import python_argv, spawn_detached

    args = ["isolate", "--nodes", ",".join(nodes), "--wait-idle", f"{AUTO_WAIT_IDLE_S:g}",
            "--peers", str(AUTO_PEERS), "--after-jobs", ",".join(_jobs_of(w, nodes, jid))]
    if partition:
        args += ["--partition", partition]
    if w.config.path:
        args += ["--config", w.config.path]
    output = w.state_path("isolate", f"auto-{jid}.log")
    os.makedirs(os.path.dirname(output), mode=0o700, exist_ok=True)
    spawned = spawn_detached(python_argv("slurm_hooks.entry", *args), output=output)
    result = "ok" if spawned.started else "failed"
    w.audit.write("action", node=w.node, action="isolate-start", target=",".join(nodes), result=result, jobs=[jid],
                  detail=f"suspected within the window: {said}; isolate started (log {output})", error=spawned.error)
    return f"isolate started on {', '.join(nodes)}" if spawned.started else f"isolate did not start: {spawned.error}"


def _jobs_of(w: Wiring, nodes: Sequence[str], jid: str) -> list[str]:
    """The failed jobs that made ``nodes`` suspects (``jid`` at least)."""
    jobs = [j for js in recorded(w, nodes).values() for j in js]
    return list(dict.fromkeys([*jobs, jid]))


def _load(path: str) -> dict:
    data = fsutil.read_json(path, missing={}, error={})
    return data if isinstance(data, dict) else {}


def _save(path: str, data: dict) -> None:
    try:
        fsutil.atomic_write(path, json.dumps(data), mode=0o600)
    except OSError:
        pass
