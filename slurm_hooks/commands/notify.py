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
    # By hand: a receiver held back after a failure is tried now, once (a failure holds it again).
    result = Notifier(settings).flush(float(timeout if timeout is not None else cfg.notify.flush_timeout),
                                      now_all=True)
    if as_json:
        click.echo(json.dumps(result))
    else:
        busy = " (another notifier holds the outbox: left to it)" if result["busy"] else ""
        click.echo(f"notify: {result['queued']} queued, {result['sent']} sent, {result['waiting']} waiting{busy}")
        if result["waiting"]:
            from slurm_hooks.observe.notify import receivers_held

            for line in receivers_held(settings):
                click.echo(f"  {line}")


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
@click.option("--prefix", default=None, metavar="P",
              help="Where `slurm-hooks install` laid the programs whose environment a url_env is read from "
                   "(default /opt/slurm-hooks).")
@json_option
@click.pass_context
def test_(ctx: click.Context, config_path: str | None, prefix: str | None, as_json: bool) -> None:
    """Send one marked test message to each receiver, the way the watcher and the health check send
    (through the outbox; a url_env from the installed programs' environment; an Alertmanager asked
    first whether it is one), and say what each answered (exit 1 if any did not take it). A
    receiver that takes it is no longer held back. The URLs are not shown: only each receiver's host."""
    import json

    from slurm_hooks import config as config_mod
    from slurm_hooks.install import layout
    from slurm_hooks.observe.notify import NotifySettings, send_test

    settings = NotifySettings.from_config(config_mod.load(config_path))
    if not settings.configured:
        click.echo("notify: no receiver configured ([notify] syslog, [[notify.webhook]] or [[notify.alertmanager]])")
        ctx.exit(1)
    prefix = prefix or layout.DEFAULT_PREFIX
    laid = layout.laid_env(prefix)
    answers = send_test(settings, environ=laid)
    notes = _env_notes(settings, prefix, laid)
    if as_json:
        click.echo(json.dumps([{"receiver": a.name, "where": a.where, "ok": a.ok, "answer": a.said}
                               for a in answers]))
    else:
        for a in answers:
            click.echo(f"{'OK  ' if a.ok else 'FAIL'} {a.where or 'receiver'}" + (f" ({a.name})" if a.name != a.where
                                                                                  and a.name else "")
                       + f": {a.said}")
    for note in notes:
        click.echo(note, err=as_json)
    ctx.exit(0 if all(a.ok for a in answers) else 1)


def _env_notes(settings, prefix: str, laid: dict[str, str] | None) -> list[str]:
    """What a ``url_env`` receiver's answer owes to the environment it was read from."""
    import os

    names = sorted({t["url_env"] for kind in ("webhook", "alertmanager") for t in getattr(settings.notify, kind)
                    if t.get("url_env") and not t.get("url")})
    out = []
    for name in names:
        if laid is None:
            out.append(f"note: ${name} was read from this shell: no programs laid by `slurm-hooks install` at "
                       f"{prefix} to read the senders' environment from; the watcher (systemd) and the health check "
                       f"(slurmd) do not inherit this shell's variables")
        elif name not in laid:
            here = " (this shell has it)" if os.environ.get(name) else ""
            slurmd = _slurmd_environ()
            if slurmd is None:
                hooks = "the health check has it only if slurmd's environment does (no slurmd here to read)"
            elif slurmd[1].get(name):
                hooks = f"slurmd (pid {slurmd[0]}) has it: the health check can read it, the watcher cannot"
            else:
                hooks = f"slurmd's environment (pid {slurmd[0]}) lacks it too: the health check cannot read it"
            out.append(f"note: ${name} is not in the environment of the programs laid at {prefix}{here}: the watcher "
                       f"(systemd starts it with its unit's Environment= lines alone) cannot read it; {hooks}. Lay it "
                       f"with `slurm-hooks install --prefix {prefix} --env {name}=...`, or give the URL with url_file")
    return out


def _slurmd_environ() -> tuple[int, dict[str, str]] | None:
    """(pid, environment) of a slurmd running on this host, when one can be read (root)."""
    import os

    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/comm", encoding="utf-8", errors="replace") as fh:
                if fh.read().strip() != "slurmd":
                    continue
            with open(f"/proc/{entry}/environ", "rb") as fh:
                raw = fh.read(1 << 20)
        except OSError:
            continue
        pairs = (p.decode(errors="replace").partition("=") for p in raw.split(b"\0") if b"=" in p)
        return int(entry), {k: v for k, _, v in pairs}
    return None
