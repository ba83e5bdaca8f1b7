"""What ``check`` prints for an admin or slurmd's log: one line per finding, then what could not be
done. Plain ``print``: the health check's fast path (:mod:`slurm_hooks.entry`) does not load click."""

from __future__ import annotations

import sys

from slurm_hooks.models import Report, Severity


def print_findings(report: Report, outcome=None) -> None:
    for f in report.findings:
        if f.severity is not Severity.OK:
            print(f.line())
    if outcome is not None:
        for failure in outcome.failed:
            print(f"slurm-hooks: could not {failure}", file=sys.stderr)
        if outcome.guarded:
            print("slurm-hooks: not drained: the same configured expectation fails on many nodes; "
                  "check [expect]/[groups] (see the audit log)", file=sys.stderr)
