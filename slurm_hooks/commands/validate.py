"""``slurm-hooks validate``: the admin's preflight. Exit 0 when nothing FAILs, 1 otherwise."""

from __future__ import annotations

import json

import click

from slurm_hooks.commands.options import config_option, json_output, node


@click.command()
@config_option
@click.option("--slurm-conf", "slurm_conf", metavar="PATH",
              help="slurm.conf to judge (default: $SLURM_CONF, then /etc/slurm/slurm.conf and the configless caches).")
@json_output("A JSON list of {check, status, message, fix, where}.")
@node("Judge GPUs and Gres for this node (default: $SLURMD_NODENAME or short hostname).")
def validate(config_path: str | None, slurm_conf: str | None, as_json: bool, node: str | None) -> int:
    """Check slurm.conf, our config, the GPUs, scontrol and (with [bridge]) Kubernetes access."""
    from slurm_hooks import nodename
    from slurm_hooks import validate as preflight

    results = preflight.run(config_path, slurm_conf, nodename.resolve(node))
    if as_json:
        click.echo(json.dumps([r.to_dict() for r in results], indent=1))
    else:
        for r in results:
            click.echo(r.line())
    return 0 if preflight.passed(results) else 1
