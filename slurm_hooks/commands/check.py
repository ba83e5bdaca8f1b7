"""``slurm-hooks check``: the HealthCheckProgram. Exit 0 healthy, 1 unhealthy, 2 config error.

NHC's ``check_slurm_hooks`` (templates/nhc) runs it with ``--deadline`` (what NHC's watchdog
leaves) and ``--verdict`` (one line it can read); with ``--dry-run`` too in report mode.
"""

from __future__ import annotations

import json

import click

from slurm_hooks.commands.findings import print_findings
from slurm_hooks.commands.options import config_option, dry_run_option, json_option, node_option
from slurm_hooks.models import Severity

#: How ``--verdict`` lines start, so that a caller tells ours from anything else on the output.
VERDICT = "slurm-hooks-verdict:"
#: NHC writes ``NHC: <our line>`` as the node's reason; Slurm's reasons are best kept short.
VERDICT_SUMMARY_MAX = 100


@click.command()
@config_option
@node_option
@json_option
@dry_run_option
@click.option("--explain", is_flag=True,
              help="Act on nothing; show per finding its scope, urgency, action and the jobs it would requeue.")
@click.option("--deadline", type=click.FloatRange(0, min_open=True), metavar="SECONDS",
              help="This run's deadline when shorter than [check] deadline (NHC passes what its watchdog leaves).")
@click.option("--verdict", is_flag=True,
              help=f"End with one line, '{VERDICT} ok' or '{VERDICT} <the drain reason, without its action>' "
                   "(for NHC's check_slurm_hooks).")
def check(config_path: str | None, node: str | None, as_json: bool, dry_run: bool, explain: bool,
          deadline: float | None, verdict: bool) -> int:
    """Check this node's GPUs; drain and requeue on a fault (unless --dry-run or --explain)."""
    from slurm_hooks.hooks import healthcheck
    from slurm_hooks.remedy import repairs, requeue
    from slurm_hooks.remedy.wiring import Wiring

    w = Wiring.load(config_path, node)
    if deadline is not None:
        w.start_deadline(min(deadline, w.config.check.deadline))
    report, outcome = healthcheck.run(w, dry_run=dry_run or explain)
    if verdict:
        print_report(report, False, outcome=None if dry_run else outcome)
        click.echo(verdict_line(report))
        return 0 if report.healthy else 1
    if explain:
        print_explained(report, requeue.explain(w, report), as_json, held=_held_as(w) if not as_json else "")
        if not as_json:
            from slurm_hooks.commands.status import held_lines

            for line in held_lines(w):  # a node we hold: its step, and who must act next (a person?)
                click.echo(line)
        return 0 if report.healthy else 1
    print_report(report, as_json, outcome=None if dry_run else outcome)
    if dry_run and not as_json:
        plan = repairs.repair_plan(w, report)
        if plan:
            click.echo(plan)
    return 0 if report.healthy else 1


def verdict_line(report) -> str:
    """``slurm-hooks-verdict: ok``, or ``slurm-hooks-verdict: slurm-hooks: XID 79 on GPU 3`` when a
    finding takes the node out. No ``[action]`` tag: under NHC's report mode nobody takes it."""
    from slurm_hooks import REASON_PREFIX
    from slurm_hooks.engine import drain_summary

    if not report.drain_findings():
        return f"{VERDICT} ok"
    summary = " ".join("".join(ch if ch.isprintable() else " " for ch in drain_summary(report)).split())
    if len(summary) > VERDICT_SUMMARY_MAX:
        summary = summary[: VERDICT_SUMMARY_MAX - 3].rstrip() + "..."
    return f"{VERDICT} {REASON_PREFIX} {summary}"


def print_report(report, as_json: bool, outcome=None) -> None:
    if as_json:
        data = report.to_dict()
        if outcome is not None:
            data["remediation"] = {"drained": outcome.drained, "requeued": outcome.requeued,
                                   "resumed": outcome.resumed, "failed": outcome.failed}
        click.echo(json.dumps(data, indent=None))
        return
    print_findings(report, outcome)


def _held_as(w) -> str:
    """The tag of our drain when we hold this node (``replace``, ``reboot 1/1``, ``validating``); ""
    when we do not, or Slurm cannot say."""
    from slurm_hooks.errors import SlurmHooksError
    from slurm_hooks.slurm import split_reason

    try:
        info = w.slurm.node(w.node)
    except SlurmHooksError:
        return ""
    text = split_reason(info.reason)[0]
    if not (info.ours and info.out_of_service and text.endswith("]") and "[" in text):
        return ""
    return text[text.rfind("[") + 1:-1]


def print_explained(report, entries: list[dict], as_json: bool, held: str = "") -> None:
    """``held``: the tag of our drain of this node: a finding's own action is then not what happens
    next (a node held [replace] waits for a person; it is not drained or rebooted again)."""
    if as_json:
        data = report.to_dict()
        data["findings"] = entries
        click.echo(json.dumps(data, indent=None))
        return
    shown = [e for e in entries if e["severity"] != Severity.OK.value]
    if not shown:  # a healthy node: one line, so that "nothing printed" never means "nothing ran"
        gpus = len(report.snapshot.gpus) if report.snapshot is not None else 0
        click.echo(f"{report.node}: {gpus} GPU{'' if gpus == 1 else 's'}, 0 findings")
    for e in shown:
        where = f"gpu{e['gpu']}" if e["gpu"] is not None else "node"
        if not e["acts"]:
            effect = "no action"
        elif held.startswith("replace"):
            effect = "nothing more: the node is held [replace], waiting for a person to replace the GPU"
        elif held:
            effect = f"nothing more now: the node is held [{held.split()[0]}] while its repair goes on"
        elif e["urgency"] == "now":
            effect = "drain now, requeue " + (", ".join(e["requeues"]) or "no job")
        else:
            effect = "drain, requeue nothing (remedy at job end)"
        if e.get("gpu_map", "known") != "known":
            effect += f" (every GPU job: GPU map unknown, {e['gpu_map']})"
        click.echo(f"{where} {e['check']}: {e['message']}: scope {e['scope']}, urgency {e['urgency']}, "
                   f"{'its rule says ' if held else 'action '}{e['action']} -> {effect}"
                   + (f" ({e['error']})" if e.get("error") else ""))
