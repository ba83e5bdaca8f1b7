"""The one shared fake of ROCm's ``amdsmi`` Python module: its names, shapes and errors.

Pass it where the code takes ``amdsmi=`` (``AmdSmiProbe(node, amdsmi=fake)``), or put
``tests/fakes/amd_site`` on ``sys.path`` so that ``import amdsmi`` finds :data:`DEFAULT`
(the ``fake_amdsmi_importable`` fixture)::

    fake = FakeAmdSmi.healthy(gpus=8, model="AMD Instinct MI300X")
    fake.set(gpu=2, ecc={"UMC": (0, 3, 0)})                 # (correctable, uncorrectable, deferred)
    fake.fail("amdsmi_get_pcie_info", gpu=1, code=STATUS["NO_PERM"])
    fake.remove("amdsmi_get_gpu_bad_page_threshold")      # an amdsmi older than the call

As the real module (ROCm/amdsmi ``py-interface/amdsmi_interface.py``, ``amdsmi_exception.py``):
module functions taking an ``amdsmi_processor_handle``; ``amdsmi_init(AmdSmiInitFlags)``; IntEnums
``AmdSmiGpuBlock`` (UMC=1, SDMA=2, GFX=4, ... bit values), ``AmdSmiMemoryPageStatus``
(RESERVED=0, PENDING=1, UNRESERVABLE=2), ``AmdSmiXgmiStatus``, ``AmdSmiTemperatureType``,
``AmdSmiTemperatureMetric``; every failure an ``AmdSmiLibraryException(code)`` whose
``get_error_code()`` is the C status (``amdsmi_wrapper.AMDSMI_STATUS_*``); a call before
``amdsmi_init`` answers NOT_INIT; dicts with the real keys ("N/A" where the library says a
value is not available); ``amdsmi_gpu_xgmi_error_status`` an int; bad pages a list of dicts
whose ``status`` is the raw int. Events as ``AmdSmiEventReader`` delivers them::

    fake.emit(gpu=3, event="RING_HANG", message="gfx_0.0.0")   # as the driver's KFD tells it

``AmdSmiEventReader(handle, [AmdSmiEvtNotificationType...])`` arms one GPU for those types;
``read(timeout_ms, num_elem=10)`` waits up to ``timeout_ms`` and returns up to ``num_elem`` dicts
``{"processor_handle": <the handle's address, an int>, "event": <type name>, "message": str}`` from
every armed GPU, or raises NO_DATA; ``stop()`` disarms.
"""

from __future__ import annotations

import copy
import threading
import types
from enum import IntEnum
from typing import Any

#: ``amdsmi_status_t`` (amdsmi_wrapper.py / amdsmi.h).
STATUS = {"SUCCESS": 0, "INVAL": 1, "NOT_SUPPORTED": 2, "NOT_YET_IMPLEMENTED": 3, "FAIL_LOAD_MODULE": 4,
          "API_FAILED": 7, "TIMEOUT": 8, "RETRY": 9, "NO_PERM": 10, "IO": 12, "FILE_ERROR": 14,
          "INIT_ERROR": 18, "BUSY": 30, "NOT_FOUND": 31, "NOT_INIT": 32, "DRIVER_NOT_LOADED": 34,
          "NO_DATA": 40, "UNKNOWN_ERROR": 4294967295}
_INFO = {"NOT_SUPPORTED": "Feature not supported", "NO_PERM": "Permission Denied", "BUSY": "Device busy",
         "DRIVER_NOT_LOADED": "Driver not loaded", "NOT_INIT": "Device not initialized",
         "NOT_FOUND": "Device Not found", "IO": "I/O Error"}

amdsmi_wrapper = types.SimpleNamespace(**{f"AMDSMI_STATUS_{k}": v for k, v in STATUS.items()})


class AmdSmiInitFlags(IntEnum):
    INIT_ALL_PROCESSORS = 4294967295
    INIT_AMD_CPUS = 1
    INIT_AMD_GPUS = 2
    INIT_NON_AMD_CPUS = 4
    INIT_NON_AMD_GPUS = 8
    INIT_AMD_APUS = 3


class AmdSmiGpuBlock(IntEnum):
    INVALID = 0
    UMC = 1
    SDMA = 2
    GFX = 4
    MMHUB = 8
    ATHUB = 16
    PCIE_BIF = 32
    HDP = 64
    XGMI_WAFL = 128
    DF = 256
    SMN = 512
    SEM = 1024
    MP0 = 2048
    MP1 = 4096
    FUSE = 8192
    MCA = 16384
    VCN = 32768
    JPEG = 65536
    IH = 131072
    MPIO = 262144
    RESERVED = 9223372036854775808


class AmdSmiMemoryPageStatus(IntEnum):
    RESERVED = 0
    PENDING = 1
    UNRESERVABLE = 2


class AmdSmiXgmiStatus(IntEnum):
    NO_ERRORS = 0
    ERROR = 1
    MULTIPLE_ERRORS = 2


class AmdSmiTemperatureType(IntEnum):
    EDGE = 0
    HOTSPOT = 1
    JUNCTION = 1
    VRAM = 2
    HBM_0 = 3
    HBM_1 = 4
    HBM_2 = 5
    HBM_3 = 6
    PLX = 7


class AmdSmiTemperatureMetric(IntEnum):
    CURRENT = 0
    MAX = 1
    MIN = 2
    CRITICAL = 5


class AmdSmiEvtNotificationType(IntEnum):
    NONE = 0
    VMFAULT = 1
    THERMAL_THROTTLE = 2
    GPU_PRE_RESET = 3
    GPU_POST_RESET = 4
    RING_HANG = 5


class AmdSmiException(Exception):
    """Base smi exception class"""


class AmdSmiLibraryException(AmdSmiException):
    def __init__(self, err_code):
        err_code = abs(err_code)
        super().__init__(err_code)
        self.err_code = err_code
        name = next((k for k, v in STATUS.items() if v == err_code), "UNKNOWN_ERROR")
        self.err_info = f"AMDSMI_STATUS_{name} - {_INFO.get(name, 'An unknown error occurred')}"

    def __str__(self):
        return f"Error code:\n\t{self.err_code} | {self.err_info}"

    def get_error_info(self):
        return self.err_info

    def get_error_code(self):
        return self.err_code


class AmdSmiParameterException(AmdSmiException):
    def __init__(self, received, expected, msg=None):
        super().__init__(msg)
        self.err_code = None
        self.err_msg = msg or f"Invalid parameter:\nActual type: {type(received)}\nExpected type: {expected}"

    def __str__(self):
        return self.err_msg


class amdsmi_processor_handle:  # noqa: N801 - the real ctypes type's name
    def __init__(self, value: int):
        self.value = value


#: market name -> (PCIe MT/s, width, VRAM MiB, XGMI)
MODELS: dict[str, tuple[int, int, int, bool]] = {
    "AMD Instinct MI300X": (32000, 16, 196608, True),
    "AMD Instinct MI325X": (32000, 16, 262144, True),
    "AMD Instinct MI250X": (16000, 16, 65536, True),
    "AMD Instinct MI210": (16000, 16, 65536, False),
}
_DEFAULT_BLOCKS = ("UMC", "SDMA", "GFX", "MMHUB", "XGMI_WAFL", "PCIE_BIF", "HDP")


def gpu_state(index: int, model: str = "AMD Instinct MI300X", partition: int = 0, physical: int | None = None,
              die: int = 0) -> dict[str, Any]:
    """One processor's answers. ``physical``: which board it is (its partitions share one PCI
    device); ``die``: an MI250X's second die is its own PCI device."""
    speed, width, vram, xgmi = MODELS[model]
    board = index if physical is None else physical
    bus = 0x0C + 0x10 * board + die
    return {
        "uuid": f"{0x5bff74a1 + board:08x}-{die:04x}-1000-80{partition:02x}-a2a7e5b2a0{board:02x}",
        "bdf": f"0000:{bus:02x}:00.{partition}",
        "serial": f"PCB0{board:02d}0A1B2C",  # both dies of an MI250X are one board
        # The driver's unique_id of the PCI device, as amdsmi_get_gpu_asic_info shows it ("0x" and
        # 16 hex; "N/A" where the ASIC has none): each die its own, a board's partitions one. ROCm
        # names the GPU GPU-<those 16 hex, lower case> (rocminfo, ROCR_VISIBLE_DEVICES).
        "asic_serial": f"0x{0xD1CB9B1A4E0A7A00 + 0x10 * board + die:016X}",
        "market_name": model,
        "partition": partition,
        "render": 128 + index,
        "ecc_enabled": sum(int(AmdSmiGpuBlock[b]) for b in _DEFAULT_BLOCKS),
        "ecc": {},  # block name -> (correctable, uncorrectable, deferred)
        "bad_pages": [],  # (page address, AmdSmiMemoryPageStatus value)
        "bad_page_threshold": 512,
        "xgmi": 0 if xgmi else None,
        "pcie_speed": speed, "pcie_speed_max": speed, "pcie_width": width, "pcie_width_max": width,
        "pcie_replay": 0, "pcie_recovery": 0,
        "temps": {"EDGE": 38, "HOTSPOT": 45, "VRAM": 40, "HBM_0": 41, "HBM_1": 42, "HBM_2": 40, "HBM_3": 41},
        "violations": {},  # "active_socket_thrm": True, ...
        "processes": [],  # dicts as amdsmi_get_gpu_process_list gives them
        "vram_used": 283, "vram_total": vram,
    }


def _rocm_uuid(asic_serial: str) -> str:
    """ROCR's name of the GPU: "GPU-" and the unique id in 16 hex digits, "GPU-XX" without one."""
    try:
        uid = int(asic_serial, 16)
    except ValueError:
        uid = 0
    return f"GPU-{uid:016x}" if uid else "GPU-XX"


class FakeAmdSmi(types.ModuleType):
    """A module object with amdsmi's names, answering from per-processor state."""

    AmdSmiInitFlags = AmdSmiInitFlags
    AmdSmiGpuBlock = AmdSmiGpuBlock
    AmdSmiMemoryPageStatus = AmdSmiMemoryPageStatus
    AmdSmiXgmiStatus = AmdSmiXgmiStatus
    AmdSmiTemperatureType = AmdSmiTemperatureType
    AmdSmiTemperatureMetric = AmdSmiTemperatureMetric
    AmdSmiEvtNotificationType = AmdSmiEvtNotificationType
    AmdSmiException = AmdSmiException
    AmdSmiLibraryException = AmdSmiLibraryException
    AmdSmiParameterException = AmdSmiParameterException
    amdsmi_processor_handle = amdsmi_processor_handle
    amdsmi_wrapper = amdsmi_wrapper

    def __init__(self, gpus: list[dict[str, Any]] | None = None, driver_version: str = "6.10.5"):
        super().__init__("amdsmi")
        self.gpus = [copy.deepcopy(g) for g in gpus or ()]
        self.driver_version = driver_version
        self.failures: dict[tuple[str, int | None], int] = {}
        self.removed: set[str] = set()
        self.calls: list[tuple[str, int | None]] = []
        self.initialised = False
        self.resets: list[int] = []
        #: Events the driver has told and no read has taken: (GPU, type name, message).
        self.events: list[tuple[int, str, str]] = []
        #: GPU -> the event types it is armed for (an AmdSmiEventReader not stopped).
        self.armed: dict[int, set[str]] = {}
        self._told = threading.Condition()
        self.AmdSmiEventReader = _event_reader(self)

    @classmethod
    def healthy(cls, gpus: int = 8, model: str = "AMD Instinct MI300X", partitions: int = 1) -> FakeAmdSmi:
        """``gpus`` boards of ``model``; ``partitions`` > 1: each board split in that many (CPX: 8)."""
        if model == "AMD Instinct MI250X":  # two dies per board, two GPUs to the OS and to Slurm
            return cls([gpu_state(2 * b + d, model, physical=b, die=d) for b in range(gpus) for d in (0, 1)])
        return cls([gpu_state(b * partitions + p, model, partition=p, physical=b)
                    for b in range(gpus) for p in range(partitions)])

    def set(self, gpu: int, **state: Any) -> FakeAmdSmi:
        unknown = set(state) - set(self.gpus[gpu])
        if unknown:
            raise KeyError(f"unknown state key(s) {sorted(unknown)}")
        self.gpus[gpu].update(state)
        return self

    def fail(self, function: str, gpu: int | None = None, code: int = STATUS["UNKNOWN_ERROR"]) -> FakeAmdSmi:
        self.failures[(function, gpu)] = code
        return self

    def remove(self, *functions: str) -> FakeAmdSmi:
        self.removed.update(functions)
        return self

    def emit(self, gpu: int, event: str, message: str = "") -> FakeAmdSmi:
        """The driver tells an event of ``gpu`` (an ``AmdSmiEvtNotificationType`` name)."""
        AmdSmiEvtNotificationType[event]
        with self._told:
            self.events.append((gpu, event, message))
            self._told.notify_all()
        return self

    def called(self, function: str) -> int:
        return sum(1 for f, _ in self.calls if f == function)

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("amdsmi_") and name in object.__getattribute__(self, "removed"):
            raise AttributeError(name)
        return object.__getattribute__(self, name)

    # --- plumbing as the real module's ------------------------------------------------------

    def _enter(self, function: str, handle: Any = None, needs_init: bool = True) -> dict[str, Any] | None:
        index = None
        if handle is not None:
            if not isinstance(handle, amdsmi_processor_handle):
                raise AmdSmiParameterException(handle, amdsmi_processor_handle)
            index = handle.value
        self.calls.append((function, index))
        for key in ((function, index), (function, None)):
            if key in self.failures:
                raise AmdSmiLibraryException(self.failures[key])
        if needs_init and not self.initialised:
            raise AmdSmiLibraryException(STATUS["NOT_INIT"])
        if index is None:
            return None
        if not 0 <= index < len(self.gpus):
            raise AmdSmiLibraryException(STATUS["NOT_FOUND"])
        return self.gpus[index]

    @staticmethod
    def _unsupported() -> AmdSmiLibraryException:
        return AmdSmiLibraryException(STATUS["NOT_SUPPORTED"])

    # --- the API ----------------------------------------------------------------------------

    def amdsmi_init(self, flag=AmdSmiInitFlags.INIT_AMD_GPUS):
        if not isinstance(flag, AmdSmiInitFlags):
            raise AmdSmiParameterException(flag, AmdSmiInitFlags)
        self._enter("amdsmi_init", needs_init=False)
        self.initialised = True

    def amdsmi_shut_down(self):
        self._enter("amdsmi_shut_down")
        self.initialised = False

    def amdsmi_get_processor_handles(self):
        self._enter("amdsmi_get_processor_handles")
        return [amdsmi_processor_handle(i) for i in range(len(self.gpus))]

    def amdsmi_get_gpu_device_uuid(self, h):
        return self._enter("amdsmi_get_gpu_device_uuid", h)["uuid"]

    def amdsmi_get_gpu_device_bdf(self, h):
        return self._enter("amdsmi_get_gpu_device_bdf", h)["bdf"]

    def amdsmi_get_gpu_board_info(self, h):
        g = self._enter("amdsmi_get_gpu_board_info", h)
        return {"model_number": "102-G30211-00", "product_serial": g["serial"] or "N/A", "fru_id": "N/A",
                "product_name": g["market_name"], "manufacturer_name": "AMD"}

    def amdsmi_get_gpu_asic_info(self, h):
        g = self._enter("amdsmi_get_gpu_asic_info", h)
        return {"market_name": g["market_name"], "vendor_id": "0x1002", "vendor_name": "Advanced Micro Devices Inc.",
                "subvendor_id": "0x1002", "device_id": "0x74a1", "rev_id": "0x00", "asic_serial": g["asic_serial"],
                "oam_id": 0, "num_compute_units": 304, "target_graphics_version": "gfx942"}

    def amdsmi_get_gpu_kfd_info(self, h):
        g = self._enter("amdsmi_get_gpu_kfd_info", h)
        return {"kfd_id": 45412 + 10 * g["render"], "node_id": 2 + g["render"] - 128,
                "current_partition_id": g["partition"]}

    def amdsmi_get_gpu_enumeration_info(self, h):
        g = self._enter("amdsmi_get_gpu_enumeration_info", h)
        return {"drm_render": g["render"], "drm_card": g["render"] - 128, "hsa_id": g["render"] - 126,
                "hip_id": g["render"] - 128,
                "hip_uuid": _rocm_uuid(g["asic_serial"])}

    def amdsmi_get_gpu_driver_info(self, h):
        self._enter("amdsmi_get_gpu_driver_info", h)
        return {"driver_name": "amdgpu", "driver_version": self.driver_version, "driver_date": "2015/01/01 00:00"}

    def amdsmi_get_gpu_total_ecc_count(self, h):
        g = self._enter("amdsmi_get_gpu_total_ecc_count", h)
        ce, ue, de = (sum(c[i] for c in g["ecc"].values()) for i in range(3))
        return {"correctable_count": ce, "uncorrectable_count": ue, "deferred_count": de}

    def amdsmi_get_gpu_ecc_enabled(self, h):
        return self._enter("amdsmi_get_gpu_ecc_enabled", h)["ecc_enabled"]

    def amdsmi_get_gpu_ecc_count(self, h, block):
        g = self._enter("amdsmi_get_gpu_ecc_count", h)
        if not isinstance(block, AmdSmiGpuBlock):
            raise AmdSmiParameterException(block, AmdSmiGpuBlock)
        if not g["ecc_enabled"] & int(block):
            raise self._unsupported()
        ce, ue, de = g["ecc"].get(block.name, (0, 0, 0))
        return {"correctable_count": ce, "uncorrectable_count": ue, "deferred_count": de}

    def amdsmi_get_gpu_bad_page_info(self, h):
        g = self._enter("amdsmi_get_gpu_bad_page_info", h)
        return [{"value": i, "page_address": addr, "page_size": 4096, "status": status}
                for i, (addr, status) in enumerate(g["bad_pages"])]

    def amdsmi_get_gpu_bad_page_threshold(self, h):
        g = self._enter("amdsmi_get_gpu_bad_page_threshold", h)
        if g["bad_page_threshold"] is None:
            raise self._unsupported()
        return g["bad_page_threshold"]

    def amdsmi_gpu_xgmi_error_status(self, h):
        g = self._enter("amdsmi_gpu_xgmi_error_status", h)
        if g["xgmi"] is None:
            raise self._unsupported()
        return AmdSmiXgmiStatus(g["xgmi"]).value

    def amdsmi_get_pcie_info(self, h):
        g = self._enter("amdsmi_get_pcie_info", h)
        return {"pcie_static": {"max_pcie_width": g["pcie_width_max"], "max_pcie_speed": g["pcie_speed_max"],
                                "pcie_interface_version": 5, "slot_type": "OAM"},
                "pcie_metric": {"pcie_width": g["pcie_width"], "pcie_speed": g["pcie_speed"], "pcie_bandwidth": "N/A",
                                "pcie_replay_count": g["pcie_replay"],
                                "pcie_l0_to_recovery_count": g["pcie_recovery"],
                                "pcie_replay_roll_over_count": 0, "pcie_nak_sent_count": 0,
                                "pcie_nak_received_count": 0, "pcie_lc_perf_other_end_recovery_count": 0}}

    def amdsmi_get_temp_metric(self, h, sensor_type, metric):
        g = self._enter("amdsmi_get_temp_metric", h)
        if not isinstance(sensor_type, AmdSmiTemperatureType):
            raise AmdSmiParameterException(sensor_type, AmdSmiTemperatureType)
        if not isinstance(metric, AmdSmiTemperatureMetric):
            raise AmdSmiParameterException(metric, AmdSmiTemperatureMetric)
        value = g["temps"].get(sensor_type.name)
        if value is None:
            raise self._unsupported()
        return value

    def amdsmi_get_violation_status(self, h):
        g = self._enter("amdsmi_get_violation_status", h)
        out: dict[str, Any] = {"reference_timestamp": 1700000000000, "violation_timestamp": 1700000000000}
        for kind in ("prochot_thrm", "ppt_pwr", "socket_thrm", "vr_thrm", "hbm_thrm"):
            active = bool(g["violations"].get(f"active_{kind}", False))
            out[f"acc_{kind}"] = 10 if active else 0
            out[f"per_{kind}"] = 100 if active else 0
            out[f"active_{kind}"] = active
        return out

    def amdsmi_get_gpu_process_list(self, h):
        return list(self._enter("amdsmi_get_gpu_process_list", h)["processes"])

    def amdsmi_get_gpu_vram_usage(self, h):
        g = self._enter("amdsmi_get_gpu_vram_usage", h)
        return {"vram_used": g["vram_used"], "vram_total": g["vram_total"]}

    def amdsmi_reset_gpu(self, h):
        self._enter("amdsmi_reset_gpu", h)
        self.resets.append(h.value)


def _event_reader(fake: FakeAmdSmi) -> type:
    """The module's ``AmdSmiEventReader`` class, answering from ``fake``'s events."""

    class AmdSmiEventReader:
        def __init__(self, processor_handle, event_types):
            if not isinstance(processor_handle, amdsmi_processor_handle):
                raise AmdSmiParameterException(processor_handle, amdsmi_processor_handle)
            if not hasattr(event_types, "__iter__"):
                raise AmdSmiParameterException(event_types, "Iterable")
            for kind in event_types:
                if not isinstance(kind, AmdSmiEvtNotificationType):
                    raise AmdSmiParameterException(kind, AmdSmiEvtNotificationType)
            self.processor_handle = processor_handle
            fake._enter("amdsmi_init_gpu_event_notification", processor_handle)
            fake._enter("amdsmi_set_gpu_event_notification_mask", processor_handle)
            fake.armed[processor_handle.value] = {k.name for k in event_types if k.name != "NONE"}

        def read(self, timestamp, num_elem=10):
            fake._enter("amdsmi_get_gpu_event_notification")

            def mine() -> list[tuple[int, str, str]]:
                return [e for e in fake.events if e[1] in fake.armed.get(e[0], ())]

            with fake._told:
                fake._told.wait_for(lambda: mine(), timeout=timestamp / 1000)
                taken = mine()[:num_elem]
                for e in taken:
                    fake.events.remove(e)
            if not taken:
                raise AmdSmiLibraryException(STATUS["NO_DATA"])
            return [{"processor_handle": gpu, "event": event, "message": message} for gpu, event, message in taken]

        def stop(self):
            fake._enter("amdsmi_stop_gpu_event_notification", self.processor_handle)
            fake.armed.pop(self.processor_handle.value, None)

        def __enter__(self):
            return self

        def __exit__(self, exc_type, exc_value, traceback):
            self.stop()

    return AmdSmiEventReader


#: What ``import amdsmi`` finds with ``tests/fakes/amd_site`` on ``sys.path``.
DEFAULT = FakeAmdSmi.healthy(gpus=8)
