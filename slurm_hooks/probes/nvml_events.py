"""XIDs as NVML delivers them: an event set registered for critical XID errors.

The watcher's source on real GPUs. ``nvmlEventSetWait_v2`` blocks for at most
``poll`` seconds so a stop request is seen promptly (each event comes once, then
NVML_ERROR_TIMEOUT until the next); NVML errors become typed :mod:`nvml_errors`
so the watcher can log, wait and register again. The binding's event
(``c_nvmlEventData_t``: device, eventType, eventData, gpuInstanceId,
computeInstanceId) carries no time and no sequence number: the time we received
it is its identity (:attr:`XidEvent.seq`, kept strictly increasing).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from slurm_hooks.models import XidEvent
from slurm_hooks.probes import nvml_errors

#: ``gpuInstanceId`` of an event that is not a MIG instance's (NVML's 0xFFFFFFFF).
_NO_INSTANCE = 0xFFFFFFFF


class NvmlEventSource:
    def __init__(self, nvml: Any = None, poll: float = 0.5, clock: Callable[[], float] = time.time):
        self._nvml = nvml
        self.poll = poll
        self.clock = clock
        self._last_seq = 0

    @property
    def nvml(self) -> Any:
        if self._nvml is None:
            import pynvml

            self._nvml = pynvml
        return self._nvml

    def backlog(self) -> list[XidEvent]:
        return []  # NVML only reports events that happen while a set is registered

    def follow(self, stop: threading.Event, on_event: Callable[[XidEvent], None]) -> None:
        nv = self.nvml
        try:
            nv.nvmlInit()
        except Exception as exc:
            raise nvml_errors.translate(exc) from None
        try:
            event_set, indexes = self._register(nv)
            uuids = _uuids(nv)
            while not stop.is_set():
                try:
                    data = nv.nvmlEventSetWait_v2(event_set, int(self.poll * 1000))
                except Exception as exc:
                    if nvml_errors.code_of(exc) == getattr(nv, "NVML_ERROR_TIMEOUT", None):
                        continue
                    raise nvml_errors.translate(exc) from None
                on_event(self._event(nv, data, indexes, uuids))
        finally:
            try:
                nv.nvmlShutdown()
            except Exception:
                pass

    def _register(self, nv: Any) -> tuple[Any, dict[Any, int]]:
        try:
            event_set = nv.nvmlEventSetCreate()
            indexes: dict[Any, int] = {}
            for i in range(nv.nvmlDeviceGetCount()):
                handle = nv.nvmlDeviceGetHandleByIndex(i)
                nv.nvmlDeviceRegisterEvents(handle, nv.nvmlEventTypeXidCriticalError, event_set)
                key = _key(handle)
                if key is not None:
                    indexes[key] = i
        except Exception as exc:
            raise nvml_errors.translate(exc) from None
        return event_set, indexes

    def _event(self, nv: Any, data: Any, indexes: dict[Any, int], uuids: dict[int, str] | None = None) -> XidEvent:
        key = _key(data.device)
        gpu = indexes.get(key) if key is not None else None
        if gpu is None:
            try:
                gpu = int(nv.nvmlDeviceGetIndex(data.device))
            except Exception:
                gpu = None
        now = self.clock()
        # The struct has no timestamp and NVML no sequence number: the microsecond we received
        # it names the event, one more than the last where two arrive within one microsecond.
        self._last_seq = max(int(now * 1e6), self._last_seq + 1)
        instance = getattr(data, "gpuInstanceId", _NO_INSTANCE)
        return XidEvent(code=int(data.eventData), gpu=gpu, ts=now, message="NVML XID event", source="nvml",
                        seq=self._last_seq, uuid=(uuids or {}).get(gpu, "") if gpu is not None else "",
                        instance=None if not isinstance(instance, int) or instance >= _NO_INSTANCE else instance)


def _uuids(nv: Any) -> dict[int, str]:
    """Index -> UUID of every GPU, so that an event names its GPU as the history counts it."""
    from slurm_hooks.probes.nvml import _text

    out: dict[int, str] = {}
    try:
        for index in range(int(nv.nvmlDeviceGetCount())):
            try:
                out[index] = _text(nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetHandleByIndex(index)))
            except Exception:
                continue
    except Exception:
        pass
    return out


def _key(handle: Any) -> Any:
    """NVML device handles are ctypes pointers: their address names the device.

    ``None`` when there is no stable address (then NVML is asked for the index);
    never ``id()``, which Python reuses once an object is freed.
    """
    value = getattr(handle, "value", None)
    if value is not None:
        return value
    contents = getattr(handle, "contents", None)
    if contents is not None:
        try:
            import ctypes

            return ctypes.addressof(contents)
        except (TypeError, ValueError):
            pass
    return None
