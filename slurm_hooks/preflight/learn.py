"""``validate --learn``: what a healthy node has, as the ``[expect]`` (or ``[groups.NAME]``) lines
that make every other node of its kind compare against it.

Typing eight port names and a rate per SKU by hand is how a site ends up checking nothing (no
expectation: the port checks judge every port present, never a missing one). Learning reads
the node once: the GPUs the probe sees and the InfiniBand/RoCE ports under the ``[links]`` tree,
and prints TOML to paste; beside them, floors for the fabric tests from a healthy run's own
figures (``[isolate] min_busbw_gbps`` from an isolate run that passed, the sweep's per-node
fabric floors from this node's own sweep records), or a note saying no
such run exists (a floor is never invented). It never rewrites the admin's config: a file with comments, groups
and a review history is theirs to edit.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence

from slurm_hooks.models import GpuSnapshot

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:
    from typing import Any


def _common(values: Sequence[Any]) -> Any:
    """The one value every GPU shares; ``None`` when they differ or one is unknown."""
    first = values[0] if values else None
    return first if first is not None and all(v == first for v in values) else None


def learn_gpus(gpus: Sequence[GpuSnapshot]) -> tuple[dict[str, Any], list[str]]:
    """(expectations, notes) from the GPUs: their count and, where every GPU agrees, model, PCIe
    generation and width (the maxima: an idle GPU trains its link down) and active NVLinks. A GPU
    lost or needing a reset is no model to learn from: a note, and it is left out of the count."""
    notes = [f"GPU {g.index} is {'lost' if g.lost else 'waiting for a reset'}: not counted; learn again once "
             "it is healthy" for g in gpus if g.lost or g.needs_reset]
    good = [g for g in gpus if not (g.lost or g.needs_reset)]
    values: dict[str, Any] = {"gpus": len(good)}
    if not good:
        return values, notes
    model = _common([g.model or None for g in good])
    if model:
        values["model"] = model
    for key, field in (("pcie_gen", "pcie_gen_max"), ("pcie_width", "pcie_width_max")):
        value = _common([getattr(g, field) for g in good])
        if value is not None:
            values[key] = value
    links = _common([None if g.nvlinks is None else sum(1 for link in g.nvlinks if link.active) for g in good])
    if links:
        values["nvlinks"] = links
    return values, notes


def learn_ports(ports: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Any], list[str]]:
    """(expectations, notes) from ``probes.ib.read_ports``: for the InfiniBand ports and, apart, the
    Ethernet (RoCE) ones, how many are up and the slowest rate among them (a faster port passes a
    lower expectation). Apart, because a storage bond at 200 Gb/s beside eight NDR ports at 400
    would otherwise lower the compute ports' rate to 200 and let a port trained down to 2X pass.
    A port that is down is no expectation: a note."""
    if not ports:
        return {}, ["no InfiniBand/RoCE port under the [links] tree: ib_ports and ib_rate_gbps left unset"]
    values: dict[str, Any] = {}
    notes: list[str] = []
    for prefix, kind, mine in (("ib", "IB", [p for p in ports if p.get("link_layer") != "Ethernet"]),
                               ("roce", "RoCE", [p for p in ports if p.get("link_layer") == "Ethernet"])):
        if not mine:
            continue
        up = [p for p in mine if p.get("state") == "ACTIVE" and p.get("phys_state") == "LinkUp"]
        notes += [f"{kind} {p['device']} port {p['port']} is {p.get('state') or '?'}/{p.get('phys_state') or '?'}: "
                  f"not counted; learn again once it is up, or leave {prefix}_ports below the ports the node has"
                  for p in mine if p not in up]
        values[f"{prefix}_ports"] = len(up)
        rates = [p["rate_gbps"] for p in up if p.get("rate_gbps")]
        if rates:
            values[f"{prefix}_rate_gbps"] = int(min(rates))
            if len(set(rates)) > 1:
                notes.append(f"{kind} ports run at {', '.join(f'{r:g}' for r in sorted(set(rates)))} Gb/s: the "
                             "slowest is expected of every one")
    return values, notes


#: A learned floor is this share of the lowest figure a healthy run measured: every test of that run
#: passes it twice over, so a healthy node's ordinary spread does not fail it.
FLOOR_SHARE = 0.5


def floor_of(figure: float) -> float:
    """The floor proposed for a healthy ``figure``: :data:`FLOOR_SHARE` of it, to 3 significant digits."""
    return float(f"{figure * FLOOR_SHARE:.3g}")


def learn_isolate(runs: Sequence[tuple[str, Mapping[str, Any]]]) -> tuple[dict[str, Any], list[str]]:
    """(``[isolate]`` values, notes) from isolate's evidence files, newest first: ``min_busbw_gbps``
    from the newest run that ended ``ok`` (every test passed), as :data:`FLOOR_SHARE` of its lowest
    test's bus bandwidth, each figure named. No such run: a note, and no figure (none is invented)."""
    for path, run in runs:
        if not isinstance(run, Mapping) or run.get("verdict") != "ok":
            continue
        measured = []
        for t in run.get("tests") or ():
            bw = t.get("bandwidth") if isinstance(t, Mapping) else None
            if isinstance(bw, (int, float)) and bw > 0 and t.get("passed") and t.get("ran", True) \
                    and len(t.get("nodes") or ()) >= 2:
                measured.append(float(bw))
        if not measured:
            continue
        low, mid = min(measured), sorted(measured)[len(measured) // 2]
        floor = floor_of(low)
        return {"min_busbw_gbps": floor}, [
            f"[isolate] min_busbw_gbps {floor:g}: {FLOOR_SHARE:.0%} of the lowest bus bandwidth ({low:g} GB/s; median {mid:g}) of "
            f"the {len(measured)} test(s) of the healthy isolate run {path}"]
    where = ", ".join(sorted({os.path.dirname(p) for p, _ in runs})) or "its output dir"
    return {}, [f"no isolate run that passed every test in {where}: [isolate] min_busbw_gbps not proposed "
                "(run `slurm-hooks isolate` on healthy nodes, then learn again)"]


def learn_sweep(records: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Any], list[str]]:
    """(``[sweep]`` values, notes) from this node's sweep-test audit records: the per-node fabric
    tests' newest healthy figures (``passed`` or ``measured``; a failed or unrun test is none) as
    floors at :data:`FLOOR_SHARE`: ``nccl_nics_busbw_gbps`` from the NCCL test through the NICs,
    ``ib_write_bw_gbps`` from the slowest HCA's newest loopback. None measured: a note, no figure."""
    newest: dict[str, Mapping[str, Any]] = {}
    for r in records:
        if r.get("action") != "sweep-test" or r.get("result") not in ("passed", "measured"):
            continue
        if not isinstance(r.get("figure"), (int, float)) or r["figure"] <= 0:
            continue
        test = str(r.get("test", ""))
        if test not in newest or r.get("ts", 0) >= newest[test].get("ts", 0):
            newest[test] = r
    values: dict[str, Any] = {}
    notes: list[str] = []
    when = lambda r: time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(r.get("ts", 0)))  # noqa: E731
    nccl = newest.get("nccl-nics")
    if nccl:
        values["nccl_nics_busbw_gbps"] = floor_of(nccl["figure"])
        notes.append(f"[sweep] nccl_nics_busbw_gbps {values['nccl_nics_busbw_gbps']:g}: {FLOOR_SHARE:.0%} of the "
                     f"busbw through the NICs ({nccl['figure']:g} GB/s) of this node's sweep at {when(nccl)}")
    else:
        notes.append("no healthy all_reduce_perf through the NICs in this node's sweep records: [sweep] "
                     "nccl_nics_busbw_gbps not proposed")
    hcas = {t: r for t, r in newest.items() if t.startswith("ib_write_bw ")}
    if hcas:
        test, low = min(hcas.items(), key=lambda kv: kv[1]["figure"])
        values["ib_write_bw_gbps"] = floor_of(low["figure"])
        notes.append(f"[sweep] ib_write_bw_gbps {values['ib_write_bw_gbps']:g}: {FLOOR_SHARE:.0%} of the slowest of "
                     f"{len(hcas)} HCA(s)' GPU-direct loopback ({test.split()[-1]}, {low['figure']:g} Gb/s) of this "
                     f"node's sweep at {when(low)}")
    else:
        notes.append("no healthy ib_write_bw loopback in this node's sweep records: [sweep] ib_write_bw_gbps not "
                     "proposed")
    return values, notes


def isolate_runs(directory: str, limit: int = 50) -> list[tuple[str, Any]]:
    """isolate's evidence files (``run-*.json``) in ``directory``, newest first (at most ``limit``)."""
    from slurm_hooks import fsutil

    try:
        names = [n for n in os.listdir(directory) if n.startswith("run-") and n.endswith(".json")]
    except OSError:
        return []
    paths = sorted((os.path.join(directory, n) for n in names), key=_mtime, reverse=True)[:limit]
    return [(p, fsutil.read_json(p, missing=None, error=None)) for p in paths]


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


def snippet(node: str, section: str, values: Mapping[str, Any], notes: Sequence[str], config_path: str = "",
            now: float | None = None, tables: Mapping[str, Mapping[str, Any]] | None = None) -> str:
    """The TOML to paste: one table (and ``tables``' non-empty ones after it), keys in a fixed order,
    the notes as comments above them."""
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(time.time() if now is None else now))
    where = f" into {config_path}" if config_path else ""
    lines = [f"# learned by `slurm-hooks validate --learn` on {node}, {when}: paste{where}, replacing these keys",
             *(f"# note: {n}" for n in notes)]
    for name, table in {section: values, **{k: v for k, v in (tables or {}).items() if v}}.items():
        lines.append(f"[{name}]")
        lines += [f"{key} = {json.dumps(value)}" for key, value in table.items()]
    return "\n".join(lines) + "\n"



def section_for(group: str) -> str:
    """The table to paste into: the node's group (``Config.group_for``), else ``[expect]``."""
    return "expect" if group == "default" else f"groups.{group}"
