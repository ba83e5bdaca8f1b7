"""One GPU, one identity: Slurm's GRES index -> device file -> minor number -> the probe's index and UUID.

Slurm numbers a node's GPUs its own way (slurm.gres), the GPU probe numbers them in its own
order, and the two agree only by luck. What ties them is the device file: GRES
``File=/dev/nvidia6`` is the GPU whose device minor number is 6 (``nvmlDeviceGetMinorNumber``);
``File=/dev/dri/renderD130`` the one whose render node is 130 (amdsmi's enumeration info), a
compute partition of a physical GPU or one die of a two-die board being a GPU of its own. A MIG instance's
files start with its parent GPU's, and its ``UniqueId`` (or the snapshot's MIG list) names
the GPU instance.

The map is built from the node's gres.conf (or ``slurmd -G`` with ``[gpu] gres_source =
"slurmd"``) and a snapshot whose GPUs all answered, then cached in the state dir for the
boot: a later run reads one small file (a GPU that has since fallen off the bus keeps its
place). A map that cannot be trusted (gres.conf unreadable, a file that names no GPU, counts
that differ) says why in :attr:`GpuMap.problem`; a GPU-scoped fault then touches every GPU
job on the node (requeue too much, never the wrong job), and the prolog judges every GPU.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence

from slurm_hooks import fsutil
from slurm_hooks.values import asdict, compile_later, dataclass

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing (~3 ms of each start)
if TYPE_CHECKING:
    from slurm_hooks.models import NodeSnapshot
    from slurm_hooks.remedy.wiring import Wiring
    from slurm_hooks.slurm.gres import GresConf

CACHE_VERSION = 1
#: ``MIG-GPU-<parent uuid>/<gi>/<ci>``: the MIG UUID older drivers (R470) print.
_OLD_MIG = compile_later(r"^MIG-(GPU-[0-9A-Fa-f-]+)/(\d+)/(\d+)$")


@dataclass(frozen=True)
class Slot:
    """One GRES index and the GPU (or MIG instance) behind it."""

    gres: int
    file: str
    minor: int | None = None
    #: NVML index, UUID and PCI bus id of the GPU (a MIG instance's parent); ``None``: not found.
    gpu: int | None = None
    uuid: str = ""
    pci_bus_id: str = ""
    #: The MIG GPU instance id and UUID; ``None``/"" for a whole GPU.
    instance: int | None = None
    mig_uuid: str = ""


@dataclass(frozen=True)
class GpuMap:
    slots: tuple[Slot, ...] = ()
    #: Where Slurm's numbering was read: ``gres.conf /etc/slurm/gres.conf``, ``slurmd -G``, ...
    source: str = ""
    #: Why the map cannot be trusted; "" when it can.
    problem: str = ""

    @property
    def known(self) -> bool:
        return not self.problem

    def slot(self, gres: int) -> Slot | None:
        return self.slots[gres] if 0 <= gres < len(self.slots) and self.slots[gres].gres == gres else None

    def describe(self) -> list[str]:
        """One line per GRES index, as ``validate`` prints it."""
        out = []
        for s in self.slots:
            gpu = f"GPU {s.gpu} {s.uuid or '?'}" if s.gpu is not None else "no GPU with that minor number"
            mig = f" MIG instance {s.instance}" if s.instance is not None else ""
            minor = "?" if s.minor is None else s.minor
            out.append(f"GRES {s.gres} -> {s.file} (minor {minor}) -> {gpu}{mig}")
        return out

    def to_dict(self) -> dict:
        return {"source": self.source, "problem": self.problem, "slots": [asdict(s) for s in self.slots]}

    @classmethod
    def from_dict(cls, d: dict) -> GpuMap:
        return cls(tuple(Slot(**s) for s in d.get("slots", ())), str(d.get("source", "")), str(d.get("problem", "")))


def unknown(why: str, source: str = "") -> GpuMap:
    return GpuMap((), source, why)


def differences(a: GpuMap, b: GpuMap) -> list[str]:
    """Where two maps of one node (gres.conf's and ``slurmd -G``'s) disagree, GRES index by index."""
    out = []
    for k in range(max(len(a.slots), len(b.slots))):
        x, y = a.slot(k), b.slot(k)
        gx, gy = (x.gpu, x.instance) if x else None, (y.gpu, y.instance) if y else None
        if gx != gy:
            out.append(f"GRES {k}: {x.file if x else 'absent'} vs {y.file if y else 'absent'}")
    return out


# --- building -----------------------------------------------------------------------------


#: slurmd's NVIDIA autodetection: ``nvml``, and ``nvidia`` (24.11+, without NVML): both number the
#: GPUs in the driver's order.
NVIDIA_AUTODETECT = ("nvml", "nvidia")
#: Autodetection that reorders gres.conf's File= lines (``rsmi``: AMD's, numbering the GPUs its own way).
REORDERING_AUTODETECT = (*NVIDIA_AUTODETECT, "rsmi")


def build(conf: GresConf, snap: NodeSnapshot, source: str = "",
          mig_minors: dict[int, tuple[int, int]] | None = None) -> GpuMap:
    """Join Slurm's GPUs with the snapshot's by device minor number. A MIG GRES names its GPU
    instance by slurmd's UniqueId, or by its nvidia-cap file's minor in ``mig_minors`` (cap
    minor -> (GPU minor, GPU instance id), :func:`parse_mig_minors`)."""
    from slurm_hooks.slurm.gres import device_minor

    source = source or conf.source
    gpus = [g for g in snap.gpus]
    if conf.autodetect in NVIDIA_AUTODETECT and not conf.devices:
        return _autodetected(snap, source)
    if conf.autodetect == "rsmi" and not conf.devices:
        return unknown("AutoDetect=rsmi alone: gres.conf does not say which render node is which GRES index; "
                       "set [gpu] gres_source = \"slurmd\"", source + " AutoDetect=rsmi")
    if not conf.devices:
        why = (f"{conf.fileless} GPU(s) given by Count= without File=: Slurm cannot say which is which"
               if conf.fileless else "no gpu GRES with File= for this node")
        why = conf.problem or why  # slurmd -G printed no list: unknown, never "no GPUs"
        return unknown(why, source)
    by_minor = {g.minor: g for g in gpus if g.minor is not None}
    if not by_minor and gpus:
        return unknown("the GPU probe gave no device minor numbers", source)
    slots: list[Slot] = []
    problems: list[str] = []
    for dev in conf.devices:
        minor = device_minor(dev.file)
        g = by_minor.get(minor)
        if g is None:
            problems.append(f"GRES {dev.index} ({dev.file}, minor {minor}) names no GPU the probe sees")
            slots.append(Slot(dev.index, dev.file, minor))
            continue
        instance, mig_uuid = None, ""
        if dev.mig:
            instance, mig_uuid = _instance_of(dev.unique_id, g, dev.files[1:], mig_minors or {})
            if instance is None:
                problems.append(f"GRES {dev.index} is a MIG instance of GPU {g.index} that names no instance "
                                f"({dev.unique_id or 'no UniqueId'})")
        slots.append(Slot(dev.index, dev.file, minor, g.index, g.uuid, g.pci_bus_id, instance, mig_uuid))
    if any(g.mig for g in gpus) and not any(dev.mig for dev in conf.devices):
        problems.append("MIG is on, but Slurm's GPUs here are whole GPUs: its GRES indexes are the instances'")
    parents = {s.gpu for s in slots if s.gpu is not None}
    if len(parents) != len(gpus):
        problems.append(f"Slurm gives this node {len(parents)} GPU(s), the probe sees {len(gpus)}")
    if conf.autodetect in REORDERING_AUTODETECT and conf.source == "gres.conf":
        problems.append(f"AutoDetect={conf.autodetect} with File= lines: slurmd reorders them; set [gpu] gres_source = \"slurmd\"")
    return GpuMap(tuple(slots), source, "; ".join(problems))


def _autodetected(snap: NodeSnapshot, source: str) -> GpuMap:
    """AutoDetect=nvml alone: slurmd numbers the GPUs in NVML's enumeration order."""
    if any(g.mig for g in snap.gpus):
        return unknown("MIG under AutoDetect=nvml: slurmd's order of the instances is not in gres.conf; "
                       "set [gpu] gres_source = \"slurmd\"", source + " AutoDetect=nvml")
    slots = tuple(Slot(i, f"/dev/nvidia{g.minor}" if g.minor is not None else "", g.minor, g.index, g.uuid,
                       g.pci_bus_id) for i, g in enumerate(sorted(snap.gpus, key=lambda g: g.index)))
    return GpuMap(slots, source + " AutoDetect=nvml")


def _instance_of(unique_id: str, gpu, caps: Sequence[str], mig_minors: dict[int, tuple[int, int]]
                 ) -> tuple[int | None, str]:
    """(GPU instance id, MIG UUID) of a MIG GRES on ``gpu``: from slurmd's UniqueId, else from
    its nvidia-cap files through the driver's mig-minors."""
    from slurm_hooks.slurm.gres import device_minor

    old = _OLD_MIG.match(unique_id)
    if old:
        return int(old.group(2)), unique_id
    for m in gpu.mig:
        if unique_id and m.uuid.lower() == unique_id.lower():
            return m.gi, m.uuid
    for cap in caps:
        minor = device_minor(cap)
        found = mig_minors.get(minor) if minor is not None else None
        if found is not None and found[0] == gpu.minor:
            gi = found[1]
            return gi, next((m.uuid for m in gpu.mig if m.gi == gi), "")
    return None, unique_id


_MIG_MINOR = compile_later(r"^gpu(\d+)/gi(\d+)(?:/ci\d+)?/access\s+(\d+)$")


def parse_mig_minors(text: str) -> dict[int, tuple[int, int]]:
    """/proc/driver/nvidia-caps/mig-minors: cap minor -> (GPU minor, GPU instance id), for the
    instances' and their compute instances' access files (Slurm's gpu_nvml.c reads it alike)."""
    out = {}
    for line in text.splitlines():
        m = _MIG_MINOR.match(line.strip())
        if m:
            out[int(m.group(3))] = (int(m.group(1)), int(m.group(2)))
    return out


def _read_mig_minors(path: str) -> dict[int, tuple[int, int]]:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return parse_mig_minors(fh.read())
    except OSError:
        return {}


# --- the per-boot cache -------------------------------------------------------------------


def cache_path(w: Wiring) -> str:
    return w.state_path(f"gpumap-{w.node}.json")


def _conf_path(w: Wiring, slurm_conf: str | None = None) -> str:
    from slurm_hooks.slurm.gres import default_path

    return w.config.gpu.gres_conf or default_path(slurm_conf)


def _signature(paths: Iterable[str]) -> list:
    out = []
    for p in paths:
        try:
            st = os.stat(p)
            out.append([p, st.st_mtime_ns, st.st_size])
        except OSError:
            out.append([p, None, None])
    return out


def _identity(snap: NodeSnapshot) -> list | None:
    """What the map was built from; ``None`` when some GPU did not say (a lost one)."""
    ids = [[g.index, g.uuid, g.minor, [m.uuid for m in g.mig]] for g in snap.gpus]
    return None if any(not u or m is None for _, u, m, _ in ids) else ids


def _boot() -> str:
    from slurm_hooks.probes.kmsg import boot_id

    return boot_id()


def cached(w: Wiring) -> GpuMap:
    """The map this boot's runs built (no snapshot at hand: the requeue); unknown when none."""
    path = cache_path(w)
    data = fsutil.read_json(path, missing=unknown("no GPU map built yet on this node"), error=unknown,
                            message="GPU map cache {path} unreadable: {reason}")
    if isinstance(data, GpuMap):
        return data
    try:
        if data.get("version") != CACHE_VERSION or data.get("boot") != _boot():
            return unknown("no GPU map built since this boot")
        if data.get("conf") != _signature(p for p, _, _ in data.get("conf", ())):
            return unknown("gres.conf changed since the GPU map was built")
        return GpuMap.from_dict(data["map"])
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return unknown(f"GPU map cache {path} unreadable: {exc}")


def current(w: Wiring, snap: NodeSnapshot) -> GpuMap:
    """The map for this snapshot: the boot's cached one while it still fits, else built afresh."""
    if snap.error is not None:
        return cached(w)
    ident = _identity(snap)
    data = fsutil.read_json(cache_path(w), missing=None, error=None)
    try:
        if (data.get("version") == CACHE_VERSION and data.get("boot") == _boot()
                and data.get("gres_source") == w.config.gpu.gres_source
                and data.get("conf") == _signature(p for p, _, _ in data.get("conf", ()))
                and (ident is None or ident == data.get("gpus"))):
            return GpuMap.from_dict(data["map"])
    except (ValueError, KeyError, TypeError, AttributeError):
        pass
    gmap, files = read(w, snap)
    if ident is not None:
        record = {"version": CACHE_VERSION, "boot": _boot(), "gres_source": w.config.gpu.gres_source,
                  "conf": _signature(files), "gpus": ident, "map": gmap.to_dict()}
        try:
            os.makedirs(os.path.dirname(cache_path(w)), mode=0o700, exist_ok=True)
            fsutil.atomic_write(cache_path(w), json.dumps(record, separators=(",", ":")), mode=0o600, durable=False)
        except OSError:
            pass  # a cache: the next run builds it again
    return gmap


def read(w: Wiring, snap: NodeSnapshot, source: str | None = None,
         slurm_conf: str | None = None) -> tuple[GpuMap, list[str]]:
    """Slurm's GPUs for this node (``source``: "gres.conf" or "slurmd", default ``[gpu]
    gres_source``; gres.conf beside ``slurm_conf`` unless ``[gpu] gres_conf`` says), joined with
    the snapshot, uncached; and the files that were read."""
    from slurm_hooks.slurm import gres

    path = _conf_path(w, slurm_conf)
    if (source or w.config.gpu.gres_source) == "slurmd":
        from slurm_hooks.errors import SlurmHooksError
        from slurm_hooks.runner import run_command

        argv = [w.config.gpu.slurmd, "-G", "-N", w.node]
        env = {**os.environ, "SLURM_CONF": slurm_conf} if slurm_conf else None
        try:
            out = run_command(argv, timeout=min(w.config.slurm.timeout, w.time_left(10.0)), env=env)
        except SlurmHooksError as exc:
            return unknown(f"{' '.join(argv)} failed: {exc}", "slurmd -G"), [path]
        conf = gres.parse_slurmd_g(out.stdout + "\n" + out.stderr)
        minors = _read_mig_minors(w.config.gpu.mig_minors) if any(d.mig for d in conf.devices) else {}
        return build(conf, snap, "slurmd -G", minors), [path]
    try:
        conf = gres.load(path, w.node)
    except gres.GresConfError as exc:
        return unknown(f"gres.conf unreadable: {exc}", f"gres.conf {path}"), [path]
    if any(d.mig for d in conf.devices):
        # mig-minors is not in the signature (a /proc file): a new MIG layout changes the snapshot's.
        return build(conf, snap, f"gres.conf {path}", _read_mig_minors(w.config.gpu.mig_minors)), list(conf.files)
    return build(conf, snap, f"gres.conf {path}"), list(conf.files)


# --- what a job's GPUs are ------------------------------------------------------------------


def job_tokens(gmap: GpuMap, snap: NodeSnapshot, tokens: Sequence[str]) -> tuple[list[str] | None, list[str]]:
    """A job's GPUs as the prolog gets them (SLURM_JOB_GPUS: GRES indexes; CUDA_VISIBLE_DEVICES: the
    same, or GPU/MIG UUIDs) as the snapshot names them (``GPU-`` UUIDs, else NVML indexes), and the
    GRES indexes a trusted map has that the snapshot does not show (missing GPUs).

    ``None``: judge every GPU (the map is unknown, or a token names nothing the map or the snapshot
    knows): a MIG index or UUID is never read as a missing GPU."""
    present = {g.uuid for g in snap.gpus if g.uuid} | {str(g.index) for g in snap.gpus}
    out: list[str] = []
    missing: list[str] = []
    for token in tokens:
        text = str(token).strip()
        if not text:
            continue
        low = text.lower()
        if low.startswith("gpu-"):
            out.append(text)
        elif low.startswith("mig-"):
            parent = _mig_parent(snap, text)
            if parent is None:
                return None, []
            out.append(parent)
        elif text.isdigit():
            if not gmap.known:
                return None, []
            s = gmap.slot(int(text))
            ident = (s.uuid or str(s.gpu)) if s is not None and s.gpu is not None else ""
            if ident in present:
                out.append(ident)
            else:
                missing.append(text)
        else:
            return None, []
    return out, missing


def _mig_parent(snap: NodeSnapshot, mig_uuid: str) -> str | None:
    old = _OLD_MIG.match(mig_uuid)
    if old:
        return old.group(1)
    for g in snap.gpus:
        if any(m.uuid.lower() == mig_uuid.lower() for m in g.mig):
            return g.uuid or str(g.index)
    return None


def touches(gmap: GpuMap, held: tuple[int, ...] | None, gpus: frozenset[int] | None,
            instances: frozenset[tuple[int, int]] = frozenset()) -> bool:
    """Whether a fault touches a job holding GRES indexes ``held`` on this node.

    ``gpus`` ``None``: a node-wide fault, every job. Otherwise whole-GPU faults on these NVML
    indexes (every instance of a MIG GPU) and faults of one MIG instance (``instances``: NVML
    index, GPU instance id). ``held`` ``()``: no GPU here (a CPU-only job), never touched;
    ``None``: Slurm did not say which, so touched; and so is every GPU job when the map is unknown."""
    if gpus is None:
        return True
    if held is not None and not held:
        return False
    if held is None or not gmap.known:
        return True
    for gres in held:
        s = gmap.slot(gres)
        if s is None or s.gpu is None or s.gpu in gpus:
            return True
        if s.instance is None and any(g == s.gpu for g, _ in instances):
            return True
        if (s.gpu, s.instance) in instances:
            return True
    return False


def nvml_of(gmap: GpuMap, held: Iterable[int]) -> list[int]:
    """The NVML indexes behind GRES indexes (those the map knows)."""
    out = []
    for gres in held:
        s = gmap.slot(gres)
        if s is not None and s.gpu is not None and s.gpu not in out:
            out.append(s.gpu)
    return sorted(out)
