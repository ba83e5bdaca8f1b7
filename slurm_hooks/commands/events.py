"""``slurm-hooks events``: the audit log (rotated files too) as incident timelines."""

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
    from slurm_hooks.observe import incidents
    from slurm_hooks.observe.audit import AuditLog

    cfg = config_mod.load(config_path)
    try:
        cutoff = ev.parse_since(since) if since else None
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--since") from None
    every = ev.select(AuditLog(cfg.log.audit).history(), node)
    if as_json:  # the records themselves, from the cutoff on
        for r in every:
            if cutoff is None or float(r.get("ts", 0)) >= cutoff:
                click.echo(json.dumps(r))
        return
    built = incidents.build(every)
    records = every
    if cutoff is not None:
        # An incident still going on at the cutoff is shown from its real start, not relabelled.
        starts = {i.node: i.first_seen for i in built
                  if i.opened_at < cutoff and (i.resolved_at is None or i.resolved_at >= cutoff)}
        records = [r for r in every if float(r.get("ts", 0)) >= min(cutoff, starts.get(str(r.get("node")), cutoff))]
    if not records:
        click.echo("no events")
        return
    for line in ev.render(ev.incidents(records)):
        click.echo(line)
