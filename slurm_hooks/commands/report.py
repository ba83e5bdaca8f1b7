"""``slurm-hooks report``: the fleet report from audit logs and Slurm's accounting."""

from __future__ import annotations

import click

from slurm_hooks.commands.options import config_option, json_option


@click.command()
@config_option
@click.option("--since", default="30d", show_default=True, metavar="WHEN", help="30d, 12h, epoch seconds or ISO-8601.")
@click.option("--audit", "audit_path", metavar="PATH_OR_DIR",
              help="An audit log, or a directory of per-node *.jsonl logs (default: [log] audit).")
@click.option("--accounting/--no-accounting", default=None,
              help="Use slurmdbd (sacctmgr, sacct). Default: when it answers.")
@click.option("--nodes", "node_list", metavar="HOSTLIST", help="Only these nodes (e.g. gpu[001-128]).")
@json_option
@click.option("--html", "html_path", metavar="FILE", help="Also write a self-contained HTML report to FILE.")
def report(config_path: str | None, since: str, audit_path: str | None, accounting: bool | None,
           node_list: str | None, as_json: bool, html_path: str | None) -> None:
    """Incidents per node and GPU, repair times, repeat offenders, RMA candidates."""
    import json
    import os
    import time

    from slurm_hooks import config as config_mod
    from slurm_hooks import fsutil
    from slurm_hooks import report as rep_mod
    from slurm_hooks.observe import events, incidents, receivers
    from slurm_hooks.report import html, text
    from slurm_hooks.report.slurmdb import OUR_PREFIX, AccountingUnavailable, SlurmDb
    from slurm_hooks.slurm import hostlist

    cfg = config_mod.load(config_path)
    try:
        start = events.parse_since(since)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--since") from None
    now = time.time()
    path = audit_path or cfg.log.audit
    if audit_path and not os.path.exists(audit_path):
        raise click.BadParameter(f"no such file or directory: {audit_path}", param_hint="--audit")
    scope: list[str] = []
    if node_list:
        try:
            scope = hostlist.expand(node_list)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--nodes") from None
    files = rep_mod.audit_files(path)
    records = rep_mod.read_audit(files)
    if scope:
        # A receiver's outage is told by the host whose notifier delivers (a login node, say): it
        # held back what these nodes' incidents had to tell, so it stays in a report scoped to them.
        records = [r for r in records if r.get("node") in scope or r.get("kind") == receivers.KIND]
    node_events = job_runs = None
    used = "off"
    db = SlurmDb(cfg.slurm.bin_dir, timeout=3 * cfg.slurm.timeout)  # 30 s by default
    if accounting is not False:
        try:
            node_events = db.node_events(start, now, scope)
            # Requeued jobs only where an incident was: the nodes of our drains, from slurmdbd and the logs.
            hit = {e.node for e in node_events if e.reason.startswith(OUR_PREFIX)}
            hit |= {i.node for i in incidents.build(records) if i.opened_at >= start}
            job_runs = db.requeued_runs(start, now, hit)
            used = "slurmdbd"
        except AccountingUnavailable as exc:
            if accounting:
                raise
            used = f"not used ({exc})"
    from slurm_hooks.remedy.repair import read_rma

    rma_list = read_rma(os.path.join(cfg.state.dir, "rma.json"))  # where readable: this host's RMA list
    if scope:
        rma_list = [e for e in rma_list if e.get("node") in scope]
    data = rep_mod.build(records, start, now, node_events, job_runs,
                         sources={"audit": path, "audit_files": len(files), "accounting": used,
                                  "accounting_queries": [" ".join(q) for q in db.queries]}, rma_list=rma_list)
    if html_path:
        try:
            fsutil.atomic_write(html_path, html.render(data), mode=0o644)
        except OSError as exc:
            raise click.ClickException(f"cannot write {html_path}: {exc.strerror}") from None
    if as_json:
        click.echo(json.dumps(data, indent=1))
        return
    for line in text.render(data):
        click.echo(line)
    if html_path:
        click.echo(f"\nHTML report: {html_path}")
