"""Simulated GPUs: a JSON state file per node under ``[gpu] sim_dir``.

This is how tests and demos run without GPUs, and how admins rehearse a fault
(``slurm-hooks sim inject --node n1 --gpu 3 --xid 79``) before trusting the
remediation with a real cluster. Writes are atomic and serialised by a lock.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
import uuid as uuidlib
from typing import Any, Callable

from slurm_hooks import fsutil
from slurm_hooks.errors import SimStateError
from slurm_hooks.models import GpuSnapshot, NodeSnapshot, XidEvent, gpu_from_dict

STATE_VERSION = 1

#: model -> (name as NVML reports it, PCIe gen, PCIe width, NVLink count, power limit W)
MODELS: dict[str, tuple[str, int, int, int, int]] = {
    "H100": ("NVIDIA H100 80GB HBM3", 5, 16, 18, 700),
    "H200": ("NVIDIA H200", 5, 16, 18, 700),
    "A100": ("NVIDIA A100-SXM4-80GB", 4, 16, 12, 400),
    "B200": ("NVIDIA B200", 6, 16, 18, 1000),
    "L40S": ("NVIDIA L40S", 4, 16, 0, 350),
}


def state_path(sim_dir: str, node: str) -> str:
    if not node or "/" in node or node.startswith("."):
        raise SimStateError(f"invalid node name {node!r}")
    return os.path.join(sim_dir, f"{node}.json")


def healthy_gpu(index: int, node: str, model: str) -> dict[str, Any]:
    name, gen, width, links, power = MODELS[model]
    uid = uuidlib.uuid5(uuidlib.NAMESPACE_DNS, f"{node}.gpu{index}.slurm-hooks.sim")
    return {
        "index": index,
        "uuid": f"GPU-{uid}",
        "serial": f"SIM{uid.int % 10**10:010d}",
        "pci_bus_id": f"00000000:{0x18 + index * 0x10:02X}:00.0",
        "model": name,
        "lost": False,
        "needs_reset": False,
        "xids": [],
        "ecc_volatile_uncorrectable": 0,
        "ecc_aggregate_uncorrectable": 0,
        "retired_pages_pending": False,
        "row_remap_pending": False,
        "row_remap_failure": False,
        "pcie_gen": gen,
        "pcie_gen_max": gen,
        "pcie_width": width,
        "pcie_width_max": width,
        "nvlinks": [{"link": i, "active": True, "crc_errors": 0, "replay_errors": 0, "recovery_errors": 0} for i in range(links)],
        "temperature_c": 34,
        "power_w": 70.0,
        "power_limit_w": float(power),
        "throttle_reasons": [],
        "persistence_mode": True,
        "fabric_state": "completed" if links else None,
        "recovery_action": "none",
        "processes": [],
        "memory_used_mib": 0,
        "errors": [],
    }


def init(sim_dir: str, node: str, gpus: int = 8, model: str = "H100") -> dict[str, Any]:
    if model not in MODELS:
        raise SimStateError(f"unknown model {model!r} (known: {', '.join(MODELS)})")
    if not 0 < gpus <= 64:
        raise SimStateError(f"--gpus must be 1..64, got {gpus}")
    state = {
        "version": STATE_VERSION,
        "node": node,
        "model": model,
        "driver_version": "sim-570.0",
        # Event numbers keep growing across re-inits, so an event key is never reused.
        "seq": _next_seq_base(sim_dir, node),
        "gpus": [healthy_gpu(i, node, model) for i in range(gpus)],
    }
    path = state_path(sim_dir, node)
    with fsutil.locked(path):
        fsutil.atomic_write(path, json.dumps(state, indent=1))
    return state


def _next_seq_base(sim_dir: str, node: str) -> int:
    try:
        previous = int(read(sim_dir, node).get("seq", 0))
    except (SimStateError, TypeError, ValueError):
        previous = 0
    return max(previous, int(time.time() * 1000))


def read(sim_dir: str, node: str) -> dict[str, Any]:
    path = state_path(sim_dir, node)
    try:
        with open(path, encoding="utf-8") as fh:
            state = json.load(fh)
    except FileNotFoundError:
        raise SimStateError(f"{path}: no simulated GPUs for node {node!r} (run: slurm-hooks sim init --node {node})") from None
    except (OSError, ValueError) as exc:
        raise SimStateError(f"{path}: corrupt sim state: {exc}") from None
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION or not isinstance(state.get("gpus"), list):
        raise SimStateError(f"{path}: corrupt sim state: expected version {STATE_VERSION} with a 'gpus' list")
    return state


def update(sim_dir: str, node: str, change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Read-modify-write the node's state under a lock; atomic on disk."""
    path = state_path(sim_dir, node)
    with fsutil.locked(path):
        state = read(sim_dir, node)
        change(state)
        fsutil.atomic_write(path, json.dumps(state, indent=1))
    return state


def gpu_entry(state: dict[str, Any], index: int) -> dict[str, Any]:
    for gpu in state["gpus"]:
        if gpu.get("index") == index:
            return gpu
    raise SimStateError(f"node {state.get('node')!r} has no GPU {index} (has {len(state['gpus'])})")


def inject(sim_dir: str, node: str, gpu: int, **fault: Any) -> dict[str, Any]:
    """Apply one or more faults to one GPU. Keys as the ``sim inject`` options."""

    def change(state: dict[str, Any]) -> None:
        entry = gpu_entry(state, gpu)
        if fault.get("xid") is not None:
            state["seq"] = int(state.get("seq", 0)) + 1
            entry["xids"].append(
                {"code": int(fault["xid"]), "gpu": gpu, "uuid": entry.get("uuid", ""),
                 "pci_bus_id": entry["pci_bus_id"], "ts": time.time(),
                 "message": "injected by slurm-hooks sim", "source": "sim", "seq": state["seq"]}
            )
        if fault.get("ecc_uncorrectable") is not None:
            entry["ecc_volatile_uncorrectable"] = int(entry.get("ecc_volatile_uncorrectable") or 0) + fault["ecc_uncorrectable"]
            entry["ecc_aggregate_uncorrectable"] = int(entry.get("ecc_aggregate_uncorrectable") or 0) + fault["ecc_uncorrectable"]
        if fault.get("row_remap_pending"):
            entry["row_remap_pending"] = True
        if fault.get("row_remap_failure"):
            entry["row_remap_failure"] = True
        if fault.get("recovery_action") is not None:
            entry["recovery_action"] = str(fault["recovery_action"])
        if fault.get("lost"):
            entry["lost"] = True
        if fault.get("pcie_width") is not None:
            entry["pcie_width"] = int(fault["pcie_width"])
        if fault.get("temp") is not None:
            entry["temperature_c"] = int(fault["temp"])
        if fault.get("process") is not None:
            entry["processes"].append({"pid": int(fault["process"]), "used_memory_mib": 1024, "name": "python"})
            entry["memory_used_mib"] = int(entry.get("memory_used_mib") or 0) + 1024
        if fault.get("nvlink_down") is not None:
            links = [link for link in entry.get("nvlinks") or [] if link["link"] == fault["nvlink_down"]]
            if not links:
                raise SimStateError(f"GPU {gpu} has no NVLink {fault['nvlink_down']} "
                                    f"(has {len(entry.get('nvlinks') or [])})")
            for link in links:
                link["active"] = False

    return update(sim_dir, node, change)


def clear(sim_dir: str, node: str, gpu: int | None = None) -> dict[str, Any]:
    """Put one GPU (or all) back to healthy, keeping identity and the event counter."""

    def change(state: dict[str, Any]) -> None:
        model = state.get("model", "H100")
        for i, entry in enumerate(state["gpus"]):
            if gpu is None or entry.get("index") == gpu:
                state["gpus"][i] = healthy_gpu(entry["index"], node, model)

    if gpu is not None:
        gpu_entry(read(sim_dir, node), gpu)
    return update(sim_dir, node, change)


class SimProbe:
    name = "sim"

    def __init__(self, sim_dir: str, node: str):
        self.sim_dir = sim_dir
        self.node = node

    def snapshot(self) -> NodeSnapshot:
        try:
            state = read(self.sim_dir, self.node)
            gpus = tuple(gpu_from_dict(g) for g in state["gpus"])
        except SimStateError as exc:
            return NodeSnapshot(self.node, self.name, taken_at=time.time(), error=str(exc))
        except (TypeError, ValueError, KeyError) as exc:
            path = state_path(self.sim_dir, self.node)
            return NodeSnapshot(self.node, self.name, taken_at=time.time(), error=f"{path}: corrupt sim state: {exc}")
        gpus = tuple(_as_seen(g) for g in gpus)
        return NodeSnapshot(self.node, self.name, gpus=gpus, taken_at=time.time(),
                            driver_version=state.get("driver_version", ""))


def events_of(gpu: dict[str, Any]) -> list[XidEvent]:
    """One GPU entry's injected XIDs, each naming its GPU (state files from before UUIDs were
    written into events get the GPU's)."""
    return [XidEvent(**{"uuid": gpu.get("uuid", ""), **x}) for x in gpu.get("xids", ())]


def _as_seen(gpu: GpuSnapshot) -> GpuSnapshot:
    """Events carry their GPU's UUID; a lost GPU answers nothing (NVML returns GPU_IS_LOST for every field)."""
    if any(x.uuid != gpu.uuid for x in gpu.xids):
        gpu = dataclasses.replace(gpu, xids=tuple(dataclasses.replace(x, uuid=x.uuid or gpu.uuid) for x in gpu.xids))
    if not gpu.lost:
        return gpu
    return GpuSnapshot(index=gpu.index, uuid=gpu.uuid, pci_bus_id=gpu.pci_bus_id, model=gpu.model, lost=True,
                       xids=gpu.xids, errors=(("*", "GPU is lost (NVML_ERROR_GPU_IS_LOST)"),))
