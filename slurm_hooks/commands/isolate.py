"""``slurm-hooks isolate``: find the node that breaks collectives and drain it (an admin's, as root)."""

from __future__ import annotations

import click

from slurm_hooks.commands.options import config_option, json_option
from slurm_hooks.commands.summary import run_and_say
from slurm_hooks.errors import EXIT_UNAVAILABLE


@click.command()
@config_option
@click.option("--nodes", metavar="LIST", help="The suspected nodes (a Slurm hostlist: n[1-16],gpu7).")
@click.option("--job", metavar="ID", help="The nodes of this job (one that failed, hung or timed out: if no test "
                                         "fails, the run is inconclusive, not ok).")
@click.option("--mode", type=click.Choice(["bisect", "pairwise"]), help="Search (default: [isolate] mode).")
@click.option("--timeout", "test_timeout", type=click.FloatRange(1), metavar="S",
              help="Each test job's limit in seconds (default: [isolate] test_timeout).")
@click.option("--budget", type=click.FloatRange(1), metavar="S",
              help="The whole run's limit: no wave starts after it (default: [isolate] budget).")
@click.option("--max-tests", type=click.IntRange(2), metavar="N",
              help="Test jobs at most (default: [isolate] max_tests).")
@click.option("--no-drain", is_flag=True, help="Name the culprits, drain none.")
@click.option("--wait-idle", type=click.FloatRange(0), default=0.0, metavar="S",
              help="First wait up to S seconds for the nodes to be idle (an epilog's automatic run).")
@click.option("--peers", type=click.IntRange(0, 16), default=0, metavar="N",
              help="Also test N idle nodes of --partition, to confirm suspects against (one suspect needs them).")
@click.option("--partition", metavar="NAME", help="Where --peers come from.")
@click.option("--after-jobs", metavar="LIST", help="The failed jobs that made --nodes suspects: if no test fails, "
                                                   "the run is inconclusive, not ok.")
@json_option
def isolate(config_path: str | None, nodes: str | None, job: str | None, mode: str | None,
            test_timeout: float | None, budget: float | None, max_tests: int | None, no_drain: bool,
            wait_idle: float, peers: int, partition: str | None, after_jobs: str | None, as_json: bool) -> int:
    """Run multi-node collective tests on idle nodes in a maintenance reservation, find the node
    that breaks them (hung, slow, dropped) and drain it once confirmed against a node that passed.

    Exit 0: every test passed, and no failed job started the run; 1: a culprit was found (drained
    unless --no-drain); 5: inconclusive (a test failed and no node could be named for it, the search
    could not finish, or the failure that started the run, --job, --after-jobs or suspects this
    host recorded, did not reproduce: it says what it saw); 3: another isolate runs, or Slurm did
    not answer.
    """
    from slurm_hooks.errors import SlurmHooksError
    from slurm_hooks.hooks import isolate as isolating
    from slurm_hooks.remedy import suspect
    from slurm_hooks.remedy.wiring import Wiring
    from slurm_hooks.slurm import JobState, hostlist, job_ref

    if bool(nodes) == bool(job):
        raise click.UsageError("give --nodes LIST or --job ID (one of them)")
    w = Wiring.load(config_path)
    cfg = w.config.isolate
    failed_job = ""
    try:
        if nodes:
            chosen = hostlist.expand(nodes)
        else:
            info = w.slurm.job(job_ref(str(job)))
            chosen = hostlist.expand(info.nodes or "")
            if info.base_state != JobState.COMPLETED:  # failed, hung, timed out: what the run looks for
                failed_job = f"{job} ({info.base_state})"
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--nodes" if nodes else "--job") from None
    except SlurmHooksError as exc:
        click.echo(f"slurm-hooks isolate: {exc}", err=True)
        return EXIT_UNAVAILABLE
    if len(chosen) < 2 and not (chosen and peers and partition):  # one suspect needs peers to be tested against
        raise click.UsageError(f"{nodes or 'job ' + str(job)}: {len(chosen)} node(s); a collective test needs 2")
    started_by, suspected = _started_by(chosen, failed_job, after_jobs, suspect.recorded(w, chosen))
    timeout = test_timeout or cfg.test_timeout
    say = None if as_json else click.echo
    if wait_idle:
        busy = isolating.wait_idle(w, chosen, wait_idle, say)
        if busy and say:
            say(f"still busy after {wait_idle:g}s: {', '.join(busy)} (skipped below)")
    chosen += isolating.idle_peers(w, partition or "", chosen, peers)
    return run_and_say(
        "isolate", lambda: isolating.isolate(
            w, chosen, mode=mode or cfg.mode, ratio=cfg.ratio, test_timeout=timeout,
            budget=budget or cfg.budget, max_tests=max_tests or cfg.max_tests, drain=not no_drain,
            progress=say, started_by=started_by, suspected=suspected),
        isolating.IsolateBusy, "its jobs cancelled, its reservation deleted", as_json,
        code=lambda summary: summary.exit_code())


def _started_by(nodes: list[str], job: str | None, after_jobs: str | None,
                recorded: dict[str, tuple[str, ...]]) -> tuple[str, list[str]]:
    """What failed and started the run ("" for a plain run), and the nodes it points at."""
    parts, suspected = [], list(recorded)
    if job:
        parts.append(f"job {job}")
    if after_jobs:
        parts.append(f"failed jobs {after_jobs} on {','.join(nodes)}")
        suspected = list(nodes)
    elif recorded:
        parts.append("suspects " + ", ".join(f"{n} (jobs {', '.join(js)})" for n, js in recorded.items()))
    return "; ".join(parts), suspected
