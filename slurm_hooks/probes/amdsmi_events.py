"""The amdgpu driver's events as amdsmi delivers them (``AmdSmiEventReader``), for the watcher.

What the driver's KFD tells listeners as it happens: VMFAULT, THERMAL_THROTTLE, GPU_PRE_RESET,
GPU_POST_RESET and RING_HANG. They are the same kind of thing as the driver's kernel lines, so each
becomes an :class:`XidEvent` with a row of the severity table (``rule``), judged the same way:

- RING_HANG: ``amdgpu-ring-timeout``, GPU_PRE_RESET: ``amdgpu-reset`` (the rows of the kernel's
  ``ring ... timeout`` and ``GPU reset begin!`` lines: recorded, never acted on by default);
- VMFAULT: ``amdgpu-vm-fault``, a job's fault, not the GPU's (see :data:`EVENT_RULES`);
- THERMAL_THROTTLE: ``amdgpu-thermal-throttle``, recorded; the thermal check judges temperatures;
- GPU_POST_RESET: no event. How the reset ended is the kernel's ``GPU reset(N) succeeded|failed``
  line, and a failed one is that line's row (``amdgpu-reset-failed``).

These events are not the kernel's lines and carry none of the RAS errors (uncorrectable ECC,
poison, retired pages), so they run beside the kernel log, never instead of it. A reset or a
hung ring is then seen twice, by the kernel line and by amdsmi, under two keys: each is only
recorded by default, and the XID history counts the kernel's line alone (the watcher marks an
amdsmi event seen, it never records it as an occurrence), so repeats are not counted twice.

The real API (ROCm/amdsmi ``py-interface/amdsmi_interface.py``): ``AmdSmiEventReader(
processor_handle, event_types)`` arms one GPU (``amdsmi_init_gpu_event_notification`` and its mask);
``read(timeout_ms, num_elem=10)`` waits at most ``timeout_ms`` and returns up to ``num_elem`` dicts
``{"processor_handle", "event" (the type's name), "message"}`` from every armed GPU, or raises
``AmdSmiLibraryException`` with AMDSMI_STATUS_NO_DATA when none came; ``stop()`` disarms. Every
read is bounded by :attr:`AmdSmiEventSource.poll`, so a stop request is seen promptly.
"""

from __future__ import annotations

import threading
import time

from slurm_hooks.errors import ProbeError
from slurm_hooks.models import XidEvent

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

#: amdsmi event -> the severity row it is judged by. A VM fault is a GPU page fault of one process:
#: almost always the job's own bug (a stale pointer, a freed buffer), as NVIDIA's XID 31 is as a
#: rule, so it is said and recorded and never drains: a GPU whose memory is failing says so in its
#: RAS counts and uncorrectable-error lines, which have rows of their own that drain.
EVENT_RULES = {
    "VMFAULT": "amdgpu-vm-fault",
    "THERMAL_THROTTLE": "amdgpu-thermal-throttle",
    "GPU_PRE_RESET": "amdgpu-reset",
    "RING_HANG": "amdgpu-ring-timeout",
}
#: Events read in one call at most (amdsmi's own default is 10).
MAX_EVENTS = 16


class EventsUnavailable(ProbeError):
    """amdsmi cannot deliver events here (not installed, not supported, no permission, no GPU):
    the kernel log alone tells the driver's events."""


class AmdSmiEventSource:
    #: What this source raises where it cannot work at all (the watcher then reads the kernel log alone).
    unavailable = EventsUnavailable

    def __init__(self, amdsmi: Any = None, poll: float = 0.5, clock: Callable[[], float] = time.time):
        self._smi = amdsmi
        self.poll = poll
        self.clock = clock
        self._last_seq = 0

    def backlog(self) -> list[XidEvent]:
        return []  # amdsmi only tells events that happen while a GPU is armed; the kernel log keeps the rest

    def follow(self, stop: threading.Event, on_event: Callable[[XidEvent], None]) -> None:
        from slurm_hooks.probes import amdsmi as probe

        smi = self._load()
        try:
            probe.open_session(smi)  # shared with the checks this process runs (probes.amdsmi.open_session)
        except Exception as exc:
            raise self._error(smi, exc, "amdsmi_init") from None
        readers: list[Any] = []
        try:
            gpus = self._gpus(smi)
            kinds = [getattr(smi.AmdSmiEvtNotificationType, name) for name in (*EVENT_RULES, "GPU_POST_RESET")]
            for gpu in gpus.values():
                try:
                    readers.append(smi.AmdSmiEventReader(gpu.handle, kinds))
                except Exception as exc:
                    raise self._error(smi, exc, "AmdSmiEventReader") from None
            while not stop.is_set():
                try:
                    # One read answers for every armed GPU (the library polls them all).
                    raw = readers[0].read(max(1, int(self.poll * 1000)), MAX_EVENTS)
                except Exception as exc:
                    if probe.status_of(smi, exc) == "NO_DATA":
                        continue
                    raise self._error(smi, exc, "AmdSmiEventReader.read") from None
                for item in raw or ():
                    event = self._event(item, gpus)
                    if event is not None:
                        on_event(event)
        finally:
            for reader in readers:
                try:
                    reader.stop()
                except Exception:
                    pass  # disarming a GPU that is gone: nothing to free
            probe.close_session(smi)

    def _load(self) -> Any:
        from slurm_hooks.probes import amdsmi as probe

        if self._smi is None:
            try:
                self._smi = probe.import_amdsmi()
            except Exception as exc:  # noqa: BLE001 - without libamd_smi the import fails in many ways
                raise EventsUnavailable(f"amdsmi not loadable ({' '.join(str(exc).split())})") from None
        if getattr(self._smi, "AmdSmiEventReader", None) is None:
            raise EventsUnavailable("this amdsmi has no AmdSmiEventReader")
        return self._smi

    def _gpus(self, smi: Any) -> dict[Any, Any]:
        """Each GPU (its handle, index, UUID and PCI address) by its handle's value, which is what an
        event's ``processor_handle`` is."""
        from slurm_hooks.probes import amdsmi as probe
        from slurm_hooks.probes.kmsg import normalize_pci

        try:
            handles = list(smi.amdsmi_get_processor_handles())
        except Exception as exc:
            raise self._error(smi, exc, "amdsmi_get_processor_handles") from None
        if not handles:
            raise EventsUnavailable("amdsmi: no GPU to listen to")
        out: dict[Any, Any] = {}
        for index, handle in enumerate(handles):
            uuid = bdf = ""
            try:
                uuid = probe._text(smi.amdsmi_get_gpu_device_uuid(handle))
                bdf = normalize_pci(probe._text(smi.amdsmi_get_gpu_device_bdf(handle)))
            except Exception:
                pass  # named by its index alone; the health check's probe says what it lacks
            out[_value(handle)] = _Gpu(handle, index, uuid, bdf)
        return out

    def _event(self, item: Any, gpus: dict[Any, Any]) -> XidEvent | None:
        if not isinstance(item, dict):
            return None
        name = str(item.get("event", ""))
        rule = EVENT_RULES.get(name)
        if rule is None:
            return None  # GPU_POST_RESET, or a type this code does not know
        gpu = gpus.get(_value(item.get("processor_handle")))
        now = self.clock()
        # No sequence number from the library: the microsecond it was received names the event.
        self._last_seq = max(int(now * 1e6), self._last_seq + 1)
        message = " ".join(str(item.get("message") or "").split())
        return XidEvent(code=0, gpu=gpu.index if gpu else None, pci_bus_id=gpu.bdf if gpu and gpu.bdf else None,
                        ts=now, message=f"amdsmi {name}" + (f": {message}" if message else ""), source="amdsmi",
                        seq=self._last_seq, uuid=gpu.uuid if gpu else "", rule=rule)

    @staticmethod
    def _error(smi: Any, exc: BaseException, fn_name: str) -> ProbeError:
        from slurm_hooks.probes import amdsmi as probe

        status = probe.status_of(smi, exc)
        kind = EventsUnavailable if status in ("NOT_SUPPORTED", "NOT_YET_IMPLEMENTED", "NO_PERM",
                                               "DRIVER_NOT_LOADED") else ProbeError
        return kind(f"{fn_name} failed: {probe.describe(smi, exc)}")


class _Gpu:
    __slots__ = ("handle", "index", "uuid", "bdf")

    def __init__(self, handle: Any, index: int, uuid: str, bdf: str):
        self.handle, self.index, self.uuid, self.bdf = handle, index, uuid, bdf


def _value(handle: Any) -> Any:
    """A processor handle is a ctypes ``c_void_p``: its address names the GPU (an event carries the
    bare address)."""
    return getattr(handle, "value", handle)
