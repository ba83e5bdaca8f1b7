"""Simulated GPUs: a JSON state file per node under ``[gpu] sim_dir``.

This is how tests and demos run without GPUs, and how admins rehearse a fault
(``slurm-hooks sim inject --node n1 --gpu 3 --xid 79``) before trusting the
remediation with a real cluster. Writes are atomic and serialised by a lock.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable

from slurm_hooks import fsutil, values
from slurm_hooks.errors import SimStateError
from slurm_hooks.models import KERNEL_LOG, Action, GpuSnapshot, NodeSnapshot, XidEvent, gpu_from_dict

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing (~3 ms of each start)
if TYPE_CHECKING:
    from typing import Any

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


def healthy_gpu(index: int, node: str, model: str, minor: int | None = None, mig: int = 0,
                generation: int = 0) -> dict[str, Any]:
    """GPU ``index`` as NVML enumerates it; its device file is /dev/nvidia<minor> (``index`` unless
    told otherwise); ``mig``: that many MIG instances (GPU instance ids 1..mig); ``generation`` > 0:
    the hardware put in its place by the ``generation``-th replacement (new UUID and serial, same
    slot, PCI bus id and device file)."""
    import uuid as uuidlib  # here: uuid imports platform, ~3 ms the snapshot does not need

    name, gen, width, links, power = MODELS[model]
    swap = f".{generation}" if generation else ""
    uid = uuidlib.uuid5(uuidlib.NAMESPACE_DNS, f"{node}.gpu{index}{swap}.slurm-hooks.sim")
    return {
        **({"generation": generation} if generation else {}),
        "index": index,
        "uuid": f"GPU-{uid}",
        "minor": index if minor is None else minor,
        "mig": [{"uuid": f"MIG-{uuidlib.uuid5(uid, f'gi{gi}')}", "gi": gi, "ci": 0} for gi in range(1, mig + 1)],
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


#: Who makes the simulated GPUs: NVIDIA's (MODELS) or AMD Instinct (:mod:`slurm_hooks.probes.sim_amd`).
VENDORS = ("nvidia", "amd")


def init(sim_dir: str, node: str, gpus: int = 8, model: str = "H100", minors: list[int] | None = None,
         mig: int = 0, vendor: str = "nvidia", partition: str | None = None) -> dict[str, Any]:
    """A node of ``gpus`` healthy GPUs. ``minors``: GPU K's device file is /dev/nvidia<minors[K]>
    (default K: NVML and the device files agree); ``mig``: MIG instances per GPU (0: MIG off).
    ``vendor`` "amd": ``gpus`` AMD Instinct boards (``model`` MI300X unless an AMD one is named),
    each ``partition`` ("cpx": 8) logical GPUs (an MI250X: its two dies)."""
    if vendor == "amd":
        return _init_amd(sim_dir, node, gpus, model if model in _amd().MODELS else "MI300X", partition)
    if vendor not in VENDORS:
        raise SimStateError(f"--vendor must be one of {', '.join(VENDORS)}, not {vendor!r}")
    if partition is not None:
        raise SimStateError("--partition goes with --vendor amd (NVIDIA GPUs are split by --mig)")
    if model not in MODELS:
        raise SimStateError(f"unknown model {model!r} (known: {', '.join(MODELS)})")
    if not 0 < gpus <= 64:
        raise SimStateError(f"--gpus must be 1..64, got {gpus}")
    if minors is not None and (len(minors) != gpus or len(set(minors)) != gpus or
                               not all(0 <= m <= 254 for m in minors)):
        raise SimStateError(f"--minors must name {gpus} distinct minor numbers 0..254, got {minors}")
    if not 0 <= mig <= 7:
        raise SimStateError(f"--mig must be 0..7 instances per GPU, got {mig}")
    state = {
        "version": STATE_VERSION,
        "node": node,
        "model": model,
        "driver_version": "sim-570.0",
        # Event numbers keep growing across re-inits, so an event key is never reused.
        "seq": _next_seq_base(sim_dir, node),
        "boot": _new_boot(),
        "gpus": [healthy_gpu(i, node, model, None if minors is None else minors[i], mig) for i in range(gpus)],
    }
    return _write_new(sim_dir, node, state)


def _write_new(sim_dir: str, node: str, state: dict[str, Any]) -> dict[str, Any]:
    path = state_path(sim_dir, node)
    with fsutil.locked(path):
        fsutil.atomic_write(path, json.dumps(state, indent=1))
    _remove_ib(sim_dir, node)  # a fresh node has no ports until `sim init --ib N` lays them
    _new_kernel_log(sim_dir, node)
    if state.get("vendor") == "amd":
        _amd().write_sysfs(sim_dir, node, state)
    return state


def _amd():
    from slurm_hooks.probes import sim_amd

    return sim_amd


def _init_amd(sim_dir: str, node: str, gpus: int, model: str, partition: str | None) -> dict[str, Any]:
    amd = _amd()
    per = amd.check(model, partition)
    if not 0 < gpus * per <= 64:
        raise SimStateError(f"--gpus: {gpus} x {per} logical GPUs, must be 1..64")
    state = {
        "version": STATE_VERSION, "node": node, "vendor": "amd", "model": model, "partition": partition,
        "driver_version": "sim-6.12.12 (amdgpu)", "seq": _next_seq_base(sim_dir, node), "boot": _new_boot(),
        "gpus": [amd.healthy_gpu(i, node, model, per) for i in range(gpus * per)],
    }
    return _write_new(sim_dir, node, state)


def _healthy(state: dict[str, Any], node: str, entry: dict[str, Any], generation: int = 0) -> dict[str, Any]:
    """``entry``'s GPU as it was made, healthy (the ``generation``-th replacement's when > 0)."""
    if state.get("vendor") == "amd":
        amd = _amd()
        return amd.healthy_gpu(entry["index"], node, state.get("model", "MI300X"), amd.per_physical(state),
                               generation=generation)
    return healthy_gpu(entry["index"], node, state.get("model", "H100"), generation=generation)


# -- the node's kernel log: the driver's lines the sim writes (AMD's faults), read as the kernel's


def kernel_log(sim_dir: str, node: str) -> str:
    """The simulated node's kernel log, ``dmesg``'s lines (``[seconds] text``)."""
    state_path(sim_dir, node)
    return os.path.join(sim_dir, "kmsg", f"{node}.log")


def _new_kernel_log(sim_dir: str, node: str) -> None:
    """A new boot's log: empty."""
    path = kernel_log(sim_dir, node)
    if os.path.exists(path):
        os.unlink(path)


def _log(sim_dir: str, node: str, texts: list[str]) -> None:
    """Append lines to the simulated kernel log, each stamped as dmesg stamps it."""
    if not texts:
        return
    path = kernel_log(sim_dir, node)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a", encoding="ascii") as fh:
        for text in texts:
            fh.write(f"[{time.time() - _START:.6f}] {text}\n")


def kernel_events(sim_dir: str, node: str, state: dict[str, Any]) -> dict[int, list[XidEvent]]:
    """The driver events in the node's kernel log, by GPU index (-1: tied to no GPU): a line names
    its GPU's PCI address, which every partition of that GPU shares, so it is each partition's."""
    from slurm_hooks.probes import kmsg

    path = kernel_log(sim_dir, node)
    if not os.path.exists(path):
        return {}
    by_bus: dict[str, list[dict[str, Any]]] = {}
    for g in state["gpus"]:
        by_bus.setdefault(kmsg.normalize_pci(g.get("pci_bus_id", "")), []).append(g)
    out: dict[int, list[XidEvent]] = {}
    for event in kmsg.read_xids(path):
        event = values.replace(event, boot=str(state.get("boot", "")))
        gpus = by_bus.get(kmsg.normalize_pci(event.pci_bus_id or ""), [])
        for g in gpus:
            out.setdefault(g["index"], []).append(values.replace(event, gpu=g["index"], uuid=g.get("uuid", "")))
        if not gpus:
            out.setdefault(-1, []).append(event)
    return out


def cap_minor(gpu_minor: int, gi: int) -> int:
    """The minor number of MIG instance ``gi``'s access file on /dev/nvidia<gpu_minor> (the
    simulation's; a real driver lists its own in /proc/driver/nvidia-caps/mig-minors)."""
    return 3 + (gpu_minor * 8 + gi) * 2


def mig_minors(gpu_minors: list[int], mig: int) -> str:
    """/proc/driver/nvidia-caps/mig-minors as the driver writes it (``gpu<minor>/gi<id>/access
    <cap minor>``, and each compute instance's), for ``mig`` instances on each GPU."""
    lines = ["config 1", "monitor 2"]
    for m in gpu_minors:
        for gi in range(1, mig + 1):
            lines += [f"gpu{m}/gi{gi}/access {cap_minor(m, gi)}", f"gpu{m}/gi{gi}/ci0/access {cap_minor(m, gi) + 1}"]
    return "\n".join(lines) + "\n"


def _next_seq_base(sim_dir: str, node: str) -> int:
    try:
        previous = int(read(sim_dir, node).get("seq", 0))
    except (SimStateError, TypeError, ValueError):
        previous = 0
    return max(previous, int(time.time() * 1000))


def read(sim_dir: str, node: str) -> dict[str, Any]:
    path = state_path(sim_dir, node)
    state = fsutil.read_json(
        path, missing=SimStateError(f"{path}: no simulated GPUs for node {node!r} (run: slurm-hooks sim init --node {node})"),
        error=SimStateError, message="{path}: corrupt sim state: {reason}")
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION or not isinstance(state.get("gpus"), list):
        raise SimStateError(f"{path}: corrupt sim state: expected version {STATE_VERSION} with a 'gpus' list")
    return state


def vendor(sim_dir: str, node: str) -> str:
    """Whose GPUs the simulated node has ("nvidia" for one with no state: NVIDIA's tools then say why)."""
    try:
        return str(read(sim_dir, node).get("vendor", "nvidia"))
    except SimStateError:
        return "nvidia"


def update(sim_dir: str, node: str, change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Read-modify-write the node's state under a lock; atomic on disk (an AMD node's RAS files too)."""
    path = state_path(sim_dir, node)
    with fsutil.locked(path):
        state = read(sim_dir, node)
        change(state)
        fsutil.atomic_write(path, json.dumps(state, indent=1))
        if state.get("vendor") == "amd":
            _amd().write_sysfs(sim_dir, node, state)
    return state


def gpu_entry(state: dict[str, Any], index: int) -> dict[str, Any]:
    for gpu in state["gpus"]:
        if gpu.get("index") == index:
            return gpu
    raise SimStateError(f"node {state.get('node')!r} has no GPU {index} (has {len(state['gpus'])})")


#: Keys of a GPU entry that are the simulation's own, not what NVML would report: a latent fault
#: only a diagnostic finds (``diag_failure``) and a reset that hangs (``reset_hang_s``) among them.
SIM_ONLY = frozenset({"cleared_by", "resets", "generation", "diag_failure", "reset_hang_s", "ras", "bad_pages"})

#: What mends a fault: a GPU reset, a reboot of the node, or nothing (a dead GPU).
CLEARED_BY = ("reset", "reboot", "never")

#: Default per injected state (not XIDs: see :func:`default_cleared_by`), after NVIDIA's catalogue:
#: a pending row remap or a volatile ECC count is applied or cleared by a GPU reset; a GPU off the
#: bus or a link that trained narrow needs the node rebooted; a failed remap is the hardware.
STATE_CLEARED_BY = {
    "ecc_uncorrectable": "reset", "row_remap_pending": "reset", "row_remap_failure": "never",
    "lost": "reboot", "pcie_width": "reboot", "temp": "reset", "process": "reset", "nvlink_down": "reset",
    "diag_failure": "never",
}


def default_cleared_by(fault: str) -> str:
    """``xid:<code>`` by the catalogue's immediate action (RESET_GPU: a reset; RESTART_BM/VM: a
    reboot; otherwise a reset for a reset-class XID, else a reboot); a state by STATE_CLEARED_BY."""
    if not fault.startswith("xid:"):
        return STATE_CLEARED_BY.get(fault, "reboot")
    from slurm_hooks.xid.catalog import lookup

    info = lookup(int(fault[4:]))
    if info is None:
        return "reboot"
    if info.immediate.startswith("RESET_GPU"):
        return "reset"
    if info.immediate.startswith("RESTART_"):
        return "reboot"
    return "reset" if info.action is Action.RESET else "reboot"


def _new_boot() -> str:
    import uuid as uuidlib

    return uuidlib.uuid4().hex[:12]


def _add_xid(state: dict[str, Any], entry: dict[str, Any], code: int, message: str = "injected by slurm-hooks sim",
             instance: int | None = None) -> None:
    state["seq"] = int(state.get("seq", 0)) + 1
    event = {"code": int(code), "gpu": entry["index"], "uuid": entry.get("uuid", ""),
             "pci_bus_id": entry["pci_bus_id"], "ts": time.time(), "boot": state.get("boot", ""),
             "message": message, "source": "sim", "seq": state["seq"]}
    if instance is not None:
        if not any(m.get("gi") == instance for m in entry.get("mig") or ()):
            raise SimStateError(f"GPU {entry['index']} has no MIG instance {instance}")
        event.update(instance=instance, message=f"GPU-I:{instance:02d}: {message}")
    entry["xids"].append(event)


def fault_names(fault: dict[str, Any]) -> list[str]:
    names = [f"xid:{int(fault['xid'])}"] if fault.get("xid") is not None else []
    return names + [k for k in STATE_CLEARED_BY if fault.get(k) is not None and fault.get(k) is not False]


#: The faults of an AMD node: the amdgpu driver's lines (and the RAS counts behind them).
AMD_FAULTS = ("ras_ue", "ras_deferred", "poison", "ring_timeout", "driver_reset", "bad_pages")
#: What only an NVIDIA GPU has.
NVIDIA_FAULTS = ("xid", "instance", "row_remap_pending", "row_remap_failure", "recovery_action", "nvlink_down")


def _given(fault: dict[str, Any], keys: tuple[str, ...]) -> list[str]:
    return [k for k in keys if fault.get(k) is not None and fault.get(k) is not False]


def inject(sim_dir: str, node: str, gpu: int, cleared_by: str | None = None, **fault: Any) -> dict[str, Any]:
    """Apply one or more faults to one GPU. Keys as the ``sim inject`` options; ``cleared_by``:
    which repair mends them (reset, reboot, never; default per fault: :func:`default_cleared_by`)."""
    if cleared_by is not None and cleared_by not in CLEARED_BY:
        raise SimStateError(f"--cleared-by must be one of {', '.join(CLEARED_BY)}, not {cleared_by!r}")
    lines: list[str] = []

    def change(state: dict[str, Any]) -> None:
        entry = gpu_entry(state, gpu)
        amd = state.get("vendor") == "amd"
        wrong = _given(fault, NVIDIA_FAULTS if amd else AMD_FAULTS)
        if wrong:
            raise SimStateError(f"{node} has {'AMD' if amd else 'NVIDIA'} GPUs: "
                                f"{', '.join('--' + w.replace('_', '-') for w in wrong)} is the other vendor's")
        if amd:
            lines.extend(_inject_amd(state, entry, fault))
        mends = entry.setdefault("cleared_by", {})
        for name in fault_names(fault):
            mends[name] = cleared_by or default_cleared_by(name)
        if fault.get("xid") is not None:
            _add_xid(state, entry, int(fault["xid"]), instance=fault.get("instance"))
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
        if fault.get("diag_failure") is not None:
            level = int(fault["diag_failure"])
            if level not in DIAG_TESTS:
                raise SimStateError(f"--diag-failure must be a DCGM level 1..{max(DIAG_TESTS)}, not {level}")
            status = str(fault.get("diag_status") or "fail").lower()
            if status not in DIAG_STATUSES:
                raise SimStateError(f"--diag-status must be one of {', '.join(DIAG_STATUSES)}, not {status!r}")
            entry["diag_failure"] = {"level": level, "test": DIAG_TESTS[level][-1], "status": DIAG_STATUSES[status]}
        elif fault.get("diag_status") is not None:
            raise SimStateError("--diag-status goes with --diag-failure LEVEL")
        if fault.get("reset_hang") is not None:
            entry["reset_hang_s"] = float(fault["reset_hang"])
        if fault.get("nvlink_down") is not None:
            links = [link for link in entry.get("nvlinks") or [] if link["link"] == fault["nvlink_down"]]
            if not links:
                raise SimStateError(f"GPU {gpu} has no NVLink {fault['nvlink_down']} "
                                    f"(has {len(entry.get('nvlinks') or [])})")
            for link in links:
                link["active"] = False

    state = update(sim_dir, node, change)
    _log(sim_dir, node, lines)
    return state


def _inject_amd(state: dict[str, Any], entry: dict[str, Any], fault: dict[str, Any]) -> list[str]:
    """The driver's lines for an AMD GPU's faults (its physical GPU's address: every partition's),
    and the RAS counts and retired pages behind them."""
    amd = _amd()
    head = f"amdgpu {entry['pci_bus_id']}: "
    state["seq"] = int(state.get("seq", 0)) + 1
    event = state["seq"] % 100000
    out: list[str] = []
    # The RAS counts and retired pages are the physical GPU's: kept on its first partition.
    step = amd.per_physical(state) if amd.MODELS[state.get("model", "MI300X")][4] == 1 else 1
    board = gpu_entry(state, entry["index"] - entry["index"] % step)
    counts = board.setdefault("ras", {})
    for kind in ("ras_ue", "ras_deferred"):
        if fault.get(kind) is not None:
            block = str(fault[kind]).lower()
            if block not in amd.RAS_BLOCKS:
                raise SimStateError(f"--{kind.replace('_', '-')}: unknown RAS block {block!r} "
                                    f"(known: {', '.join(amd.RAS_BLOCKS)})")
            ue, ce = counts.get(block, (0, 0))
            counts[block] = (ue + 1, ce) if kind == "ras_ue" else (ue, ce)
            out += amd.line(kind, block=block, total=ue + 1, event=event)
    if fault.get("poison"):
        out += amd.line("poison", event=event)
    if fault.get("ring_timeout") is not None:
        out += amd.line("ring_timeout", ring=str(fault["ring_timeout"]))
    if fault.get("driver_reset") is not None:
        if fault["driver_reset"] not in amd.DRIVER_RESETS:
            raise SimStateError(f"--driver-reset must be one of {', '.join(amd.DRIVER_RESETS)}")
        entry["resets"] = int(entry.get("resets", 0)) + 1
        out += amd.line("reset", ok=fault["driver_reset"] == "succeeded", count=entry["resets"])
    if fault.get("bad_pages") is not None:
        before = int(board.get("bad_pages", 0))
        board["bad_pages"] = before + int(fault["bad_pages"])
        if before < amd.BAD_PAGE_THRESHOLD <= board["bad_pages"]:
            out += amd.line("bad_pages", pages=board["bad_pages"])
    return [head + text for text in out]


class ResetFailed(SimStateError):
    """The simulated GPU did not come back from its reset (it is off the bus)."""


def _mend(entry: dict[str, Any], healthy: dict[str, Any], name: str) -> None:
    """Put one fault's fields back to ``healthy`` (an XID's log line stays: only a reboot clears the log)."""
    fields = {"ecc_uncorrectable": ("ecc_volatile_uncorrectable",), "process": ("processes", "memory_used_mib"),
              "temp": ("temperature_c",), "nvlink_down": ("nvlinks",)}.get(name, (name,))
    for key in fields:
        if name.startswith("xid:"):
            continue
        if key in healthy:
            entry[key] = healthy[key]
        else:
            entry.pop(key, None)


def reset(sim_dir: str, node: str, gpu: int) -> dict[str, Any]:
    """What ``nvidia-smi --gpu-reset`` does to a simulated GPU: faults a reset mends are gone (their
    XID lines stay in the log); a dead GPU's XIDs come back at once (a new event); a lost GPU does
    not come back from a reset (:class:`ResetFailed`)."""

    said: list[str] = []

    def change(state: dict[str, Any]) -> None:
        entry = gpu_entry(state, gpu)
        mends = entry.setdefault("cleared_by", {})
        if entry.get("lost") and mends.get("lost", "reboot") != "reset":
            raise ResetFailed(f"{node} GPU {gpu}: reset failed: the GPU is lost (off the bus)")
        healthy = _healthy(state, node, entry)
        for name, by in sorted(mends.items()):
            if by == "reset":
                _mend(entry, healthy, name)
                del mends[name]
            elif by == "never" and name.startswith("xid:"):
                _add_xid(state, entry, int(name[4:]), "came back after a GPU reset (slurm-hooks sim)")
        entry["resets"] = int(entry.get("resets", 0)) + 1
        if state.get("vendor") == "amd":  # the driver says what it did, as for its own resets
            said.extend(f"amdgpu {entry['pci_bus_id']}: {t}" for t in _amd().line("reset", count=entry["resets"]))

    state = update(sim_dir, node, change)
    _log(sim_dir, node, said)
    return state


def reboot(sim_dir: str, node: str) -> dict[str, Any]:
    """What a reboot does to the node's simulated GPUs: a new boot (new kernel-log keys), an empty
    kernel log, every fault a reset or a reboot mends gone; a dead GPU's faults come back."""

    def change(state: dict[str, Any]) -> None:
        state["boot"] = _new_boot()
        for entry in state["gpus"]:
            healthy = _healthy(state, node, entry)
            entry["xids"] = []
            mends = entry.setdefault("cleared_by", {})
            for name, by in sorted(mends.items()):
                if by != "never":
                    _mend(entry, healthy, name)
                    del mends[name]
                elif name.startswith("xid:"):
                    _add_xid(state, entry, int(name[4:]), "came back after a reboot (slurm-hooks sim)")
        state["boots"] = int(state.get("boots", 0)) + 1

    done = update(sim_dir, node, change)
    _reset_ib_counters(sim_dir, node)
    _new_kernel_log(sim_dir, node)
    return done


# -- the node's GPU services and diagnostics: what the sim's nvidia-smi, systemctl and dcgmi act on

#: DCGM's tests by the level that first runs them (dcgmi diag -r 1..4); a latent fault found at
#: level L fails that level's last test, and every deeper run.
DIAG_TESTS = {1: ("software",), 2: ("software", "pcie", "memory"),
              3: ("software", "pcie", "memory", "targeted_stress", "targeted_power", "memory_bandwidth"),
              4: ("software", "pcie", "memory", "targeted_stress", "targeted_power", "memory_bandwidth", "eud")}
#: How long the simulated diagnostic takes per level: DCGM's seconds / ~2 min / ~15 min / ~hours,
#: scaled down so a testbed runs them end to end (``sim inject --diag-seconds`` sets a node's own).
DIAG_SECONDS = {1: 0.5, 2: 2.0, 3: 5.0, 4: 8.0}
#: What the latent fault's test answers (``sim inject --diag-status``): a failure, or an answer that
#: vouches for nothing (DCGM's Warn, or a Skip: a plugin that did not run).
DIAG_STATUSES = {"fail": "Fail", "warn": "Warn", "skip": "Skip"}


def set_service(sim_dir: str, node: str, name: str, active: bool) -> dict[str, Any]:
    """``systemctl start|stop NAME`` on the simulated node."""
    if not name or "/" in name or name.startswith("-"):
        raise SimStateError(f"invalid service name {name!r}")

    def change(state: dict[str, Any]) -> None:
        state.setdefault("services", {})[name] = "active" if active else "inactive"

    return update(sim_dir, node, change)


def service_state(state: dict[str, Any], name: str) -> str:
    """A simulated service's state: ``active`` unless something stopped it."""
    return str(state.get("services", {}).get(name, "active"))


def set_diag_seconds(sim_dir: str, node: str, seconds: float) -> dict[str, Any]:
    """Every simulated diagnostic on this node takes ``seconds`` (a diag slower than its budget)."""

    def change(state: dict[str, Any]) -> None:
        state["diag_seconds"] = float(seconds)

    return update(sim_dir, node, change)


def diag_seconds(state: dict[str, Any], level: int) -> float:
    own = state.get("diag_seconds")
    return float(own) if own is not None else DIAG_SECONDS[level]


def diag(state: dict[str, Any], level: int) -> dict[str, Any]:
    """The simulated ``dcgmi diag -r LEVEL -j`` document (DCGM 4.x shape): every test of the level
    on every GPU; a GPU with a latent fault found at this level or a shallower one fails its test."""
    if level not in DIAG_TESTS:
        raise SimStateError(f"dcgmi diag -r: level must be 1..{max(DIAG_TESTS)}, not {level}")
    tests = []
    for name in DIAG_TESTS[level]:
        results = []
        for gpu in state["gpus"]:
            fault = gpu.get("diag_failure") or {}
            failing = bool(fault) and int(fault.get("level", 99)) <= level and fault.get("test") == name
            status = str(fault.get("status", "Fail")) if failing else "Pass"
            result: dict[str, Any] = {"entity_group": "GPU", "entity_id": gpu["index"], "status": status}
            if failing:
                said = {"Fail": "failed", "Warn": "warned", "Skip": "was skipped"}.get(status, status)
                result["warnings"] = [{"warning": f"GPU {gpu['index']}: {name} test {said} (slurm-hooks sim, "
                                                  f"latent fault found at level {fault['level']})"}]
            results.append(result)
        tests.append({"name": name, "results": results})
    return {"DCGM Diagnostic": {"version": "sim", "test_categories": [{"category": "sim", "tests": tests}]}}


# -- the node's InfiniBand/RoCE ports: a tree shaped like /sys/class/infiniband (slurm_hooks.probes.ib)

#: The counters a ConnectX port shows under ``counters/`` (all laid; slurm_hooks.probes.ib reads those it judges).
IB_COUNTERS = ("VL15_dropped", "excessive_buffer_overrun_errors", "link_downed", "link_error_recovery",
               "local_link_integrity_errors", "multicast_rcv_packets", "multicast_xmit_packets",
               "port_rcv_constraint_errors", "port_rcv_data", "port_rcv_errors", "port_rcv_packets",
               "port_rcv_remote_physical_errors", "port_rcv_switch_relay_errors", "port_xmit_constraint_errors",
               "port_xmit_data", "port_xmit_discards", "port_xmit_packets", "port_xmit_wait", "symbol_error",
               "unicast_rcv_packets", "unicast_xmit_packets")
IB_UP = ("4: ACTIVE", "5: LinkUp")
#: The simulated kernel log's clock starts here (seconds since "boot", as dmesg prints them).
_START = 1.7e9
IB_DOWN = ("1: DOWN", "2: Polling")


def ib_root(sim_dir: str, node: str) -> str:
    """Where the simulated node's ports live (``[links] sysfs_root`` for the sim backend)."""
    state_path(sim_dir, node)  # the same check of the node's name
    return os.path.join(sim_dir, "ib", node)


def _ib_port(sim_dir: str, node: str, target: str) -> str:
    device, _, port = target.partition(":")
    base = os.path.join(ib_root(sim_dir, node), device, "ports", port or "1")
    if not device or "/" in device or device.startswith(".") or not (port or "1").isdigit() or not os.path.isdir(base):
        raise SimStateError(f"{node} has no IB port {target!r} (sim init --ib N lays mlx5_0:1 .. mlx5_<N-1>:1)")
    return base


def ib_kmsg(sim_dir: str, node: str) -> str:
    """The simulated node's kernel log of mlx5 lines (what ``sim inject --ib ... --event`` writes)."""
    return os.path.join(sim_dir, "ib", f"{node}.kmsg")


def _remove_ib(sim_dir: str, node: str) -> None:
    root = os.path.join(sim_dir, "ib", node)
    if os.path.isdir(root):
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    if os.path.exists(ib_kmsg(sim_dir, node)):
        os.unlink(ib_kmsg(sim_dir, node))


def _put(path: str, text: str) -> None:
    fsutil.atomic_write(path, text + "\n", durable=False)


def init_ib(sim_dir: str, node: str, ports: int, rate_gbps: int = 400) -> list[str]:
    """``ports`` healthy NDR ports ``mlx5_0:1`` ..., every counter at 0 (replaces an earlier tree)."""
    if not 0 < ports <= 64:
        raise SimStateError(f"--ib must be 1..64 ports, got {ports}")
    root = ib_root(sim_dir, node)
    _remove_ib(sim_dir, node)
    names = []
    for i in range(ports):
        base = os.path.join(root, f"mlx5_{i}", "ports", "1")
        os.makedirs(os.path.join(base, "counters"), exist_ok=True)
        _put(os.path.join(base, "state"), IB_UP[0])
        _put(os.path.join(base, "phys_state"), IB_UP[1])
        _put(os.path.join(base, "rate"), f"{rate_gbps} Gb/sec (4X NDR)")
        _put(os.path.join(base, "link_layer"), "InfiniBand")
        os.symlink(f"../../devices/pci0000:00/{_ib_pci(i)}", os.path.join(root, f"mlx5_{i}", "device"))
        for counter in IB_COUNTERS:
            _put(os.path.join(base, "counters", counter), "0")
        names.append(f"mlx5_{i}:1")
    return names


def _ib_pci(i: int) -> str:
    return f"0000:{0x1a + i * 0x10:02x}:00.0"


#: What ``--event`` writes: the mlx5 driver's lines (drivers/net/ethernet/mellanox/mlx5/core/events.c, cmd.c).
IB_EVENTS = {
    "module-temperature": "mlx5_port_module_event:1131:(pid 0): Port module event[error]: module 0, Cable error, "
                          "High Temperature",
    "power": "mlx5_pcie_event:299:(pid 268269): Detected insufficient power on the PCIe slot (27W).",
    "access-reg": "mlx5_cmd_out_err:838:(pid 1441871): ACCESS_REG(0x805) op_mod(0x1) failed, status bad "
                  "resource(0x5), syndrome (0x305684), err(-22)",
}


def _bump(base: str, counter: str, by: int) -> int:
    path = os.path.join(base, "counters", counter)
    try:
        with open(path) as fh:
            now = int(fh.read().strip() or 0)
    except (OSError, ValueError):
        now = 0
    _put(path, str(now + by))
    return now + by


def inject_ib(sim_dir: str, node: str, target: str, state: str | None = None, counter: tuple[str, int] | None = None,
              flap: bool = False, rate_gbps: int | None = None, event: str | None = None) -> str:
    """Change one port: ``state`` "down" (``link_downed`` counts the drop) or "up"; add to a
    counter; ``flap``: a drop that came and went between two readings (``link_downed`` + 1);
    ``rate_gbps``: the rate it trained at; ``event``: its adapter logs an mlx5 line
    (:data:`IB_EVENTS`). Returns what was done."""
    base = _ib_port(sim_dir, node, target)
    done = []
    if state is not None:
        if state not in ("down", "up"):
            raise SimStateError(f"--state must be down or up, got {state!r}")
        pair = IB_DOWN if state == "down" else IB_UP
        with open(os.path.join(base, "state")) as fh:
            was_up = fh.read().strip() == IB_UP[0]
        _put(os.path.join(base, "state"), pair[0])
        _put(os.path.join(base, "phys_state"), pair[1])
        if state == "down" and was_up:
            _bump(base, "link_downed", 1)
        done.append(f"state {state}")
    if counter is not None:
        name, by = counter
        if name not in IB_COUNTERS:
            raise SimStateError(f"unknown counter {name!r} (known: {', '.join(IB_COUNTERS)})")
        done.append(f"{name}={_bump(base, name, by)}")
    if flap:
        done.append(f"flap (link_downed={_bump(base, 'link_downed', 1)})")
    if rate_gbps is not None:
        _put(os.path.join(base, "rate"), f"{rate_gbps} Gb/sec")
        done.append(f"rate {rate_gbps} Gb/s")
    if event is not None:
        if event not in IB_EVENTS:
            raise SimStateError(f"unknown event {event!r} (known: {', '.join(IB_EVENTS)})")
        device = target.partition(":")[0]
        pci = os.path.basename(os.readlink(os.path.join(ib_root(sim_dir, node), device, "device")))
        with open(ib_kmsg(sim_dir, node), "a", encoding="ascii") as fh:
            fh.write(f"[{time.time() - _START:.6f}] mlx5_core {pci}: {IB_EVENTS[event]}\n")
        done.append(f"kernel line {event}")
    return ", ".join(done)


def parse_counter(text: str) -> tuple[str, int]:
    """``"symbol_error+=200"`` -> ("symbol_error", 200)."""
    name, sep, by = text.partition("+=")
    if not sep or not name.strip() or not by.strip().isdigit():
        raise SimStateError(f"--counter must be NAME+=N (e.g. symbol_error+=200), got {text!r}")
    return name.strip(), int(by)


def _reset_ib_counters(sim_dir: str, node: str) -> None:
    """A reboot starts every counter at 0 again, and a new kernel log, as the kernel does (an mlx5
    line of the last boot read again would be a new event of this one)."""
    if os.path.exists(ib_kmsg(sim_dir, node)):
        os.unlink(ib_kmsg(sim_dir, node))
    root = os.path.join(sim_dir, "ib", node)
    if not os.path.isdir(root):
        return
    for device in os.listdir(root):
        ports = os.path.join(root, device, "ports")
        for port in os.listdir(ports) if os.path.isdir(ports) else ():
            counters = os.path.join(ports, port, "counters")
            for name in os.listdir(counters) if os.path.isdir(counters) else ():
                _put(os.path.join(counters, name), "0")


def boot_id(sim_dir: str, node: str) -> str:
    """The simulated node's boot id ("" for state written before boots were simulated)."""
    return str(read(sim_dir, node).get("boot", ""))


def clear(sim_dir: str, node: str, gpu: int | None = None) -> dict[str, Any]:
    """Put one GPU (or all) back to healthy, keeping identity and the event counter."""

    def change(state: dict[str, Any]) -> None:
        for i, entry in enumerate(state["gpus"]):
            if gpu is None or entry.get("index") == gpu:
                state["gpus"][i] = {**_healthy(state, node, entry, generation=int(entry.get("generation", 0))),
                                    **{k: entry[k] for k in ("minor", "mig") if k in entry}}

    if gpu is not None:
        gpu_entry(read(sim_dir, node), gpu)
    return update(sim_dir, node, change)


def replace(sim_dir: str, node: str, gpu: int | None = None) -> dict[str, Any]:
    """New hardware in one GPU's slot (or every slot): healthy, with a new UUID and serial, as
    a replaced board has; the slot (index, PCI bus id, device file) stays. What the old GPU had is gone."""

    def change(state: dict[str, Any]) -> None:
        model = state.get("model", "H100")
        for i, entry in enumerate(state["gpus"]):
            if gpu is None or entry.get("index") == gpu:
                generation = int(entry.get("generation", 0)) + 1
                if state.get("vendor") == "amd":
                    fresh = _healthy(state, node, entry, generation=generation)
                else:
                    fresh = healthy_gpu(entry["index"], node, model, generation=generation, minor=entry.get("minor"),
                                        mig=len(entry.get("mig") or ()))
                state["gpus"][i] = fresh

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
            gpus = tuple(gpu_from_dict({k: v for k, v in g.items() if k not in SIM_ONLY}) for g in state["gpus"])
        except SimStateError as exc:
            return NodeSnapshot(self.node, self.name, taken_at=time.time(), error=str(exc))
        except (TypeError, ValueError, KeyError) as exc:
            path = state_path(self.sim_dir, self.node)
            return NodeSnapshot(self.node, self.name, taken_at=time.time(), error=f"{path}: corrupt sim state: {exc}")
        errors: tuple[tuple[str, str], ...] = ()
        try:
            logged = kernel_events(self.sim_dir, self.node, state)
        except Exception as exc:  # noqa: BLE001 - as the NVML probe: the GPUs stand, the log is said unread
            logged, errors = {}, ((KERNEL_LOG, str(exc) or type(exc).__name__),)
        lost = "GPU is lost (amdsmi: device not found)" if state.get("vendor") == "amd" else \
            "GPU is lost (NVML_ERROR_GPU_IS_LOST)"
        gpus = tuple(_as_seen(values.replace(g, xids=g.xids + tuple(logged[g.index])) if g.index in logged else g,
                              lost) for g in gpus)
        return NodeSnapshot(self.node, self.name, gpus=gpus, taken_at=time.time(),
                            driver_version=state.get("driver_version", ""), node_xids=tuple(logged.get(-1, ())),
                            errors=errors)


def events_of(gpu: dict[str, Any]) -> list[XidEvent]:
    """One GPU entry's injected XIDs, each naming its GPU (state files from before UUIDs were
    written into events get the GPU's)."""
    return [XidEvent(**{"uuid": gpu.get("uuid", ""), **x}) for x in gpu.get("xids", ())]


def _as_seen(gpu: GpuSnapshot, lost: str = "GPU is lost (NVML_ERROR_GPU_IS_LOST)") -> GpuSnapshot:
    """Events carry their GPU's UUID; a lost GPU answers nothing (NVML returns GPU_IS_LOST for every
    field; ``lost``: what its library says)."""
    if any(x.uuid != gpu.uuid for x in gpu.xids):
        gpu = values.replace(gpu, xids=tuple(values.replace(x, uuid=x.uuid or gpu.uuid) for x in gpu.xids))
    if not gpu.lost:
        return gpu
    return GpuSnapshot(index=gpu.index, uuid=gpu.uuid, pci_bus_id=gpu.pci_bus_id, model=gpu.model, lost=True,
                       xids=gpu.xids, partition=gpu.partition, errors=(("*", lost),))
