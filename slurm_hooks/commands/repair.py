"""``slurm-hooks repair --validate`` (a person's) and ``repair-worker`` (started by the hooks)."""

from __future__ import annotations

import click

from slurm_hooks.commands.options import config_option, node_option
from slurm_hooks.errors import EXIT_INTERNAL, EXIT_OK, EXIT_UNAVAILABLE, EXIT_UNHEALTHY, EXIT_USAGE

#: verdict -> (exit code, what a person reads)
_VERDICTS = {
    "ok": (EXIT_OK, "validated: the diagnostic passed in full, back in service"),
    "failed": (EXIT_UNHEALTHY, "failed: the node stays drained (slurm-hooks events shows why)"),
    "unverified": (EXIT_UNAVAILABLE, "unverified: the diagnostic did not run in full; the node stays drained "
                                     "[unverified] (slurm-hooks events shows why)"),
    "busy": (EXIT_UNAVAILABLE, "a repair worker holds this node right now; try again when it is done"),
}


@click.command()
@config_option
@node_option
@click.option("--validate", is_flag=True, required=True,
              help="Drain the node [validating], run the [repair] dcgm_level diagnostic, and return it to "
                   "service only when it passed in full.")
def repair(config_path: str | None, node: str | None, validate: bool) -> int:
    """Validate this node before it returns to service (run it on the node, as root)."""
    import getpass

    from slurm_hooks.errors import SlurmHooksError
    from slurm_hooks.hooks import healthcheck
    from slurm_hooks.remedy import repairs
    from slurm_hooks.remedy.wiring import Wiring

    w = Wiring.load(config_path, node)
    if w.policy.monitor_only:
        click.echo("slurm-hooks repair: monitor-only ([check] drain = false): this node side drains and resumes "
                   "nothing, so it cannot hold the node out while it validates", err=True)
        return EXIT_USAGE
    try:
        info = w.slurm.node(w.node)
        jobs = [j.ref for j in w.slurm.jobs_on_node(w.node) if j.active]
    except SlurmHooksError as exc:
        click.echo(f"slurm-hooks repair: {w.node}: {exc}", err=True)
        return EXIT_UNAVAILABLE
    if jobs:
        click.echo(f"slurm-hooks repair: {w.node} runs job(s) {', '.join(jobs)}: validate it once they end "
                   "(or use slurm-hooks sweep, which waits for idle nodes)", err=True)
        return EXIT_USAGE
    if info.reason and not info.ours:
        click.echo(f"slurm-hooks repair: {w.node} is drained by someone else ({info.reason!r}): their drain is "
                   "theirs to end; validate it once they resume it, or with slurm-hooks sweep", err=True)
        return EXIT_USAGE
    verdict = repairs.validate_node(w, getpass.getuser(), healthcheck.rejudge(w))
    code, text = _VERDICTS[verdict]
    click.echo(f"{w.node}: {text}")
    return code


@click.command(name="repair-worker", hidden=True)
@config_option
@node_option
@click.option("--job", "own_job", default="", help="The job whose epilog handed the repair over (still ending).")
def repair_worker(config_path: str | None, node: str | None, own_job: str) -> int:
    """Run the node's due repair rung, detached from the hook that started it."""
    from slurm_hooks.hooks import healthcheck
    from slurm_hooks.remedy import repairs
    from slurm_hooks.remedy.wiring import Wiring
    from slurm_hooks.runner import signal_ready

    w = Wiring.load(config_path, node)
    try:
        outcome = repairs.repair_worker(w, healthcheck.rejudge(w), own_job, ready=signal_ready)
    except Exception as exc:  # noqa: BLE001 - its stderr is /dev/null once it runs: the audit log must say
        w.audit.write("action", node=w.node, action="repair-worker", target=w.node, result="failed", duration_s=0.0,
                      level="error", error=f"{type(exc).__name__}: {exc}",
                      detail="the repair worker crashed; the next health check looks again")
        return EXIT_INTERNAL
    return EXIT_OK if outcome is None or outcome.ok else EXIT_UNHEALTHY
