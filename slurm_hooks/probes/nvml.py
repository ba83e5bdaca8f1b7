"""The real GPU probe: one NVML session per snapshot, every field read once.

Field rules: unsupported -> ``None`` (a reason, not a failure); GPU lost ->
``lost`` and no more questions to that GPU; reset required -> ``needs_reset``;
any other error or an answer that cannot be true -> ``None`` plus an entry in
``errors``, so a check can say "unreadable" instead of guessing. The same rules
hold for the return code NVML gives inside an answer (a field value's own
``nvmlReturn``). A process list that grew between the binding's count and fill
calls (INSUFFICIENT_SIZE) is asked again.
"""

from __future__ import annotations

import ctypes
import time

from slurm_hooks.models import KERNEL_LOG, GpuProcess, GpuSnapshot, MigDevice, NodeSnapshot, NvLink, XidEvent
from slurm_hooks.probes import nvml_errors
from slurm_hooks.probes.answers import Garbled as _Garbled
from slurm_hooks.probes.answers import integer as _int
from slurm_hooks.probes.answers import ranged as _ranged
from slurm_hooks.probes.answers import text as _text
from slurm_hooks.probes.nvml_errors import GpuLost, NotSupported, ResetRequired
from slurm_hooks.values import replace

TYPE_CHECKING = False  # as typing.TYPE_CHECKING: typing (and dataclasses, inspect) stay off a node's every run
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

#: Bit -> name for nvmlDeviceGetCurrentClocksEventReasons (same bits as ...ThrottleReasons).
CLOCK_EVENT_REASONS: tuple[tuple[int, str], ...] = (
    (0x001, "gpu_idle"),
    (0x002, "applications_clocks_setting"),
    (0x004, "sw_power_cap"),
    (0x008, "hw_slowdown"),
    (0x010, "sync_boost"),
    (0x020, "sw_thermal_slowdown"),
    (0x040, "hw_thermal_slowdown"),
    (0x080, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)

_FABRIC_STATES = {1: "not_started", 2: "in_progress"}
_FABRIC_COMPLETED = 3
_COUNTER_MAX = 0xFFFFFFFF  # NVML's "not available" sentinels are 0xFFFFFFFF and above
_MIB = 1024 * 1024
#: How often a list that keeps changing while read (INSUFFICIENT_SIZE) is asked for.
_LIST_TRIES = 3


class _Lost(Exception):
    """Internal: the GPU answered GPU_IS_LOST; stop asking it."""


_MISSING = object()
_UNSUPPORTED = object()


class NvmlProbe:
    name = "nvml"

    def __init__(self, node: str, kmsg_path: str = "/dev/kmsg", nvml: Any = None, gpu_map_path: str = ""):
        self.node = node
        self.kmsg_path = kmsg_path
        self._nvml = nvml
        #: Where this boot's GPU identities are kept (probes.identity), for a GPU that stops saying its
        #: own and for the watcher's kernel-log source; "" for nowhere.
        self.gpu_map_path = gpu_map_path
        #: The last snapshot found no NVML here at all (no binding, library or driver), rather than
        #: an NVML that failed: what ``[gpu] backend = "auto"`` asks before it tries another vendor.
        self.unloadable = False

    def snapshot(self) -> NodeSnapshot:
        taken = time.time()
        self.unloadable = False
        try:
            nvml = self._nvml if self._nvml is not None else _import_pynvml()
        except ImportError as exc:
            self.unloadable = True
            return self._failed(taken, f"NVML: python binding not installed ({exc})")
        try:
            nvml.nvmlInit()
        except Exception as exc:
            self.unloadable = nvml_errors.classify(exc) in (nvml_errors.LibraryNotFound, nvml_errors.DriverNotLoaded)
            return self._failed(taken, _node_error(exc, "nvmlInit"))
        try:
            driver = _driver_version(nvml)
            try:
                count = nvml.nvmlDeviceGetCount()
            except Exception as exc:
                return self._failed(taken, _node_error(exc, "nvmlDeviceGetCount"), driver)
            if not isinstance(count, int) or not 0 <= count <= 1024:
                return self._failed(taken, f"NVML: garbled GPU count {count!r}", driver)
            gpus = [_read_gpu(nvml, index) for index in range(count)]
        finally:
            try:
                nvml.nvmlShutdown()
            except Exception:
                pass  # nothing useful to do; the snapshot is already taken
        errors: list[tuple[str, str]] = []
        gpus, node_xids = self._attach_xids(gpus, errors)
        return NodeSnapshot(self.node, self.name, gpus=tuple(gpus), taken_at=taken, driver_version=driver,
                            node_xids=node_xids, errors=tuple(errors))

    def _failed(self, taken: float, error: str, driver: str = "") -> NodeSnapshot:
        return NodeSnapshot(self.node, self.name, taken_at=taken, driver_version=driver, error=error)

    def _attach_xids(self, gpus: list[GpuSnapshot],
                     errors: list[tuple[str, str]]) -> tuple[list[GpuSnapshot], tuple[XidEvent, ...]]:
        """XIDs come from the kernel log, each tied to its GPU here, at the source, by the PCI bus
        id this boot last read for it (a GPU fallen off the bus no longer says its own). An
        unreadable log is no reason to fail the snapshot, but no XID seen then says nothing:
        ``errors`` gets ``KERNEL_LOG`` and why (the XID check says so)."""
        from slurm_hooks.probes import identity, kmsg

        boot = kmsg.boot_id()
        if self.gpu_map_path:
            gpus = identity.recall(gpus, self.gpu_map_path, boot)
        try:
            events = kmsg.assign_gpus(kmsg.dated(kmsg.read_xids(self.kmsg_path), boot), kmsg.gpu_map(gpus))
        except Exception as exc:  # noqa: BLE001 - the GPUs were read: the snapshot stands, saying what it lacks
            errors.append((KERNEL_LOG, str(exc) or type(exc).__name__))
            return gpus, ()
        by_gpu: dict[int, list[XidEvent]] = {}
        for event in events:
            by_gpu.setdefault(event.gpu if event.gpu is not None else -1, []).append(event)
        out = [replace(g, xids=tuple(by_gpu[g.index])) if g.index in by_gpu else g for g in gpus]
        return out, tuple(by_gpu.get(-1, ()))


def read_gpu_map(nvml: Any = None) -> dict[str, tuple[int, str]]:
    """PCI bus id -> (index, UUID) of every GPU, straight from NVML (the watcher's kernel-log
    source when the probe has left no map); empty when NVML cannot say."""
    from slurm_hooks.probes import kmsg

    try:
        nvml = nvml if nvml is not None else _import_pynvml()
        nvml.nvmlInit()
    except Exception:
        return {}
    out: dict[str, tuple[int, str]] = {}
    try:
        for index in range(int(nvml.nvmlDeviceGetCount())):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                bus = _bus_id(nvml.nvmlDeviceGetPciInfo(handle))
            except Exception:
                continue
            try:
                uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            except Exception:
                uuid = ""
            out[kmsg.normalize_pci(bus)] = (index, uuid)
    except Exception:
        pass
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass
    return out


def _import_pynvml() -> Any:
    import pynvml

    return pynvml


def _node_error(exc: BaseException, fn_name: str) -> str:
    kind = nvml_errors.classify(exc)
    what = f"{fn_name} failed" if kind is nvml_errors.NvmlFailure else kind.what
    return f"NVML: {what} ({nvml_errors.describe(exc)})"


def _driver_version(nvml: Any) -> str:
    try:
        value = nvml.nvmlSystemGetDriverVersion()
    except Exception:
        return ""
    return _text(value) if isinstance(value, (str, bytes)) else ""


class _GpuReader:
    """Asks one GPU for each field and records what went wrong, field by field."""

    def __init__(self, nvml: Any, index: int):
        self.nvml = nvml
        self.index = index
        self.handle: Any = None
        self.errors: list[tuple[str, str]] = []
        self.needs_reset = False

    def ask(self, field: str, fn_names: str | tuple[str, ...], *args: Any,
            check: Callable[[Any], Any] | None = None, tries: int = 1) -> Any:
        """Value of ``nvml.<fn_name>(handle, *args)`` after ``check``, or _MISSING.

        Several names: the first one this driver and binding support answers. ``tries``: how
        often a list that changed while read (INSUFFICIENT_SIZE) is asked for.
        """
        for fn_name in (fn_names,) if isinstance(fn_names, str) else fn_names:
            raw = self._ask_one(field, fn_name, args, tries)
            if raw is _UNSUPPORTED:
                continue
            if raw is _MISSING:
                return _MISSING
            try:
                return check(raw) if check is not None else raw
            except Exception as exc:
                self.errors.append((field, f"garbled answer from {fn_name}: {exc}"))
                return _MISSING
        return _MISSING

    def _ask_one(self, field: str, fn_name: str, args: tuple, tries: int) -> Any:
        for attempt in range(1, max(1, tries) + 1):
            try:
                return self.call(fn_name, *args)
            except NotSupported:
                return _UNSUPPORTED
            except nvml_errors.InsufficientSize as err:
                if attempt < tries:
                    continue
                self.errors.append((field, f"{fn_name} failed {tries} time(s): {err}"))
                return _MISSING
            except nvml_errors.NvmlError as err:
                if not isinstance(err, ResetRequired):
                    self.errors.append((field, f"{fn_name} failed: {err}"))
                return _MISSING
        return _MISSING

    def call(self, fn_name: str, *args: Any) -> Any:
        """Raw call; NVML errors come back typed, GPU_IS_LOST as _Lost."""
        fn = getattr(self.nvml, fn_name, None)
        if fn is None:
            raise NotSupported(f"{fn_name} not in this pynvml")
        try:
            return fn(self.handle, *args)
        except Exception as exc:
            raise self.typed(exc, fn_name) from None

    def typed(self, exc: Exception, fn_name: str) -> Exception:
        kind = nvml_errors.classify(exc)
        if kind is GpuLost:
            return _Lost(f"GPU is lost ({nvml_errors.code_name(nvml_errors.code_of(exc))} at {fn_name})")
        if kind is ResetRequired:
            self.needs_reset = True
        return nvml_errors.translate(exc)

    def returned(self, code: int, where: str) -> nvml_errors.NvmlError:
        """A return code inside an answer, typed as a raised one; GPU_IS_LOST raises _Lost."""
        err = nvml_errors.for_code(code, where)
        if isinstance(err, GpuLost):
            raise _Lost(f"GPU is lost ({nvml_errors.code_name(code)} at {where})")
        if isinstance(err, ResetRequired):
            self.needs_reset = True
        return err


def _read_gpu(nvml: Any, index: int) -> GpuSnapshot:
    r = _GpuReader(nvml, index)
    fields: dict[str, Any] = {}
    try:
        try:
            r.handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except Exception as exc:
            err = r.typed(exc, "nvmlDeviceGetHandleByIndex")
            if isinstance(err, _Lost):
                raise err from None
            if not isinstance(err, ResetRequired):
                r.errors.append(("handle", f"nvmlDeviceGetHandleByIndex failed: {err}"))
            return GpuSnapshot(index=index, needs_reset=r.needs_reset, errors=tuple(r.errors))
        _read_fields(r, fields)
    except _Lost as lost:
        return GpuSnapshot(index=index, lost=True, needs_reset=r.needs_reset, errors=(("*", str(lost)),),
                           **{k: v for k, v in fields.items() if k in _IDENTITY})
    return GpuSnapshot(index=index, needs_reset=r.needs_reset, errors=tuple(r.errors), **fields)


_IDENTITY = ("uuid", "minor", "serial", "pci_bus_id", "model")


def _read_fields(r: _GpuReader, out: dict[str, Any]) -> None:
    """Fill ``out`` with every field that could be read; identity first, so a lost GPU keeps it."""
    nvml, ask = r.nvml, r.ask

    def put(field: str, value: Any) -> None:
        if value is not _MISSING:
            out[field] = value

    put("uuid", ask("uuid", "nvmlDeviceGetUUID", check=_text))
    put("minor", ask("minor", "nvmlDeviceGetMinorNumber", check=_ranged(0, 254)))
    put("serial", ask("serial", "nvmlDeviceGetSerial", check=_text))
    put("pci_bus_id", ask("pci_bus_id", "nvmlDeviceGetPciInfo", check=_bus_id))
    put("model", ask("model", "nvmlDeviceGetName", check=_text))
    put("mig", _mig_devices(r))

    unc = nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    put("ecc_volatile_uncorrectable",
        ask("ecc_volatile_uncorrectable", "nvmlDeviceGetTotalEccErrors", unc, nvml.NVML_VOLATILE_ECC, check=_count))
    put("ecc_aggregate_uncorrectable",
        ask("ecc_aggregate_uncorrectable", "nvmlDeviceGetTotalEccErrors", unc, nvml.NVML_AGGREGATE_ECC, check=_count))
    put("retired_pages_pending", ask("retired_pages_pending", "nvmlDeviceGetRetiredPagesPendingStatus", check=_flag))
    rows = ask("row_remap", "nvmlDeviceGetRemappedRows", check=_remapped_rows)
    if rows is not _MISSING:
        out["row_remap_pending"], out["row_remap_failure"] = rows

    put("pcie_gen", ask("pcie_gen", "nvmlDeviceGetCurrPcieLinkGeneration", check=_ranged(1, 10)))
    put("pcie_gen_max", ask("pcie_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration", check=_ranged(1, 10)))
    put("pcie_width", ask("pcie_width", "nvmlDeviceGetCurrPcieLinkWidth", check=_ranged(1, 32)))
    put("pcie_width_max", ask("pcie_width_max", "nvmlDeviceGetMaxPcieLinkWidth", check=_ranged(1, 32)))
    put("nvlinks", _nvlinks(r))

    put("temperature_c", ask("temperature_c", "nvmlDeviceGetTemperature", nvml.NVML_TEMPERATURE_GPU,
                             check=_ranged(0, 150)))
    put("power_w", ask("power_w", "nvmlDeviceGetPowerUsage", check=_watts))
    put("power_limit_w", ask("power_limit_w", "nvmlDeviceGetEnforcedPowerLimit", check=_watts))
    put("throttle_reasons", _throttle(r))
    put("persistence_mode", ask("persistence_mode", "nvmlDeviceGetPersistenceMode", check=_flag))
    put("fabric_state", _fabric_state(r))
    put("recovery_action", _recovery_action(r))

    procs = ask("processes", ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetComputeRunningProcesses_v2"),
                check=_processes, tries=_LIST_TRIES)
    if procs is not _MISSING:
        out["processes"] = tuple(GpuProcess(pid, mib, _process_name(nvml, pid)) for pid, mib in procs)
    put("memory_used_mib", ask("memory_used_mib", "nvmlDeviceGetMemoryInfo", check=_memory_used_mib))


def _nvlinks(r: _GpuReader) -> Any:
    """Links 0.. until NVML says there are no more; ``None`` on a GPU without NVLink."""
    nvml = r.nvml
    counters = (
        ("replay_errors", nvml.NVML_NVLINK_ERROR_DL_REPLAY),
        ("recovery_errors", nvml.NVML_NVLINK_ERROR_DL_RECOVERY),
        ("crc_errors", nvml.NVML_NVLINK_ERROR_DL_CRC_FLIT),
    )
    links: list[NvLink] = []
    for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))):
        try:
            state = r.call("nvmlDeviceGetNvLinkState", link)
        except NotSupported:
            break
        except nvml_errors.NvmlError as err:
            if err.code == nvml.NVML_ERROR_INVALID_ARGUMENT:
                break
            if not isinstance(err, ResetRequired):
                r.errors.append((f"nvlink{link}.active", f"nvmlDeviceGetNvLinkState failed: {err}"))
            links.append(NvLink(link))
            continue
        if state not in (0, 1) or isinstance(state, bool):
            r.errors.append((f"nvlink{link}.active", f"garbled answer from nvmlDeviceGetNvLinkState: {state!r}"))
            links.append(NvLink(link))
            continue
        values: dict[str, Any] = {}
        if state:
            for name, counter in counters:
                value = r.ask(f"nvlink{link}.{name}", "nvmlDeviceGetNvLinkErrorCounter", link, counter, check=_count)
                if value is not _MISSING:
                    values[name] = value
        links.append(NvLink(link, active=bool(state), **values))
    return tuple(links) if links else _MISSING


def _mig_devices(r: _GpuReader) -> Any:
    """The GPU's MIG instances (UUID, GPU instance id, compute instance id) when MIG mode is on."""
    mode = r.ask("mig", "nvmlDeviceGetMigMode")
    if mode is _MISSING or not isinstance(mode, (tuple, list)) or not mode or mode[0] != 1:
        return _MISSING
    count = r.ask("mig", "nvmlDeviceGetMaxMigDeviceCount", check=_ranged(0, 64))
    if count is _MISSING:
        return _MISSING
    nvml, out = r.nvml, []
    for j in range(count):
        try:
            handle = r.call("nvmlDeviceGetMigDeviceHandleByIndex", j)
        except nvml_errors.NvmlError:
            continue  # no instance in this slot (a lost GPU raises _Lost: no more questions)
        try:
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        except _Garbled as exc:
            r.errors.append(("mig", f"MIG device {j}: garbled answer from nvmlDeviceGetUUID: {exc}"))
            continue
        except Exception as exc:
            err = r.typed(exc, "nvmlDeviceGetUUID")
            if isinstance(err, _Lost):
                raise err from None
            r.errors.append(("mig", f"MIG device {j}: nvmlDeviceGetUUID failed: {err}"))
            continue
        ids = []
        for fn in ("nvmlDeviceGetGpuInstanceId", "nvmlDeviceGetComputeInstanceId"):
            try:
                ids.append(_ranged(0, 1023)(getattr(nvml, fn)(handle)))
            except Exception:
                ids.append(None)
        out.append(MigDevice(uuid, ids[0], ids[1]))
    return tuple(out)


def _throttle(r: _GpuReader) -> Any:
    mask = r.ask("throttle_reasons", ("nvmlDeviceGetCurrentClocksEventReasons",
                                      "nvmlDeviceGetCurrentClocksThrottleReasons"), check=_mask)
    if mask is _MISSING:
        return _MISSING
    names = [name for bit, name in CLOCK_EVENT_REASONS if mask & bit]
    known = sum(bit for bit, _ in CLOCK_EVENT_REASONS)
    names += [f"unknown_0x{1 << b:x}" for b in range(64) if mask & ~known & (1 << b)]
    return tuple(names)


#: NVML's GPU recovery action field (``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``, driver >= 565).
RECOVERY_ACTION_FIELD = 230
#: Its values (``nvmlGpuRecoveryAction_t``) as DESIGN.md gives them; the binding's names win.
RECOVERY_ACTIONS = {0: "none", 1: "gpu_reset", 2: "node_reboot", 3: "drain_p2p", 4: "drain_and_reset"}


def _recovery_action(r: _GpuReader) -> Any:
    """The driver's verdict on this GPU (:data:`RECOVERY_ACTIONS`, judged by checks/recovery.py);
    absent (old driver, old binding, field unknown) is no error: the field stays ``None``. The
    call succeeds and the field carries its own return code: NOT_SUPPORTED where the driver does
    not know field 230, GPU_IS_LOST as from any call; other codes are recorded."""
    field = getattr(r.nvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", RECOVERY_ACTION_FIELD)
    try:
        values = r.call("nvmlDeviceGetFieldValues", [field])
    except nvml_errors.NvmlError:
        return _MISSING
    try:
        value = values[0]
        returned = int(value.nvmlReturn)
        code = int(value.value.uiVal) if returned == 0 else None
    except (IndexError, AttributeError, TypeError, ValueError) as exc:
        r.errors.append(("recovery_action", f"garbled answer from nvmlDeviceGetFieldValues: {exc}"))
        return _MISSING
    if code is None:
        err = r.returned(returned, f"nvmlDeviceGetFieldValues field {field}")
        if not isinstance(err, (NotSupported, ResetRequired)):
            r.errors.append(("recovery_action", f"nvmlDeviceGetFieldValues failed for field {field}: {err}"))
        return _MISSING
    return _recovery_names(r.nvml).get(code, f"unknown ({code})")


def _recovery_names(nvml: Any) -> dict[int, str]:
    """Value -> name: the binding's own names where it has them (bindings disagree on 5..7)."""
    names = dict(RECOVERY_ACTIONS)
    prefix = "NVML_GPU_RECOVERY_ACTION_"
    for attr in dir(nvml):
        if attr.startswith(prefix):
            value = getattr(nvml, attr, None)
            if isinstance(value, int):
                names[value] = attr[len(prefix):].lower()
    return names


def _fabric_state(r: _GpuReader) -> Any:
    """NVSwitch fabric registration; ``None`` where the GPU has no fabric to join."""
    nvml = r.nvml
    for fn_name, struct_name in (("nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfoV_t"),
                                 ("nvmlDeviceGetGpuFabricInfo", "c_nvmlGpuFabricInfo_t")):
        struct = getattr(nvml, struct_name, None)
        if struct is None or getattr(nvml, fn_name, None) is None:
            continue
        info = struct()
        try:
            r.call(fn_name, ctypes.byref(info))
        except NotSupported:
            continue
        except nvml_errors.NvmlError as err:
            if err.code == getattr(nvml, "NVML_ERROR_ARGUMENT_VERSION_MISMATCH", -1):
                continue
            if not isinstance(err, ResetRequired):
                r.errors.append(("fabric_state", f"{fn_name} failed: {err}"))
            return _MISSING
        return _fabric_from(r, info, fn_name)
    return _MISSING


def _fabric_from(r: _GpuReader, info: Any, fn_name: str) -> Any:
    state, status = getattr(info, "state", None), getattr(info, "status", None)
    if state == 0:
        return _MISSING
    if state in _FABRIC_STATES:
        return _FABRIC_STATES[state]
    if state == _FABRIC_COMPLETED and isinstance(status, int):
        return "completed" if status == 0 else f"failed:{nvml_errors.code_name(status)}"
    r.errors.append(("fabric_state", f"garbled answer from {fn_name}: state={state!r} status={status!r}"))
    return _MISSING


def _process_name(nvml: Any, pid: int) -> str:
    try:
        return _text(nvml.nvmlSystemGetProcessName(pid))
    except Exception:
        return ""  # a process in another PID namespace has no name we can see


# --- answer checks: return the clean value or raise _Garbled (the shared ones: probes/answers.py) --


def _count(value: Any) -> int:
    n = _int(value)
    if not 0 <= n < _COUNTER_MAX:
        raise _Garbled(f"impossible count {n}")
    return n


def _mask(value: Any) -> int:
    n = _int(value)
    if not 0 <= n < 1 << 64:
        raise _Garbled(f"impossible bit mask {n}")
    return n


def _flag(value: Any) -> bool:
    if _int(value) not in (0, 1):
        raise _Garbled(f"expected 0 or 1, got {value!r}")
    return bool(value)


def _watts(value: Any) -> float:
    mw = _int(value)
    if not 0 <= mw <= 10_000_000:
        raise _Garbled(f"impossible power {mw} mW")
    return mw / 1000.0


def _bus_id(info: Any) -> str:
    bus = _text(info.busId)
    if not bus:
        raise _Garbled("empty PCI bus id")
    return bus.upper()


def _remapped_rows(value: Any) -> tuple[bool, bool]:
    if not isinstance(value, (tuple, list)) or len(value) != 4:
        raise _Garbled(f"expected (corr, unc, pending, failure), got {value!r}")
    for n in value[:2]:
        _count(n)
    return _flag(value[2]), _flag(value[3])


def _processes(value: Any) -> list[tuple[int, int | None]]:
    if not isinstance(value, (list, tuple)):
        raise _Garbled(f"expected a list of processes, got {type(value).__name__}")
    out = []
    for proc in value:
        pid = _int(proc.pid)
        if pid <= 0:
            raise _Garbled(f"impossible pid {pid}")
        used = getattr(proc, "usedGpuMemory", None)
        mib = None if used is None else _int(used) // _MIB
        if mib is not None and mib < 0:
            raise _Garbled(f"negative memory for pid {pid}")
        out.append((pid, mib))
    return out


def _memory_used_mib(info: Any) -> int:
    used, total = _int(info.used), _int(info.total)
    if not 0 <= used <= total:
        raise _Garbled(f"used {used} of total {total} bytes")
    return used // _MIB
