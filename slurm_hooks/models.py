"""Value objects shared by probes, checks, the engine and the hooks.

Everything here is a frozen dataclass or a str-Enum so that a snapshot or a
finding can be compared, hashed, logged as JSON and rebuilt from JSON.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum

from slurm_hooks.values import POSITIVE, Range, asdict, compile_later, dataclass, field, fields, setting

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing (~3 ms of each start)
if TYPE_CHECKING:
    from typing import Any

#: What ``[expect]``'s temperatures and DCGM levels can be (and so every ``[groups.*]`` override).
_TEMPERATURE = Range(1, 150, why="degrees C, as NVML reports them")
DCGM_LEVEL = Range(0, 4, why="0 = off, 1..4 = dcgmi diag -r level")


class Severity(str, Enum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"


class Action(str, Enum):
    """Suggested remediation, ordered from harmless to most disruptive."""

    NONE = "none"
    WARN = "warn"
    DRAIN = "drain"
    RESET = "reset"
    REBOOT = "reboot"
    REPLACE = "replace"

    @property
    def rank(self) -> int:
        return _ACTION_ORDER.index(self)

    @property
    def takes_node_out(self) -> bool:
        """Drain or worse: the node must stop taking jobs."""
        return self.rank >= Action.DRAIN.rank


_ACTION_ORDER = list(Action)

#: What follows the action in the bracket of a drain for a fault that waits for the running jobs.
AT_JOB_END = "at job end"
#: The action tag of our drain reason, its one grammar (written and read by :mod:`slurm_hooks.slurm`,
#: read by the incident view, which stands below the Slurm adapter): ``[reboot]``,
#: ``[reset, at job end]``, ``[reboot 1/2]`` (the ladder's attempt at this rung, of how many: kept
#: in Slurm so that a lost state dir does not reset the count).
REASON_TAG = (rf"\[(?P<action>{'|'.join(a.value for a in Action)})(?: (?P<n>\d+)/(?P<of>\d+))?"
              rf"(?P<end>, {AT_JOB_END})?\]")
#: Any reason that ends in an action tag, then Slurm's ``" : ..."`` suffixes (no bracket in them).
_LAST_TAG = compile_later(rf"{REASON_TAG}(?: : [^\[\]]*)?\s*$")


def reason_tag(reason: str) -> tuple[str, bool]:
    """``(action, at job end)`` of the tag a reason ends with, through Slurm's suffixes
    (``[reboot 1/1] : reboot timed out`` is ``("reboot", False)``); ``("drain", False)`` without
    one. Whoever wrote the rest: the incident view reads the reasons accounting kept, too."""
    m = _LAST_TAG.search(reason or "")
    return (m.group("action"), bool(m.group("end"))) if m else ("drain", False)


class Scope(str, Enum):
    """Which jobs a fault touches: those on its GPU, or every job on the node."""

    GPU = "gpu"
    NODE = "node"
    #: Every job that spans nodes (a network link: a job on this node alone does not use it).
    FABRIC = "fabric"


class Urgency(str, Enum):
    """When a fault is acted on: at once (the job cannot go on, or its results are wrong), when the
    running jobs end (degrading hardware: drain, requeue nothing), or never (record it)."""

    NOW = "now"
    JOB_END = "job-end"
    WATCH = "watch"


class Context(str, Enum):
    """Where the engine runs; some checks only make sense in one context."""

    CHECK = "check"
    PROLOG = "prolog"
    EPILOG = "epilog"
    WATCH = "watch"


def gpu_identity(uuid: str = "", index: int | None = None, pci_bus_id: str | None = None) -> str:
    """What names one GPU across runs and reboots: its UUID; else its index; else its PCI bus id."""
    if uuid:
        return uuid
    if index is not None:
        return f"gpu{index}"
    return f"pci:{pci_bus_id}" if pci_bus_id else ""


@dataclass(frozen=True)
class XidEvent:
    code: int
    gpu: int | None = None
    pci_bus_id: str | None = None
    ts: float | None = None
    message: str = ""
    source: str = ""  # "nvml", "kmsg", "sim"
    seq: int | None = None  # kernel log sequence number, when known
    boot: str = ""  # the kernel's boot id, for kernel-log events read from /dev/kmsg
    uuid: str = ""  # the GPU's UUID, set where the source knows it
    #: The MIG GPU instance the driver names (``GPU-I:05`` in the kernel line); ``None``: the whole GPU.
    instance: int | None = None
    #: When it happened, wall clock, where the source can tell (a kernel-log record of this boot:
    #: the boot's start plus its ``ts``); ``None``: when it was read. Not part of :attr:`key`.
    at: float | None = None
    #: The severity row of a driver event that has no XID code (an amdgpu kernel line:
    #: ``amdgpu-ue-umc``; ``code`` is then 0); "" for an XID, whose row is ``xid.<code>``.
    rule: str = ""
    #: What within the GPU the line names (a RAS block ``umc``, a ring ``gfx_0.0.0``); "" for none.
    subject: str = ""

    @property
    def key(self) -> str:
        """Stable identity used to never act twice on one event.

        Kernel-log record numbers restart at every boot: their key also carries
        the boot id and the boot-relative time, so an event acknowledged before
        a reboot never hides a new one with the same record number after it.
        A kernel-log key holds only what the log line itself says (never the GPU
        index, which is looked up), so the probe, the watcher and the history
        name one line alike whether or not they could map it to a GPU.
        """
        boot = f"{self.boot}:" if self.boot else ""
        what = self.rule or self.code
        if self.source == "kmsg":
            if self.seq is not None:
                ident = f"{self.seq}@{self.ts}" if self.ts is not None else f"{self.seq}"
            else:
                ident = f"{self.ts}@{self.pci_bus_id}"
            return f"kmsg:{boot}{ident}:{what}"
        ident: object = self.seq if self.seq is not None else self.ts
        return f"{self.source}:{boot}{ident}:{self.gpu}:{what}"

    @property
    def gpu_id(self) -> str:
        """The GPU this event happened on, as XID history and escalation count it (:func:`gpu_identity`)."""
        return gpu_identity(self.uuid, self.gpu, self.pci_bus_id)


@dataclass(frozen=True)
class NvLink:
    link: int
    active: bool | None = None
    crc_errors: int | None = None
    replay_errors: int | None = None
    recovery_errors: int | None = None


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_memory_mib: int | None = None
    name: str = ""


@dataclass(frozen=True)
class MigDevice:
    """One MIG instance of a GPU as NVML names it: what CUDA_VISIBLE_DEVICES and Slurm's
    ``UniqueId`` carry (``MIG-<uuid>``, or ``MIG-GPU-<parent uuid>/<gi>/<ci>`` on old drivers)."""

    uuid: str
    #: GPU instance id (the ``GPU-I:`` of a kernel line) and compute instance id; ``None``: unknown.
    gi: int | None = None
    ci: int | None = None


@dataclass(frozen=True)
class EccBlock:
    """One RAS block's error counts since the driver loaded, as AMD's RAS reports them per block (UMC
    is the HBM's memory controller; GFX, SDMA, MMHUB, XGMI_WAFL, ...). ``deferred``: poisoned data
    not yet consumed. ``None``: not reported for this block."""

    block: str
    correctable: int | None = None
    uncorrectable: int | None = None
    deferred: int | None = None


@dataclass(frozen=True)
class BadPages:
    """Retired memory pages by status: ``reserved`` (retired), ``pending`` (retired at the next
    reset), ``unreservable`` (could not be retired); ``threshold``: how many the board may retire
    before the driver calls it worn out (``None``: not told)."""

    reserved: int = 0
    pending: int = 0
    unreservable: int = 0
    threshold: int | None = None


def _why(errors: tuple[tuple[str, str], ...], name: str) -> str | None:
    """Why ``name`` could not be read, from a snapshot's (name, why) pairs; ``None`` when it was."""
    for key, why in errors:
        if key == name:
            return why
    return None


@dataclass(frozen=True)
class GpuSnapshot:
    """One GPU as the probe saw it. ``None`` means "not supported / unknown"."""

    index: int
    uuid: str = ""
    serial: str = ""
    pci_bus_id: str = ""
    model: str = ""
    #: ROCm's own name for an AMD GPU: ``GPU-`` and the 16 hex digits of the ASIC's unique id (the
    #: driver's ``unique_id``), as rocminfo shows it and a job may put it in ROCR_VISIBLE_DEVICES;
    #: amdsmi's :attr:`uuid` is another form. ``None``: not an AMD GPU, or the probe cannot tell.
    rocm_uuid: str | None = None
    #: The device file's minor number (``/dev/nvidia<minor>``, nvmlDeviceGetMinorNumber): what ties
    #: Slurm's GRES ``File=`` to this GPU (hooks.gpumap).
    minor: int | None = None
    #: Its MIG instances, when MIG mode is on.
    mig: tuple[MigDevice, ...] = ()
    #: Which part of its physical GPU this logical GPU is (a compute partition's id, a die of a
    #: two-die board); ``None``: the whole GPU. Parts share the physical GPU's PCI device; its
    #: readings (ECC, pages, PCIe, temperatures) are read on part 0 and shown on each part, so a
    #: fault of the physical GPU touches the jobs of every part.
    partition: int | None = None
    lost: bool = False
    #: What of its identity (UUID, serial, PCI bus id, model, minor) it did not say now is the last
    #: this boot read (probes.identity): a GPU fallen off the bus answers nothing, not even its handle.
    remembered: bool = False
    needs_reset: bool = False
    xids: tuple[XidEvent, ...] = ()
    ecc_volatile_uncorrectable: int | None = None
    ecc_aggregate_uncorrectable: int | None = None
    retired_pages_pending: bool | None = None
    row_remap_pending: bool | None = None
    row_remap_failure: bool | None = None
    pcie_gen: int | None = None
    pcie_gen_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    nvlinks: tuple[NvLink, ...] | None = None
    temperature_c: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    throttle_reasons: tuple[str, ...] | None = None
    persistence_mode: bool | None = None
    fabric_state: str | None = None
    #: The driver's own verdict (NVML field 230, driver >= 565): "none", "gpu_reset", "node_reboot",
    #: "drain_p2p", "drain_and_reset"; ``None`` where the driver does not say.
    recovery_action: str | None = None
    processes: tuple[GpuProcess, ...] = ()
    memory_used_mib: int | None = None
    #: Field name -> why it could not be read (garbled answer, NVML error, ...).
    errors: tuple[tuple[str, str], ...] = ()
    #: Per RAS block error counts (:class:`EccBlock`); ``None`` where the probe reads totals only.
    ecc_blocks: tuple[EccBlock, ...] | None = None
    bad_pages: BadPages | None = None
    #: The GPU-to-GPU fabric's error status: "none", "error", "multiple"; ``None``: no such fabric.
    xgmi_error: str | None = None
    #: PCIe replays and recoveries (L0 -> recovery) since the driver loaded.
    pcie_replay: int | None = None
    pcie_recovery: int | None = None
    #: The hottest memory (HBM) sensor.
    memory_temperature_c: int | None = None

    def error(self, name: str) -> str | None:
        return _why(self.errors, name)


@dataclass(frozen=True)
class IbPort:
    """One InfiniBand/RoCE port as ``/sys/class/infiniband/<device>/ports/<port>`` shows it, with
    its counters' growth over a window of real time (:mod:`slurm_hooks.probes.ib`)."""

    device: str
    port: int
    state: str = ""  # "ACTIVE", "DOWN", "INIT", "ARMED" (the text after "4: ")
    phys_state: str = ""  # "LinkUp", "Polling", "Disabled", ...
    rate_gbps: float | None = None
    link_layer: str = ""  # "InfiniBand" or "Ethernet" (RoCE)
    #: Counter name -> its value now; and -> its growth (resets added back) over ``window_s``.
    counters: tuple[tuple[str, int], ...] = ()
    deltas: tuple[tuple[str, int], ...] = ()
    window_s: float = 0.0
    #: The window a rate must span to be judged (``[links] rate_window``): a shorter one only warns.
    rate_window_s: float = 0.0
    #: When each flap ended (a drop of at least the flap length that came back), newest last.
    flaps: tuple[float, ...] = ()
    #: Seconds this port has been seen down (0: up).
    down_s: float = 0.0
    #: mlx5 kernel lines of its adapter seen lately: (severity rule, the line), e.g.
    #: ("ib-module-temperature", "... Port module event[error]: module 0, Cable error, High Temperature").
    events: tuple[tuple[str, str], ...] = ()
    #: The RoCE port's network interface (its carrier counts the link's drops); "" for none.
    netdev: str = ""
    #: False: seen since boot, gone now (an adapter fallen off the bus); ``down_s`` is how long.
    present: bool = True
    #: Counters whose growth cannot be seen ("excessive_buffer_overrun_errors at 15, its maximum",
    #: "symbol_error refused by the kernel"); ``unjudged_new``: first said on this boot.
    unjudged: tuple[str, ...] = ()
    unjudged_new: bool = False

    @property
    def name(self) -> str:
        return f"{self.device} port {self.port}"

    @property
    def roce(self) -> bool:
        """An Ethernet port (RoCE): judged apart from the InfiniBand ones."""
        return self.link_layer == "Ethernet"

    @property
    def kind(self) -> str:
        return "RoCE" if self.roce else "IB"

    @property
    def up(self) -> bool:
        return self.present and self.state.upper() == "ACTIVE" and self.phys_state.lower() in ("linkup", "")

    def delta(self, counter: str) -> int | None:
        for key, value in self.deltas:
            if key == counter:
                return value
        return None


#: :attr:`NodeSnapshot.errors` name of a kernel log the probe could not read: no XID seen then says nothing.
KERNEL_LOG = "kernel-log"


class LinkPorts(tuple):
    """The ports one gather step read (a tuple of :class:`IbPort`), and what the step itself could
    not do: ``memory_error`` says why the counters' memory could not be written ("": it was)."""

    memory_error: str

    def __new__(cls, ports=(), memory_error: str = "") -> LinkPorts:
        self = super().__new__(cls, ports)
        self.memory_error = memory_error
        return self


@dataclass(frozen=True)
class NodeSnapshot:
    node: str
    backend: str
    gpus: tuple[GpuSnapshot, ...] = ()
    taken_at: float = 0.0
    driver_version: str = ""
    #: Node-level probe failure (NVML cannot initialise, state file unreadable).
    error: str | None = None
    #: XIDs that could not be tied to one GPU index.
    node_xids: tuple[XidEvent, ...] = ()
    #: What of the node (not of one GPU) could not be read, while the rest could: name -> why
    #: (``("kernel-log", "cannot read kernel log /dev/kmsg: Operation not permitted")``).
    errors: tuple[tuple[str, str], ...] = ()

    def unread(self, name: str) -> str | None:
        """Why ``name`` could not be read; ``None`` when it was."""
        return _why(self.errors, name)

    def gpu(self, index: int) -> GpuSnapshot | None:
        for gpu in self.gpus:
            if gpu.index == index:
                return gpu
        return None


@dataclass(frozen=True)
class Finding:
    check: str
    severity: Severity
    action: Action
    message: str
    gpu: int | None = None
    #: Short form for a Slurm drain reason, e.g. "XID 79 on GPU 3".
    summary: str = ""
    #: Judged against a value an admin configured ([expect], [groups]: GPU count, model,
    #: PCIe, NVLinks), not against what the hardware says of itself. A wrong value in the
    #: config fails every node alike; the drain guard watches for that (drain.drain).
    config_based: bool = False
    #: Which jobs the fault touches and when it is acted on: set by the engine from the severity
    #: table (:mod:`slurm_hooks.severity`), keyed by :attr:`rule`.
    scope: Scope = Scope.NODE
    urgency: Urgency = Urgency.NOW
    #: The severity table's key for this finding: ``xid.79``, or a check's rule (``row-remap``,
    #: ``row-remap-failure``); "" means the check's name.
    rule: str = ""
    #: The MIG GPU instance the fault was reported for (``GPU-I:``); ``None``: the whole GPU.
    instance: int | None = None
    #: What within the node (beyond its GPU) the finding is about, when it names one part of
    #: several: a port (``mlx5_0/1``), a device. Each subject is judged apart wherever findings are
    #: remembered across runs (hysteresis); "" for the GPU (``gpu``) or the node as a whole.
    subject: str = ""

    @property
    def rule_key(self) -> str:
        return self.rule or self.check

    @property
    def acts(self) -> bool:
        """Drain or worse, and not merely watched: this finding takes the node out."""
        return self.action.takes_node_out and self.urgency is not Urgency.WATCH

    def line(self) -> str:
        where = f"gpu{self.gpu}" if self.gpu is not None else "node"
        return f"{where} {self.check}: {self.message} -> {self.action.value}"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["severity"] = self.severity.value
        d["action"] = self.action.value
        d["scope"] = self.scope.value
        d["urgency"] = self.urgency.value
        if self.instance is None:
            del d["instance"]  # a whole GPU's (or the node's) fault, as every finding was before MIG
        if not self.subject:
            del d["subject"]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Finding:
        return cls(
            check=d["check"],
            severity=Severity(d["severity"]),
            action=Action(d["action"]),
            message=d["message"],
            gpu=d.get("gpu"),
            summary=d.get("summary", ""),
            config_based=bool(d.get("config_based", False)),
            scope=Scope(d.get("scope", Scope.NODE.value)),
            urgency=Urgency(d.get("urgency", Urgency.NOW.value)),
            rule=d.get("rule", ""),
            instance=d.get("instance"),
            subject=str(d.get("subject") or ""),
        )


_PORT_RATE = Range(1, 3200, why="Gb/s, as /sys/class/infiniband/*/ports/*/rate says")


@dataclass(frozen=True)
class Expectations:
    """What every node should have, unless a group below says otherwise (unset, None: not compared)."""

    gpus: int | None = setting(None, range=Range(0, 1024), doc="GPU count (unset: not checked)", example=8)
    model: str | None = setting(None, doc="substring of the NVML name", example="H100")
    pcie_gen: int | None = setting(None, range=Range(1, 10), example=5)
    pcie_width: int | None = setting(None, range=Range(1, 32), example=16)
    nvlinks: int | None = setting(None, range=Range(0, 36, why="NVML knows at most 36 links per GPU"),
                                  doc="active NVLinks per GPU", example=18)
    temp_warn_c: int = setting(85, range=_TEMPERATURE)
    temp_fail_c: int = setting(95, range=_TEMPERATURE)
    ecc_uncorrectable_volatile_max: int = setting(0)
    ecc_uncorrectable_aggregate_max: int | None = setting(None, example=10)
    nvlink_crc_max: int = setting(100)
    nvlink_replay_max: int = setting(100)
    persistence_mode: bool | None = setting(True)
    fabric_manager: bool = setting(False, doc="true on NVSwitch systems (HGX): fabric registration must complete")
    xid_repeat_count: int = setting(3, doc="the same XID this many times in the window -> replace")
    xid_repeat_window_s: int = setting(86400, range=POSITIVE)
    dcgm_level_prolog: int = setting(0, range=DCGM_LEVEL,
                                     doc="0 = off, 1 = quick (seconds), 2 = medium (~2 min), 3 = long")
    dcgm_level_epilog: int = setting(0, range=DCGM_LEVEL)
    dcgm_level_check: int = setting(0, range=DCGM_LEVEL)
    dcgm_level_after_failure: int = setting(0, range=DCGM_LEVEL,
                                            doc="epilog of a job that exited non-zero (e.g. 2: ~2 min)")
    ib_ports: int | None = setting(None, range=Range(0, 64), example=8,
                                   doc="InfiniBand ports (link_layer InfiniBand: a RoCE port is never counted, "
                                       "as in gpud and gcm) that must be ACTIVE/LinkUp (unset: those present)")
    ib_rate_gbps: int | None = setting(None, range=_PORT_RATE, doc="the rate each must run at (H100 NDR: 400)",
                                       example=400)
    roce_ports: int | None = setting(None, range=Range(0, 64), example=1,
                                     doc="RoCE ports (link_layer Ethernet), judged apart from the InfiniBand ones, "
                                         "that must be ACTIVE/LinkUp (unset: those present)")
    roce_rate_gbps: int | None = setting(None, range=_PORT_RATE, doc="the rate each RoCE port must run at",
                                         example=200)


@dataclass(frozen=True)
class CheckInput:
    """Everything a check may look at. Checks are pure functions of this."""

    snapshot: NodeSnapshot
    expect: Expectations
    context: Context = Context.CHECK
    #: Only these GPU indexes matter (the job's GPUs); ``None`` means all.
    gpus: tuple[int, ...] | None = None
    #: Snapshot taken by the prolog of the same job, for "new during the job" checks.
    baseline: NodeSnapshot | None = None
    #: XID events recorded on this node by earlier runs (for escalation):
    #: event key -> (GPU identity as :func:`gpu_identity` gives it, code, when recorded).
    xid_history: dict[str, tuple[str, int | str, float]] = field(default_factory=dict)
    #: XIDs an admin has dealt with (GPU reset, node resumed): still in the kernel
    #: log until the next reboot, but no longer a reason to drain.
    acked_xids: frozenset[str] = frozenset()
    #: Uncorrectable ECC counts per GPU identity and RAS block a repair dealt with on this boot
    #: (AMD's counts outlive a GPU reset): the ECC check judges the growth past them.
    ecc_acked: dict[str, dict[str, int]] = field(default_factory=dict)
    #: Result of a DCGM diagnostic run by the engine, when one was run.
    dcgm: DcgmResult | None = None
    now: float = 0.0
    #: Where the XID check looks a code up (``None``: NVIDIA's catalogue, ``xid.catalog.lookup``).
    xid_lookup: Callable[[int], Any] | None = None
    #: The node's InfiniBand/RoCE ports, gathered once per run; ``None``: not gathered here.
    links: tuple[IbPort, ...] | None = None

    def selected(self) -> tuple[GpuSnapshot, ...]:
        if self.gpus is None:
            return self.snapshot.gpus
        wanted = set(self.gpus)
        return tuple(g for g in self.snapshot.gpus if g.index in wanted)


@dataclass(frozen=True)
class DcgmResult:
    level: int
    available: bool
    passed: bool | None = None
    failures: tuple[tuple[int | None, str], ...] = ()
    reason: str = ""
    #: What reasons and audit lines call the diagnostic that gave this result: its vendor's tool
    #: (``RVS diagnostic`` on AMD nodes), so that no node reads another vendor's name.
    tool: str = "DCGM diag"


@dataclass(frozen=True)
class Report:
    node: str
    context: Context
    findings: tuple[Finding, ...]
    duration_s: float
    snapshot: NodeSnapshot | None = None
    #: Names of the checks the engine ran (``gpu-probe`` first: the snapshot could be read).
    checks_run: tuple[str, ...] = ()
    #: What the leftover check finds on every GPU, when asked (``JudgeRequest.if_idle``): faults
    #: only on a node with no job, so not part of the verdict.
    if_idle: tuple[Finding, ...] = ()

    @property
    def healthy(self) -> bool:
        return not any(f.severity is Severity.FAIL for f in self.findings)

    @property
    def worst_action(self) -> Action:
        """The worst action of the findings that take the node out; without any, of every finding."""
        pool = self.drain_findings() or self.findings
        return max((f.action for f in pool), key=lambda a: a.rank, default=Action.NONE)

    def drain_findings(self) -> tuple[Finding, ...]:
        """Findings that take the node out (drain or worse, urgency not ``watch``)."""
        return tuple(f for f in self.findings if f.acts)

    def urgent(self) -> bool:
        """Some finding must be acted on now; otherwise the running jobs may finish."""
        return any(f.urgency is Urgency.NOW for f in self.drain_findings())

    def requeue_gpus(self) -> frozenset[int] | None:
        """Whose jobs a now-fault touches: ``None`` every job on the node (a node-scope fault, or
        one tied to no GPU), else the GPU indexes whose jobs go (empty: no job is requeued).
        A fault of one MIG instance is not its GPU's: see :meth:`requeue_instances`."""
        gpus: set[int] = set()
        for f in self.drain_findings():
            if f.urgency is not Urgency.NOW or f.scope is Scope.FABRIC:
                continue  # a fabric fault's jobs: requeue_multi_node
            if f.scope is Scope.NODE or f.gpu is None:
                return None
            if f.instance is None:
                gpus.add(f.gpu)
        return frozenset(gpus)

    def requeue_multi_node(self) -> bool:
        """A now-fault of the fabric (a network link): every job that spans nodes goes too."""
        return any(f.urgency is Urgency.NOW and f.scope is Scope.FABRIC for f in self.drain_findings())

    def requeue_instances(self) -> frozenset[tuple[int, int]]:
        """(GPU index, GPU instance id) of every now-fault reported for one MIG instance."""
        return frozenset((f.gpu, f.instance) for f in self.drain_findings()
                         if f.urgency is Urgency.NOW and f.scope is Scope.GPU and f.gpu is not None
                         and f.instance is not None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "context": self.context.value,
            "healthy": self.healthy,
            "action": self.worst_action.value,
            "duration_s": round(self.duration_s, 4),
            "urgency": (Urgency.NOW if self.urgent() else Urgency.JOB_END).value if self.drain_findings() else "",
            "findings": [f.to_dict() for f in self.findings],
        }


#: GPU fields only some probes fill (AMD's per-block RAS, partitions, ...): left out of a snapshot's dict where unset.
OPTIONAL_GPU_FIELDS = ("rocm_uuid", "partition", "ecc_blocks", "bad_pages", "xgmi_error", "pcie_replay",
                       "pcie_recovery", "memory_temperature_c")


def snapshot_to_dict(snap: NodeSnapshot) -> dict[str, Any]:
    d = asdict(snap)
    if not snap.errors:
        del d["errors"]  # a snapshot that read everything reads as it always did
    for gpu in d["gpus"]:
        for name in OPTIONAL_GPU_FIELDS:
            if gpu.get(name) is None:
                gpu.pop(name, None)
    for event in [*(x for g in d["gpus"] for x in g["xids"]), *d["node_xids"]]:
        for key in ("rule", "subject"):
            if not event[key]:
                del event[key]  # an XID reads as it always did
    return d


def snapshot_from_dict(d: dict[str, Any]) -> NodeSnapshot:
    """Rebuild a snapshot from :func:`snapshot_to_dict` output (or a captured fixture)."""
    gpus = tuple(gpu_from_dict(g) for g in d.get("gpus", ()))
    return NodeSnapshot(
        node=d["node"],
        backend=d.get("backend", ""),
        gpus=gpus,
        taken_at=d.get("taken_at", 0.0),
        driver_version=d.get("driver_version", ""),
        error=d.get("error"),
        node_xids=tuple(XidEvent(**x) for x in d.get("node_xids", ())),
        errors=tuple((str(k), str(v)) for k, v in d.get("errors", ())),
    )


_GPU_FIELDS = {f.name for f in fields(GpuSnapshot)}


def gpu_from_dict(d: dict[str, Any]) -> GpuSnapshot:
    unknown = set(d) - _GPU_FIELDS
    if unknown:
        raise ValueError(f"unknown GPU field(s): {', '.join(sorted(unknown))}")
    kw = dict(d)
    kw["xids"] = tuple(XidEvent(**x) for x in d.get("xids", ()))
    kw["processes"] = tuple(GpuProcess(**p) for p in d.get("processes", ()))
    if d.get("nvlinks") is not None:
        kw["nvlinks"] = tuple(NvLink(**n) for n in d["nvlinks"])
    if d.get("throttle_reasons") is not None:
        kw["throttle_reasons"] = tuple(d["throttle_reasons"])
    kw["errors"] = tuple(tuple(e) for e in d.get("errors", ()))
    kw["mig"] = tuple(MigDevice(**m) for m in d.get("mig", ()))
    if d.get("ecc_blocks") is not None:
        kw["ecc_blocks"] = tuple(EccBlock(**b) for b in d["ecc_blocks"])
    if d.get("bad_pages") is not None:
        kw["bad_pages"] = BadPages(**d["bad_pages"])
    return GpuSnapshot(**kw)
