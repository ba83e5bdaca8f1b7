"""``slurm-hooks events``: the audit log as incident timelines."""

from __future__ import annotations

import json

import click

from slurm_hooks.commands.options import config_option, json_option


@click.command()
@config_option
@click.option("--node", metavar="NAME", help="Only this node.")
@click.option("--since", metavar="WHEN", help="30m, 2h, 1d, epoch seconds or ISO-8601.")
@json_option
def events(config_path: str | None, node: str | None, since: str | None, as_json: bool) -> None:
    """Show alerts and remediations, grouped into incidents."""
    from slurm_hooks import config as config_mod
    from slurm_hooks.observe import events as ev
    from slurm_hooks.observe.audit import AuditLog

    cfg = config_mod.load(config_path)
    try:
        cutoff = ev.parse_since(since) if since else None
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--since") from None
    records = ev.select(AuditLog(cfg.log.audit).read(), node, cutoff)
    if as_json:
        for r in records:
            click.echo(json.dumps(r))
        return
    if not records:
        click.echo("no events")
        return
    for line in ev.render(ev.incidents(records)):
        click.echo(line)
