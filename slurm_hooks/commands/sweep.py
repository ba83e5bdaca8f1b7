"""``slurm-hooks sweep`` (an admin's, or a timer's) and ``sweep-node`` (its job, on the node)."""

from __future__ import annotations

import re

import click

from slurm_hooks.commands.options import config_option, json_option, node_option
from slurm_hooks.commands.summary import run_and_say
from slurm_hooks.errors import EXIT_OK, EXIT_UNAVAILABLE, EXIT_UNHEALTHY, EXIT_USAGE

#: What Slurm takes as a partition name (the adapter refuses anything else before running sinfo).
_PARTITION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


@click.command()
@config_option
@click.option("--nodes", metavar="LIST", help="Nodes to validate (a Slurm hostlist: n[1-4],gpu7).")
@click.option("--partition", metavar="NAME", help="Every node of this partition.")
@click.option("--level", type=click.IntRange(1, 4), help="dcgmi diag -r level (default: [sweep] level).")
@click.option("--max-parallel", metavar="N|P%", help="Nodes at once: a count or a share of those chosen "
                                                     "(default: [sweep] max_parallel).")
@click.option("--timeout", "job_timeout", type=click.FloatRange(1), metavar="S",
              help="Each validation job's limit in seconds (default: [sweep] job_timeout).")
@json_option
def sweep(config_path: str | None, nodes: str | None, partition: str | None, level: int | None,
          max_parallel: str | None, job_timeout: float | None, as_json: bool) -> int:
    """Deep-validate idle nodes in a maintenance reservation; drain those that fail.

    Exit 0: every node validated passed (skipped ones are named); 1: a node failed or
    could not be verified, or no node was validated at all (each skipped: busy, drained, or
    unknown to Slurm); 3: another sweep is running, or Slurm did not answer. With
    ``--partition`` the validation jobs are submitted to that partition.
    """
    from slurm_hooks import config as config_mod
    from slurm_hooks.config import parse_share
    from slurm_hooks.errors import SlurmHooksError
    from slurm_hooks.hooks import sweep as sweeping
    from slurm_hooks.remedy.wiring import Wiring
    from slurm_hooks.slurm import hostlist

    if bool(nodes) == bool(partition):
        raise click.UsageError("give --nodes LIST or --partition NAME (one of them)")
    if partition and not _PARTITION.match(partition):
        raise click.BadParameter(f"{partition!r} is not a partition name", param_hint="--partition")
    if max_parallel is not None:
        try:
            parse_share(max_parallel)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--max-parallel") from None
    cfg = config_mod.load(config_path)
    w = Wiring.load(config_path)
    try:
        chosen = hostlist.expand(nodes) if nodes else w.slurm.partition_nodes(str(partition))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--nodes") from None
    except SlurmHooksError as exc:
        click.echo(f"slurm-hooks sweep: {exc}", err=True)
        return EXIT_UNAVAILABLE
    if not chosen:
        raise click.UsageError(f"partition {partition!r} has no nodes")
    say = None if as_json else click.echo
    return run_and_say(
        "sweep", lambda: sweeping.sweep(
            w, chosen, level=level or cfg.sweep.level, max_parallel=max_parallel or cfg.sweep.max_parallel,
            job_timeout=job_timeout or cfg.sweep.job_timeout, progress=say, partition=partition or ""),
        sweeping.SweepBusy, "its jobs cancelled, its reservations deleted", as_json, then=_none_validated)


def _none_validated(summary) -> None:
    if not summary.of("passed") and not summary.of("failed") and not summary.of("unverified"):
        click.echo("slurm-hooks sweep: no node was validated", err=True)


@click.command(name="sweep-node", hidden=True)
@config_option
@node_option
@click.option("--level", type=click.IntRange(1, 4), required=True)
@click.option("--timeout", type=click.FloatRange(1), required=True)
def sweep_node(config_path: str | None, node: str | None, level: int, timeout: float) -> int:
    """The sweep's validation job, on the node it validates (root)."""
    import os

    from slurm_hooks.hooks import sweep as sweeping
    from slurm_hooks.remedy.wiring import Wiring

    w = Wiring.load(config_path, node)
    verdict, detail = sweeping.validate_here(w, level, timeout, job=os.environ.get("SLURM_JOB_ID", ""))
    click.echo(f"{w.node}: {verdict}: {detail}")
    return {"passed": EXIT_OK, "failed": EXIT_UNHEALTHY}.get(verdict, EXIT_UNAVAILABLE if verdict else EXIT_USAGE)
