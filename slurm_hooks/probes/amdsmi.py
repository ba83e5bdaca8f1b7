"""The AMD Instinct probe: one amdsmi session per snapshot, filling the same snapshot as NVML's.

Field rules, as the NVML probe's: ``AMDSMI_STATUS_NOT_SUPPORTED`` (or a function this amdsmi does
not have) leaves the field ``None``, never a fault; any other failure (NO_PERM, BUSY,
DRIVER_NOT_LOADED, ...) or an answer that cannot be true leaves it ``None`` with one line in
``errors``. A node where ``amdsmi_init`` fails is a node-level error in one line.

A physical GPU split into compute partitions (CPX, DPX, ...) shows one processor per partition;
its physical readings (ECC, retired pages, XGMI, PCIe, temperatures, throttling) are read on
partition 0 only and given to each of its partitions, so every partition's jobs see its fault.

Where the ``amdsmi`` module cannot be loaded on a node whose GPUs the amdgpu driver runs, the
driver's own RAS files in sysfs still judge ECC and retired pages (:mod:`slurm_hooks.probes.amdras`).
``amdsmi`` is imported only when this probe runs.

Either way the amdgpu driver's kernel lines (:mod:`slurm_hooks.probes.amdgpu_log`) are tied to
their GPUs here, at the source, as the NVML probe ties XIDs: by the PCI device the line names. The
kernel names a partitioned GPU's physical device, so its line is every partition's (each
partition's jobs are on the faulty board); a line whose device is no GPU of the node, or that
names none (an older kernel's ``DRM_ERROR``), is the node's. A GPU that no longer says who it is
keeps the identity this boot last read for it (:mod:`slurm_hooks.probes.identity`), so that the
line for its address stays its own and the page and the RMA list name its board.
"""

from __future__ import annotations

import threading
import time

from slurm_hooks.models import KERNEL_LOG, BadPages, EccBlock, GpuProcess, GpuSnapshot, NodeSnapshot, XidEvent
from slurm_hooks.probes.answers import integer as _int
from slurm_hooks.probes.answers import ranged as _ranged
from slurm_hooks.probes.answers import text as _text
from slurm_hooks.values import replace

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

#: amdsmi's status codes (``amdsmi_status_t``, the C library's ABI); the module's own values win.
STATUS = {"NOT_SUPPORTED": 2, "NOT_YET_IMPLEMENTED": 3, "NO_PERM": 10, "BUSY": 30, "NOT_FOUND": 31,
          "DRIVER_NOT_LOADED": 34, "NO_DATA": 40}
#: What a status means, in a few words, for one-line messages.
MEANING = {"NO_PERM": "no permission", "BUSY": "device busy", "DRIVER_NOT_LOADED": "driver not loaded",
           "NOT_FOUND": "device not found"}
#: RAS blocks asked for their counts when the driver does not say which have ECC enabled.
DEFAULT_BLOCKS = ("UMC", "SDMA", "GFX", "MMHUB", "XGMI_WAFL")
#: PCIe transfer rate (MT/s) -> link generation.
_PCIE_GEN = {2500: 1, 5000: 2, 8000: 3, 16000: 4, 32000: 5, 64000: 6}
#: amdsmi_get_violation_status's "active" flags -> throttle reason.
VIOLATIONS = (("active_socket_thrm", "socket_thermal"), ("active_hbm_thrm", "hbm_thermal"),
              ("active_vr_thrm", "vr_thermal"), ("active_prochot_thrm", "prochot"),
              ("active_ppt_pwr", "power_cap"))
_XGMI = {0: "none", 1: "error", 2: "multiple"}
_MISSING = object()
#: The physical GPU's readings, read on partition 0 and shown on every partition of it.
PHYSICAL = ("ecc_volatile_uncorrectable", "ecc_blocks", "bad_pages", "xgmi_error", "pcie_gen", "pcie_gen_max",
            "pcie_width", "pcie_width_max", "pcie_replay", "pcie_recovery", "temperature_c",
            "memory_temperature_c", "throttle_reasons")


class AmdSmiProbe:
    name = "amdsmi"

    def __init__(self, node: str, amdsmi: Any = None, drm_root: str = "/sys/class/drm", kmsg_path: str = "/dev/kmsg",
                 gpu_map_path: str = ""):
        self.node = node
        self._smi = amdsmi
        self.drm_root = drm_root
        self.kmsg_path = kmsg_path
        #: Where this boot's GPU identities are kept (probes.identity); "" for nowhere.
        self.gpu_map_path = gpu_map_path

    def snapshot(self) -> NodeSnapshot:
        snap = self._read()
        return snap if snap.error is not None else self._attach_kernel_log(snap)

    def _read(self) -> NodeSnapshot:
        taken = time.time()
        try:
            smi = self._smi if self._smi is not None else import_amdsmi()
        except Exception as exc:  # noqa: BLE001 - without libamd_smi the module fails at import, not always ImportError
            from slurm_hooks.probes import amdras

            return amdras.SysfsRasProbe(self.node, self.drm_root,
                                        missing=f"amdsmi not loadable ({_one_line(exc)})").snapshot()
        try:
            open_session(smi)
        except Exception as exc:
            return self._failed(taken, node_error(smi, exc, "amdsmi_init"))
        try:
            try:
                handles = list(smi.amdsmi_get_processor_handles())
            except Exception as exc:
                return self._failed(taken, node_error(smi, exc, "amdsmi_get_processor_handles"))
            driver = _driver_version(smi, handles)
            gpus = [_read_gpu(smi, index, handle, self.drm_root) for index, handle in enumerate(handles)]
        finally:
            close_session(smi)
        return NodeSnapshot(self.node, self.name, gpus=tuple(_share_physical(gpus)), taken_at=taken,
                            driver_version=driver)

    def _failed(self, taken: float, error: str, driver: str = "") -> NodeSnapshot:
        return NodeSnapshot(self.node, self.name, taken_at=taken, driver_version=driver, error=error)

    def _attach_kernel_log(self, snap: NodeSnapshot) -> NodeSnapshot:
        """The GPUs with their identity recalled where they did not say it, and the driver's kernel
        lines tied to them by PCI device (the node's where none matches). An unreadable log fails
        nothing, but no line seen then says nothing: ``errors`` gets ``KERNEL_LOG`` and why."""
        from slurm_hooks.probes import identity, kmsg

        boot = kmsg.boot_id()
        gpus = list(snap.gpus)
        if self.gpu_map_path:
            gpus = identity.recall(gpus, self.gpu_map_path, boot)
        try:
            events = kmsg.dated(kmsg.read_xids(self.kmsg_path), boot)
        except Exception as exc:  # noqa: BLE001 - the GPUs were read: the snapshot stands, saying what it lacks
            return replace(snap, gpus=tuple(gpus), errors=(*snap.errors, (KERNEL_LOG, str(exc) or type(exc).__name__)))
        gpus, node_events = attribute(gpus, events)
        return replace(snap, gpus=tuple(gpus), node_xids=tuple(node_events))


def attribute(gpus: list[GpuSnapshot], events: list[XidEvent]) -> tuple[list[GpuSnapshot], list[XidEvent]]:
    """Each kernel event on every GPU of the PCI device it names (all partitions of a physical GPU,
    which may each show their own PCI function), with that GPU's index and UUID; the rest the node's."""
    from slurm_hooks.probes.kmsg import normalize_pci

    by_device: dict[str, list[GpuSnapshot]] = {}
    for g in gpus:
        if g.pci_bus_id:
            by_device.setdefault(_device(normalize_pci(g.pci_bus_id)), []).append(g)
    mine: dict[int, list[XidEvent]] = {}
    node: list[XidEvent] = []
    for event in events:
        owners = by_device.get(_device(normalize_pci(event.pci_bus_id)), []) if event.pci_bus_id else []
        for g in owners:
            mine.setdefault(g.index, []).append(replace(event, gpu=g.index, uuid=g.uuid or event.uuid))
        if not owners:
            node.append(event)
    return [replace(g, xids=g.xids + tuple(mine[g.index])) if g.index in mine else g for g in gpus], node


#: Users of each amdsmi module's library session in this process (id of the module -> count).
_SESSIONS: dict[int, int] = {}
_SESSION_LOCK = threading.Lock()


def open_session(smi: Any) -> None:
    """Join this process's amdsmi session, starting it (``amdsmi_init``) if none is open.

    The library is initialised once per process, not per caller: ``amdsmi_init`` does nothing while
    it is, and ``amdsmi_shut_down`` tears it down under every thread. In the watcher, the event
    listener holds a session for as long as it listens while each check's probe opens and closes
    its own: the last to leave shuts the library down, so a check never pulls it from under the
    listener. Raises what ``amdsmi_init`` raises (then nothing is joined)."""
    with _SESSION_LOCK:
        if not _SESSIONS.get(id(smi)):
            smi.amdsmi_init(smi.AmdSmiInitFlags.INIT_AMD_GPUS)
        _SESSIONS[id(smi)] = _SESSIONS.get(id(smi), 0) + 1


def close_session(smi: Any) -> None:
    """Leave the session :func:`open_session` joined; the last one out shuts the library down."""
    with _SESSION_LOCK:
        left = _SESSIONS.get(id(smi), 1) - 1
        if left > 0:
            _SESSIONS[id(smi)] = left
            return
        _SESSIONS.pop(id(smi), None)
        try:
            smi.amdsmi_shut_down()
        except Exception:
            pass  # what was read stands; nothing more to free


def import_amdsmi() -> Any:
    import amdsmi

    return amdsmi


def loads() -> bool:
    """Whether the ``amdsmi`` module (and so ``libamd_smi``) loads here."""
    try:
        import_amdsmi()
    except Exception:  # noqa: BLE001 - any failure to load is "no"
        return False
    return True


# --- errors -----------------------------------------------------------------------------------


def status_of(smi: Any, exc: BaseException) -> str | None:
    """``"NO_PERM"`` for an AmdSmiLibraryException with that code; ``None`` for anything else."""
    library = getattr(smi, "AmdSmiLibraryException", None)
    if library is None or not isinstance(exc, library):
        return None
    try:
        code = abs(int(exc.get_error_code()))
    except Exception:
        return "UNKNOWN"
    wrapper = getattr(smi, "amdsmi_wrapper", None)
    for name, default in STATUS.items():
        if code == getattr(wrapper, f"AMDSMI_STATUS_{name}", default):
            return name
    return str(code)


def describe(smi: Any, exc: BaseException) -> str:
    """One line: ``AMDSMI_STATUS_NO_PERM - Permission Denied``, or the Python exception."""
    status = status_of(smi, exc)
    if status is None:
        return _one_line(f"{type(exc).__name__}: {exc}")
    info = ""
    try:
        info = str(exc.get_error_info())
    except Exception:
        pass
    return _one_line(info or f"AMDSMI_STATUS_{status}")


def node_error(smi: Any, exc: BaseException, fn_name: str) -> str:
    """``amdsmi: driver not loaded (AMDSMI_STATUS_DRIVER_NOT_LOADED - Driver not loaded)``."""
    what = MEANING.get(status_of(smi, exc) or "", f"{fn_name} failed")
    return f"amdsmi: {what} ({describe(smi, exc)})"


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _unsupported(smi: Any, exc: BaseException) -> bool:
    return status_of(smi, exc) in ("NOT_SUPPORTED", "NOT_YET_IMPLEMENTED")


# --- one GPU ----------------------------------------------------------------------------------


class _Reader:
    """Asks one processor for each field and records what went wrong, field by field."""

    def __init__(self, smi: Any, handle: Any):
        self.smi, self.handle = smi, handle
        self.errors: list[tuple[str, str]] = []

    def ask(self, field: str, fn_name: str, *args: Any, check: Callable[[Any], Any] | None = None) -> Any:
        fn = getattr(self.smi, fn_name, None)
        if fn is None:
            return _MISSING  # an older amdsmi: as unsupported
        try:
            raw = fn(self.handle, *args)
        except Exception as exc:
            if not _unsupported(self.smi, exc):
                self.errors.append((field, f"{fn_name} failed: {describe(self.smi, exc)}"))
            return _MISSING
        if raw == "N/A":
            return _MISSING
        try:
            return check(raw) if check is not None else raw
        except Exception as exc:
            self.errors.append((field, f"garbled answer from {fn_name}: {exc}"))
            return _MISSING


def _read_gpu(smi: Any, index: int, handle: Any, drm_root: str) -> GpuSnapshot:
    r = _Reader(smi, handle)
    out: dict[str, Any] = {}

    def put(field: str, value: Any) -> None:
        if value is not _MISSING:
            out[field] = value

    put("uuid", r.ask("uuid", "amdsmi_get_gpu_device_uuid", check=_text))
    put("pci_bus_id", r.ask("pci_bus_id", "amdsmi_get_gpu_device_bdf", check=_bdf))
    board = r.ask("serial", "amdsmi_get_gpu_board_info", check=dict)
    if board is not _MISSING:
        serial = _text(board.get("product_serial", ""))
        out["serial"] = "" if serial == "N/A" else serial
    asic = r.ask("model", "amdsmi_get_gpu_asic_info", check=dict)
    if asic is not _MISSING and _text(asic.get("market_name", "")) not in ("", "N/A"):
        out["model"] = _text(asic["market_name"])
    if asic is not _MISSING:
        put("rocm_uuid", _rocm_uuid(r, asic.get("asic_serial")))
    kfd = r.ask("partition", "amdsmi_get_gpu_kfd_info", check=dict)
    if kfd is not _MISSING and isinstance(kfd.get("current_partition_id"), int):
        out["partition"] = _ranged(0, 63)(kfd["current_partition_id"])
    put("minor", _render_minor(r, out.get("pci_bus_id", ""), out.get("partition"), drm_root))
    if not out.get("partition"):
        _read_physical(r, out, put)
    procs = r.ask("processes", "amdsmi_get_gpu_process_list", check=_processes)
    if procs is not _MISSING:
        out["processes"] = procs
    usage = r.ask("memory_used_mib", "amdsmi_get_gpu_vram_usage", check=dict)
    if usage is not _MISSING and isinstance(usage.get("vram_used"), int):
        out["memory_used_mib"] = usage["vram_used"]
    return GpuSnapshot(index=index, errors=tuple(r.errors), **out)


def _read_physical(r: _Reader, out: dict[str, Any], put: Callable[[str, Any], None]) -> None:
    smi = r.smi
    total = r.ask("ecc_volatile_uncorrectable", "amdsmi_get_gpu_total_ecc_count", check=dict)
    if total is not _MISSING:
        put("ecc_volatile_uncorrectable", _count(total.get("uncorrectable_count")))
    put("ecc_blocks", _ecc_blocks(r))
    put("bad_pages", _bad_pages(r))
    put("xgmi_error", r.ask("xgmi_error", "amdsmi_gpu_xgmi_error_status", check=_xgmi))
    pcie = r.ask("pcie", "amdsmi_get_pcie_info", check=dict)
    if pcie is not _MISSING:
        _pcie(r, pcie, out)
    metric = smi.AmdSmiTemperatureMetric.CURRENT
    kinds = smi.AmdSmiTemperatureType
    hot = r.ask("temperature_c", "amdsmi_get_temp_metric", kinds.HOTSPOT, metric, check=_ranged(0, 200))
    put("temperature_c", hot if hot is not _MISSING else
        r.ask("temperature_c", "amdsmi_get_temp_metric", kinds.EDGE, metric, check=_ranged(0, 200)))
    hbm = [r.ask("memory_temperature_c", "amdsmi_get_temp_metric", getattr(kinds, name), metric,
                 check=_ranged(0, 200)) for name in ("HBM_0", "HBM_1", "HBM_2", "HBM_3") if hasattr(kinds, name)]
    hbm = [t for t in hbm if t is not _MISSING]
    if hbm:
        out["memory_temperature_c"] = max(hbm)
    violation = r.ask("throttle_reasons", "amdsmi_get_violation_status", check=dict)
    if violation is not _MISSING:
        out["throttle_reasons"] = tuple(name for key, name in VIOLATIONS if violation.get(key) is True)


def _ecc_blocks(r: _Reader) -> Any:
    """Counts of every RAS block with ECC enabled (the driver's mask), else of the usual blocks."""
    smi = r.smi
    blocks = [b for b in smi.AmdSmiGpuBlock if b.name not in ("INVALID", "RESERVED")]
    mask = r.ask("ecc_blocks", "amdsmi_get_gpu_ecc_enabled", check=_count)
    if mask is not _MISSING:
        blocks = [b for b in blocks if mask & int(b)]
    else:
        blocks = [b for b in blocks if b.name in DEFAULT_BLOCKS]
    out = []
    for block in blocks:
        counts = r.ask(f"ecc.{block.name}", "amdsmi_get_gpu_ecc_count", block, check=dict)
        if counts is _MISSING:
            continue
        out.append(EccBlock(block.name, _count_or_none(counts.get("correctable_count")),
                            _count_or_none(counts.get("uncorrectable_count")),
                            _count_or_none(counts.get("deferred_count"))))
    return tuple(out) if out or mask is not _MISSING else _MISSING


def _bad_pages(r: _Reader) -> Any:
    pages = r.ask("bad_pages", "amdsmi_get_gpu_bad_page_info", check=list)
    if pages is _MISSING:
        return _MISSING
    status = r.smi.AmdSmiMemoryPageStatus
    counts = {int(status.RESERVED): 0, int(status.PENDING): 0, int(status.UNRESERVABLE): 0}
    for page in pages:
        value = page.get("status") if isinstance(page, dict) else None
        if value in counts:
            counts[value] += 1
    threshold = r.ask("bad_pages.threshold", "amdsmi_get_gpu_bad_page_threshold", check=_count)
    return BadPages(counts[int(status.RESERVED)], counts[int(status.PENDING)], counts[int(status.UNRESERVABLE)],
                    None if threshold is _MISSING else threshold)


def _pcie(r: _Reader, info: dict, out: dict[str, Any]) -> None:
    static, metric = info.get("pcie_static") or {}, info.get("pcie_metric") or {}
    for field, value, check in (("pcie_width", metric.get("pcie_width"), _ranged(1, 32)),
                                ("pcie_width_max", static.get("max_pcie_width"), _ranged(1, 32)),
                                ("pcie_gen", metric.get("pcie_speed"), _gen),
                                ("pcie_gen_max", static.get("max_pcie_speed"), _gen),
                                ("pcie_replay", metric.get("pcie_replay_count"), _count),
                                ("pcie_recovery", metric.get("pcie_l0_to_recovery_count"), _count)):
        if value is None or value == "N/A":
            continue
        try:
            out[field] = check(value)
        except ValueError as exc:
            r.errors.append((field, f"garbled answer from amdsmi_get_pcie_info: {exc}"))


def _render_minor(r: _Reader, bdf: str, partition: int | None, drm_root: str) -> Any:
    """The N of /dev/dri/renderD<N> (what Slurm's gres.conf File= names): amdsmi's enumeration info,
    else the PCI device's own render node in sysfs (partition 0 only: the others' are not under it)."""
    info = r.ask("minor", "amdsmi_get_gpu_enumeration_info", check=dict)
    if info is not _MISSING and isinstance(info.get("drm_render"), int):
        return info["drm_render"]
    if not bdf or partition:
        return _MISSING
    import os

    from slurm_hooks.probes.amdras import render_minor

    sys_root = os.path.dirname(os.path.dirname(drm_root.rstrip("/")))  # /sys/class/drm -> /sys
    minor = render_minor(os.path.join(sys_root, "bus", "pci", "devices"), bdf)
    return _MISSING if minor is None else minor


def _share_physical(gpus: list[GpuSnapshot]) -> list[GpuSnapshot]:
    """Give each partition the readings of its physical GPU's partition 0 (same PCI device). A
    physical GPU seen as one processor is whole: its partition id (0) is dropped."""
    per_device: dict[str, int] = {}
    for g in gpus:
        per_device[_device(g.pci_bus_id)] = per_device.get(_device(g.pci_bus_id), 0) + 1
    gpus = [replace(g, partition=None) if g.partition is not None and g.pci_bus_id
            and per_device[_device(g.pci_bus_id)] == 1 else g for g in gpus]
    if not any(g.partition for g in gpus):
        return gpus
    first = {_device(g.pci_bus_id): g for g in gpus if not g.partition and g.pci_bus_id}
    out = []
    for g in gpus:
        source = first.get(_device(g.pci_bus_id)) if g.partition else None
        out.append(replace(g, **{f: getattr(source, f) for f in PHYSICAL}) if source is not None else g)
    return out


def _device(bdf: str) -> str:
    """``0000:0C:00.3`` -> ``0000:0C:00``: a partition may show its own PCI function."""
    return bdf.rsplit(".", 1)[0]


def _driver_version(smi: Any, handles: list) -> str:
    fn = getattr(smi, "amdsmi_get_gpu_driver_info", None)
    try:
        info = fn(handles[0]) if fn is not None and handles else {}
    except Exception:
        return ""
    version = info.get("driver_version", "") if isinstance(info, dict) else ""
    return version if isinstance(version, str) else ""


# --- answer checks: the clean value or ValueError (the shared ones: probes/answers.py) ---------


def _count(value: Any) -> int:
    n = _int(value)
    if not 0 <= n < 1 << 63:
        raise ValueError(f"impossible count {n}")
    return n


def _count_or_none(value: Any) -> int | None:
    return None if value is None or value == "N/A" else _count(value)


def _gen(value: Any) -> int:
    """A PCIe rate in MT/s (32000), or in GT/s (32) as some versions give the maximum, as its generation."""
    n = _int(value)
    gen = _PCIE_GEN.get(n * 1000 if n < 100 else n)
    if gen is None:
        raise ValueError(f"unknown PCIe rate {n}")
    return gen


def _bdf(value: Any) -> str:
    bdf = _text(value)
    if not bdf or ":" not in bdf:
        raise ValueError(f"not a PCI address: {bdf!r}")
    return bdf.upper()


def _rocm_uuid(r: _Reader, serial: Any) -> Any:
    """ROCm's ``GPU-<16 hex>`` from amdsmi's ``asic_serial`` (``0x`` and the driver's ``unique_id``
    in hex, the number ROCR prints after ``GPU-``); "N/A" or 0 (no unique id: ROCR says ``GPU-XX``)
    name no GPU."""
    if serial is None or serial == "N/A" or serial == "":
        return _MISSING
    try:
        n = int(_text(serial), 16)
        if not 0 <= n < 1 << 64:
            raise ValueError(f"impossible ASIC serial {serial!r}")
    except ValueError as exc:
        r.errors.append(("rocm_uuid", f"garbled answer from amdsmi_get_gpu_asic_info: {exc}"))
        return _MISSING
    return f"GPU-{n:016x}" if n else _MISSING


def _xgmi(value: Any) -> str:
    n = int(value)
    if n not in _XGMI:
        raise ValueError(f"unknown XGMI status {value!r}")
    return _XGMI[n]


def _processes(value: Any) -> tuple[GpuProcess, ...]:
    """amdsmi's process list: dicts with ``pid``, ``name`` and ``mem`` (bytes); other shapes say nothing."""
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"expected a list of processes, got {type(value).__name__}")
    out = []
    for proc in value:
        if not isinstance(proc, dict) or not isinstance(proc.get("pid"), int):
            continue
        mem = proc.get("mem")
        out.append(GpuProcess(proc["pid"], mem // (1024 * 1024) if isinstance(mem, int) else None,
                              _text(proc.get("name", "")) if isinstance(proc.get("name", ""), str) else ""))
    return tuple(out)
