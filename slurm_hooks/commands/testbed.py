"""``slurm-hooks testbed``: a real Slurm cluster on this machine (root)."""

from __future__ import annotations

import os
import shlex

import click

from slurm_hooks.lab.testbed import LabSettings, default_state_dir

_state_dir_option = click.option("--state-dir", default=default_state_dir,
                                 show_default="$XDG_RUNTIME_DIR/slurm-hooks-testbed, else "
                                              "/var/lib/slurm-hooks/testbed-<uid>: one per user",
                                 metavar="DIR", help="Where the cluster keeps its config, spool, logs and sim GPUs.")


@click.group()
def testbed() -> None:
    """A local Slurm cluster (n1..nN, gpu:8 each) for tests, demos and fault rehearsals."""


@testbed.command()
@click.option("--nodes", default=2, show_default=True, type=click.IntRange(1, 99),
              help="Number of slurmd's (99 at most: one port each in a block of 100; each idle slurmd holds "
                   "about 6 MiB).")
@click.option("--gpus", default=8, show_default=True, type=click.IntRange(1, 64), help="GPUs per node.")
@_state_dir_option
@click.option("--hooks/--no-hooks", default=True, show_default=True,
              help="Wire slurm-hooks in as Prolog, Epilog and HealthCheckProgram.")
@click.option("--kill-wait", default=LabSettings.kill_wait, show_default=True, type=click.IntRange(0, 300),
              help="KillWait (s): 120 as `install` recommends (above [requeue] checkpoint_grace); a few seconds "
                   "makes a job that ignores SIGTERM requeue faster in a rehearsal, and validate warns.")
@click.option("--health-check-interval", default=30, show_default=True, type=click.IntRange(0, 86400),
              help="HealthCheckInterval (s).")
@click.option("--requeue-grace", default=3.0, show_default=True, type=click.FloatRange(0),
              help="[remediation] requeue_grace written to the testbed's config (s).")
@click.option("--accounting", is_flag=True, help="Also run slurmdbd on a private MariaDB (installed when missing).")
@click.option("--repair/--no-repair", default=False, show_default=True,
              help="Turn the repair ladder on in the testbed's config (reset -> reboot -> replace).")
@click.option("--gres-order", metavar="M0,M1,...",
              help="gres.conf's File= order as device numbers (e.g. 7,6,5,4,3,2,1,0): Slurm's GRES index i is "
                   "/dev/nvidia<Mi>, so Slurm's numbering differs from NVML's as on hand-written gres.conf.")
@click.option("--reboot-program/--no-reboot-program", default=True, show_default=True,
              help="Set RebootProgram in slurm.conf; without it Slurm refuses `scontrol reboot`, as on sites "
                   "that never set one.")
@click.option("--shards", default=0, show_default=True, type=click.IntRange(0, 64),
              help="Declare this many gres/shard per GPU (jobs holding a share of a GPU).")
@click.option("--mig", default=0, show_default=True, type=click.IntRange(0, 7),
              help="MIG instances per simulated GPU, each declared to Slurm as its own GPU.")
@click.option("--nhc", "nhc", metavar="SOURCE", default="",
              help="Run LBNL NHC as HealthCheckProgram, from its source (a git archive tarball of mej/nhc, such as "
                   "../shared/third_party/lbnl-nhc-*.tar.gz, or an unpacked tree), with check_slurm_hooks first "
                   "in its nhc.conf.")
@click.option("--nhc-check", default="check_slurm_hooks", show_default=True, metavar="LINE",
              help="Our check's part of the nhc.conf line ('check_slurm_hooks -r': report mode).")
@click.option("--own-addresses/--shared-address", default=False, show_default=True,
              help="Each node on a loopback address of its own (NodeAddr=127.1.B.K), so that a fault can be put "
                   "on one node's traffic (`testbed fault`).")
@click.option("--programs", default="", metavar="PREFIX",
              help="Name the programs a `slurm-hooks install --prefix PREFIX` laid in slurm.conf (rehearse a "
                   "roll-out), instead of the testbed's own wrappers.")
@click.option("--slurm-prefix", default="", metavar="PREFIX", envvar="SLURM_HOOKS_SLURM_PREFIX",
              help="Run another Slurm's slurmctld, slurmd and commands (PREFIX/sbin, PREFIX/bin: a build from "
                   "SchedMD's source with --enable-multiple-slurmd) instead of Debian's. "
                   "Default: $SLURM_HOOKS_SLURM_PREFIX.")
@click.option("--slurm-backend", default="scontrol", show_default=True,
              type=click.Choice(["auto", "scontrol", "pyslurm"]),
              help="[slurm] backend of the hooks slurmd runs (auto: pyslurm where it matches this Slurm).")
@click.option("--vendor", "vendors", multiple=True, metavar="[NODE=]VENDOR",
              help="Whose simulated GPUs: nvidia (the default) or amd (MI300X, gres.conf naming their "
                   "/dev/dri/renderD* files), for every node, or one node (n2=amd: a mixed fleet). Repeatable.")
def up(nodes: int, gpus: int, state_dir: str, hooks: bool, kill_wait: int, health_check_interval: int,
       requeue_grace: float, accounting: bool, repair: bool, gres_order: str | None, reboot_program: bool,
       shards: int, mig: int, nhc: str, nhc_check: str, own_addresses: bool, programs: str,
       slurm_prefix: str, slurm_backend: str, vendors: tuple[str, ...]) -> None:
    """Start the cluster (installs Slurm and munge with apt-get when missing). Idempotent."""
    from slurm_hooks.lab.testbed import LabSettings, Testbed

    settings = LabSettings(nodes=nodes, gpus=gpus, hooks=hooks, kill_wait=kill_wait,
                        health_check_interval=health_check_interval, requeue_grace=requeue_grace,
                        accounting=accounting, repair=repair, gres_order=_order(gres_order),
                        reboot_program=reboot_program, shards=shards, mig=mig,
                        nhc=os.path.abspath(nhc) if nhc else "", nhc_check=nhc_check, programs=programs,
                        own_addresses=own_addresses, force_requeue_on_fail=True,
                        slurm_prefix=os.path.abspath(slurm_prefix) if slurm_prefix else "",
                        slurm_backend=slurm_backend, **_vendors(vendors))
    tb = Testbed(state_dir, settings, progress=click.echo)
    tb.up()
    click.echo(_exports(tb))


def _vendors(given: tuple[str, ...]) -> dict:
    """``--vendor amd --vendor n1=nvidia`` -> LabSettings' vendor and vendors."""
    out: dict = {"vendors": {}}
    for item in given:
        node, sep, vendor = item.rpartition("=")
        if sep:
            out["vendors"][node] = vendor
        else:
            out["vendor"] = vendor
    return out


@testbed.command()
@_state_dir_option
def down(state_dir: str) -> None:
    """Stop every daemon and job of the cluster."""
    from slurm_hooks.lab.testbed import Testbed

    Testbed(state_dir, progress=click.echo).down()


@testbed.command()
@_state_dir_option
def status(state_dir: str) -> int:
    """Daemons, nodes and their states. Exit 0 when up, 3 when not."""
    from slurm_hooks.lab.testbed import Testbed

    tb = Testbed(state_dir)
    st = tb.status()
    click.echo(f"testbed {'up' if st.up else 'down'} in {st.state_dir}")
    ports = tb.ports()
    for label, pid in st.daemons.items():
        port = ports.get(label.split()[-1]) if label != "munged" else None
        click.echo(f"  {label:<12} {'pid ' + str(pid) if pid else 'not running':<12}"
                   + (f" port {port}" if port else ""))
    if st.up:
        kept = tb.kept_config()
        click.echo(f"  config       {tb.config_path}" + (f" ({len(kept.splitlines())} line(s) of yours kept)"
                                                         if kept.strip() else ""))
    if st.error:
        click.echo(f"  not up: {st.error}")
    for node in st.nodes:
        line = f"  {node.name:<6} {node.state:<16} {node.gres}"
        if node.reason:
            line += f"  reason: {node.reason}"
        click.echo(line)
    if st.up:
        click.echo(_exports(tb))
    return 0 if st.up else 3


@testbed.command()
@_state_dir_option
@click.pass_context
def env(ctx: click.Context, state_dir: str) -> None:
    """Print the shell exports that point Slurm and slurm-hooks at the cluster (exit 3, printing
    none, when no testbed is up there)."""
    from slurm_hooks.lab.testbed import Testbed

    tb = Testbed(state_dir)
    st = tb.status()
    if not st.up:
        why = f": {st.error}" if st.error else ""
        click.echo(f"slurm-hooks testbed env: no testbed up in {tb.state_dir}{why} (`slurm-hooks testbed up` starts "
                   "one there; --state-dir names another)", err=True)
        ctx.exit(3)
    for key, value in tb.exports().items():
        click.echo(f"export {key}={shlex.quote(value)}")


@testbed.command()
@_state_dir_option
@click.option("--node", required=True, help="The node whose traffic the fault is on.")
@click.argument("fault", nargs=-1, required=True, metavar="net-drop | net-slow KBPS | net-loss PCT | hang | none")
def fault(state_dir: str, node: str, fault: tuple[str, ...]) -> None:
    """Put a fault on one node's traffic (or clear it: none).

    net-*: made by the kernel, nftables rules on the node's own address (testbed up
    --own-addresses) in a table of the testbed's own, which `down` and the next `up` delete.
    hang: a file in the testbed's faults/ that only test-side wrappers read.
    """
    from slurm_hooks.lab.testbed import Testbed, TestbedError

    text = " ".join(fault)
    try:
        Testbed(state_dir).set_fault(node, "" if text == "none" else text)
    except TestbedError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{node}: {text}")


@testbed.command("reboot-program", hidden=True)
@_state_dir_option
def reboot_program(state_dir: str) -> None:
    """The testbed's RebootProgram (slurmd runs it, with no arguments)."""
    from slurm_hooks.lab.testbed import Testbed

    click.echo(Testbed(state_dir).reboot_program())


@testbed.command("reboot-node", hidden=True)
@_state_dir_option
@click.option("--node", required=True)
@click.option("--slurmd-pid", required=True, type=click.IntRange(2))
def reboot_node(state_dir: str, node: str, slurmd_pid: int) -> None:
    """The detached half of a testbed reboot: sim reboot, then slurmd again with a new boot time."""
    from slurm_hooks.lab.testbed import Testbed
    from slurm_hooks.runner import signal_ready

    signal_ready()
    Testbed(state_dir).reboot_node(node, slurmd_pid)
    click.echo(f"{node}: rebooted")


def _order(text: str | None) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in (text or "").split(",") if p.strip())
    except ValueError:
        raise click.BadParameter(f"expected device numbers separated by commas, got {text!r}",
                                 param_hint="--gres-order") from None


def _exports(tb) -> str:
    return "export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in tb.exports().items())
