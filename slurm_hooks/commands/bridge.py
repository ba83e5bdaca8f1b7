"""``slurm-hooks bridge``: the level-triggered Slurm -> Kubernetes reconciler.

Runs where Kubernetes credentials are: a Deployment next to Slinky, or the
controller host on bare metal (the slurmd pod has no service-account token).
``kubernetes`` is imported only when a pass is about to run.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import click

from slurm_hooks import config as config_mod
from slurm_hooks.commands.options import config_option
from slurm_hooks.errors import EXIT_OK, EXIT_UNAVAILABLE
from slurm_hooks.observe.audit import AuditLog


def _settings(config_path: str | None, **overrides):
    from slurm_hooks.bridge import settings as settings_mod

    cfg = config_mod.load(config_path)
    return cfg, settings_mod.with_overrides(settings_mod.from_config(cfg), **overrides)


@click.group(invoke_without_command=True)
@config_option
@click.option("--once", is_flag=True, help="Run one pass and exit (cron, tests, a first look).")
@click.option("--dry-run", is_flag=True, help="Send every write with dryRun=All: the API server checks it, nothing changes.")
@click.option("--interval", type=click.FloatRange(min=0.1), metavar="SECONDS", help="Seconds between passes (default [bridge] interval).")
@click.option("--kubeconfig", metavar="PATH", help="Kubeconfig (default [bridge] kubeconfig, then $KUBECONFIG / ~/.kube/config).")
@click.option("--context", metavar="NAME", help="Kubeconfig context.")
@click.option("--in-cluster/--no-in-cluster", default=None, help="Use the pod's service account (default: when running in a pod).")
@click.option("--json", "as_json", is_flag=True, help="One JSON line per pass instead of a summary line.")
@click.pass_context
def bridge(ctx: click.Context, config_path, once, dry_run, interval, kubeconfig, context, in_cluster, as_json) -> None:
    """Cordon, drain and replace the Kubernetes nodes under Slurm nodes drained for a GPU fault.

    A node drained with a `slurm-hooks: ... [reboot]` or `[replace]` reason is
    cordoned, tainted, marked GpuHealthy=False, drained by eviction and handed to
    the replacement backend; when Slurm shows it healthy again, exactly that is
    undone. A circuit breaker caps how many nodes it may take in a window.
    """
    if ctx.invoked_subcommand is not None:
        ctx.obj = {"config_path": config_path}
        return
    cfg, settings = _settings(config_path, interval=interval, kubeconfig=kubeconfig, context=context)

    from slurm_hooks.bridge.kubeclient import connect
    from slurm_hooks.bridge.reconciler import Reconciler
    from slurm_hooks.bridge.replace import make_backend
    from slurm_hooks.bridge.serve import serve
    from slurm_hooks.slurm.factory import from_config as slurm_from_config

    kube = connect(
        kubeconfig=settings.kubeconfig or None, context=settings.context or None, in_cluster=in_cluster,
        timeout=settings.request_timeout, retries=settings.retries,
    )
    # A dry run persists nothing, the Lease included: it neither takes nor renews it, and reads the
    # breaker's state from it (or the state file) without writing it back.
    elector = None if dry_run else _elector(settings, kube)
    if elector is not None:
        kube.deadline = elector.acting_deadline  # no call of a pass outlives the renew deadline
    audit = AuditLog(cfg.log.audit)
    notifier = _notifier(cfg, settings.state_file)
    management = _management(settings, elector)
    reconciler = Reconciler(
        slurm_from_config(cfg), kube, settings, audit=audit, dry_run=dry_run,
        backend=make_backend(settings.replace, management) if management is not None else None,
        metrics_dir=cfg.metrics.textfile_dir, store=_store(settings, elector, kube),
        leader=elector.check if elector is not None else None,
        notify=notifier.poke if notifier is not None else None,
    )
    stop = threading.Event()
    if not once:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        if notifier is not None:
            threading.Thread(target=notifier.run, args=(stop,), name="notify", daemon=True).start()

    def failed(exc: Exception) -> None:
        click.echo(f"slurm-hooks bridge: pass failed: {type(exc).__name__}: {exc}", err=True)
        audit.write("bridge_pass_failed", error=f"{type(exc).__name__}: {exc}")

    def leading(now: bool, holder: str) -> None:
        if not now and elector.last_error:
            click.echo(f"slurm-hooks bridge: cannot take the lease {elector.namespace}/{elector.name}: "
                       f"{elector.last_error}", err=True)
            audit.write("bridge_leader", leading=False, error=elector.last_error, identity=elector.identity)
            return
        if now:
            click.echo(f"slurm-hooks bridge: leading (lease {elector.namespace}/{elector.name})", err=True)
        else:
            click.echo(f"slurm-hooks bridge: standing by: lease {elector.namespace}/{elector.name} is held by "
                       f"{holder or 'nobody yet'}", err=True)
        audit.write("bridge_leader", leading=now, holder=holder, identity=elector.identity)

    def passed(result) -> None:
        _report(result, as_json)
        if notifier is not None and hasattr(notifier, "standing") and not dry_run:
            notifier.standing(result.standing)  # alerts that stay firing while true, ended when not

    try:
        result = serve(reconciler, elector, stop, settings.interval, once=once, on_pass=passed,
                       on_error=failed, on_leading=leading)
    finally:
        kube.close()
        if management is not None:
            management.close()
    if once and notifier is not None:
        notifier.flush(cfg.notify.flush_timeout)
    rc = EXIT_OK
    if once and result is not None and (result.aborted or result.errors):
        rc = EXIT_UNAVAILABLE
    if once and result is None and elector is not None and elector.last_error:
        click.echo("slurm-hooks bridge: pass aborted: the API server cannot be reached", err=True)
        rc = EXIT_UNAVAILABLE
    ctx.exit(rc)


def _management(settings, elector):
    """The Cluster API management cluster's client (``[bridge.capi] kubeconfig``), or ``None``: the
    Machines are in this cluster. Its calls are bounded by the same renew deadline."""
    if settings.replace.backend != "capi" or not settings.capi.kubeconfig:
        return None
    from slurm_hooks.bridge.kubeclient import connect

    management = connect(kubeconfig=settings.capi.kubeconfig, context=settings.capi.context or None,
                         in_cluster=False, timeout=settings.request_timeout, retries=settings.retries)
    if elector is not None:
        management.deadline = elector.acting_deadline
    return management


def _notifier(cfg, state_file: str):
    """The bridge tells its own news (breaker trips, replacements and reboots it asked for, a missing
    permission, a drain past its timeout) through [notify], as the nodes do: from its audit log (each
    told once, across restarts), woken by the reconciler's ``notify`` hook as each is written; its
    outbox and cursor beside its state file."""
    from slurm_hooks.observe.notify import Notifier, NotifySettings

    ns = NotifySettings.from_config(cfg, os.path.join(os.path.dirname(os.path.abspath(state_file)), "notify"))
    if not ns.configured:
        return None
    return Notifier(ns, log=lambda msg: click.echo(f"slurm-hooks bridge: notify: {msg}", err=True))


def _lease_namespace(settings) -> str:
    from slurm_hooks.bridge.leader import lease_namespace

    return lease_namespace(settings.lease_namespace)


def _elector(settings, kube):
    """The Lease elector, or ``None`` with ``leader_election = false`` (one process, a state file)."""
    if not settings.leader_election:
        return None
    import socket
    import uuid

    from slurm_hooks.bridge.leader import LeaderElector
    from slurm_hooks.bridge.serve import identity

    return LeaderElector(kube, _lease_namespace(settings), settings.lease_name,
                         identity(socket.gethostname(), os.getpid(), uuid.uuid4().hex),
                         lease_duration=settings.lease_duration)


def _store(settings, elector, kube):
    from slurm_hooks.bridge.leader import LeaseAdminStore, LeaseStateStore
    from slurm_hooks.bridge.state import StateStore

    if elector is not None:
        return LeaseStateStore(elector)
    if settings.leader_election:  # a dry run: the leader's state, read only (run_pass never saves it)
        return LeaseAdminStore(kube, _lease_namespace(settings), settings.lease_name)
    return StateStore(settings.state_file)


def _report(result, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({
            "dry_run": result.dry_run, "slurm_nodes": result.slurm_nodes, "bad": result.bad, "held": result.owned,
            "taken": result.taken, "opted_out": result.opted_out, "drained": result.drained,
            "draining": result.pending, "waiting_for_jobs": result.waiting, "replaced": result.replaced, "restored": result.restored,
            "blocked": result.blocked, "breaker_open": result.breaker_open, "errors": result.errors,
            "aborted": result.aborted, "api_calls": result.api_calls, "duration_s": round(result.duration, 3),
        }))
        return
    stream = sys.stderr if (result.errors or result.aborted or result.blocked) else sys.stdout
    if result.acted or result.waiting or result.errors or result.aborted or result.blocked or result.dry_run:
        click.echo(f"slurm-hooks bridge: {result.summary()}", file=stream)
    if result.breaker_open and result.blocked:
        click.echo("slurm-hooks bridge: CIRCUIT BREAKER OPEN: not taking "
                   f"{', '.join(result.blocked)}; `slurm-hooks bridge reset-breaker` to resume", err=True)
    for node, error in result.errors:
        click.echo(f"slurm-hooks bridge: {node}: {error}", err=True)


@bridge.command("reset-breaker")
@click.option("--yes", is_flag=True, help="Do not ask.")
@click.pass_obj
def reset_breaker(obj, yes: bool) -> None:
    """Close the circuit breaker and start a fresh window (after checking why it tripped)."""
    from slurm_hooks.bridge.breaker import CircuitBreaker

    cfg, settings = _settings(obj["config_path"])
    store, close = _admin_store(settings)
    try:
        _reset(cfg, settings, store, yes, CircuitBreaker)
    finally:
        close()


def _admin_store(settings):
    """Where the breaker's state is: the Lease (leader election on) or the state file; and a closer."""
    from slurm_hooks.bridge.state import StateStore

    if not settings.leader_election:
        return StateStore(settings.state_file), lambda: None
    from slurm_hooks.bridge.kubeclient import connect
    from slurm_hooks.bridge.leader import LeaseAdminStore

    kube = connect(kubeconfig=settings.kubeconfig or None, context=settings.context or None,
                   timeout=settings.request_timeout, retries=settings.retries)
    return LeaseAdminStore(kube, _lease_namespace(settings), settings.lease_name), kube.close


def _reset(cfg, settings, store, yes, CircuitBreaker) -> None:
    state = store.load()
    if state.tripped_at is None and not state.taken:
        click.echo("circuit breaker is closed and its window is empty: nothing to reset")
        return
    if state.tripped_at is not None:
        click.echo(f"tripped {time.time() - state.tripped_at:.0f} s ago: {state.trip_reason}")
        if state.blocked:
            click.echo(f"blocked: {', '.join(state.blocked)}")
    if not yes:
        click.confirm("reset it?", abort=True)
    CircuitBreaker(settings.breaker, state).reset(time.time())
    store.save(state)
    AuditLog(cfg.log.audit).write("bridge_breaker_reset", by=os.environ.get("SUDO_USER") or os.environ.get("USER", ""))
    click.echo("circuit breaker reset")


@bridge.command("status")
@click.pass_obj
def status(obj) -> None:
    """The circuit breaker's state: from the leader's Lease (one GET), or the state file."""
    from slurm_hooks.bridge.breaker import CircuitBreaker

    _, settings = _settings(obj["config_path"])
    store, close = _admin_store(settings)
    try:
        state = store.load()
    finally:
        close()
    breaker = CircuitBreaker(settings.breaker, state)
    now = time.time()
    holder = ((getattr(store, "lease", None) or {}).get("spec") or {}).get("holderIdentity")
    click.echo(json.dumps({
        "state_file": str(store),
        "leader": holder if settings.leader_election else None,
        "open": breaker.is_open(now),
        "trip_reason": state.trip_reason or None,
        "tripped_s_ago": round(now - state.tripped_at, 1) if state.tripped_at else None,
        "taken_in_window": sorted(breaker.in_window(now)),
        "blocked": list(state.blocked),
        "max_percent": settings.breaker.max_percent,
        "max_nodes": settings.breaker.max_nodes,
        "window_s": settings.breaker.window,
    }, indent=1))
