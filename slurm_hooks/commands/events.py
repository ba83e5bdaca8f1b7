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
@click.option("--records", "raw", is_flag=True, help="The audit records themselves, one JSON object a line.")
def events(config_path: str | None, node: str | None, since: str | None, as_json: bool, raw: bool) -> None:
    """Show incidents by their id: what was seen, what was done, who acts next."""
    from slurm_hooks import config as config_mod
    from slurm_hooks.observe import events as ev
    from slurm_hooks.observe import incidents, timeline
    from slurm_hooks.observe.audit import AuditLog

    cfg = config_mod.load(config_path)
    try:
        cutoff = ev.parse_since(since) if since else None
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--since") from None
    every = ev.select(AuditLog(cfg.log.audit).history(), node)
    if raw:  # the records themselves, from the cutoff on
        for r in every:
            if cutoff is None or float(r.get("ts", 0)) >= cutoff:
                click.echo(json.dumps(r))
        return
    groups = timeline.by_incident(incidents.build(every), every, cutoff)
    if as_json:  # one incident a line, as the pages and the report carry it
        for inc, run in groups:
            if inc is not None:
                click.echo(json.dumps({**incidents.summary(inc), "records": len(run)}))
        return
    if not groups:
        click.echo("no events")
        return
    for line in timeline.render(groups):
        click.echo(line)
