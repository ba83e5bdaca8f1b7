"""The one shared fake NVML: a module-like object with pynvml's names.

Pass it where the code takes ``nvml=`` (``NvmlProbe(node, nvml=fake)``). Its
functions answer from per-GPU state and raise *real* ``pynvml.NVMLError``
subclasses, so the probe's error mapping runs exactly as with a driver::

    fake = FakeNvml.healthy(gpus=8, model="NVIDIA H100 80GB HBM3")
    fake.fail("nvmlDeviceGetTemperature", gpu=2, code=pynvml.NVML_ERROR_NOT_SUPPORTED)
    fake.set(gpu=3, temperature=0xFFFFFFFF)
    fake.lose(gpu=5)

State keys are raw NVML answers (milliwatts, bytes, bit masks), see ``GPU_KEYS``.
Constants and ctypes structs come from the real pynvml; a function the fake
does not implement is absent, as in an old binding (``remove`` makes more so).
"""

from __future__ import annotations

import copy
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
}

#: Functions that name no GPU: errors for them are set with ``gpu=None``.
NODE_FUNCTIONS = ("nvmlInit", "nvmlShutdown", "nvmlDeviceGetCount", "nvmlSystemGetDriverVersion")


@dataclass
class FakeLink:
    active: int = 1
    replay: int = 0
    recovery: int = 0
    crc_flit: int = 0


@dataclass(frozen=True)
class FakeHandle:
    index: int


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
        self._pending_xids: list[tuple[int, int]] = []  # (gpu, xid) for nvmlEventSetWait_v2
        self.registered: list[tuple[int, int]] = []  # (gpu, event mask)

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

    def lose(self, gpu: int) -> FakeNvml:
        """The GPU fell off the bus: NVML cannot even get its handle."""
        return self.fail("nvmlDeviceGetHandleByIndex", gpu=gpu, code=pynvml.NVML_ERROR_GPU_IS_LOST)

    def remove(self, *functions: str) -> FakeNvml:
        """Hide functions, as an older pynvml would not have them."""
        self._removed.update(functions)
        return self

    def emit_xid(self, gpu: int, xid: int) -> FakeNvml:
        """Queue a critical XID for the next ``nvmlEventSetWait_v2``."""
        self._pending_xids.append((gpu, xid))
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
        code = self._errors.get((function, gpu), self._errors.get((function, None)))
        if code is not None:
            raise pynvml.NVMLError(code)

    def _gpu(self, function: str, handle: Any) -> dict[str, Any]:
        if not isinstance(handle, FakeHandle):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._enter(function, handle.index)
        return self.gpus[handle.index]

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

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        self._enter("nvmlDeviceGetHandleByIndex", index)
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return FakeHandle(index)

    def nvmlEventSetCreate(self) -> object:
        self._enter("nvmlEventSetCreate")
        return object()

    def nvmlDeviceRegisterEvents(self, handle: Any, mask: int, event_set: object) -> None:
        self._gpu("nvmlDeviceRegisterEvents", handle)
        self.registered.append((handle.index, mask))

    def nvmlEventSetWait_v2(self, event_set: object, timeout_ms: int) -> Any:
        self._enter("nvmlEventSetWait_v2")
        if not self._pending_xids:
            time.sleep(min(timeout_ms, 50) / 1000)
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        gpu, xid = self._pending_xids.pop(0)
        return types.SimpleNamespace(device=FakeHandle(gpu), eventType=pynvml.nvmlEventTypeXidCriticalError,
                                     eventData=xid, timeStamp=1_700_000_000_000_000 + len(self.calls))

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        self._gpu("nvmlDeviceGetIndex", handle)
        return handle.index

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
        return FakeMigHandle(handle.index, index)

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

    def nvmlDeviceGetFieldValues(self, handle: Any, field_ids: list[int]) -> list:
        """Per field, its own return code as NVML gives it: a field the driver does not know
        answers NOT_SUPPORTED inside an otherwise successful call (``recovery_action`` None)."""
        gpu = self._gpu("nvmlDeviceGetFieldValues", handle)
        out = []
        for field_id in field_ids:
            value = pynvml.c_nvmlFieldValue_t()
            value.fieldId = field_id
            answer = gpu.get("recovery_action") if field_id == pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION else None
            if answer is None:
                value.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
            else:
                value.nvmlReturn = pynvml.NVML_SUCCESS
                value.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
                value.value.uiVal = answer
            out.append(value)
        return out

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list:
        procs = self._answer(self._gpu("nvmlDeviceGetComputeRunningProcesses", handle), "processes")
        if not isinstance(procs, list):
            return procs
        return [types.SimpleNamespace(pid=pid, usedGpuMemory=used, gpuInstanceId=0xFFFFFFFF,
                                      computeInstanceId=0xFFFFFFFF) for pid, used, _ in procs]

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
    }
