"""``slurm-hooks prolog`` / ``epilog`` (run by P/bin/slurm-hooks-prolog and -epilog, which `slurm-hooks install` lays)."""

from __future__ import annotations

import click

from slurm_hooks.commands.options import config_option, node_option


@click.command()
@config_option
@node_option
def prolog(config_path: str | None, node: str | None) -> int:
    """Check the job's GPUs before it starts; drain and refuse the job on a fault."""
    from slurm_hooks.hooks import jobhooks
    from slurm_hooks.remedy.wiring import Wiring

    return jobhooks.prolog(Wiring.load(config_path, node))


@click.command()
@config_option
@node_option
def epilog(config_path: str | None, node: str | None) -> int:
    """Check the job's GPUs after it ends; drain on leftovers or new faults."""
    from slurm_hooks.hooks import jobhooks
    from slurm_hooks.remedy.wiring import Wiring

    return jobhooks.epilog(Wiring.load(config_path, node))


@click.command(name="follow-jobs", hidden=True)
@config_option
@node_option
@click.option("--timeout", type=float, default=180.0)
@click.argument("refs", nargs=-1, required=True)
def follow_jobs(config_path: str | None, node: str | None, timeout: float, refs: tuple[str, ...]) -> int:
    """Release requeued jobs if our prolog's refusal held them and make them eligible now (spawned by the hooks).

    REFS are job ids or array tasks (``123``, ``100_7``). Once its config is
    loaded the follower tells the hook that started it that it runs
    (runner.signal_ready); failures from then on go to the audit log.
    """
    from slurm_hooks.remedy import follower
    from slurm_hooks.remedy.wiring import Wiring
    from slurm_hooks.runner import signal_ready
    from slurm_hooks.slurm import job_ref

    try:
        wanted = [job_ref(r) for r in refs]
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="REFS") from None
    w = Wiring.load(config_path, node)
    signal_ready()
    results = follower.follow_requeued(w, wanted, timeout)
    return 0 if all(r in ("ok", "already running") for r in results.values()) else 1
