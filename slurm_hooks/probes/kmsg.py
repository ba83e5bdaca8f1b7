"""GPU driver events from the kernel log: NVIDIA's XIDs, and the amdgpu driver's lines that are
events like them (:mod:`slurm_hooks.probes.amdgpu_log`).

NVML only reports XIDs that happen while someone listens; the kernel ring buffer
keeps the ones from before we started (a prolog, a health check run, a watcher
that was restarted). The driver prints them as ``NVRM: Xid (PCI:0000:9b:00): 119,
pid=..., name=..., <message>``; we read them from raw ``/dev/kmsg`` records
(``pri,seq,usec,flags;text``) or from ``dmesg`` / ``dmesg -T`` lines.
"""

from __future__ import annotations

import errno
import os
import re
import select
import stat
import threading
import time
from collections.abc import Callable, Iterable, Mapping

from slurm_hooks.errors import ProbeError
from slurm_hooks.models import XidEvent
from slurm_hooks.values import compile_later, replace

_KMSG_RECORD = compile_later(r"^(\d+),(\d+),(\d+),[^;]*;(.*)$")
_DMESG_PREFIX = compile_later(r"^\[\s*([^\]]+)\]\s?(.*)$")
# "SXid" (NVSwitch) must not match, hence "NVRM: " in front. On a MIG GPU the driver names the
# instance after the bus id: "NVRM: Xid (PCI:0000:01:00 GPU-I:05 GPU-CI:02): 109, ...".
_XID = compile_later(r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f:.]+)((?:\s+GPU-C?I:\s*[0-9A-Fa-f]+)*)\s*\): (\d+)\b,?\s*(.*)$")
#: The MIG GPU instance a line names: the driver prints ``GPU-I:%02u`` (decimal).
_GPU_INSTANCE = compile_later(r"GPU-I:\s*(\d+)")
_PCI = compile_later(r"^(?:([0-9A-Fa-f]{1,8}):)?([0-9A-Fa-f]{1,2}):([0-9A-Fa-f]{1,2})(?:\.([0-7]))?$")

#: Lines of one code on one GPU within this many seconds of the first are one event: the driver
#: prints a burst (three XID 119 lines in 3 ms) for one fault, and escalation counts faults.
COALESCE_S = 1.0

#: Normalised PCI bus id -> (GPU index, UUID): what ties a kernel-log line to its GPU.
GpuMap = Mapping[str, tuple[int, str]]

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


def _split(text: str, priority: bool = False) -> tuple[int | None, float | None, str]:
    """A kernel log line or ``/dev/kmsg`` record -> (seq, ts, message). ``ts`` is seconds since boot
    for kmsg records and plain ``dmesg`` lines, and epoch seconds for ``dmesg -T`` lines (the only
    clock they carry); ``priority``: skip a ``<6>`` prefix (``dmesg -r``, pstore captures) first."""
    record = _KMSG_RECORD.match(text)
    if record:
        return int(record.group(2)), int(record.group(3)) / 1e6, record.group(4)
    if priority and text.startswith("<") and ">" in text[:5]:
        text = text[text.index(">") + 1:]
    prefixed = _DMESG_PREFIX.match(text)
    if prefixed:
        return None, _dmesg_time(prefixed.group(1)), prefixed.group(2)
    return None, None, text


def parse_line(line: str) -> XidEvent | None:
    """One kernel log line or ``/dev/kmsg`` record -> its XID or amdgpu event, or ``None`` (``ts`` as
    :func:`_split`)."""
    seq, ts, text = _split(line.split("\n", 1)[0].rstrip("\r"))
    m = _XID.search(text)
    if not m:
        if "amdgpu" in text:
            from slurm_hooks.probes import amdgpu_log

            event = amdgpu_log.parse(text, seq, ts)
            return replace(event, pci_bus_id=normalize_pci(event.pci_bus_id)) if event and event.pci_bus_id else event
        return None
    mig = " ".join(m.group(2).split())
    message = m.group(4).strip()
    instance = _GPU_INSTANCE.search(mig)
    return XidEvent(code=int(m.group(3)), pci_bus_id=normalize_pci(m.group(1)), ts=ts,
                    message=f"{mig}: {message}" if mig else message, source="kmsg", seq=seq,
                    instance=int(instance.group(1)) if instance else None)


#: mlx5 (ConnectX) kernel lines that are events like XIDs: severity rule -> pattern (gpud's
#: ``infiniband/kmsg_matcher.go``, after drivers/net/ethernet/mellanox/mlx5/core/events.c and cmd.c).
MLX5_PATTERNS = (
    ("ib-module-temperature", r"Port module event.*High Temperature"),
    ("ib-power", r"Detected insufficient power on the PCIe slot \((\d+)W\)"),
    ("ib-access-reg", r"mlx5_cmd_out_err.*ACCESS_REG.*failed"),
)
_mlx5: list = []  # compiled on first use: the XID path never pays for them


def _mlx5_patterns() -> list:
    if not _mlx5:
        _mlx5.extend((rule, re.compile(pattern)) for rule, pattern in MLX5_PATTERNS)
        _mlx5.append(("", re.compile(r"\b([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\b")))
    return _mlx5


def parse_mlx5_line(line: str) -> tuple[str, str, float | None, int | None, str] | None:
    """One kernel log line -> (rule, PCI bus id or "", ts, seq, message) of an mlx5 event, or ``None``.

    The rule is the severity table's (``ib-module-temperature``, ``ib-power``, ``ib-access-reg``);
    ``ts`` and ``seq`` as :func:`parse_line` gives them; ``<6>`` priority prefixes of a
    ``dmesg -r`` or pstore capture are skipped."""
    text = line.split("\n", 1)[0].rstrip("\r")
    if "mlx5" not in text and "Port module event" not in text:
        return None
    seq, ts, text = _split(text, priority=True)
    *patterns, (_, pci) = _mlx5_patterns()
    for rule, pattern in patterns:
        if pattern.search(text):
            where = pci.search(text)
            return rule, normalize_pci(where.group(1)) if where else "", ts, seq, text.strip()
    return None


def read_mlx5(path: str = "/dev/kmsg", max_records: int = 100000) -> list[tuple[str, str, float | None, int | None, str]]:
    """Every mlx5 event line still in the kernel ring buffer (or in a captured log file)."""
    lines, _ = _read_all(path, max_records)
    events = (parse_mlx5_line(raw.decode("utf-8", "replace")) for raw in lines)
    return [e for e in events if e is not None]


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


class Coalescer:
    """Folds a burst of lines into one event: a line of the same code on the same GPU within
    ``window`` seconds of the burst's first line is dropped. The window counts from the first
    line, not the last, so a GPU that keeps failing still gives one event per window."""

    def __init__(self, window: float = COALESCE_S):
        self.window = window
        self._first: dict[tuple[str, int | str], float] = {}

    def keep(self, event: XidEvent) -> bool:
        if event.ts is None:
            return True  # no time to compare (a syslog line): every line counts
        where = (f"{event.boot}/{event.pci_bus_id or event.gpu_id}", event.rule or event.code)
        first = self._first.get(where)
        if first is not None and 0 <= event.ts - first <= self.window:
            return False
        self._first[where] = event.ts
        return True


def coalesce(events: Iterable[XidEvent], window: float = COALESCE_S) -> list[XidEvent]:
    keep = Coalescer(window).keep
    return [e for e in events if keep(e)]


def _xids(lines: Iterable[bytes], boot: str = "", coalescer: Coalescer | None = None) -> list[XidEvent]:
    events = []
    for raw in lines:
        event = parse_line(raw.decode("utf-8", "replace"))
        if event is not None:
            event = replace(event, boot=boot) if boot else event
            if coalescer is None or coalescer.keep(event):
                events.append(event)
    return events


def read_xids(path: str = "/dev/kmsg", max_records: int = 100000, coalescer: Coalescer | None = None) -> list[XidEvent]:
    """Every XID event still in the kernel ring buffer (or in a captured log file), a burst of
    lines once (``coalescer``: one to share with :func:`follow`; a new one by default)."""
    coalescer = coalescer or Coalescer()
    lines, captured = _read_all(path, max_records)
    return _xids(lines, "" if captured else boot_id(), coalescer)


def _read_all(path: str, max_records: int) -> tuple[list[bytes], bool]:
    """The first ``max_records`` lines of a captured log file, or the records still in the ring
    buffer of ``/dev/kmsg`` (read without blocking); and whether it was a captured file (its lines
    belong to no boot we know)."""
    fd = _open(path)
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            with os.fdopen(os.dup(fd), "rb") as fh:
                return [line for _, line in zip(range(max_records), fh)], True
        records = []
        try:
            while len(records) < max_records:
                record = _read_record(fd)
                if not record:
                    break
                records.append(record)
        except OSError as exc:
            raise ProbeError(f"cannot read kernel log {path}: {exc.strerror or exc}") from None
        return records, False
    finally:
        os.close(fd)


def follow(path: str, stop: threading.Event, on_event: Callable[[XidEvent], None], poll: float = 0.5,
           coalescer: Coalescer | None = None) -> None:
    """Call ``on_event`` for each XID event logged from now on, until ``stop`` is set.

    A burst of lines is one event (``coalescer``: pass the one :func:`read_xids` used for the
    backlog, so a burst that straddles the start is one event too). Exceptions from
    ``on_event`` propagate: the watcher decides what a failed delivery means.
    """
    coalescer = coalescer or Coalescer()
    fd = _open(path)
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            _follow_file(fd, stop, on_event, poll, coalescer)
        else:
            _follow_kmsg(fd, path, stop, on_event, poll, coalescer)
    finally:
        os.close(fd)


def _follow_kmsg(fd: int, path: str, stop: threading.Event, on_event: Callable[[XidEvent], None],
                 poll: float, coalescer: Coalescer) -> None:
    os.lseek(fd, 0, os.SEEK_END)
    boot = boot_id()
    while not stop.is_set():
        try:
            select.select([fd], [], [], poll)
            while not stop.is_set():
                record = _read_record(fd)
                if not record:
                    break
                for event in _xids([record], boot, coalescer):
                    on_event(event)
        except OSError as exc:
            if exc.errno == errno.EINTR:
                continue
            raise ProbeError(f"cannot read kernel log {path}: {exc.strerror or exc}") from None


def _follow_file(fd: int, stop: threading.Event, on_event: Callable[[XidEvent], None], poll: float,
                 coalescer: Coalescer) -> None:
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
        for event in _xids(lines, coalescer=coalescer):
            on_event(event)


def dated(events: list[XidEvent], boot: str) -> list[XidEvent]:
    """Kernel-log records of this boot with their wall-clock time (the boot's start plus the record's
    seconds since boot): a burst read by two runs minutes apart is still one burst. Others as read."""
    if not boot:
        return events
    started = time.time() - time.monotonic()  # the kernel stamps records on its monotonic clock
    return [replace(e, at=started + e.ts) if e.boot == boot and e.ts is not None else e for e in events]


def gpu_map(gpus: Iterable[object]) -> dict[str, tuple[int, str]]:
    """The map of GPUs as a probe saw them (anything with ``index``, ``uuid``, ``pci_bus_id``)."""
    return {normalize_pci(g.pci_bus_id): (g.index, g.uuid) for g in gpus if getattr(g, "pci_bus_id", "")}


def assign_gpus(events: Iterable[XidEvent], gpus: GpuMap) -> list[XidEvent]:
    """Tie each event to its GPU (index and UUID) by PCI bus id; unmatched events stay as they are."""
    by_bus = {normalize_pci(bus): ref for bus, ref in gpus.items()}
    out = []
    for event in events:
        ref = by_bus.get(normalize_pci(event.pci_bus_id)) if event.pci_bus_id else None
        out.append(replace(event, gpu=ref[0], uuid=ref[1] or event.uuid) if ref else event)
    return out
