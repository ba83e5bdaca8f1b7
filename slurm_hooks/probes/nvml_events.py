"""XIDs as NVML delivers them: an event set registered for critical XID errors.

The watcher's source on real GPUs. ``nvmlEventSetWait_v2`` blocks for at most
``poll`` seconds so a stop request is seen promptly; NVML errors become typed
:mod:`nvml_errors` so the watcher can log, wait and register again.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from slurm_hooks.models import XidEvent
from slurm_hooks.probes import nvml_errors


class NvmlEventSource:
    def __init__(self, nvml: Any = None, poll: float = 0.5):
        self._nvml = nvml
        self.poll = poll

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

    @staticmethod
    def _event(nv: Any, data: Any, indexes: dict[Any, int], uuids: dict[int, str] | None = None) -> XidEvent:
        key = _key(data.device)
        gpu = indexes.get(key) if key is not None else None
        if gpu is None:
            try:
                gpu = int(nv.nvmlDeviceGetIndex(data.device))
            except Exception:
                gpu = None
        now = time.time()
        # NVML gives no sequence number; the event's own timestamp (microseconds) identifies it.
        stamp = getattr(data, "timeStamp", 0) or int(now * 1e6)
        return XidEvent(code=int(data.eventData), gpu=gpu, ts=now, message="NVML XID event", source="nvml",
                        seq=int(stamp), uuid=(uuids or {}).get(gpu, "") if gpu is not None else "")


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
