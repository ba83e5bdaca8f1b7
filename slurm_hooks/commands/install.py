"""``slurm-hooks install``: lay the programs slurmd runs, the watcher's unit and the NHC check.

See :mod:`slurm_hooks.install.layout` for the layout and :mod:`slurm_hooks.install.apply` for how
versions are switched and undone.
"""

from __future__ import annotations

import os
import sys

import click

from slurm_hooks.install import layout


def _env_pair(ctx, param, values: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    out = []
    for v in values:
        name, sep, value = v.partition("=")
        if not sep or not name or not (name.replace("_", "a").isalnum() and not name[0].isdigit()):
            raise click.BadParameter(f"{v!r}: expected NAME=VALUE", param_hint="--env")
        out.append((name, value))
    return tuple(out)


def interpreter() -> str:
    """This interpreter as it was invoked: a venv's ``bin/python`` is a symlink to the base
    interpreter, and only the unresolved path finds the venv (and so slurm-hooks)."""
    return os.path.abspath(sys.executable)


@click.command()
@click.option("--prefix", default=layout.DEFAULT_PREFIX, show_default=True, metavar="DIR",
              help="Where bin/, share/, versions/ and the manifest go.")
@click.option("--config", "config_path", default=layout.DEFAULT_CONFIG, show_default=True, metavar="FILE",
              help="The config the programs use (baked in); the example is written there only if none exists.")
@click.option("--on-internal-error", type=click.Choice(layout.ON_ERROR), default="allow", show_default=True,
              help="When slurm-hooks itself cannot run: allow (the job runs, the node stays) or refuse "
                   "(fail closed: Slurm drains the node).")
@click.option("--env", "env", multiple=True, metavar="NAME=VALUE", callback=_env_pair,
              help="An environment variable the programs set (repeatable), e.g. SLURM_CONF for a non-default slurm.conf.")
@click.option("--uninstall", is_flag=True, help="Remove exactly what installs laid under --prefix (refused while "
                                                 "slurm.conf still names its programs).")
@click.option("--force", is_flag=True, help="With --uninstall: remove even while slurm.conf names the programs.")
@click.option("--slurm-conf", "slurm_conf", metavar="FILE",
              help="The slurm.conf --uninstall looks in (default: $SLURM_CONF, then /etc/slurm/slurm.conf).")
@click.option("--dry-run", is_flag=True, help="Say what would change; change nothing.")
def install(prefix: str, config_path: str, on_internal_error: str, env: tuple[tuple[str, str], ...],
            uninstall: bool, force: bool, slurm_conf: str | None, dry_run: bool) -> int:
    """Lay PREFIX/bin/slurm-hooks-{healthcheck,prolog,epilog} (this interpreter and --config baked in),
    the watcher's systemd unit and the NHC check; print the slurm.conf lines to add.

    Idempotent. A new version is laid beside the old one and switched to with one atomic rename.
    """
    from slurm_hooks.install import apply

    prefix = os.path.abspath(prefix)
    if uninstall:
        from slurm_hooks.errors import EXIT_USAGE
        from slurm_hooks.slurm import conffile

        conf_path = conffile.resolve_path(slurm_conf)
        named = _programs_named(prefix, conf_path)
        if named is None:
            why = "file not found" if not os.path.lexists(conf_path) else "unreadable"
            click.echo(f"warning: cannot read {conf_path} ({why}): not checked whether slurm.conf still names the "
                       "removed programs (pass --slurm-conf FILE)", err=True)
            named = []
        if named and not force:
            click.echo("slurm-hooks install: refusing to uninstall: slurm.conf still names its programs, and "
                       "slurmd would run files that are gone (every job start fails on Prolog=, every node "
                       "drains on HealthCheckProgram=):", err=True)
            for line in named:
                click.echo(f"  {line}", err=True)
            click.echo("remove those lines, `scontrol reconfigure`, then uninstall (or pass --force)", err=True)
            return EXIT_USAGE
        for line in named:
            click.echo(f"warning: slurm.conf still names a removed program: {line}", err=True)
        done = apply.uninstall(prefix, dry=dry_run)
        _show(done, dry_run)
        for path in done.kept:
            click.echo(f"kept {path} (changed since install)")
        return 0
    inputs = _inputs(prefix, os.path.abspath(config_path), on_internal_error, env)
    done = apply.install(inputs, dry=dry_run)
    _show(done, dry_run)
    if not done.changed:
        click.echo(f"{prefix}: version {done.version_id} already in place, nothing changed")
    for path in done.kept:
        click.echo(f"kept {path} (changed since install)")
    click.echo("\nslurm.conf (on every node and the controller; then `scontrol reconfigure`):\n")
    for line in layout.slurm_conf_lines(prefix):
        click.echo(f"  {line}")
    click.echo("\nWhat these do to every job on the cluster (not only to those slurm-hooks touches):\n")
    for note in layout.slurm_conf_notes():
        click.echo(f"  - {note}")
    click.echo(f"\nwatcher: systemctl enable --now {os.path.join(prefix, layout.UNIT)}")
    click.echo(f"NHC:     ln -s {os.path.join(prefix, layout.NHC)} /etc/nhc/scripts/, then `* || check_slurm_hooks` "
               "in nhc.conf")
    click.echo(f"then:    {interpreter_bin()} validate --config {inputs.config}")
    return 0


def interpreter_bin() -> str:
    return os.path.join(os.path.dirname(interpreter()), "slurm-hooks")


def _inputs(prefix: str, config_path: str, on_error: str, env: tuple[tuple[str, str], ...]) -> layout.Inputs:
    """What the programs bake in: read from the config (its example when there is none yet), so a
    config that does not load stops the install before anything is laid."""
    from slurm_hooks import config as config_mod

    if os.path.lexists(config_path):
        cfg = config_mod.load(config_path)
    else:
        cfg = config_mod.parse(layout.example_config(), config_path)
    return layout.Inputs(
        prefix=prefix, python=interpreter(), config=config_path, state_dir=cfg.state.dir, audit=cfg.log.audit,
        textfile_dir=cfg.metrics.textfile_dir, scontrol=os.path.join(cfg.slurm.bin_dir, "scontrol"),
        on_error=on_error, env=env,
        extra_write_paths=(os.path.dirname(cfg.interop.nvrx_socket),) if cfg.interop.nvrx_socket else (),
    )


def _show(done, dry: bool) -> None:
    for line in done.lines:
        click.echo(("would " if dry else "") + line)


def _programs_named(prefix: str, slurm_conf: str) -> list[str] | None:
    """The slurm.conf lines (``file:line: Key=value``, Include files followed) that still name a
    program under ``prefix``: uninstalling then leaves slurmd running a file that is gone, and
    every job start fails (Prolog) or every node drains (HealthCheckProgram). ``None`` when
    ``slurm_conf`` itself cannot be read: nothing was checked."""
    from slurm_hooks.slurm import conffile

    keys = {p.slurm_key.lower() for p in layout.PROGRAMS}
    root = os.path.abspath(prefix) + os.sep
    found: list[str] = []
    todo, seen = [slurm_conf], set()
    while todo:
        path = todo.pop(0)
        if path in seen or len(seen) > 64:
            continue
        seen.add(path)
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
        except OSError:
            if path == slurm_conf:
                return None
            continue
        for no, line in conffile.logical_lines(text):
            inc = conffile.INCLUDE.match(line)
            if inc:
                todo.extend(conffile.include_paths(inc.group(1), path))
                continue
            try:
                pairs = conffile.split_pairs(line)
            except ValueError:
                continue
            for key, value in pairs:
                if key.lower() in keys and any(os.path.abspath(v.strip()).startswith(root)
                                               for v in value.split(",") if v.strip()):
                    found.append(f"{path}:{no}: {key}={value}")
    return found
