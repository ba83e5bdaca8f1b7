"""``slurm-hooks validate``: the admin's preflight. Exit 0 when nothing FAILs, 1 otherwise."""

from __future__ import annotations

import json

import click

from slurm_hooks.commands.options import config_option, json_output, node


@click.command()
@config_option
@click.option("--slurm-conf", "slurm_conf", metavar="PATH",
              help="slurm.conf to judge (default: $SLURM_CONF, then /etc/slurm/slurm.conf and the configless caches).")
@json_output("A JSON list of {check, status, message, fix, where}.")
@node("Judge GPUs and Gres for this node (default: $SLURMD_NODENAME or short hostname).")
@click.option("--learn", is_flag=True,
              help="Instead: print the [expect] (or [groups.NAME]) lines this healthy node passes (GPU count, "
                   "model, PCIe, NVLinks, InfiniBand ports and rate) and the fabric tests' floors a healthy "
                   "run measured ([isolate] min_busbw_gbps; [sweep]'s per-node fabric floors), to paste into the "
                   "config. Writes nothing.")
def validate(config_path: str | None, slurm_conf: str | None, as_json: bool, node: str | None,
             learn: bool = False) -> int:
    """Check slurm.conf, our config, the GPUs, scontrol and (with [bridge]) Kubernetes access."""
    from slurm_hooks import preflight
    from slurm_hooks.slurm import nodename

    node = nodename.resolve(node)
    if learn:
        return _learn(config_path, node, as_json)
    results = preflight.run(config_path, slurm_conf, node)
    results += _gpu_map(config_path, node, slurm_conf)
    results += _links(config_path, node)
    if as_json:
        click.echo(json.dumps([r.to_dict() for r in results], indent=1))
    else:
        for r in results:
            click.echo(r.line())
    return 0 if preflight.passed(results) else 1


def _learn(config_path: str | None, node: str, as_json: bool) -> int:
    """What this node has, as TOML to paste (preflight.learn); exit 1 when its GPUs cannot be read."""
    from slurm_hooks import engine
    from slurm_hooks.preflight import learn
    from slurm_hooks.probes import ib
    from slurm_hooks.remedy.wiring import Wiring

    w = Wiring.load(config_path, node)
    snap = engine.take_snapshot(w.probe(), node, w.config.gpu.probe_timeout)
    if snap.error is not None:
        click.echo(f"validate --learn: the GPUs of {node} cannot be read ({snap.error}): nothing learned", err=True)
        return 1
    values, notes = learn.learn_gpus(snap.gpus)
    more, port_notes = learn.learn_ports(ib.read_ports(ib.from_config(w.config, node).root))
    values.update(more)
    section = learn.section_for(w.config.group_for(node))
    isolate, isolate_notes = learn.learn_isolate(learn.isolate_runs(w.config.isolate.output_dir
                                                                    or w.state_path("isolate")))
    sweep, sweep_notes = learn.learn_sweep(list(w.audit.history()))
    tables = {"isolate": isolate, "sweep": sweep}
    notes += port_notes + isolate_notes + sweep_notes
    if as_json:
        click.echo(json.dumps({"section": section, "values": values, "tables": tables, "notes": notes}, indent=1))
    else:
        click.echo(learn.snippet(node, section, values, notes, w.config.path or "", tables=tables), nl=False)
    return 0


def _links(config_path: str | None, node: str) -> list:
    """The node's links as the health check gathers them: what cannot be judged on this boot (a
    counter saturated or refused) and a counter memory that cannot be written, every time; nothing
    for a node without ports or a config that cannot be read (its own check FAILs)."""
    from slurm_hooks.checks import links
    from slurm_hooks.errors import SlurmHooksError
    from slurm_hooks.preflight.results import Result, Status
    from slurm_hooks.probes import ib

    try:
        from slurm_hooks import config as config_mod

        cfg = config_mod.load(config_path)
        ports = ib.from_config(cfg, node)()
    except (SlurmHooksError, OSError):
        return []
    if ports is None:
        return []
    said = links.standing(ports)
    if not said:
        kinds = [p.kind for p in ports if p.present]
        return [Result("links", Status.PASS, f"{kinds.count('IB')} InfiniBand and {kinds.count('RoCE')} RoCE "
                                             "port(s): every counter can be judged")]
    return [Result("links", Status.WARN, line, fix) for line, fix in said]


def _gpu_map(config_path: str | None, node: str, slurm_conf: str | None) -> list:
    """How Slurm's GPU numbers map to NVML's on this node (hooks.gpumap), one line per GRES index,
    and where gres.conf and ``slurmd -G`` disagree; nothing when the config or GPUs cannot be read
    (their own checks FAIL)."""
    import os

    from slurm_hooks import engine
    from slurm_hooks.errors import SlurmHooksError
    from slurm_hooks.preflight.results import Result, Status
    from slurm_hooks.remedy import gpumap
    from slurm_hooks.remedy.wiring import Wiring
    from slurm_hooks.slurm import gres

    try:
        w = Wiring.load(config_path, node)
        snap = engine.take_snapshot(w.probe(), node, w.config.gpu.probe_timeout)
    except (SlurmHooksError, ImportError):
        return []
    if snap.error is not None:
        return []
    gmap, _ = gpumap.read(w, snap, slurm_conf=slurm_conf)
    if not gmap.known:
        return [Result("gpu-map", Status.WARN, f"{gmap.source}: {gmap.problem}",
                       "a GPU fault requeues every GPU job on this node until the map is known: fix gres.conf, "
                       "or set [gpu] gres_source = \"slurmd\" (AutoDetect=nvml, MIG)", w.config.path or "")]
    moved = sum(1 for s in gmap.slots if s.gpu != s.gres)
    out = [Result("gpu-map", Status.PASS, f"{gmap.source}: {len(gmap.slots)} GRES index(es)"
                  + (f", {moved} numbered differently by Slurm and NVML (the map ties them)" if moved else ""))]
    out += [Result("gpu-map", Status.PASS, line) for line in gmap.describe()]
    other = "slurmd" if w.config.gpu.gres_source == "gres.conf" else "gres.conf"
    if other == "slurmd" and not (os.access(w.config.gpu.slurmd, os.X_OK) and os.geteuid() == 0):
        return out  # slurmd -G needs root and the binary; gres.conf's map stands alone
    second, _ = gpumap.read(w, snap, other, slurm_conf)
    if second.known:
        diff = gpumap.differences(gmap, second)
        if diff:
            out.append(Result("gpu-map", Status.FAIL, f"{gmap.source} and {second.source} disagree: "
                              + "; ".join(diff[:4]),
                              f"slurmd numbers the GPUs as {second.source} says: set [gpu] gres_source accordingly",
                              w.config.path or ""))
        else:
            out.append(Result("gpu-map", Status.PASS, f"{second.source} agrees"))
    elif second.problem == gres.NO_LIST:  # 24.11.x prints none: a known gap, nothing to mend
        out.append(Result("gpu-map", Status.PASS, f"{second.source} not compared: {second.problem}"))
    else:  # slurmd ignores every GPU, cannot start, or the other file is unreadable: not a pass
        out.append(Result("gpu-map", Status.WARN, f"{second.source} not compared: {second.problem}",
                          f"see why {second.source} gives no GPU list for {node} and mend it", w.config.path or ""))
    return out
