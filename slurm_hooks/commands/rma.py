"""``slurm-hooks rma``: the GPUs the repair ladder marked for replacement on this node, and a
person's way to clear a mark (audited), on the node whose state dir holds them."""

from __future__ import annotations

import json
import os

import click

from slurm_hooks.commands.options import config_option, json_option, node_option
from slurm_hooks.errors import EXIT_OK, EXIT_UNHEALTHY


@click.group()
def rma() -> None:
    """GPUs marked for replacement: list them, or clear a mark."""


@rma.command(name="list")
@config_option
@json_option
def list_(config_path: str | None, as_json: bool) -> int:
    """The RMA list of this host's state dir: node, GPU, serial, why, since when."""
    from slurm_hooks import config as config_mod
    from slurm_hooks.observe.incidents import utc
    from slurm_hooks.remedy.repair import read_rma

    cfg = config_mod.load(config_path)
    entries = read_rma(os.path.join(cfg.state.dir, "rma.json"))
    if as_json:
        click.echo(json.dumps(entries, indent=1))
        return EXIT_OK
    if not entries:
        click.echo("no GPU marked for replacement")
    for e in entries:
        added = e.get("added")
        since = utc(float(added)) if isinstance(added, (int, float)) else "?"
        click.echo(f"{e.get('node')} GPU {e.get('gpu')} ({e.get('uuid') or '?'}, serial {e.get('serial') or '?'}) "
                   f"marked since {since}: {e.get('reason') or 'tagged [replace]'}"
                   + (f"; evidence: {e['evidence']}" if e.get("evidence") else ""))
    return EXIT_OK


@rma.command()
@config_option
@node_option
@click.option("--gpu", type=int, required=True, metavar="INDEX", help="The GPU's index (as the page names it).")
def clear(config_path: str | None, node: str | None, gpu: int) -> int:
    """Clear a GPU's mark for replacement (it was mended, or found good): its RMA entry goes, the
    repair ladder forgets it, and an audit record says who cleared it. Run it on the node."""
    import getpass

    from slurm_hooks.remedy.repair import clear_mark, worker_lock
    from slurm_hooks.remedy.wiring import Wiring

    w = Wiring.load(config_path, node)
    user = os.environ.get("SUDO_USER") or getpass.getuser()
    with worker_lock(w) as mine:
        if not mine:
            click.echo(f"slurm-hooks rma: a repair worker holds {w.node} right now; try again when it is done",
                       err=True)
            return EXIT_UNHEALTHY
        cleared = clear_mark(w, gpu, user)
    if not cleared:
        click.echo(f"slurm-hooks rma: GPU {gpu} of {w.node} is not marked for replacement "
                   f"(slurm-hooks rma list shows what is)", err=True)
        return EXIT_UNHEALTHY
    for g in cleared:
        ids = ", ".join(x for x in (g["uuid"], f"serial {g['serial']}" if g["serial"] else "") if x)
        click.echo(f"{w.node} GPU {g['index']}" + (f" ({ids})" if ids else "") + ": no longer marked for replacement")
    return EXIT_OK
