"""Command line. Errors become exit codes and messages in :func:`slurm_hooks.errors.guard`.

Subcommands are imported lazily so that ``slurm-hooks check`` (run on every
node every few minutes) and the prolog never pay for the bridge's imports.
"""

from __future__ import annotations

import importlib
import sys

import click

from slurm_hooks.errors import EXIT_USAGE, guard

#: name -> "module:attribute" of a click command.
COMMANDS = {
    "check": "slurm_hooks.commands.check:check",
    "prolog": "slurm_hooks.commands.hooks:prolog",
    "epilog": "slurm_hooks.commands.hooks:epilog",
    "sim": "slurm_hooks.commands.sim:sim",
    "events": "slurm_hooks.commands.events:events",
    "notify": "slurm_hooks.commands.notify:notify",
    "report": "slurm_hooks.commands.report:report",
    "testbed": "slurm_hooks.commands.testbed:testbed",
    "watch": "slurm_hooks.commands.watch:watch",
    "validate": "slurm_hooks.commands.validate:validate",
    "demo": "slurm_hooks.commands.demo:demo",
    "bridge": "slurm_hooks.commands.bridge:bridge",
    "render": "slurm_hooks.commands.render:render",
    "install": "slurm_hooks.commands.install:install",
    "follow-jobs": "slurm_hooks.commands.hooks:follow_jobs",
    "repair": "slurm_hooks.commands.repair:repair",
    "repair-worker": "slurm_hooks.commands.repair:repair_worker",
    "sweep": "slurm_hooks.commands.sweep:sweep",
    "sweep-node": "slurm_hooks.commands.sweep:sweep_node",
    "isolate": "slurm_hooks.commands.isolate:isolate",
    "status": "slurm_hooks.commands.status:status",
    "rma": "slurm_hooks.commands.rma:rma",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = COMMANDS.get(name)
        if target is None:
            return None
        module, attr = target.split(":")
        try:
            return getattr(importlib.import_module(module), attr)
        except ImportError as exc:
            raise click.ClickException(f"{name}: not available ({exc})") from None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="slurm-hooks")
def cli() -> None:
    """GPU health checks, drain and requeue for Slurm, and a Kubernetes bridge."""


def main(argv: list[str] | None = None) -> None:
    """The click CLI; errors become one line on stderr and a defined exit code, never a traceback."""

    def run() -> int | None:
        try:
            return cli.main(args=argv, prog_name="slurm-hooks", standalone_mode=False)
        except click.exceptions.Abort:
            click.echo("slurm-hooks: aborted", err=True)
            return EXIT_USAGE
        except click.ClickException as exc:
            exc.show()
            return EXIT_USAGE
        except click.exceptions.Exit as exc:
            return exc.exit_code

    sys.exit(guard(run))
