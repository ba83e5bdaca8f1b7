"""Options shared by the commands: each defined once, here.

``node(help)`` and ``json_output(help)`` give the same option with a command's own help text.
"""

from __future__ import annotations

import click

CONFIG_HELP = "Config file (default: $SLURM_HOOKS_CONFIG or /etc/slurm-hooks/config.toml)."
NODE_HELP = "Slurm node name (default: $SLURMD_NODENAME or short hostname)."
JSON_HELP = "Machine-readable output."


def node(help: str = NODE_HELP):
    return click.option("--node", metavar="NAME", help=help)


def json_output(help: str = JSON_HELP):
    return click.option("--json", "as_json", is_flag=True, help=help)


config_option = click.option("--config", "config_path", metavar="PATH", envvar=None, help=CONFIG_HELP)
node_option = node()
json_option = json_output()
dry_run_option = click.option("--dry-run", is_flag=True, help="Report only: no drain, no requeue, no resume.")
