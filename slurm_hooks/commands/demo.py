"""``slurm-hooks demo``: the README's main command."""

from __future__ import annotations

import click


@click.command()
@click.option("--state-dir", default="/var/lib/slurm-hooks/testbed", show_default=True, metavar="DIR",
              help="Where the local cluster lives.")
@click.option("--keep", is_flag=True, help="Leave the cluster up afterwards.")
@click.option("--timeout", default=120.0, show_default=True, help="Seconds to wait for each phase.")
@click.option("--job", "job", type=click.Choice(["auto", "ddp", "one-node"]), default="auto", show_default=True,
              help="ddp: a PyTorch DDP job on 2 of 3 nodes (needs python3-torch); one-node: a pure-Python job "
                   "on 2 nodes, then the repair of the bad node; auto: ddp where /usr/bin/python3 has torch.")
def demo(state_dir: str, keep: bool, timeout: float, job: str) -> int:
    """A local cluster, a training job, XID 79 under it, and the recovery, live."""
    from slurm_hooks.lab import demo as demo_mod

    ddp = None if job == "auto" else job == "ddp"
    if ddp:
        from slurm_hooks.lab import ddp_train

        why = ddp_train.torch_missing()
        if why:
            raise click.UsageError(f"--job ddp: {why}")
    ms = demo_mod.run(state_dir, keep=keep, say=lambda line: click.echo(line), timeout=timeout, ddp=ddp)
    ok = all(k in ms.times for k in ("node drained", "job running again", "resumed from checkpoint"))
    return 0 if ok else 1
