"""NVIDIA XIDs from the kernel log.

NVML only reports XIDs that happen while someone listens; the kernel ring buffer
keeps the ones from before we started (a prolog, a health check run, a watcher
that was restarted). The driver prints them as ``NVRM: Xid (PCI:0000:9b:00): 119,
pid=..., name=..., <message>``; we read them from raw ``/dev/kmsg`` records
(``pri,seq,usec,flags;text``) or from ``dmesg`` / ``dmesg -T`` lines.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import re
import select
import stat
import threading
import time
from collections.abc import Iterable
from typing import Callable

from slurm_hooks.errors import ProbeError
from slurm_hooks.models import XidEvent

_KMSG_RECORD = re.compile(r"^(\d+),(\d+),(\d+),[^;]*;(.*)$")
_DMESG_PREFIX = re.compile(r"^\[\s*([^\]]+)\]\s?(.*)$")
# "SXid" (NVSwitch) must not match, hence "NVRM: " in front. On a MIG GPU the driver names the
# instance after the bus id: "NVRM: Xid (PCI:0000:01:00 GPU-I:05 GPU-CI:02): 109, ...".
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f:.]+)((?:\s+GPU-C?I:\s*[0-9A-Fa-f]+)*)\s*\): (\d+)\b,?\s*(.*)$")
_PCI = re.compile(r"^(?:([0-9A-Fa-f]{1,8}):)?([0-9A-Fa-f]{1,2}):([0-9A-Fa-f]{1,2})(?:\.([0-7]))?$")

#: Largest record /dev/kmsg returns (CONSOLE_EXT_LOG_MAX is 8 KiB); smaller reads fail with EINVAL.
_RECORD_MAX = 16384


def normalize_pci(bus_id: str) -> str:
    """``0000:9b:00`` / ``00000000:9B:00.0`` -> NVML's ``00000000:9B:00.0``."""
    text = bus_id.strip()
    m = _PCI.match(text)
    if not m:
        return text.upper()
    domain, bus, device, function = m.groups()
    return f"{int(domain or '0', 16):08X}:{int(bus, 16):02X}:{int(device, 16):02X}.{int(function or '0')}"


def _dmesg_time(stamp: str) -> float | None:
    """``12345.678901`` (seconds since boot) or ``Sun Feb 23 16:24:18 2025`` (local wall clock)."""
    try:
        return float(stamp)
    except ValueError:
        pass
    try:
        return time.mktime(time.strptime(stamp.strip(), "%a %b %d %H:%M:%S %Y"))
    except ValueError:
        return None


def parse_line(line: str) -> XidEvent | None:
    """One kernel log line or ``/dev/kmsg`` record -> its XID, or ``None``.

    ``ts`` is seconds since boot for kmsg records and plain ``dmesg`` lines, and
    epoch seconds for ``dmesg -T`` lines (the only clock they carry).
    """
    text = line.split("\n", 1)[0].rstrip("\r")
    seq = ts = None
    record = _KMSG_RECORD.match(text)
    if record:
        seq, ts, text = int(record.group(2)), int(record.group(3)) / 1e6, record.group(4)
    else:
        prefixed = _DMESG_PREFIX.match(text)
        if prefixed:
            ts, text = _dmesg_time(prefixed.group(1)), prefixed.group(2)
    m = _XID.search(text)
    if not m:
        return None
    mig = " ".join(m.group(2).split())
    message = m.group(4).strip()
    return XidEvent(code=int(m.group(3)), pci_bus_id=normalize_pci(m.group(1)), ts=ts,
                    message=f"{mig}: {message}" if mig else message, source="kmsg", seq=seq)


def _open(path: str) -> int:
    try:
        return os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise ProbeError(f"cannot read kernel log {path}: {exc.strerror or exc}") from None


def _read_record(fd: int) -> bytes | None:
    """Next /dev/kmsg record; ``None`` when none is left for now."""
    while True:
        try:
            return os.read(fd, _RECORD_MAX)
        except BlockingIOError:
            return None
        except BrokenPipeError:
            continue  # records were overwritten before we read them; the next read resumes
        except InterruptedError:
            continue


BOOT_ID = "/proc/sys/kernel/random/boot_id"


def boot_id(path: str = BOOT_ID) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def _xids(lines: Iterable[bytes], boot: str = "") -> list[XidEvent]:
    events = []
    for raw in lines:
        event = parse_line(raw.decode("utf-8", "replace"))
        if event is not None:
            events.append(dataclasses.replace(event, boot=boot) if boot else event)
    return events


def read_xids(path: str = "/dev/kmsg", max_records: int = 100000) -> list[XidEvent]:
    """Every XID still in the kernel ring buffer (or in a captured log file)."""
    fd = _open(path)
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            with os.fdopen(os.dup(fd), "rb") as fh:
                return _xids(line for _, line in zip(range(max_records), fh))
        records = []
        try:
            while len(records) < max_records:
                record = _read_record(fd)
                if not record:
                    break
                records.append(record)
        except OSError as exc:
            raise ProbeError(f"cannot read kernel log {path}: {exc.strerror or exc}") from None
        return _xids(records, boot_id())
    finally:
        os.close(fd)


def follow(path: str, stop: threading.Event, on_event: Callable[[XidEvent], None], poll: float = 0.5) -> None:
    """Call ``on_event`` for each XID logged from now on, until ``stop`` is set.

    Exceptions from ``on_event`` propagate: the watcher decides what a failed
    delivery means.
    """
    fd = _open(path)
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            _follow_file(fd, stop, on_event, poll)
        else:
            _follow_kmsg(fd, path, stop, on_event, poll)
    finally:
        os.close(fd)


def _follow_kmsg(fd: int, path: str, stop: threading.Event, on_event: Callable[[XidEvent], None],
                 poll: float) -> None:
    os.lseek(fd, 0, os.SEEK_END)
    boot = boot_id()
    while not stop.is_set():
        try:
            select.select([fd], [], [], poll)
            while not stop.is_set():
                record = _read_record(fd)
                if not record:
                    break
                for event in _xids([record], boot):
                    on_event(event)
        except OSError as exc:
            if exc.errno == errno.EINTR:
                continue
            raise ProbeError(f"cannot read kernel log {path}: {exc.strerror or exc}") from None


def _follow_file(fd: int, stop: threading.Event, on_event: Callable[[XidEvent], None], poll: float) -> None:
    pos = os.lseek(fd, 0, os.SEEK_END)
    pending = b""
    while not stop.is_set():
        if os.fstat(fd).st_size < pos:
            pos, pending = os.lseek(fd, 0, os.SEEK_SET), b""  # truncated or rotated in place
        chunk = os.read(fd, 65536)
        if not chunk:
            stop.wait(poll)
            continue
        pos += len(chunk)
        *lines, pending = (pending + chunk).split(b"\n")
        for event in _xids(lines):
            on_event(event)


def assign_gpus(events: Iterable[XidEvent], pci_to_index: dict[str, int]) -> list[XidEvent]:
    """Tie each event to a GPU index by PCI bus id; unmatched events keep ``gpu``."""
    index = {normalize_pci(bus): gpu for bus, gpu in pci_to_index.items()}
    out = []
    for event in events:
        gpu = index.get(normalize_pci(event.pci_bus_id)) if event.pci_bus_id else None
        out.append(dataclasses.replace(event, gpu=gpu) if gpu is not None else event)
    return out
