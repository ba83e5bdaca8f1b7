"""``slurm-hooks status``: the fleet now. Which nodes we hold, at which step, since when, who acts next.

From Slurm alone (our reason's grammar, the node's state, ``Extra``), so it answers on any host
that reaches slurmctld; the local audit log and RMA list, where this host has them, add the
lifecycle (why it waits, what to do, the GPU's serial). Exit 1 when a node has waited for a
person longer than ``--max-wait``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from datetime import datetime
from typing import Any

import click

from slurm_hooks.commands.options import config_option, json_option
from slurm_hooks.errors import EXIT_OK, EXIT_UNHEALTHY

PERSON, US, SLURM, JOBS = "a person", "slurm-hooks", "Slurm", "its jobs"


def rows(nodes: Iterable[Any], open_incidents: dict[str, Any], rma: Iterable[dict[str, Any]],
         now: float, for_a_person: Iterable[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    """One row per node carrying our drain (or DOWN with our reason): node, tag, since, who acts
    next and what they do. ``open_incidents``: node -> its open :class:`Incident` from the local
    log (may be empty); ``rma``: the RMA list's entries (may be empty). ``for_a_person``: what the
    log says waits for a person (:meth:`slurm_hooks.observe.incidents.Fleet.for_a_person`, as the
    report lists it): a node among them that Slurm does not show as ours (drained by someone else
    over our [replace], or returned to service with a GPU still marked) gets its row too."""
    from slurm_hooks.models import Action
    from slurm_hooks.observe.incidents import replace_todo
    from slurm_hooks.slurm import held_for, is_held, parse_reason, split_reason, status_tag

    by_node: dict[str, list[dict[str, Any]]] = {}
    for e in rma:
        by_node.setdefault(str(e.get("node")), []).append(e)
    out = []
    for info in nodes:
        if not (info.ours and info.out_of_service):
            continue
        parsed = parse_reason(info.reason) or ("", None)
        summary, action = parsed
        text = split_reason(info.reason)[0]
        tag = text[text.rfind("["):] if text.endswith("]") else ""
        inc = open_incidents.get(info.name)
        since = _since(info, inc)
        status = status_tag(info.reason)
        why = todo = ""
        if inc is not None and inc.waiting_for == PERSON:
            who, todo, why = PERSON, inc.todo, inc.why
        elif action is Action.REPLACE:
            who, todo = PERSON, replace_todo(info.name, _gpus(inc, by_node.get(info.name, [])))
            why = summary
        elif is_held(info.reason):
            who, todo = PERSON, (f"look at its history (slurm-hooks events --node {info.name}), then "
                                 f"scontrol update NodeName={info.name} State=RESUME")
            why = "held for a person: " + held_for(info.reason)
        elif status == "unverified":
            who, todo = PERSON, f"run `slurm-hooks repair --validate` on {info.name} (or resume it once mended)"
            why = "its diagnostic did not run in full"
        elif "DCGM" in summary:
            who, todo = PERSON, f"mend it, then scontrol update NodeName={info.name} State=RESUME"
            why = "drained for a DCGM diagnostic, which the periodic check does not run"
        elif status == "validating":
            who, todo = US, "validating (DCGM diag) before it returns"
        elif info.reboot_pending:
            who, todo = SLURM, "reboot (RebootProgram) once idle"
        elif action is Action.REBOOT and info.down:
            who, todo = US, "the first check on the new boot"
        elif info.busy:
            who, todo = JOBS, "run to their end; then the repair"
        else:
            who = US
            todo = (f"{inc.step} ({inc.waiting_for})" if inc is not None and inc.waiting_for else
                    f"{action.value if action else 'repair'} at the next check")
        out.append({"node": info.name, "state": info.state, "tag": tag, "reason": info.reason,
                    "since": since, "waited_s": None if since is None else round(max(0.0, now - since), 1),
                    "next": who, "todo": todo, "why": why or None, "extra": info.extra_text or None,
                    "incident": inc.id if inc is not None else None,
                    "evidence": list(inc.evidence) if inc is not None else [],
                    "history": list(inc.history) if inc is not None else []})
    states = {info.name: info for info in nodes}
    shown = {r["node"] for r in out}
    for e in for_a_person:
        if e["node"] in shown:
            continue
        info = states.get(e["node"])
        state = info.state if info is not None else "?"
        where = "in service" if e["in_service"] else \
            (f"drained by someone else ({info.reason})" if info is not None and info.reason else state)
        out.append({"node": e["node"], "state": state, "tag": f"[{e['action']}]", "reason": where,
                    "since": e["since"], "waited_s": round(max(0.0, now - e["since"]), 1), "next": PERSON,
                    "todo": e["todo"], "why": e["why"] if e["in_service"] else f"{where}; {e['why'] or ''}".rstrip("; "),
                    "extra": info.extra_text or None if info is not None else None, "incident": e["incident"],
                    "evidence": list(e["evidence"]), "history": []})
    out.sort(key=lambda r: (r["next"] != PERSON, r["node"]))
    return out


def _since(info: Any, inc: Any) -> float | None:
    """Since when it is where it is: the lifecycle's step when the log has it, else Slurm's ReasonTime."""
    if inc is not None:
        return float(inc.step_since if inc.step_since is not None else inc.opened_at)
    stamp = info.reason_time
    if not stamp or stamp in ("None", "Unknown"):
        return None
    try:
        return datetime.fromisoformat(stamp).timestamp()  # slurmctld prints its local time
    except ValueError:
        return None


def _gpus(inc: Any, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return list(inc.rma) if inc is not None and inc.rma else \
        [{"index": e.get("gpu"), "uuid": e.get("uuid"), "serial": e.get("serial")} for e in entries]


#: Warnings that say a node's own verdicts see less than they seem to (its kernel log, its memory of
#: readings): status shows them for every node whose log has them, held or not.
BLIND_RULES = frozenset({"kernel-log", "hysteresis-memory"})
#: How recent such a warning must be to be shown: the health check runs every few minutes.
BLIND_RECENT_S = 3600.0


def blind_spots(records: Iterable[dict[str, Any]], now: float) -> list[dict[str, Any]]:
    """The latest of each :data:`BLIND_RULES` warning per node within :data:`BLIND_RECENT_S`, from
    audit records (``alert``, and the ``repeat`` records that count it again)."""
    last: dict[tuple[str, str], dict[str, Any]] = {}
    for r in records:
        of, ts = r, r.get("ts")
        if r.get("kind") == "repeat":
            of, ts = r.get("of") or {}, r.get("last_ts", ts)
        if of.get("kind") != "alert" or of.get("rule") not in BLIND_RULES:
            continue
        key = (str(r.get("node")), str(of["rule"]))
        if key not in last or float(ts or 0) >= last[key]["ts"]:
            last[key] = {"node": key[0], "rule": key[1], "message": of.get("message", ""), "ts": float(ts or 0)}
    return sorted((e for e in last.values() if now - e["ts"] <= BLIND_RECENT_S), key=lambda e: (e["node"], e["rule"]))


def render_blind(spots: list[dict[str, Any]], now: float) -> list[str]:
    from slurm_hooks.observe.incidents import duration

    return [f"{e['node']}: {e['message']} (said {duration(max(0.0, now - e['ts']))} ago)" for e in spots]


def render(table: list[dict[str, Any]]) -> list[str]:
    from slurm_hooks.observe.incidents import duration

    if not table:
        return ["no node held by slurm-hooks"]
    width = max(len(r["node"]) for r in table)
    tag_w = max(len(r["tag"]) for r in table)
    lines = []
    for r in table:
        waited = duration(r["waited_s"]) if r["waited_s"] is not None else "?"
        line = f"{r['node']:<{width}}  {r['tag']:<{tag_w}}  {waited:>7}  {r['next']}: {r['todo']}"
        if r["why"]:
            line += f" (why: {r['why']})"
        if r.get("evidence"):
            line += f" evidence: {', '.join(r['evidence'])} (on {r['node']})"
        if r["extra"]:
            line += f" [Extra: {r['extra']}]"
        lines.append(line)
        if r.get("history"):
            from slurm_hooks.observe.incidents import history_line

            lines += [f"  {'':<{width}}  remediation {k}: {history_line(h)}" for k, h in enumerate(r["history"], 1)]
    return lines


def held_lines(w: Any) -> list[str]:
    """What ``check --explain`` adds for a node we hold: its step, since when, who acts next and why
    (one Slurm read; the local log and RMA list). [] for a node we do not hold, or when Slurm cannot say."""
    from slurm_hooks.errors import SlurmHooksError
    from slurm_hooks.observe import incidents
    from slurm_hooks.remedy.repair import read_rma

    try:
        info = w.slurm.node(w.node)
    except SlurmHooksError as exc:
        return [f"{w.node}: cannot read the node from Slurm ({exc})"]
    records = [r for r in w.audit.history() if r.get("node") == w.node]
    fleet = incidents.fold(records)
    now = time.time()
    open_ = {i.node: i for i in fleet.incidents if i.open}
    table = rows([info], open_, read_rma(w.state_path("rma.json")), now, fleet.for_a_person(now))
    return ["held by slurm-hooks: " + line for line in render(table)] if table else []


@click.command()
@config_option
@click.option("--max-wait", default="1d", show_default=True, metavar="DURATION",
              help="Exit 1 when a node has waited for a person longer than this (30m, 12h, 2d; 0: never).")
@json_option
@click.option("--textfile", "textfile_dir", metavar="DIR",
              help="Also write the fleet's lifecycle to DIR/slurm_hooks_status.prom (node_exporter's textfile "
                   "collector on the host that runs this).")
def status(config_path: str | None, max_wait: str, as_json: bool, textfile_dir: str | None) -> int:
    """Which nodes slurm-hooks holds, at which step, since when, and who must act next."""
    from slurm_hooks import config as config_mod
    from slurm_hooks.observe import incidents
    from slurm_hooks.observe.audit import AuditLog
    from slurm_hooks.remedy.repair import read_rma
    from slurm_hooks.slurm.factory import from_config

    limit = _seconds(max_wait)
    cfg = config_mod.load(config_path)
    nodes = from_config(cfg).nodes()
    everything = list(AuditLog(cfg.log.audit).history())
    fleet = incidents.fold(everything)  # the one state the report reads too
    open_ = {i.node: i for i in fleet.incidents if i.open}
    now = time.time()
    table = rows(nodes, open_, read_rma(os.path.join(cfg.state.dir, "rma.json")), now, fleet.for_a_person(now))
    blind = blind_spots(everything, now)
    late = [r for r in table if r["next"] == PERSON and limit > 0 and (r["waited_s"] or 0) > limit]
    if textfile_dir:
        from slurm_hooks.observe import metrics

        try:
            metrics.write_textfile(textfile_dir, metrics.STATUS_FILE, metrics.render_status(table))
        except OSError as exc:
            raise click.ClickException(f"cannot write {os.path.join(textfile_dir, metrics.STATUS_FILE)}: "
                                       f"{exc.strerror}") from None
    here, standing = _local_links(cfg)
    outages = receiver_outages(everything, now)
    if as_json:
        click.echo(json.dumps({"nodes": table, "waiting_for_a_person_too_long": [r["node"] for r in late],
                               "not_seen": blind, "links": {"node": here, "cannot_judge": standing},
                               "receivers": [{"receiver": o.receiver, "where": o.where, "node": o.node or None,
                                              "out": o.open, "since": o.since, "until": o.until,
                                              "error": o.error or None, "line": o.line(now)} for o in outages]},
                              indent=1))
    else:
        for line in render(table):
            click.echo(line)
        if blind:
            click.echo("what these nodes' checks cannot see (warnings, nothing drained):")
            for line in render_blind(blind, now):
                click.echo("  " + line)
        for line in standing:
            click.echo(f"links of {here}: {line}")
        if outages:
            click.echo("receivers of the notifications (this host's audit log):")
            for o in outages:
                click.echo("  " + o.line(now))
        if late:
            click.echo(f"{len(late)} node(s) waiting for a person longer than {max_wait}: "
                       + ", ".join(r["node"] for r in late), err=True)
    return EXIT_UNHEALTHY if late else EXIT_OK


def receiver_outages(records: Iterable[dict[str, Any]], now: float) -> list[Any]:
    """The receivers' outages this host's notifier told (:mod:`slurm_hooks.observe.receivers`): each
    still open, and each that ended within the last hour."""
    from slurm_hooks.observe import receivers

    return receivers.shown(receivers.fold(records), now)


def _local_links(cfg: Any) -> tuple[str, list[str]]:
    """(this host's node name, what stands against judging its links): the counters that cannot
    be judged on this boot and a counter memory that cannot be written, gathered as the health
    check gathers them; nothing on a host without ports."""
    from slurm_hooks.checks import links
    from slurm_hooks.probes import ib
    from slurm_hooks.slurm import nodename

    node = nodename.resolve(None)
    try:
        return node, [line for line, _ in links.standing(ib.from_config(cfg, node)())]
    except OSError as exc:
        return node, [f"cannot read the links: {exc}"]


def _seconds(text: str) -> float:
    from slurm_hooks.observe.events import parse_duration

    try:
        return parse_duration(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--max-wait") from None
