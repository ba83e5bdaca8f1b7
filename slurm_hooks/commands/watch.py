"""``slurm-hooks watch``: the per-node XID watcher daemon (the unit `slurm-hooks install` lays: P/share/systemd/slurm-hooks-watch.service)."""

from __future__ import annotations

import signal
import threading

import click

from slurm_hooks.commands.options import config_option, node_option


@click.command()
@config_option
@node_option
def watch(config_path: str | None, node: str | None) -> int:
    """React to critical XIDs within seconds: drain, requeue, audit."""
    from slurm_hooks.hooks.watch import Watcher, default_source
    from slurm_hooks.remedy.wiring import Wiring

    w = Wiring.load(config_path, node)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    click.echo(f"slurm-hooks watch: watching {w.node} ({w.config.gpu.backend})", err=True)
    Watcher(w, default_source(w)).run(stop)
    return 0
