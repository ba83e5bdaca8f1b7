"""The one shared fake NVML: a module-like object with pynvml's names.

Pass it where the code takes ``nvml=`` (``NvmlProbe(node, nvml=fake)``). Its
functions answer from per-GPU state and raise *real* ``pynvml.NVMLError``
subclasses, so the probe's error mapping runs exactly as with a driver::

    fake = FakeNvml.healthy(gpus=8, model="NVIDIA H100 80GB HBM3")
    fake.fail("nvmlDeviceGetTemperature", gpu=2, code=pynvml.NVML_ERROR_NOT_SUPPORTED)
    fake.set(gpu=3, temperature=0xFFFFFFFF)
    fake.lose(gpu=5)                                   # gone before the read
    fake.lose(gpu=6, at="nvmlDeviceGetPowerUsage")     # gone in the middle of it

It answers in NVML's own shapes, as libnvidia-ml does through nvidia-ml-py: device handles
are ``c_nvmlDevice_t`` pointers; a link past the last NVLink is INVALID_ARGUMENT;
``nvmlDeviceGetFieldValues`` succeeds with a per-field ``nvmlReturn`` (NOT_SUPPORTED for a
field the driver does not know); an event is a ``c_nvmlEventData_t`` (device, eventType,
eventData, gpuInstanceId, computeInstanceId: no timestamp), delivered once, then TIMEOUT;
a lost GPU answers GPU_IS_LOST to every later call; process lists go through the
INSUFFICIENT_SIZE count protocol (``processes_started`` adds processes between the binding's
count and fill calls).

State keys are raw NVML answers (milliwatts, bytes, bit masks), see ``GPU_KEYS``.
Constants and ctypes structs come from the real pynvml; a function the fake
does not implement is absent, as in an old binding (``remove`` makes more so).
"""

from __future__ import annotations

import copy
import ctypes
import inspect
import time
import types
from dataclasses import dataclass
from typing import Any

import pynvml

#: model name -> (PCIe gen, width, NVLink count, power limit mW, memory bytes)
MODELS: dict[str, tuple[int, int, int, int, int]] = {
    "NVIDIA H100 80GB HBM3": (5, 16, 18, 700_000, 80 * 1024**3),
    "NVIDIA H200": (5, 16, 18, 700_000, 141 * 1024**3),
    "NVIDIA A100-SXM4-80GB": (4, 16, 12, 400_000, 80 * 1024**3),
    "NVIDIA L40S": (4, 16, 0, 350_000, 48 * 1024**3),
}

#: Every per-GPU state key ``set`` accepts, with what it feeds.
GPU_KEYS = {
    "uuid": "nvmlDeviceGetUUID",
    "minor": "nvmlDeviceGetMinorNumber (the N of /dev/nvidiaN)",
    "mig": "MIG instances, list of (MIG UUID, GPU instance id, compute instance id); [] when MIG mode is off",
    "serial": "nvmlDeviceGetSerial",
    "pci_bus_id": "nvmlDeviceGetPciInfo().busId",
    "name": "nvmlDeviceGetName",
    "ecc_volatile_uncorrectable": "nvmlDeviceGetTotalEccErrors(UNCORRECTED, VOLATILE)",
    "ecc_aggregate_uncorrectable": "nvmlDeviceGetTotalEccErrors(UNCORRECTED, AGGREGATE)",
    "retired_pages_pending": "nvmlDeviceGetRetiredPagesPendingStatus (0/1)",
    "remapped_rows": "nvmlDeviceGetRemappedRows (corr, unc, pending, failure)",
    "pcie_gen": "nvmlDeviceGetCurrPcieLinkGeneration",
    "pcie_gen_max": "nvmlDeviceGetMaxPcieLinkGeneration",
    "pcie_width": "nvmlDeviceGetCurrPcieLinkWidth",
    "pcie_width_max": "nvmlDeviceGetMaxPcieLinkWidth",
    "nvlinks": "list of FakeLink, one per link nvmlDeviceGetNvLinkState answers for",
    "temperature": "nvmlDeviceGetTemperature (C)",
    "power_mw": "nvmlDeviceGetPowerUsage (mW)",
    "power_limit_mw": "nvmlDeviceGetEnforcedPowerLimit (mW)",
    "clocks_event_reasons": "nvmlDeviceGetCurrentClocksEventReasons (bit mask)",
    "persistence_mode": "nvmlDeviceGetPersistenceMode (0/1)",
    "fabric_state": "GpuFabricInfo.state (NVML_GPU_FABRIC_STATE_*)",
    "fabric_status": "GpuFabricInfo.status (an NVML return code)",
    "processes": "list of (pid, used bytes or None, name)",
    "memory_used": "nvmlDeviceGetMemoryInfo().used (bytes)",
    "memory_total": "nvmlDeviceGetMemoryInfo().total (bytes)",
    "recovery_action": "nvmlDeviceGetFieldValues([NVML_FI_DEV_GET_GPU_RECOVERY_ACTION]) uiVal; None: field unknown",
    "field_returns": "field id -> the nvmlReturn NVML gives that field in nvmlDeviceGetFieldValues",
    "processes_started": "processes (as ``processes``) that start between the binding's count and fill calls",
}

#: XID 79 as the driver logs it (a raw /dev/kmsg record) for the GPU at 00000000:38:00.0, which
#: ``healthy_gpu`` puts at index 2: a GPU fallen off the bus, in the kernel log.
XID79_GPU2 = ("3,4123,3757433200,-;NVRM: Xid (PCI:0000:38:00): 79, pid='<unknown>', name=<unknown>, "
              "GPU has fallen off the bus.\n")

#: Functions that name no GPU: errors for them are set with ``gpu=None``.
NODE_FUNCTIONS = ("nvmlInit", "nvmlShutdown", "nvmlDeviceGetCount", "nvmlSystemGetDriverVersion")


@dataclass
class FakeLink:
    active: int = 1
    replay: int = 0
    recovery: int = 0
    crc_flit: int = 0


@dataclass(frozen=True)
class FakeMigHandle:
    gpu: int
    index: int


class FakeNvml:
    """A pynvml stand-in; every call is recorded in ``calls`` as (name, gpu index or None)."""

    def __init__(self, gpus: list[dict[str, Any]] | None = None, driver_version: str = "570.124.06"):
        self.gpus: list[dict[str, Any]] = gpus or []
        self.driver_version = driver_version
        self.calls: list[tuple[str, int | None]] = []
        self.inits = 0
        self.shutdowns = 0
        self._errors: dict[tuple[str, int | None], int] = {}
        self._removed: set[str] = set()
        self._pending_xids: list[tuple[int, int, int | None]] = []  # (gpu, xid, GPU instance)
        self.registered: list[tuple[int, int]] = []  # (gpu, event mask)
        self._lost_at: dict[int, str] = {}  # gpu -> the call from which on it is lost
        self._lost: set[int] = set()
        self._devices: dict[int, Any] = {}  # gpu -> the memory its c_nvmlDevice_t handle points at
        self._stalls: dict[str, Any] = {}  # function -> the threading.Event that lets it answer

    # --- building a scenario ---------------------------------------------------

    @classmethod
    def healthy(cls, gpus: int = 8, model: str = "NVIDIA H100 80GB HBM3") -> FakeNvml:
        return cls([healthy_gpu(i, model) for i in range(gpus)])

    def set(self, gpu: int, **state: Any) -> FakeNvml:
        """Replace raw answers for one GPU; any value goes, to test garbled answers."""
        unknown = set(state) - set(GPU_KEYS)
        if unknown:
            raise TypeError(f"unknown FakeNvml GPU key(s) {sorted(unknown)}; known: {sorted(GPU_KEYS)}")
        self.gpus[gpu].update(state)
        return self

    def fail(self, function: str, gpu: int | None = None, code: int = pynvml.NVML_ERROR_UNKNOWN) -> FakeNvml:
        """Make ``function`` raise ``NVMLError(code)`` for one GPU, or for all GPUs and node calls when ``gpu`` is None."""
        if not function.startswith("nvml") or not hasattr(pynvml, function):
            raise TypeError(f"{function!r} is not a pynvml function")
        self._errors[(function, gpu)] = code
        return self

    def lose(self, gpu: int, at: str = "") -> FakeNvml:
        """The GPU fell off the bus: NVML cannot even get its handle; with ``at``, it falls off in
        the middle of a read: that call and every later one naming the GPU answer GPU_IS_LOST."""
        if not at:
            return self.fail("nvmlDeviceGetHandleByIndex", gpu=gpu, code=pynvml.NVML_ERROR_GPU_IS_LOST)
        if not at.startswith("nvml") or not hasattr(pynvml, at):
            raise TypeError(f"{at!r} is not a pynvml function")
        self._lost_at[gpu] = at
        return self

    def stall(self, function: str, until: Any) -> FakeNvml:
        """A driver that does not answer: ``function`` blocks until ``until`` (a threading.Event) is set."""
        if not function.startswith("nvml") or not hasattr(pynvml, function):
            raise TypeError(f"{function!r} is not a pynvml function")
        self._stalls[function] = until
        return self

    def remove(self, *functions: str) -> FakeNvml:
        """Hide functions, as an older pynvml would not have them."""
        self._removed.update(functions)
        return self

    def emit_xid(self, gpu: int, xid: int, instance: int | None = None) -> FakeNvml:
        """Queue a critical XID (on MIG GPU instance ``instance``) for the next ``nvmlEventSetWait_v2``."""
        self._pending_xids.append((gpu, xid, instance))
        return self

    def called(self, function: str) -> int:
        return sum(1 for name, _ in self.calls if name == function)

    # --- module-like behaviour ---------------------------------------------------

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("nvml") and name in object.__getattribute__(self, "_removed"):
            raise AttributeError(f"FakeNvml: {name} removed")
        return object.__getattribute__(self, name)

    def __getattr__(self, name: str) -> Any:
        """Constants, structs and exception classes from the real pynvml; never its functions."""
        value = getattr(pynvml, name)
        if inspect.isfunction(value):
            raise AttributeError(f"FakeNvml does not implement {name}")
        return value

    def _enter(self, function: str, gpu: int | None = None) -> None:
        self.calls.append((function, gpu))
        if function in self._stalls:
            self._stalls[function].wait()
        if gpu is not None and self._lost_at.get(gpu) == function:
            self._lost.add(gpu)
        if gpu in self._lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        code = self._errors.get((function, gpu), self._errors.get((function, None)))
        if code is not None:
            raise pynvml.NVMLError(code)

    def _handle(self, index: int) -> Any:
        """The GPU's ``c_nvmlDevice_t``, as NVML's: a pointer that is the same for the same GPU."""
        if index not in self._devices:
            self._devices[index] = ctypes.create_string_buffer(8)
        return ctypes.cast(self._devices[index], pynvml.c_nvmlDevice_t)

    def _index(self, handle: Any) -> int:
        if isinstance(handle, pynvml.c_nvmlDevice_t) and handle:
            address = ctypes.addressof(handle.contents)
            for index, buf in self._devices.items():
                if ctypes.addressof(buf) == address:
                    return index
        raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def _gpu(self, function: str, handle: Any) -> dict[str, Any]:
        index = self._index(handle)
        self._enter(function, index)
        return self.gpus[index]

    @staticmethod
    def _answer(gpu: dict[str, Any], key: str) -> Any:
        value = gpu[key]
        if value is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return copy.copy(value)

    # --- node ----------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self._enter("nvmlInit")
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._enter("nvmlDeviceGetHandleByIndex", index)
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._handle(index)

    def nvmlEventSetCreate(self) -> object:
        self._enter("nvmlEventSetCreate")
        return object()

    def nvmlDeviceRegisterEvents(self, handle: Any, mask: int, event_set: object) -> None:
        self._gpu("nvmlDeviceRegisterEvents", handle)
        self.registered.append((self._index(handle), mask))

    def nvmlEventSetWait_v2(self, event_set: object, timeout_ms: int) -> Any:
        """Each queued XID once, as the binding returns it (a ``c_nvmlEventData_t``: no timestamp,
        no sequence number); then NVML_ERROR_TIMEOUT."""
        self._enter("nvmlEventSetWait_v2")
        if not self._pending_xids:
            time.sleep(min(timeout_ms, 50) / 1000)
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        gpu, xid, instance = self._pending_xids.pop(0)
        data = pynvml.c_nvmlEventData_t()
        data.device = self._handle(gpu)
        data.eventType = pynvml.nvmlEventTypeXidCriticalError
        data.eventData = xid
        data.gpuInstanceId = 0xFFFFFFFF if instance is None else instance
        data.computeInstanceId = 0xFFFFFFFF
        return data

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        self._gpu("nvmlDeviceGetIndex", handle)
        return self._index(handle)

    def nvmlSystemGetProcessName(self, pid: int) -> str:
        self._enter("nvmlSystemGetProcessName")
        for gpu in self.gpus:
            for proc_pid, _, name in gpu["processes"] or ():
                if proc_pid == pid:
                    return name
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    # --- per GPU ---------------------------------------------------------------------

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        if isinstance(handle, FakeMigHandle):
            return self._mig(handle)[0]
        return self._answer(self._gpu("nvmlDeviceGetUUID", handle), "uuid")

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        return self._answer(self._gpu("nvmlDeviceGetMinorNumber", handle), "minor")

    def nvmlDeviceGetMigMode(self, handle: Any) -> tuple[int, int]:
        mode = 1 if self._gpu("nvmlDeviceGetMigMode", handle).get("mig") else 0
        return (mode, mode)

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        return 7 if self._gpu("nvmlDeviceGetMaxMigDeviceCount", handle).get("mig") else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> FakeMigHandle:
        migs = self._gpu("nvmlDeviceGetMigDeviceHandleByIndex", handle).get("mig") or []
        if not 0 <= index < len(migs):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return FakeMigHandle(self._index(handle), index)

    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int:
        return self._mig(handle)[1]

    def nvmlDeviceGetComputeInstanceId(self, handle: Any) -> int:
        return self._mig(handle)[2]

    def _mig(self, handle: Any) -> tuple:
        if not isinstance(handle, FakeMigHandle):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._enter("mig", handle.gpu)
        return tuple(self.gpus[handle.gpu]["mig"][handle.index])

    def nvmlDeviceGetSerial(self, handle: Any) -> str:
        return self._answer(self._gpu("nvmlDeviceGetSerial", handle), "serial")

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._answer(self._gpu("nvmlDeviceGetName", handle), "name")

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        bus = self._answer(self._gpu("nvmlDeviceGetPciInfo", handle), "pci_bus_id")
        return types.SimpleNamespace(busId=bus, busIdLegacy=bus)

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter_type: int) -> int:
        gpu = self._gpu("nvmlDeviceGetTotalEccErrors", handle)
        if error_type != pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
            return 0
        key = "ecc_volatile_uncorrectable" if counter_type == pynvml.NVML_VOLATILE_ECC else "ecc_aggregate_uncorrectable"
        return self._answer(gpu, key)

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Any) -> int:
        return self._answer(self._gpu("nvmlDeviceGetRetiredPagesPendingStatus", handle), "retired_pages_pending")

    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple:
        return self._answer(self._gpu("nvmlDeviceGetRemappedRows", handle), "remapped_rows")

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any) -> int:
        return self._answer(self._gpu("nvmlDeviceGetCurrPcieLinkGeneration", handle), "pcie_gen")

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any) -> int:
        return self._answer(self._gpu("nvmlDeviceGetMaxPcieLinkGeneration", handle), "pcie_gen_max")

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any) -> int:
        return self._answer(self._gpu("nvmlDeviceGetCurrPcieLinkWidth", handle), "pcie_width")

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any) -> int:
        return self._answer(self._gpu("nvmlDeviceGetMaxPcieLinkWidth", handle), "pcie_width_max")

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:
        links = self._gpu("nvmlDeviceGetNvLinkState", handle)["nvlinks"]
        if not links:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= link < len(links):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return links[link].active

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: Any, link: int, counter: int) -> int:
        links = self._gpu("nvmlDeviceGetNvLinkErrorCounter", handle)["nvlinks"]
        if not links or not 0 <= link < len(links):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        names = {pynvml.NVML_NVLINK_ERROR_DL_REPLAY: "replay", pynvml.NVML_NVLINK_ERROR_DL_RECOVERY: "recovery",
                 pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT: "crc_flit"}
        if counter not in names:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return getattr(links[link], names[counter])

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        gpu = self._gpu("nvmlDeviceGetTemperature", handle)
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._answer(gpu, "temperature")

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return self._answer(self._gpu("nvmlDeviceGetPowerUsage", handle), "power_mw")

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        return self._answer(self._gpu("nvmlDeviceGetEnforcedPowerLimit", handle), "power_limit_mw")

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return self._answer(self._gpu("nvmlDeviceGetCurrentClocksEventReasons", handle), "clocks_event_reasons")

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        return self._answer(self._gpu("nvmlDeviceGetCurrentClocksThrottleReasons", handle), "clocks_event_reasons")

    def nvmlDeviceGetPersistenceMode(self, handle: Any) -> int:
        return self._answer(self._gpu("nvmlDeviceGetPersistenceMode", handle), "persistence_mode")

    def nvmlDeviceGetGpuFabricInfoV(self, handle: Any, info_ref: Any) -> int:
        return self._fabric("nvmlDeviceGetGpuFabricInfoV", handle, info_ref)

    def nvmlDeviceGetGpuFabricInfo(self, handle: Any, info_ref: Any) -> int:
        return self._fabric("nvmlDeviceGetGpuFabricInfo", handle, info_ref)

    def _fabric(self, function: str, handle: Any, info_ref: Any) -> int:
        gpu = self._gpu(function, handle)
        info = getattr(info_ref, "_obj", None) or info_ref.contents  # ctypes.byref(...) or ctypes.pointer(...)
        state = gpu["fabric_state"]
        if state is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        info.state = state
        info.status = gpu["fabric_status"]
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetFieldValues(self, handle: Any, field_ids: list[int]) -> Any:
        """The binding's array of ``c_nvmlFieldValue_t``, each with its own return code: the call
        succeeds while a field the driver does not know answers NOT_SUPPORTED (``recovery_action``
        None), or whatever ``field_returns`` says for that field."""
        gpu = self._gpu("nvmlDeviceGetFieldValues", handle)
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        for value, field_id in zip(values, field_ids):
            value.fieldId = field_id
            answer = gpu.get("recovery_action") if field_id == pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION else None
            code = (gpu.get("field_returns") or {}).get(field_id)
            if code is not None or answer is None:
                value.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED if code is None else code
            else:
                value.nvmlReturn = pynvml.NVML_SUCCESS
                value.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
                value.value.uiVal = answer
        return values

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list:
        """nvidia-ml-py's own wrapper over the C call: ask the count (NULL buffer: SUCCESS when
        none, else INSUFFICIENT_SIZE and the count), then fill a buffer of 2n+5; more processes
        than that by then is INSUFFICIENT_SIZE raised. Friendly objects, as the binding's."""
        index = self._index(handle)
        gpu = self._gpu("nvmlDeviceGetComputeRunningProcesses", handle)
        procs = self._answer(gpu, "processes")
        if not isinstance(procs, list):
            return procs  # a garbled answer, as a test sets it
        c_count = ctypes.c_uint(0)
        ret = self._c_running_processes(index, c_count, None)
        if ret == pynvml.NVML_SUCCESS:
            return []
        if ret != pynvml.NVML_ERROR_INSUFFICIENT_SIZE:
            raise pynvml.NVMLError(ret)
        gpu["processes"] = list(gpu["processes"]) + list(gpu.get("processes_started") or ())
        gpu["processes_started"] = []
        c_count.value = c_count.value * 2 + 5
        c_procs = (pynvml.c_nvmlProcessInfo_v3_t * c_count.value)()
        ret = self._c_running_processes(index, c_count, c_procs)
        if ret != pynvml.NVML_SUCCESS:
            raise pynvml.NVMLError(ret)
        out = []
        for i in range(c_count.value):
            obj = pynvml.nvmlStructToFriendlyObject(c_procs[i])
            if obj.usedGpuMemory == pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value:
                obj.usedGpuMemory = None
            out.append(obj)
        return out

    def _c_running_processes(self, index: int, c_count: Any, c_procs: Any) -> int:
        """``nvmlDeviceGetComputeRunningProcesses_v3`` as libnvidia-ml answers it."""
        procs = self.gpus[index]["processes"]
        if c_procs is None or c_count.value < len(procs):
            c_count.value = len(procs)
            return pynvml.NVML_SUCCESS if not procs and c_procs is None else pynvml.NVML_ERROR_INSUFFICIENT_SIZE
        for slot, (pid, used, _) in zip(c_procs, procs):
            slot.pid = pid
            slot.usedGpuMemory = pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value if used is None else used
            slot.gpuInstanceId = slot.computeInstanceId = 0xFFFFFFFF
        c_count.value = len(procs)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> Any:
        gpu = self._gpu("nvmlDeviceGetMemoryInfo", handle)
        used, total = self._answer(gpu, "memory_used"), self._answer(gpu, "memory_total")
        return types.SimpleNamespace(used=used, total=total, free=total - used if isinstance(used, int) else 0)


def healthy_gpu(index: int, model: str = "NVIDIA H100 80GB HBM3") -> dict[str, Any]:
    """Raw NVML answers of one healthy, idle GPU of ``model`` in an HGX board."""
    gen, width, links, power_limit, memory = MODELS[model]
    return {
        "uuid": f"GPU-{index:08x}-fake-4000-8000-{index:012x}",
        "minor": index,
        "mig": [],
        "serial": f"165012401{index:04d}",
        "pci_bus_id": f"00000000:{0x18 + index * 0x10:02X}:00.0",
        "name": model,
        "ecc_volatile_uncorrectable": 0,
        "ecc_aggregate_uncorrectable": 0,
        "retired_pages_pending": 0,
        "remapped_rows": (0, 0, 0, 0),
        "pcie_gen": gen,
        "pcie_gen_max": gen,
        "pcie_width": width,
        "pcie_width_max": width,
        "nvlinks": [FakeLink() for _ in range(links)],
        "temperature": 33,
        "power_mw": 71_234,
        "power_limit_mw": power_limit,
        "clocks_event_reasons": 0x1,  # GPU idle
        "persistence_mode": 1,
        "fabric_state": pynvml.NVML_GPU_FABRIC_STATE_COMPLETED if links else None,
        "fabric_status": pynvml.NVML_SUCCESS,
        "processes": [],
        "memory_used": 4 * 1024**2 + 512 * 1024**2,
        "memory_total": memory,
        "recovery_action": 0,  # NONE (driver 570 knows field 230; None: a driver before 565)
        "field_returns": {},
        "processes_started": [],
    }
