"""Options shared by the node-side commands."""

from __future__ import annotations

import click

config_option = click.option("--config", "config_path", metavar="PATH", envvar=None,
                             help="Config file (default: $SLURM_HOOKS_CONFIG or /etc/slurm-hooks/config.toml).")
node_option = click.option("--node", metavar="NAME", help="Slurm node name (default: $SLURMD_NODENAME or short hostname).")
json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
dry_run_option = click.option("--dry-run", is_flag=True, help="Report only: no drain, no requeue, no resume.")
