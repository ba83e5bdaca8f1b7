"""What Slurm's own accounting (slurmdbd) knows: node drain history and requeued jobs.

``sacctmgr show event`` keeps every node state change with its reason and times,
cluster-wide; ``sacct -D`` keeps every run of a requeued job. Both are read with
``run_command`` (argv, timeout); times are printed in the local time zone.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from datetime import datetime

from slurm_hooks.errors import CommandError, TransientError
from slurm_hooks.runner import run_command

OUR_PREFIX = "slurm-hooks:"
_GPUS = re.compile(r"gres/gpu=(\d+)")


class AccountingUnavailable(TransientError):
    """slurmdbd could not be asked (not configured, not running, not reachable)."""


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


def parse_time(text: str) -> float | None:
    """sacct/sacctmgr time (local, ``2026-12-01T10:02:00``); ``None`` for Unknown/None/empty."""
    text = text.strip()
    if not text or text in ("Unknown", "None", "N/A") or not text[:4].isdigit():
        return None
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def _stamp(ts: float) -> str:
    return datetime.fromtimestamp(ts).strftime("%Y-%m-%dT%H:%M:%S")


class SlurmDb:
    def __init__(self, bin_dir: str = "/usr/bin", timeout: float = 30.0, env: dict[str, str] | None = None):
        self.bin_dir, self.timeout, self.env = bin_dir, timeout, env

    def _run(self, argv: list[str]) -> str:
        try:
            return run_command([os.path.join(self.bin_dir, argv[0]), *argv[1:]], self.timeout, env=self.env).stdout
        except CommandError as exc:
            raise AccountingUnavailable(f"accounting not reachable: {exc}") from None

    def node_events(self, since: float, until: float | None = None) -> list[NodeEvent]:
        until = until or time.time()
        out = self._run(["sacctmgr", "-n", "-P", "show", "event", "Event=Node", f"Start={_stamp(since)}",
                         f"End={_stamp(until + 60)}", "format=NodeName,TimeStart,TimeEnd,State,Reason,User"])
        return parse_events(out)

    def requeued_runs(self, since: float, until: float | None = None) -> list[JobRun]:
        """Every run of every job in the window (``-D``: the runs a requeue ended too)."""
        until = until or time.time()
        out = self._run(["sacct", "-n", "-P", "-X", "-D", "-a", f"--starttime={_stamp(since)}",
                         f"--endtime={_stamp(until + 60)}",
                         "--format=JobID,User,State,Start,End,NodeList,AllocTRES,AdminComment"])
        return parse_runs(out)


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
