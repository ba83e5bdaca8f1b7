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
@json_option
@click.option("--html", "html_path", metavar="FILE", help="Also write a self-contained HTML report to FILE.")
def report(config_path: str | None, since: str, audit_path: str | None, accounting: bool | None, as_json: bool,
           html_path: str | None) -> None:
    """Incidents per node and GPU, repair times, repeat offenders, RMA candidates."""
    import json
    import os
    import time

    from slurm_hooks import config as config_mod
    from slurm_hooks import fsutil
    from slurm_hooks import report as rep_mod
    from slurm_hooks.observe import events
    from slurm_hooks.report import html, text
    from slurm_hooks.report.slurmdb import AccountingUnavailable, SlurmDb

    cfg = config_mod.load(config_path)
    try:
        start = events.parse_since(since)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--since") from None
    now = time.time()
    path = audit_path or cfg.log.audit
    if audit_path and not os.path.exists(audit_path):
        raise click.BadParameter(f"no such file or directory: {audit_path}", param_hint="--audit")
    files = rep_mod.audit_files(path)
    records = rep_mod.read_audit(files)
    node_events = job_runs = None
    used = "off"
    if accounting is not False:
        db = SlurmDb(cfg.slurm.bin_dir, timeout=max(30.0, float(cfg.slurm.timeout)))
        try:
            node_events = db.node_events(start, now)
            job_runs = db.requeued_runs(start, now)
            used = "slurmdbd"
        except AccountingUnavailable as exc:
            if accounting:
                raise
            used = f"not used ({exc})"
    data = rep_mod.build(records, start, now, node_events, job_runs,
                         sources={"audit": path, "audit_files": len(files), "accounting": used})
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
