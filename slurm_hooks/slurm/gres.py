"""Slurm's view of a node's GPUs: GRES index -> device file(s), from gres.conf or ``slurmd -G``.

Slurm numbers a node's GPUs (the ``IDX:`` of ``scontrol -d show job``, SLURM_JOB_GPUS) in
the order gres.conf gives their ``File=`` (a range or list is one GPU per file; a
``MultipleFiles=`` record is one GPU), for the gres.conf lines that name this node
(``NodeName=`` hostlists; a line without one names every node). Under ``AutoDetect=nvml``
slurmd sorts its GPUs by NVML's enumeration instead (``gres_gpu.c``:
``_sort_gpu_by_links_order``); :attr:`GresConf.autodetect` says so and the mapping
(hooks.gpumap) orders them by NVML. ``slurmd -G`` prints slurmd's final list, in order;
its ``Index=`` is the device file's number, not the GRES index.
"""

from __future__ import annotations

import os
import re

from slurm_hooks.errors import ConfigError
from slurm_hooks.slurm import conffile, hostlist
from slurm_hooks.values import dataclass

#: Most GPUs one node's gres.conf may give (a typo in a range must not expand to millions).
MAX_DEVICES = 1024
_MAX_INCLUDE_DEPTH = 16
_TRAILING_DIGITS = re.compile(r"(\d+)$")


class GresConfError(ConfigError):
    """gres.conf cannot be read or parsed; the message names file and line."""


@dataclass(frozen=True)
class GresDevice:
    """One GPU as Slurm numbers it on this node."""

    index: int
    #: Its device files: the first is the GPU (``/dev/nvidia3``); a MIG instance adds its caps.
    files: tuple[str, ...]
    type: str = ""
    #: ``UniqueId`` where slurmd's log gives one (a MIG instance's UUID).
    unique_id: str = ""
    #: ``file:line`` of the gres.conf line (or "slurmd -G").
    where: str = ""

    @property
    def file(self) -> str:
        return self.files[0] if self.files else ""

    @property
    def mig(self) -> bool:
        return len(self.files) > 1 and any("nvidia-caps" in f for f in self.files[1:]) or \
            self.unique_id.upper().startswith("MIG-")


@dataclass(frozen=True)
class GresConf:
    """The GPUs Slurm gives this node, in GRES index order."""

    devices: tuple[GresDevice, ...] = ()
    #: ``AutoDetect=`` for this node, lower-case ("" when not set, "off" when turned off).
    autodetect: str = ""
    #: Every file read (the cache's signature), the main one first.
    files: tuple[str, ...] = ()
    #: "gres.conf" or "slurmd -G".
    source: str = "gres.conf"
    #: GPUs given by ``Count=`` alone (no ``File=``): Slurm cannot tell which GPU is which.
    fileless: int = 0


def device_minor(path: str) -> int | None:
    """The device number of a GPU's file: the char device's minor, else the trailing digits of
    its name (Slurm's own rule, ``gres_common.c``: ``dev_num``)."""
    try:
        st = os.stat(path)
        import stat as stat_mod

        if stat_mod.S_ISCHR(st.st_mode):
            return os.minor(st.st_rdev)
    except OSError:
        pass
    m = _TRAILING_DIGITS.search(path)
    return int(m.group(1)) if m else None


def default_path(slurm_conf: str | None = None) -> str:
    """gres.conf lives beside slurm.conf (configless: in slurmd's conf-cache, beside its copy)."""
    return os.path.join(os.path.dirname(os.path.abspath(conffile.resolve_path(slurm_conf))), "gres.conf")


def load(path: str, node: str) -> GresConf:
    """The GPUs ``path`` (with its includes) gives ``node``; GresConfError when unreadable."""
    b = _Builder(node)
    b.feed(_read(path, None), path, 0)
    return b.result()


def parse(text: str, node: str, path: str = "<string>") -> GresConf:
    b = _Builder(node)
    b.feed(text, path, 0)
    return b.result()


def _read(path: str, where: str | None) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError as exc:
        why = "file not found" if isinstance(exc, FileNotFoundError) else f"cannot read: {exc.strerror}"
        if where is not None:
            p, _, line = where.rpartition(":")
            raise GresConfError(f"{why}: {path}", p, int(line), "Include") from None
        raise GresConfError(why, path) from None


class _Builder:
    def __init__(self, node: str):
        self.node = node
        self.devices: list[GresDevice] = []
        self.autodetect = ""
        self.node_autodetect = ""
        self.files: list[str] = []
        self.fileless = 0

    def feed(self, text: str, path: str, depth: int) -> None:
        self.files.append(path)
        for no, line in conffile.logical_lines(text):
            inc = conffile.INCLUDE.match(line)
            if inc:
                if depth >= _MAX_INCLUDE_DEPTH:
                    raise GresConfError(f"includes nested deeper than {_MAX_INCLUDE_DEPTH} (a loop?)", path, no,
                                        "Include")
                for p in conffile.include_paths(inc.group(1), path):
                    self.feed(_read(p, f"{path}:{no}"), p, depth + 1)
                continue
            try:
                pairs = conffile.split_pairs(line)
            except ValueError as exc:
                raise GresConfError(str(exc), path, no) from None
            self._line({k.lower(): v for k, v in pairs}, pairs[0][0].lower(), path, no)

    def _line(self, kv: dict[str, str], first: str, path: str, no: int) -> None:
        if first == "nodename":
            try:
                if not hostlist.matches(kv["nodename"], self.node):
                    return
            except ValueError as exc:
                raise GresConfError(f"bad NodeName: {exc}", path, no, "NodeName") from None
        if "autodetect" in kv:
            value = kv["autodetect"].lower()
            if first == "nodename":
                self.node_autodetect = value
            else:
                self.autodetect = value
        if kv.get("name", "").lower() != "gpu":
            return
        where = f"{path}:{no}"
        gtype = kv.get("type", "")
        if kv.get("multiplefiles"):
            files = self._expand(kv["multiplefiles"], path, no, "MultipleFiles")
            self._add(files, gtype, where)
            return
        if not kv.get("file"):
            try:
                self.fileless += int(kv.get("count", "1") or "1")
            except ValueError:
                raise GresConfError(f"Count={kv.get('count')!r} is not a number", path, no, "Count") from None
            return
        for f in self._expand(kv["file"], path, no, "File"):
            self._add((f,), gtype, where)

    def _expand(self, expr: str, path: str, no: int, key: str) -> tuple[str, ...]:
        try:
            files = hostlist.expand(expr)
        except ValueError as exc:
            raise GresConfError(f"bad {key}: {exc}", path, no, key) from None
        if len(self.devices) + len(files) > MAX_DEVICES:
            raise GresConfError(f"{key}={expr} gives more than {MAX_DEVICES} GPUs", path, no, key)
        return tuple(files)

    def _add(self, files: tuple[str, ...], gtype: str, where: str) -> None:
        self.devices.append(GresDevice(len(self.devices), files, gtype, where=where))

    def result(self) -> GresConf:
        auto = self.node_autodetect or self.autodetect
        return GresConf(tuple(self.devices), auto, tuple(self.files), "gres.conf", self.fileless)


# --- ``slurmd -G`` and slurmd's GRES log ------------------------------------------------------

#: ``Gres Name=gpu Type=h100 Count=1 Index=0 ID=7696487 File=/dev/nvidia0 Links=(null) Flags=...``
#: (``slurmd -G``), or the debug log's ``GRES[gpu] Type:(null) Count:1 ... File:/dev/nvidia1,... UniqueId:MIG-...``.
_G_LINE = re.compile(r"\bGres Name=(?P<name>\S+)(?P<rest>.*)$")
_LOG_LINE = re.compile(r"\bGRES\[(?P<name>[^\]]+)\](?P<rest>.*)$")
_FIELD = re.compile(r"\b(Type|Count|File|UniqueId)[=:](\S*)")


def parse_slurmd_g(text: str) -> GresConf:
    """slurmd's final GPU list, in GRES index order, from ``slurmd -G`` output (or the same list in
    slurmd's debug log). A record of Count=N with a File range is N GPUs; Count=1 with a file list
    is one GPU with several files (MIG)."""
    devices: list[GresDevice] = []
    for raw in text.splitlines():
        m = _G_LINE.search(raw) or _LOG_LINE.search(raw)
        if not m or m.group("name").lower() != "gpu":
            continue
        fields = {k.lower(): v for k, v in _FIELD.findall(m.group("rest"))}
        file_expr = "" if fields.get("file", "(null)") == "(null)" else fields.get("file", "")
        gtype = "" if fields.get("type", "(null)") == "(null)" else fields.get("type", "")
        uid = "" if fields.get("uniqueid", "(null)") == "(null)" else fields.get("uniqueid", "")
        try:
            count = int(fields.get("count", "1"))
        except ValueError:
            continue
        if not file_expr:
            continue
        try:
            files = hostlist.expand(file_expr)
        except ValueError:
            continue
        if count == 1 or len(files) != count:
            devices.append(GresDevice(len(devices), tuple(files), gtype, uid, "slurmd -G"))
        else:
            devices.extend(GresDevice(len(devices) + i, (f,), gtype, "", "slurmd -G") for i, f in enumerate(files))
        if len(devices) > MAX_DEVICES:
            break
    return GresConf(tuple(devices[:MAX_DEVICES]), "", (), "slurmd -G")
