"""``slurm-hooks sim``: create, break and mend simulated GPUs."""

from __future__ import annotations

import json
import os

import click

from slurm_hooks import config as config_mod
from slurm_hooks.commands.options import config_option, json_option, node_option
from slurm_hooks.probes import sim as simstate
from slurm_hooks.slurm import nodename

_dir_option = click.option("--sim-dir", metavar="DIR", help="Overrides [gpu] sim_dir.")


def _sim_dir(config_path: str | None, sim_dir: str | None) -> str:
    return sim_dir or config_mod.load(config_path).gpu.sim_dir


@click.group()
def sim() -> None:
    """Simulated GPUs for tests, demos and fault rehearsals."""


@sim.command()
@node_option
@click.option("--gpus", default=8, show_default=True, type=click.IntRange(1, 64),
              help="GPUs (with --vendor amd: boards, each --partition's logical GPUs, an MI250X two dies).")
@click.option("--vendor", default="nvidia", show_default=True, type=click.Choice(simstate.VENDORS))
@click.option("--model", type=click.Choice(sorted(simstate.MODELS) + ["MI250X", "MI300X", "MI325X"]),
              help="Default: H100, or MI300X with --vendor amd.")
@click.option("--partition", type=click.Choice(["spx", "dpx", "qpx", "cpx"]),
              help="With --vendor amd: the compute partition mode (cpx: 8 logical GPUs per MI300X).")
@click.option("--minors", metavar="M0,M1,...",
              help="Device minor numbers in NVML order: GPU K is /dev/nvidia<MK> (default: /dev/nvidiaK).")
@click.option("--mig", default=0, show_default=True, type=click.IntRange(0, 7), help="MIG instances per GPU.")
@click.option("--ib", "ib", default=0, type=click.IntRange(0, 64), metavar="N",
              help="Also N healthy InfiniBand ports mlx5_0:1 .. (a /sys/class/infiniband-like tree).")
@config_option
@_dir_option
def init(node: str | None, gpus: int, vendor: str, model: str | None, partition: str | None, minors: str | None,
         mig: int, ib: int, config_path: str | None, sim_dir: str | None) -> None:
    """Create NODE with healthy GPUs (replaces any earlier state)."""
    node = nodename.resolve(node)
    order = _int_list(minors, "--minors") if minors else None
    directory = _sim_dir(config_path, sim_dir)
    _not_someone_elses(simstate.state_path(directory, node), node)
    amd = vendor == "amd"
    if amd and (order or mig):
        raise click.UsageError("--minors and --mig are NVIDIA's (an AMD GPU's render nodes follow its index; "
                               "it is split by --partition)")
    model = model or ("MI300X" if amd else "H100")
    if (model.startswith("MI")) != amd:
        raise click.UsageError(f"--model {model} is {'not ' if amd else ''}an AMD GPU: give --vendor "
                               f"{'nvidia' if amd else 'amd'}")
    state = simstate.init(directory, node, gpus, model, minors=order, mig=mig, vendor=vendor, partition=partition)
    if ib:
        simstate.init_ib(directory, node, ib)
    logical = len(state["gpus"])
    made = (f"{gpus} simulated {model} GPUs" + (f" in {partition.upper()} mode: {logical} logical GPUs"
                                                if logical != gpus and partition else
                                                f" ({logical} dies)" if logical != gpus else ""))
    click.echo(f"{node}: {made}" + (f", {mig} MIG instances each" if mig else "")
               + (f", {ib} InfiniBand ports" if ib else ""))


def _not_someone_elses(path: str, node: str) -> None:
    """A node's simulated GPUs another user made (a shared [gpu] sim_dir: their rehearsal) are theirs:
    ``init`` does not replace them."""
    import os

    try:
        owner = os.stat(path).st_uid
    except FileNotFoundError:
        return
    if owner != os.geteuid():
        raise click.ClickException(f"{path}: {node}'s simulated GPUs belong to uid {owner}, not to you: not "
                                   "replaced (another user's rehearsal?); use a sim_dir of your own ([gpu] sim_dir "
                                   "in your config, or --sim-dir)")


def _int_list(text: str, option: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise click.BadParameter(f"expected numbers separated by commas, got {text!r}", param_hint=option) from None


@sim.command()
@node_option
@click.option("--gpu", "gpu", type=click.IntRange(0, 63), help="GPU index (or --ib for a port).")
@click.option("--ib", "ib", metavar="DEV:PORT", help="An InfiniBand port instead of a GPU, e.g. mlx5_0:1.")
@click.option("--state", "ib_state", type=click.Choice(["down", "up"]), help="With --ib: take the port down or up.")
@click.option("--counter", "ib_counter", metavar="NAME+=N", help="With --ib: add N to a counter (symbol_error+=200).")
@click.option("--flap", "ib_flap", is_flag=True, help="With --ib: a drop that came and went (link_downed + 1).")
@click.option("--rate", "ib_rate", type=click.IntRange(1, 3200), metavar="GBPS", help="With --ib: the trained rate.")
@click.option("--event", "ib_event", type=click.Choice(sorted(simstate.IB_EVENTS)),
              help="With --ib: its adapter logs this mlx5 kernel line.")
@click.option("--xid", type=click.IntRange(1, 1000), help="Record an XID event.")
@click.option("--instance", type=click.IntRange(0, 63), metavar="GI",
              help="The XID names this MIG GPU instance (GPU-I: in the kernel line), not the whole GPU.")
@click.option("--ecc-uncorrectable", type=click.IntRange(1), metavar="K", help="Add K uncorrectable ECC errors.")
@click.option("--row-remap-pending", is_flag=True)
@click.option("--row-remap-failure", is_flag=True)
@click.option("--lost", is_flag=True, help="GPU falls off the bus.")
@click.option("--pcie-width", type=click.IntRange(1, 32), metavar="W", help="Link trains at width W.")
@click.option("--temp", type=click.IntRange(0, 150), metavar="C", help="Temperature in Celsius.")
@click.option("--process", type=click.IntRange(1), metavar="PID", help="Leave a process on the GPU.")
@click.option("--nvlink-down", type=click.IntRange(0, 63), metavar="LINK", help="Take one NVLink down.")
@click.option("--recovery-action", type=click.Choice(["none", "gpu_reset", "node_reboot", "drain_p2p", "drain_and_reset"]),
              help="The driver's verdict (NVML's GPU recovery action).")
@click.option("--diag-failure", type=click.IntRange(1, 4), metavar="LEVEL",
              help="A latent fault NVML does not show: a DCGM diagnostic at LEVEL or deeper fails on this GPU.")
@click.option("--diag-status", type=click.Choice(list(simstate.DIAG_STATUSES)),
              help="With --diag-failure: what that test answers (default fail; warn and skip vouch for nothing).")
@click.option("--ras-ue", metavar="BLOCK", help="AMD: an uncorrectable error in this RAS block (umc: HBM ECC); "
              "the driver's line, the block's ue count.")
@click.option("--ras-deferred", metavar="BLOCK", help="AMD: a deferred error in this RAS block.")
@click.option("--poison", is_flag=True, help="AMD: a job consumes poisoned memory (the driver's line).")
@click.option("--ring-timeout", metavar="RING", help="AMD: this ring times out (gfx_0.0.0, sdma0, comp_1.0.0).")
@click.option("--driver-reset", type=click.Choice(["succeeded", "failed"]),
              help="AMD: the driver resets the GPU itself, and it comes back or not.")
@click.option("--bad-pages", type=click.IntRange(1), metavar="N",
              help="AMD: N more retired pages (at 128 the driver says the threshold is reached).")
@click.option("--reset-hang", type=click.FloatRange(0), metavar="S",
              help="nvidia-smi --gpu-reset on this GPU (the sim's stand-in) hangs S seconds before it acts.")
@click.option("--cleared-by", type=click.Choice(simstate.CLEARED_BY),
              help="What mends it: a GPU reset, a reboot, or never (a dead GPU). Default: NVIDIA's catalogue "
                   "(reset-class XIDs and a pending row remap: reset; XID 79 and a lost GPU: reboot; "
                   "a diagnostic failure: never).")
@config_option
@_dir_option
def inject(node: str | None, gpu: int | None, ib: str | None, ib_state: str | None, ib_counter: str | None,
           ib_flap: bool, ib_rate: int | None, ib_event: str | None, config_path: str | None, sim_dir: str | None,
           cleared_by: str | None, **fault) -> None:
    """Inject a fault on one simulated GPU (--gpu) or InfiniBand port (--ib)."""
    port_change = ib_state is not None or ib_counter is not None or ib_flap or ib_rate is not None or bool(ib_event)
    if ib is not None:
        if gpu is not None or any(v is not None and v is not False for v in fault.values()):
            raise click.UsageError("--ib goes with --state, --counter, --flap, --rate or --event only")
        if not port_change:
            raise click.UsageError("name a change of the port: --state, --counter, --flap, --rate or --event")
        node = nodename.resolve(node)
        counter = simstate.parse_counter(ib_counter) if ib_counter is not None else None
        done = simstate.inject_ib(_sim_dir(config_path, sim_dir), node, ib, state=ib_state, counter=counter,
                                  flap=ib_flap, rate_gbps=ib_rate, event=ib_event)
        click.echo(f"{node} {ib}: {done}")
        return
    if port_change:
        raise click.UsageError("--state, --counter, --flap, --rate and --event go with --ib DEV:PORT")
    if gpu is None:
        raise click.UsageError("name a GPU (--gpu) or an InfiniBand port (--ib)")
    if fault.get("instance") is not None and fault.get("xid") is None:
        raise click.UsageError("--instance goes with --xid")
    if fault.get("diag_status") is not None and fault.get("diag_failure") is None:
        raise click.UsageError("--diag-status goes with --diag-failure LEVEL")
    if not any(v is not None and v is not False for k, v in fault.items() if k not in ("instance", "diag_status")):
        raise click.UsageError("name a fault: --xid, --ecc-uncorrectable, --row-remap-pending, --row-remap-failure, "
                               "--lost, --pcie-width, --temp, --process, --nvlink-down, --diag-failure, "
                               "--reset-hang; on AMD GPUs --ras-ue, --ras-deferred, --poison, --ring-timeout, "
                               "--driver-reset or --bad-pages")
    node = nodename.resolve(node)
    state = simstate.inject(_sim_dir(config_path, sim_dir), node, gpu, cleared_by=cleared_by, **fault)
    mends = simstate.gpu_entry(state, gpu).get("cleared_by", {})
    what = ", ".join(f"{k.replace('_', '-')}={v}" if v is not True else k.replace("_", "-")
                     for k, v in fault.items() if v is not None and v is not False)
    by = sorted({mends[name] for name in simstate.fault_names(fault) if name in mends})
    click.echo(f"{node} gpu{gpu}: injected {what}" + (f" (cleared by: {', '.join(by)})" if by else ""))


@sim.command()
@node_option
@click.option("--gpu", "gpu", required=True, type=click.IntRange(0, 63), help="GPU index.")
@config_option
@_dir_option
def reset(node: str | None, gpu: int, config_path: str | None, sim_dir: str | None) -> None:
    """Reset one simulated GPU, as nvidia-smi --gpu-reset would (exit 1 when it does not come back)."""
    node = nodename.resolve(node)
    try:
        simstate.reset(_sim_dir(config_path, sim_dir), node, gpu)
    except simstate.ResetFailed as exc:
        click.echo(f"slurm-hooks: {exc}", err=True)
        raise SystemExit(1) from None
    click.echo(f"{node} gpu{gpu}: reset")


@sim.command()
@node_option
@config_option
@_dir_option
def reboot(node: str | None, config_path: str | None, sim_dir: str | None) -> None:
    """Reboot a simulated node: new boot id, empty kernel log, faults a reboot mends gone."""
    node = nodename.resolve(node)
    state = simstate.reboot(_sim_dir(config_path, sim_dir), node)
    click.echo(f"{node}: rebooted (boot {state['boot']})")


@sim.command()
@node_option
@click.option("--gpu", "gpu", type=click.IntRange(0, 63), help="Only this GPU (default: all).")
@config_option
@_dir_option
def clear(node: str | None, gpu: int | None, config_path: str | None, sim_dir: str | None) -> None:
    """Make simulated GPUs healthy again."""
    node = nodename.resolve(node)
    simstate.clear(_sim_dir(config_path, sim_dir), node, gpu)
    click.echo(f"{node}: {'gpu' + str(gpu) if gpu is not None else 'all GPUs'} healthy")


@sim.command(name="set")
@node_option
@click.option("--diag-seconds", type=click.FloatRange(0), required=True, metavar="S",
              help="Every simulated DCGM diagnostic on NODE takes S seconds (default: scaled down per level).")
@config_option
@_dir_option
def set_(node: str | None, diag_seconds: float, config_path: str | None, sim_dir: str | None) -> None:
    """Set how the simulated node behaves (not a fault of one GPU)."""
    node = nodename.resolve(node)
    simstate.set_diag_seconds(_sim_dir(config_path, sim_dir), node, diag_seconds)
    click.echo(f"{node}: DCGM diagnostics take {diag_seconds:g}s")


@sim.command()
@click.option("--dir", "directory", required=True, metavar="DIR", help="Where to write them.")
@config_option
@_dir_option
def tools(directory: str, config_path: str | None, sim_dir: str | None) -> None:
    """Write stand-ins for nvidia-smi, systemctl, dcgmi, amd-smi and rvs that act on the simulated GPUs
    (point [repair] nvidia_smi / systemctl and [dcgm] dcgmi / rvs at them to rehearse repairs and sweeps;
    an AMD node's reset runs amd-smi's stand-in by itself)."""
    from slurm_hooks.probes import simtools

    for tool, path in simtools.install(directory, os.path.abspath(_sim_dir(config_path, sim_dir))).items():
        click.echo(f"{tool}: {path}")


@sim.command()
@node_option
@click.option("--gpu", "gpu", type=click.IntRange(0, 63), help="Only this GPU's slot (default: every GPU).")
@config_option
@_dir_option
def replace(node: str | None, gpu: int | None, config_path: str | None, sim_dir: str | None) -> None:
    """Put new hardware in a GPU's slot: healthy, new UUID and serial (what ends a [replace])."""
    node = nodename.resolve(node)
    state = simstate.replace(_sim_dir(config_path, sim_dir), node, gpu)
    for g in state["gpus"]:
        if gpu is None or g["index"] == gpu:
            click.echo(f"{node} gpu{g['index']}: replaced, now {g['uuid']} (serial {g['serial']})")


@sim.command()
@node_option
@json_option
@config_option
@_dir_option
def show(node: str | None, as_json: bool, config_path: str | None, sim_dir: str | None) -> None:
    """Show the simulated state of NODE."""
    node = nodename.resolve(node)
    state = simstate.read(_sim_dir(config_path, sim_dir), node)
    if as_json:
        click.echo(json.dumps(state, indent=1))
        return
    mode = f" ({state['partition'].upper()})" if state.get("partition") else ""
    click.echo(f"{node}: {len(state['gpus'])} x {state.get('model', '?')}{mode}")
    stopped = sorted(n for n, v in state.get("services", {}).items() if v != "active")
    if stopped:
        click.echo(f"  services stopped: {', '.join(stopped)}")
    for g in state["gpus"]:
        faults = []
        if g.get("lost"):
            faults.append("LOST")
        faults += [f"XID {x['code']}" for x in g.get("xids", [])]
        if g.get("ecc_volatile_uncorrectable"):
            faults.append(f"ECC {g['ecc_volatile_uncorrectable']}")
        if g.get("row_remap_pending"):
            faults.append("row-remap-pending")
        if g.get("row_remap_failure"):
            faults.append("row-remap-failure")
        if g.get("pcie_width") != g.get("pcie_width_max"):
            faults.append(f"PCIe x{g.get('pcie_width')}")
        if g.get("processes"):
            faults.append(f"{len(g['processes'])} process(es)")
        if g.get("diag_failure"):
            said = {"Warn": "warns in", "Skip": "skips"}.get(g["diag_failure"].get("status", "Fail"), "fails")
            faults.append(f"latent: {said} DCGM L{g['diag_failure']['level']} {g['diag_failure']['test']}")
        if g.get("reset_hang_s"):
            faults.append(f"reset hangs {g['reset_hang_s']:g}s")
        for block, (ue, _) in sorted((g.get("ras") or {}).items()):
            if ue:
                faults.append(f"{block} ue {ue}")
        if g.get("bad_pages"):
            faults.append(f"{g['bad_pages']} bad pages")
        where = f" {g['pci_bus_id']}" + (f" part {g['partition']}" if g.get("partition") is not None else "") \
            if state.get("vendor") == "amd" else ""
        temp = f"{g.get('temperature_c')}C " if g.get("temperature_c") is not None else ""
        click.echo(f"  gpu{g['index']} {g['uuid']}{where} {temp}{', '.join(faults) or 'healthy'}")
