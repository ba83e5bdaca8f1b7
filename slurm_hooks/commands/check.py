"""``slurm-hooks check``: the HealthCheckProgram. Exit 0 healthy, 1 unhealthy, 2 config error."""

from __future__ import annotations

import json

import click

from slurm_hooks.commands.options import config_option, dry_run_option, json_option, node_option
from slurm_hooks.models import Severity


@click.command()
@config_option
@node_option
@json_option
@dry_run_option
def check(config_path: str | None, node: str | None, as_json: bool, dry_run: bool) -> int:
    """Check this node's GPUs; drain and requeue on a fault (unless --dry-run)."""
    from slurm_hooks.hooks import healthcheck
    from slurm_hooks.hooks.wiring import Wiring

    w = Wiring.load(config_path, node)
    report, outcome = healthcheck.run(w, dry_run=dry_run)
    print_report(report, as_json, outcome=None if dry_run else outcome)
    if dry_run and not as_json:
        plan = healthcheck.repair_plan(w, report)
        if plan:
            click.echo(plan)
    return 0 if report.healthy else 1


def print_report(report, as_json: bool, outcome=None) -> None:
    if as_json:
        data = report.to_dict()
        if outcome is not None:
            data["remediation"] = {"drained": outcome.drained, "requeued": outcome.requeued,
                                   "resumed": outcome.resumed, "failed": outcome.failed}
        click.echo(json.dumps(data, indent=None))
        return
    for f in report.findings:
        if f.severity is not Severity.OK:
            click.echo(f.line())
    if outcome is not None:
        for failure in outcome.failed:
            click.echo(f"slurm-hooks: could not {failure}", err=True)
        if outcome.guarded:
            click.echo("slurm-hooks: not drained: the same configured expectation fails on many nodes; "
                       "check [expect]/[groups] (see the audit log)", err=True)
