"""``slurm-hooks demo``: the README's main command."""

from __future__ import annotations

import click


@click.command()
@click.option("--state-dir", default="/var/lib/slurm-hooks/testbed", show_default=True, metavar="DIR",
              help="Where the local cluster lives.")
@click.option("--keep", is_flag=True, help="Leave the cluster up afterwards.")
@click.option("--timeout", default=120.0, show_default=True, help="Seconds to wait for each phase.")
def demo(state_dir: str, keep: bool, timeout: float) -> int:
    """A local cluster, a training job, XID 79 under it, and the recovery, live."""
    from slurm_hooks.lab import demo as demo_mod

    ms = demo_mod.run(state_dir, keep=keep, say=lambda line: click.echo(line), timeout=timeout)
    ok = all(k in ms.times for k in ("node drained", "job running again", "resumed from checkpoint"))
    return 0 if ok else 1
