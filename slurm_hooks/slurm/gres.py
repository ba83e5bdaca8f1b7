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
    #: Why the list is unknown rather than empty ("" when it is what Slurm says).
    problem: str = ""


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


# --- GRES lists: slurm.conf's ``Gres=``, a job's ``GRES=`` ------------------------------------

_COUNT = re.compile(r"^(\d+)([KMGTP]?)$", re.IGNORECASE)
_SUFFIX = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4, "p": 1024**5}


@dataclass(frozen=True)
class GresCount:
    """One item of slurm.conf's ``Gres=``: ``gpu:h100:8`` is ("gpu", "h100", 8)."""

    name: str
    type: str = ""
    count: int = 1


def split_list(value: str) -> list[str]:
    """``gpu:2(IDX:0-1),shard:2(2/4,0/4)`` -> its items, the way Slurm writes a GRES list (slurm.conf's
    ``Gres=``, a job's ``GRES=``): commas inside parentheses stay; blanks and ``(null)`` go."""
    items, depth, cur = [], 0, []
    for ch in value:
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            items.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    items.append("".join(cur))
    return [i.strip() for i in items if i.strip() and i.strip().lower() != "(null)"]


def parse_counts(text: str) -> list[GresCount]:
    """slurm.conf's ``Gres=gpu:h100:8(S:0-1),mps:100`` -> [GresCount("gpu", "h100", 8), GresCount("mps", "", 100)]."""
    out = []
    for item in split_list(text):
        item = re.sub(r"\(.*?\)", "", item).strip()
        if not item:
            continue
        fields = item.split(":")
        name, rest, count = fields[0].lower(), fields[1:], 1
        m = _COUNT.match(rest[-1]) if rest else None
        if m:
            count = int(m.group(1)) * _SUFFIX[m.group(2).lower()]
            rest = rest[:-1]
        types = [f for f in rest if f.lower() not in ("no_consume",)]
        out.append(GresCount(name, types[0] if types else "", count))
    return out


#: GRES that sit on a GPU: a whole one (``gpu``), or a share of one (``shard``, ``mps``).
GPU_GRES = ("gpu", "shard", "mps")


def gpu_indexes(value: str) -> set[int] | None:
    """The GPU indexes a job's GRES list holds on one node (``gpu:2(IDX:0-1)``, ``gpu:a100:1(IDX:5)``,
    ``shard:2(2/4,0/4)``: a share names its GPU by position); ``set()`` when it holds none (a CPU-only
    job); ``None`` when some GPU item does not say which (``IDX:N/A``, ``CNT:``, garbled)."""
    found: set[int] = set()
    for item in split_list(value):
        name, _, rest = item.partition(":")
        if name.split("(")[0].lower() not in GPU_GRES:
            continue
        indexes = _gres_indexes(rest if "(" in rest else item)
        if indexes is None:
            return None
        found.update(indexes)
    return found


def _gres_indexes(item: str) -> list[int] | None:
    """The GPU indexes one GRES item holds: ``...(IDX:0-1,3)`` or per-position ``...(1/4,0/4)``."""
    open_at = item.find("(")
    if open_at < 0 or not item.endswith(")"):
        return None
    inner = item[open_at + 1:-1]
    if inner.startswith("IDX:"):
        return _index_list(inner[4:])
    out = []
    for pos, share in enumerate(inner.split(",")):
        held, sep, avail = share.partition("/")
        if not (sep and held.strip().isdigit() and avail.strip().isdigit()) or pos > 1023:
            return None
        if int(held) > 0:
            out.append(pos)
    return out


def _index_list(text: str) -> list[int] | None:
    """``0-1,3`` -> [0, 1, 3]; ``None`` for anything else (``N/A``)."""
    out: list[int] = []
    for part in text.split(","):
        low, sep, high = part.strip().partition("-")
        if not low.isdigit() or (sep and not high.isdigit()):
            return None
        first, last = int(low), int(high) if sep else int(low)
        if last < first or last > 1023:
            return None
        out.extend(range(first, last + 1))
    return out


# --- ``slurmd -G`` and slurmd's GRES log ------------------------------------------------------

#: ``Gres Name=gpu Type=h100 Count=1 Index=0 ID=7696487 File=/dev/nvidia0 Links=(null) Flags=...``
#: (``slurmd -G``), or the debug log's ``GRES[gpu] Type:(null) Count:1 ... File:/dev/nvidia1,... UniqueId:MIG-...``.
_G_LINE = re.compile(r"\bGres Name=(?P<name>\S+)(?P<rest>.*)$")
_LOG_LINE = re.compile(r"\bGRES\[(?P<name>[^\]]+)\](?P<rest>.*)$")
_FIELD = re.compile(r"\b(Type|Count|File|UniqueId)[=:](\S*)")
#: The debug log's header before slurmd's final list (``gres_gpu.c``; ``gres_c_s.c`` for shards).
_FINAL = re.compile(r"Final (?:normalized )?gres\.conf list:")
#: What slurmd prints before GRES lines that are *not* in its final list: GPUs it ignores
#: (``_merge_system_gres_conf``), a configured GPU whose Cores/Links mismatch the system's
#: (the configured and the system record both follow), a config-only GPU it discards.
_NOT_FINAL = re.compile(r"being ignored|mismatching|Discarding|\[slurm\|gres\]\.conf:|\berror: system:")
#: Why an answer of ``slurmd -G`` holds no GPU list.
NO_LIST = "slurmd -G printed no GPU list (Slurm 24.11.0 to 24.11.x print none): Slurm's numbering is unknown"


def parse_slurmd_g(text: str) -> GresConf:
    """slurmd's final GPU list, in GRES index order, from ``slurmd -G`` output: its ``Gres Name=``
    lines only. A record of Count=N with N files (a list or a range) is N GPUs; Count=1 with a file
    list is one GPU with several files (MIG). Without ``Gres Name=`` lines, the debug log's
    ``GRES[gpu]`` lines count where they are the final list: under its header, or a bare excerpt
    that names no GPU slurmd ignored. No list at all (24.11 prints none) is :attr:`GresConf.problem`:
    unknown, never "no GPUs"."""
    final = [m for m in map(_G_LINE.search, text.splitlines()) if m]
    if not final:
        final = _final_log_lines(text.splitlines())
    if final is None:
        return GresConf((), "", (), "slurmd -G", problem="slurmd -G printed only GPUs it ignores or rejects, "
                        "not its final list: Slurm's numbering is unknown")
    devices: list[GresDevice] = []
    for m in final:
        if m.group("name").lower() != "gpu":
            continue
        fields = {k.lower(): v for k, v in _FIELD.findall(m.group("rest"))}
        file_expr, gtype, uid = (_value(fields, k) for k in ("file", "type", "uniqueid"))
        try:
            count = int(fields.get("count", "1"))
            files = hostlist.expand(file_expr) if file_expr else []
        except ValueError:
            continue
        if not files:
            continue
        per_gpu = [(f,) for f in files] if count > 1 and len(files) == count else [tuple(files)]
        for gpu_files in per_gpu:
            devices.append(GresDevice(len(devices), gpu_files, gtype, uid if len(per_gpu) == 1 else "",
                                      "slurmd -G"))
        if len(devices) > MAX_DEVICES:
            break
    problem = "" if final else NO_LIST
    return GresConf(tuple(devices[:MAX_DEVICES]), "", (), "slurmd -G", problem=problem)


def _value(fields: dict[str, str], key: str) -> str:
    value = fields.get(key, "")
    return "" if value == "(null)" else value


def _final_log_lines(lines: list[str]) -> list[re.Match] | None:
    """The debug log's ``GRES[...]`` lines of slurmd's final list: those under its last "Final
    ... list:" header; without one, every such line where nothing says some are not final; None
    when the only ones are GPUs slurmd ignores or rejects."""
    headed: list[re.Match] | None = None
    bare: list[re.Match] = []
    state = ""
    for raw in lines:
        m = _LOG_LINE.search(raw)
        if m is None:
            if _FINAL.search(raw):
                state, headed = "final", []
            elif _NOT_FINAL.search(raw):
                state = "not-final"
            continue
        if state == "final" and headed is not None:
            headed.append(m)
        elif state == "":
            bare.append(m)
    if headed is not None:
        return headed
    if state == "not-final":
        return None
    return bare
