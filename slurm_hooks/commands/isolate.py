"""``slurm-hooks isolate``: find the node that breaks collectives and drain it (an admin's, as root)."""

from __future__ import annotations

import click

from slurm_hooks.commands.options import config_option, json_option
from slurm_hooks.commands.summary import run_and_say
from slurm_hooks.errors import EXIT_UNAVAILABLE


@click.command()
@config_option
@click.option("--nodes", metavar="LIST", help="The suspected nodes (a Slurm hostlist: n[1-16],gpu7).")
@click.option("--job", metavar="ID", help="The nodes of this job (one that failed, hung or timed out).")
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
@json_option
def isolate(config_path: str | None, nodes: str | None, job: str | None, mode: str | None,
            test_timeout: float | None, budget: float | None, max_tests: int | None, no_drain: bool,
            wait_idle: float, peers: int, partition: str | None, as_json: bool) -> int:
    """Run multi-node collective tests on idle nodes in a maintenance reservation, find the node
    that breaks them (hung, slow, dropped) and drain it once confirmed against a node that passed.

    Exit 0: every test passed; 1: a culprit was found (drained unless --no-drain); 5: inconclusive (a
    test failed and no node could be named for it, or the search could not finish: it says what it
    saw); 3: another isolate runs, or Slurm did not answer.
    """
    from slurm_hooks.errors import SlurmHooksError
    from slurm_hooks.hooks import isolate as isolating
    from slurm_hooks.remedy.wiring import Wiring
    from slurm_hooks.slurm import hostlist, job_ref

    if bool(nodes) == bool(job):
        raise click.UsageError("give --nodes LIST or --job ID (one of them)")
    w = Wiring.load(config_path)
    cfg = w.config.isolate
    try:
        if nodes:
            chosen = hostlist.expand(nodes)
        else:
            chosen = hostlist.expand(w.slurm.job(job_ref(str(job))).nodes or "")
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--nodes" if nodes else "--job") from None
    except SlurmHooksError as exc:
        click.echo(f"slurm-hooks isolate: {exc}", err=True)
        return EXIT_UNAVAILABLE
    if len(chosen) < 2 and not (chosen and peers and partition):  # one suspect needs peers to be tested against
        raise click.UsageError(f"{nodes or 'job ' + str(job)}: {len(chosen)} node(s); a collective test needs 2")
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
            progress=say),
        isolating.IsolateBusy, "its jobs cancelled, its reservation deleted", as_json,
        code=lambda summary: summary.exit_code())
