"""What Slurm's own accounting (slurmdbd) knows: node drain history and requeued jobs.

``sacctmgr show event`` keeps every node state change with its reason and times,
cluster-wide; ``sacct -D`` keeps every run of a requeued job. Both are read with
``run_command`` (argv, timeout), and every query is bounded, so that a report over a
month of a large fleet does not load slurmdbd: our drains only (``States=DRAIN``,
``Start=``/``End=``, ``Nodes=`` when the report is scoped); requeued runs only
(``sacct -s REQUEUED``) on the nodes of those drains (``-N``); then the runs of just
those jobs (``-j``, in batches).

Times: the commands run with ``TZ=UTC SLURM_TIME_FORMAT=%s``, whatever the caller's
environment says (``SLURM_TIME_FORMAT=relative`` would print "15:39:47"; a local zone
moves an hour at DST): they print epoch seconds, and our own ``Start=`` are UTC.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from slurm_hooks.errors import CommandError, CommandTimeout, TransientError
from slurm_hooks.runner import run_command
from slurm_hooks.slurm import JobState

OUR_PREFIX = "slurm-hooks:"
_GPUS = re.compile(r"gres/gpu=(\d+)")
#: Job ids per ``sacct -j`` call.
JOBS_PER_QUERY = 500
#: The environment of every accounting command: times as epoch seconds, and UTC for what we pass.
TIME_ENV = {"TZ": "UTC", "SLURM_TIME_FORMAT": "%s"}


class AccountingUnavailable(TransientError):
    """slurmdbd could not be asked (not configured, not running, not reachable)."""


class AccountingTimeout(TransientError):
    """An accounting query did not finish in time: an error naming the command (exit 3), never "not used"."""


@dataclass(frozen=True)
class NodeEvent:
    node: str
    start: float
    end: float | None
    state: str
    reason: str
    user: str


@dataclass(frozen=True)
class JobRun:
    job_id: str
    user: str
    state: str
    start: float | None
    end: float | None
    nodes: str
    gpus: int
    admin_comment: str

    @property
    def requeued(self) -> bool:
        """A run that a requeue ended (sacct's ``REQUEUED``; the job ran again as a later run)."""
        return self.state == JobState.REQUEUED


def parse_time(text: str) -> float | None:
    """Epoch seconds (``SLURM_TIME_FORMAT=%s``), or an ISO time taken as UTC (``TZ=UTC``);
    ``None`` for Unknown/None/empty."""
    text = text.strip()
    if text.isdigit():
        return float(text)
    if not text or text in ("Unknown", "None", "N/A") or not text[:4].isdigit():
        return None
    try:
        return datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        return None


def _stamp(ts: float) -> str:
    """A time for ``Start=`` / ``-S`` (read as UTC under :data:`TIME_ENV`)."""
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")


_RUN_FORMAT = "--format=JobID,User,State,Start,End,NodeList,AllocTRES,AdminComment"


class SlurmDb:
    """``run``: how a command runs (``run_command`` unless given); ``queries`` records every argv
    issued (the report shows them: what it asked slurmdbd)."""

    def __init__(self, bin_dir: str = "/usr/bin", timeout: float = 30.0, env: dict[str, str] | None = None,
                 run: Callable[..., Any] | None = None):
        self.bin_dir, self.timeout = bin_dir, timeout
        self.env = {**(os.environ if env is None else env), **TIME_ENV}
        self.run = run or run_command
        self.queries: list[list[str]] = []

    def _run(self, argv: list[str]) -> str:
        self.queries.append(argv)
        try:
            return self.run([os.path.join(self.bin_dir, argv[0]), *argv[1:]], self.timeout, env=self.env).stdout
        except CommandTimeout:
            shown = " ".join(argv) if len(" ".join(argv)) <= 300 else " ".join(argv)[:300] + " ..."
            raise AccountingTimeout(f"accounting query timed out after {self.timeout:g}s: {shown}") from None
        except CommandError as exc:
            raise AccountingUnavailable(f"accounting not reachable: {exc}") from None

    def node_events(self, since: float, until: float | None = None, nodes: Iterable[str] = ()) -> list[NodeEvent]:
        """Drains in the window (ours and others': the caller keeps ours), on ``nodes`` when given."""
        until = until or time.time()
        scope = [f"Nodes={','.join(sorted(set(nodes)))}"] if nodes else []
        out = self._run(["sacctmgr", "-n", "-P", "show", "event", "Event=Node", "States=DRAIN", *scope,
                         f"Start={_stamp(since)}", f"End={_stamp(until + 60)}",
                         "format=NodeName,TimeStart,TimeEnd,State,Reason,User"])
        return parse_events(out)

    def requeued_runs(self, since: float, until: float | None = None, nodes: Iterable[str] = ()) -> list[JobRun]:
        """The runs a requeue ended on ``nodes`` in the window (``-s REQUEUED -N``), and every run of
        those jobs (``-j``: where they started again). No nodes, no query."""
        nodes = sorted(set(nodes))
        if not nodes:
            return []
        until = until or time.time()
        requeued = parse_runs(self._run(["sacct", "-n", "-P", "-X", "-D", "-a", "-s", JobState.REQUEUED, "-N", ",".join(nodes),
                                         f"--starttime={_stamp(since)}", f"--endtime={_stamp(until + 60)}",
                                         _RUN_FORMAT]))
        ids = sorted({r.job_id for r in requeued}, key=lambda j: (len(j), j))
        runs: list[JobRun] = []
        for k in range(0, len(ids), JOBS_PER_QUERY):
            runs += parse_runs(self._run(["sacct", "-n", "-P", "-X", "-D", "-j", ",".join(ids[k:k + JOBS_PER_QUERY]),
                                          _RUN_FORMAT]))
        return runs


def parse_events(text: str) -> list[NodeEvent]:
    events = []
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < 6 or not parts[0]:
            continue
        start = parse_time(parts[1])
        if start is None:
            continue
        events.append(NodeEvent(parts[0], start, parse_time(parts[2]), parts[3], "|".join(parts[4:-1]), parts[-1]))
    return events


def parse_runs(text: str) -> list[JobRun]:
    runs = []
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < 8 or not parts[0]:
            continue
        m = _GPUS.search(parts[6])
        runs.append(JobRun(parts[0], parts[1], parts[2].split()[0] if parts[2] else "", parse_time(parts[3]),
                           parse_time(parts[4]), parts[5], int(m.group(1)) if m else 0, "|".join(parts[7:])))
    return runs
