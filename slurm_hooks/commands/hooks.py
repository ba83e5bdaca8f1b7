"""``slurm-hooks prolog`` / ``epilog`` (run by the executables in prolog.d/ and epilog.d/)."""

from __future__ import annotations

import click

from slurm_hooks.commands.options import config_option, node_option


@click.command()
@config_option
@node_option
def prolog(config_path: str | None, node: str | None) -> int:
    """Check the job's GPUs before it starts; drain and refuse the job on a fault."""
    from slurm_hooks.hooks import jobhooks
    from slurm_hooks.hooks.wiring import Wiring

    return jobhooks.prolog(Wiring.load(config_path, node))


@click.command()
@config_option
@node_option
def epilog(config_path: str | None, node: str | None) -> int:
    """Check the job's GPUs after it ends; drain on leftovers or new faults."""
    from slurm_hooks.hooks import jobhooks
    from slurm_hooks.hooks.wiring import Wiring

    return jobhooks.epilog(Wiring.load(config_path, node))


@click.command(name="follow-jobs", hidden=True)
@config_option
@node_option
@click.option("--timeout", type=float, default=180.0)
@click.argument("job_ids", nargs=-1, type=int, required=True)
def follow_jobs(config_path: str | None, node: str | None, timeout: float, job_ids: tuple[int, ...]) -> int:
    """Release requeued jobs if held and make them eligible now (spawned by the hooks)."""
    from slurm_hooks.hooks import remediate
    from slurm_hooks.hooks.wiring import Wiring

    results = remediate.follow_requeued(Wiring.load(config_path, node), list(job_ids), timeout)
    return 0 if all(r in ("ok", "already running") for r in results.values()) else 1
