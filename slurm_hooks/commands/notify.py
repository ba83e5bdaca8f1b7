"""``slurm-hooks notify``: deliver what the audit log has to tell (Alertmanager, webhooks, syslog)."""

from __future__ import annotations

import click

from slurm_hooks.commands.options import config_option, json_option


@click.group()
def notify() -> None:
    """Notifications from the audit log ([notify] in the config)."""


@notify.command()
@config_option
@click.option("--timeout", type=click.FloatRange(min=0.1), metavar="S",
              help="Return within S seconds (default: [notify] flush_timeout).")
@json_option
def flush(config_path: str | None, timeout: float | None, as_json: bool) -> None:
    """Read new audit records into the outbox and deliver what can be delivered now."""
    import json

    from slurm_hooks import config as config_mod
    from slurm_hooks.observe.notify import Notifier, NotifySettings

    cfg = config_mod.load(config_path)
    settings = NotifySettings.from_config(cfg)
    if not settings.configured:
        click.echo("notify: no receiver configured ([notify] syslog, [[notify.webhook]] or "
                   "[[notify.alertmanager]]); nothing to do")
        return
    result = Notifier(settings).flush(float(timeout if timeout is not None else cfg.notify.flush_timeout))
    if as_json:
        click.echo(json.dumps(result))
    else:
        busy = " (another notifier holds the outbox: left to it)" if result["busy"] else ""
        click.echo(f"notify: {result['queued']} queued, {result['sent']} sent, {result['waiting']} waiting{busy}")


@notify.command()
@config_option
def status(config_path: str | None) -> None:
    """Messages waiting in the outbox, and the ones a receiver refused."""
    import os

    from slurm_hooks import config as config_mod
    from slurm_hooks.observe.notify import NotifySettings, Outbox, pending, receivers_held

    settings = NotifySettings.from_config(config_mod.load(config_path))
    box = Outbox(settings.dir, settings.notify.max_queued, settings.notify.max_age)
    waiting = pending(box.entries())
    click.echo(f"outbox {box.box}: {len(waiting)} waiting")
    for line in waiting:
        click.echo(f"  {line}")
    for line in receivers_held(settings):
        click.echo(f"  {line}")
    for path in box.moved_aside:
        click.echo(f"  unreadable, moved to {box.bad}: {os.path.basename(path)}")
    failed = pending(box.failed_entries())
    if failed:
        click.echo(f"refused, kept in {box.failed}: {len(failed)}")
        for line in failed:
            click.echo(f"  {line}")


@notify.command("test")
@config_option
@json_option
@click.pass_context
def test_(ctx: click.Context, config_path: str | None, as_json: bool) -> None:
    """Send one marked test message to each receiver now and say what each answered (exit 1 if any
    did not take it). The URLs are not shown: only each receiver's host."""
    import json

    from slurm_hooks import config as config_mod
    from slurm_hooks.observe.notify import NotifySettings, send_test

    settings = NotifySettings.from_config(config_mod.load(config_path))
    if not settings.configured:
        click.echo("notify: no receiver configured ([notify] syslog, [[notify.webhook]] or [[notify.alertmanager]])")
        ctx.exit(1)
    answers = send_test(settings)
    if as_json:
        click.echo(json.dumps([{"receiver": a.name, "where": a.where, "ok": a.ok, "answer": a.said}
                               for a in answers]))
    else:
        for a in answers:
            click.echo(f"{'OK  ' if a.ok else 'FAIL'} {a.where or 'receiver'}" + (f" ({a.name})" if a.name != a.where
                                                                                  and a.name else "")
                       + f": {a.said}")
    ctx.exit(0 if all(a.ok for a in answers) else 1)
