"""The configuration's sections: one frozen class per ``[section]``, one field per key.

A new key is a new field of its section's class here (:func:`~slurm_hooks.values.setting`:
its type, default, the values it can take and what it does); ``tools/gen_config_doc.py`` writes the
example config and docs/configuration.md from them, and :mod:`slurm_hooks.config` loads and checks
a file against them.
"""

from __future__ import annotations

from slurm_hooks.models import DCGM_LEVEL, Expectations
from slurm_hooks.severity import Severities
from slurm_hooks.slurm import hostlist
from slurm_hooks.values import POSITIVE, Range, dataclass, field, fields, setting

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing (~3 ms of each start)
if TYPE_CHECKING:
    from typing import Any

    from slurm_hooks.config import Locator

DEFAULT_PATH = "/etc/slurm-hooks/config.toml"
ENV_VAR = "SLURM_HOOKS_CONFIG"

_Num = (int, float)

#: slurmd kills HealthCheckProgram at 60 s (hard-coded in slurmd, not configurable).
HEALTH_CHECK_KILL_S = 60.0


# --- the sections: one class each, one field per key ----------------------------------------


@dataclass(frozen=True)
class GpuSection:
    backend: str = setting("nvml", choices=("nvml", "amdsmi", "auto", "sim"),
                           doc='"nvml" (NVIDIA GPUs), "amdsmi" (AMD Instinct GPUs; without the amdsmi module, '
                               'the amdgpu driver\'s RAS files), "auto" (NVML where it loads, else amdsmi where '
                               'the amdgpu driver runs GPUs) or "sim" (simulated, for tests and rehearsals)')
    sim_dir: str = setting("/var/lib/slurm-hooks/sim", doc="one JSON state file per node for the sim backend")
    probe_timeout: float = setting(20.0, range=POSITIVE, doc="seconds, shorter than [check] deadline; a GPU probe "
                                                             "that hangs longer is a failing finding")
    gres_conf: str = setting("", doc="Slurm's gres.conf for this node; \"\" = beside slurm.conf ($SLURM_CONF, "
                                     "/etc/slurm, configless cache)")
    gres_source: str = setting("gres.conf", choices=("gres.conf", "slurmd"),
                               doc="how Slurm numbers this node's GPUs: \"gres.conf\" (read it), or \"slurmd\" "
                                   "(`slurmd -G`, once per boot: for AutoDetect=nvml with File= lines, and MIG)")
    slurmd: str = setting("/usr/sbin/slurmd", doc='for gres_source = "slurmd"')
    mig_minors: str = setting("/proc/driver/nvidia-caps/mig-minors",
                              doc="which MIG instance a gres.conf nvidia-cap file is")


@dataclass(frozen=True)
class LogSection:
    audit: str = setting("/var/log/slurm-hooks/audit.jsonl", doc="one JSON line per alert and per action")


@dataclass(frozen=True)
class StateSection:
    dir: str = setting("/var/lib/slurm-hooks/state", doc="XID history, job baselines, drain markers")


@dataclass(frozen=True)
class CheckSection:
    deadline: float = setting(45.0, range=Range(0, HEALTH_CHECK_KILL_S, low_open=True, high_open=True,
                                                 why=f"slurmd kills the health check at {HEALTH_CHECK_KILL_S:g} s"),
                              doc="whole run, above 0 and below 60: slurmd kills HealthCheckProgram at 60 s")
    drain: bool = setting(True, doc="false: report and log only, never drain")
    on_check_error: str = setting("drain", choices=("drain", "warn"),
                                  doc='a check that crashes: "drain" (fail safe) or "warn"')
    drain_guard: int = setting(3, doc="a fault judged against a configured value ([expect]/[groups]: GPU count, "
                                      "model, PCIe, NVLinks) already drained on this many nodes with the same reason "
                                      "looks like a wrong value in the config: stop draining, alert loudly, let jobs "
                                      "run; 0 disables")


@dataclass(frozen=True)
class HysteresisSection:  # read by slurm_hooks.checks.hysteresis
    confirm: str = setting("1/1", doc="threshold checks (IB counters and rate, PCIe width, NVLink counters, thermal) "
                                      "take the node out only on K bad of the last N readings: \"2/3\" rides out one "
                                      "bad reading; XIDs and lost GPUs are never delayed")
    resume_after: int = setting(1, range=Range(1, 100), doc="a node we drained for such a check is resumed after "
                                                            "this many good readings in a row (3 keeps a flapping "
                                                            "link out)")
    sticky: float = setting(0.0, doc="... and no sooner than this many seconds after its last bad reading (600: an "
                                     "IB drop that cleared in 30 s keeps the node out 10 minutes)")


@dataclass(frozen=True)
class LinksSection:
    """The node's InfiniBand and RoCE ports, judged apart against [expect] ib_* and roce_* (gpud counts
    only link_layer InfiniBand ports against its thresholds; gcm's ibstat check defaults to IB links
    only). Error rates need rate_window of readings: a symbol-error rate drains above a bit error
    rate of 1e-12 of the port's own rate (1,440/h at 400 Gb/s; docs/severity.md has the arithmetic)."""

    sysfs_root: str = setting("/sys/class/infiniband", doc="InfiniBand/RoCE ports; %n = the node's name (the sim "
                                                           "lays one per node)")
    rate_window: float = setting(600.0, range=Range(60, 86400, why="seconds"),
                                 doc="seconds of readings an error rate is judged over (kept across runs, per boot); "
                                     "a burst in a shorter window only warns (600: the XID watcher's runs seconds "
                                     "apart judge the same 10 minutes as the health check)")


@dataclass(frozen=True)
class SlurmSection:
    backend: str = setting("auto", choices=("auto", "scontrol", "pyslurm"),
                           doc='"auto" (pyslurm if it matches the running Slurm, else scontrol), "scontrol", '
                               '"pyslurm"')
    bin_dir: str = setting("/usr/bin", doc="where scontrol and squeue live (Slurm gives hooks no PATH)")
    timeout: float = setting(10.0, range=POSITIVE, doc="seconds per Slurm command, shorter than [check] deadline")


@dataclass(frozen=True)
class RemediationSection:
    requeue: bool = setting(True, doc="requeue the jobs of a node drained for a fault")
    requeue_grace: float = setting(120.0, doc="seconds a job gets to checkpoint after SIGTERM (Slurm's KillWait "
                                              "must be >= this)")
    node_limit: int = setting(5, range=Range(0, 1000, why="0 = never hold"),
                              doc="a node we drain anew this many times within node_window (any GPU, any rule, "
                                  "links included; one fault's drain, reset and reboot count once) is held for a "
                                  "person: no automatic resume, no repair, until someone resumes it "
                                  "(NVSentinel's MultipleRemediations: 5 in 7 days); 0 = never")
    node_window: float = setting(604800.0, range=POSITIVE, doc="seconds (7 days)")


@dataclass(frozen=True)
class RequeueSection:
    """A job's own checkpoint signal (sbatch --signal=[{R|B}:]SIG[@TIME], read from its script,
    SBATCH_SIGNAL or sacct's SubmitLine) is sent first on a fault; the job then has up to
    checkpoint_grace seconds to requeue itself (submitit, Lightning) or end, before we requeue it."""

    signal: str = setting("", doc='site policy for jobs that declare none, e.g. "USR1" ("" = none)')
    partitions: dict[str, str] = setting({}, doc="per partition, over signal", example={"gpu": "USR1"})
    checkpoint_grace: float = setting(90.0, range=Range(0, 3600, why="0 = no grace: requeue at once after the signal"),
                                      doc="never past the job's own @TIME nor KillWait")
    full: bool = setting(False, doc="scancel --full (batch shell, its children, every step)")
    spool_dir: str = setting("/var/spool/slurmd", doc="SlurmdSpoolDir (%n = node name): the batch host's copy of "
                                                      "the script")
    submit_line: bool = setting(True, doc="also read sacct -o SubmitLine (slurmdbd): the command line wins")


@dataclass(frozen=True)
class RepairSection:
    """The repair ladder on a node we drained, once no job runs on it: GPU reset -> reboot -> replace."""

    enabled: bool = setting(True)
    reset: bool = setting(True, doc="rung 1: nvidia-smi --gpu-reset of the faulty GPUs, then a full check")
    reboot: bool = setting(True, doc="rung 2: scontrol reboot ASAP nextstate=DOWN; back in service after our check")
    window: float = setting(86400.0, range=POSITIVE, doc="a fault back on the same GPU within this many seconds "
                                                         "starts one rung higher")
    attempts: int = setting(1, range=Range(1, 10), doc="at most this many tries of one rung per GPU within the window")
    reboot_timeout: float = setting(900.0, range=POSITIVE, doc="a reboot not done after this long counts as failed")
    reset_timeout: float = setting(60.0, range=POSITIVE, doc="per nvidia-smi / systemctl call")
    dcgm_level: int = setting(2, range=DCGM_LEVEL, doc="validation before return to service: DCGM diag level after "
                                                       "a reset, reboot or replacement (0 = none: back on the NVML "
                                                       "check alone); a diag that cannot run, times out or is not "
                                                       "installed leaves the node [unverified]")
    validate_timeout: float = setting(1800.0, range=POSITIVE, doc="how long that diagnostic may take (level 2 ~ 2 "
                                                                  "min, 3 ~ 15-30 min)")
    fabric_tests: bool = setting(False, doc="validation runs the per-node fabric tests too, with [sweep]'s tools and "
                                            "floors (all_reduce_perf through the NICs, ib_write_bw loopback per HCA): "
                                            "a figure under its floor fails it, a test with a floor that could not "
                                            "run leaves the node [unverified]; needs dcgm_level > 0")
    worker_timeout: float = setting(3600.0, range=POSITIVE, doc="the repair worker's whole budget (the hooks hand it "
                                                                "the repair, it runs detached)")
    nvidia_smi: str = setting("/usr/bin/nvidia-smi")
    systemctl: str = setting("/usr/bin/systemctl")
    services: tuple[str, ...] = setting((), doc='stopped around a reset, e.g. ["nvidia-dcgm", "nvidia-fabricmanager"]')


@dataclass(frozen=True)
class DcgmSection:
    dcgmi: str = setting("/usr/bin/dcgmi", doc="absent DCGM is a reason, not a failure")
    timeout: float = setting(30.0, range=POSITIVE)
    rvs: str = setting("/opt/rocm/bin/rvs", doc="AMD GPUs' diagnostic (ROCm Validation Suite, `rvs -r LEVEL`), run "
                                                "at the same levels in place of dcgmi where [gpu] backend reads AMD "
                                                "GPUs; absent, the diagnostic did not run (never a pass)")


@dataclass(frozen=True)
class SweepSection:
    """slurm-hooks sweep: deep validation of idle nodes in a maintenance reservation, as a root job."""

    level: int = setting(2, range=Range(1, 4, why="dcgmi diag -r level"),
                         doc="dcgmi diag -r level (1 ~ seconds, 2 ~ 2 min, 3 ~ 15-30 min, 4 ~ hours)")
    max_parallel: str = setting("1", doc='nodes validated at once: a count, or a share of the nodes chosen ("10%")')
    job_timeout: float = setting(3600.0, range=POSITIVE, doc="the validation job's time limit; the sweep gives up "
                                                             "on it after that")
    nvbandwidth: str = setting("/usr/bin/nvbandwidth", doc="run too where installed")
    all_reduce_perf: str = setting("/usr/bin/all_reduce_perf", doc="nccl-tests, one node, all its GPUs; run too "
                                                                   "where installed")
    fabric_tests: bool = setting(True, doc="the per-node fabric tests too, where their tools are installed: "
                                           "all_reduce_perf through the NICs and ib_write_bw GPU-direct loopback")
    nccl_nics_busbw_gbps: float = setting(0.0, range=Range(0), doc="floor of all_reduce_perf's busbw (GB/s) on one "
                                                                   "node with NVLink and shared memory off "
                                                                   "(NCCL_P2P_DISABLE/NCCL_SHM_DISABLE); 0 = "
                                                                   "measured, not judged (validate --learn proposes "
                                                                   "one)")
    ib_write_bw: str = setting("/usr/bin/ib_write_bw", doc="perftest's ib_write_bw (built with CUDA: --use_cuda)")
    ib_write_bw_gbps: float = setting(0.0, range=Range(0), doc="floor of each HCA's GPU-direct loopback (Gb/s, "
                                                               "BW average); 0 = measured, not judged "
                                                               "(validate --learn proposes one)")
    ib_hcas: tuple[str, ...] = setting((), doc="the HCAs to test, HCA i with GPU i mod the GPU count; [] = every "
                                               "HCA with an active InfiniBand port")


@dataclass(frozen=True)
class IsolateSection:
    """slurm-hooks isolate: multi-node collective tests in a maintenance reservation find the node that
    breaks collectives (a hung rank, a slow node, a dropped link) and drain it once confirmed."""

    mode: str = setting("bisect", choices=("bisect", "pairwise"),
                        doc='"bisect" (halves, then confirm) or "pairwise" (every pair, then confirm)')
    command: tuple[str, ...] = setting((), doc="one rank's argv under srun; [] = all_reduce_perf ([sweep]) where "
                                               "installed, else the PyTorch all-reduce")
    python: str = setting("/usr/bin/python3", doc="the interpreter of the built-in PyTorch all-reduce (Debian's "
                                                  "python3-torch)")
    ratio: float = setting(0.5, range=Range(0, 1, low_open=True, high_open=True, why="a share of the peers' bandwidth"),
                           doc="a test under this share of the peers' bus bandwidth fails")
    min_busbw_gbps: float = setting(0.0, range=Range(0), doc="the absolute floor, in nccl-tests' busbw (GB/s): a test "
                                                            "under it fails, a node is a partner only after passing "
                                                            "it; 0 = the relative bar alone (set it: validate --learn "
                                                            "proposes one)")
    repeats: int = setting(2, range=Range(1, 10), doc="passes a suspect that once failed needs before it is cleared")
    mpi: str = setting("pmix", doc="srun --mpi= for all_reduce_perf (an MPI build needs Slurm's plugin; "
                                   "validate checks srun --mpi=list offers it)")
    test_timeout: float = setting(120.0, range=POSITIVE, doc="each test job's limit (s), from its start; a rank waits "
                                                             "as long for its peers")
    budget: float = setting(1800.0, range=POSITIVE, doc="the whole run (s): no wave starts after it")
    max_tests: int = setting(64, range=Range(2, 10000), doc="test jobs in one run, at most")
    output_dir: str = setting("", doc='where test jobs write (every node and this host see it); "" = [state] '
                                      'dir/isolate')
    auto: bool = setting(False, doc="isolate the suspected nodes once idle (started by an epilog, once per node "
                                    "within the window)")
    suspect_jobs: int = setting(2, range=Range(2, 1000, why="one failed job is no pattern"),
                                doc="a node in this many failed multi-node jobs within the window (whatever their "
                                    "other nodes) is suspected")
    window: float = setting(86400.0, range=POSITIVE, doc="seconds a failed job counts toward its nodes' suspicion")


@dataclass(frozen=True)
class MetricsSection:
    textfile_dir: str = setting("", doc='node_exporter textfile collector directory; "" disables')


@dataclass(frozen=True)
class WatchSection:
    kmsg: str = setting("/dev/kmsg", doc="kernel log the watcher and the NVML probe read XIDs from")
    poll_interval: float = setting(0.5, range=POSITIVE, doc="seconds")


@dataclass(frozen=True)
class InteropSection:
    """Work with the job's own resilience (docs/interop.md, docs/checkpoint.md): NVIDIA Resiliency
    Extension's ft_launcher asks the watcher whether this node is fit before each rendezvous; a job
    that heals in place (NVRx, torchrun elastic, Megatron-LM, Lightning) is told to leave a node we
    drain and requeued only if it does not."""

    in_job_grace: float = setting(180.0, range=Range(0, 3600, why="0 = no window: such a job is requeued as any "
                                                                   "other"),
                                  doc="seconds a job that heals in place has to leave a node we drained (its ranks "
                                      "there get SIGTERM) before we requeue it")

    nvrx_socket: str = setting("", doc="Unix socket on which the watcher answers NVRx's node health check "
                                       "(ft_launcher --ft-node-health-check-endpoint); \"\" = off. Needs the "
                                       "nvrx extra (grpcio, protobuf)")
    nvrx_group: str = setting("", doc="group of that socket (mode 0660): the users whose jobs may ask; \"\" = the "
                                      "watcher's own")
    nvrx_max_age: float = setting(30.0, range=POSITIVE, doc="seconds: an older verdict is judged again before it "
                                                            "answers")
    nvrx_wait: float = setting(5.0, range=POSITIVE, doc="seconds an answer waits for that judgement, never past the "
                                                        "asker's own deadline (ft_launcher's is 60 s); then the last "
                                                        "verdict answers, with its age")


@dataclass(frozen=True)
class NotifySection:
    """Tell people: one message per incident (the node taken out, why, which jobs were requeued),
    a follow-up when the node is back in service or the action escalates, a reminder while
    it stays out. Messages go to an on-disk outbox first and are delivered by `slurm-hooks
    watch` (or `slurm-hooks notify flush`) with retries; sending never delays a drain.
    The URL of a receiver is a credential: keep it in a 0600 file (url_file) or the environment
    (url_env); `slurm-hooks validate` fails a url file its group or others can read. Never printed (scheme and host only)."""

    syslog: bool = setting(False, doc="one line per message to syslog/journald (facility daemon)")
    outbox: str = setting("", doc='"" = <[state] dir>/notify; the outbox, the log cursor and what was sent')
    settle: float = setting(2.0, doc="seconds after a drain or an escalation to gather what the hooks write (requeued "
                             "jobs, the ladder's [replace] with its evidence) before the message")
    reminder_after: float = setting(14400.0, doc="seconds an incident may stay open before a reminder (again each "
                                                 "period); 0 = never")
    timeout: float = setting(5.0, range=POSITIVE, doc="seconds per webhook request")
    retry_max: float = setting(300.0, range=POSITIVE, doc="longest wait between retries of a message that failed "
                                                          "(backoff doubles up to it)")
    flush_timeout: float = setting(5.0, range=POSITIVE, doc="how long `notify flush` may take when --timeout is not "
                                                            "given")
    cluster: str = setting("", doc='the `cluster` label of every alert and the name in every message; "" = '
                                   '$SLURM_CLUSTER_NAME')
    max_queued: int = setting(500, range=Range(1, 100000), doc="messages waiting per receiver at most; the oldest go "
                                                               "(counted, said in the next one)")
    max_age: float = setting(259200.0, range=POSITIVE, doc="seconds a message may wait (3 days); older ones go "
                                                           "(counted, said in the next one)")
    rate: float = setting(1.0, range=POSITIVE, doc="requests per second to one receiver at most (Slack takes about 1 "
                                                   "per webhook)")
    alert_repost: float = setting(60.0, range=Range(1, 3600, why="each post holds the alert open (endsAt) for "
                                                                 "max(4 x alert_repost, 15 min); a longer gap risks "
                                                                 "a flap"),
                                  doc="seconds between posts of an open incident's alerts to Alertmanager")
    runbook: str = setting("", doc="a line (a URL) every alert and message carries for the on-call")
    webhook: tuple[dict[str, str], ...] = setting((), doc="one [[notify.webhook]] table per receiver")
    alertmanager: tuple[dict[str, str], ...] = setting((), doc="one [[notify.alertmanager]] table per Alertmanager "
                                                               "(the fleet's path)")


WEBHOOK_FORMATS = ("slack", "json")
#: ``[[notify.<kind>]]``: the receivers' tables; their keys are the fields of
#: :data:`slurm_hooks.config.receivers.TABLES` (imported only for a file that has one).
DESTINATION_KEYS = ("webhook", "alertmanager")


@dataclass(frozen=True)
class Group:
    name: str
    nodes: str
    expect: Expectations


@dataclass(frozen=True)
class Config:
    """The whole file: one typed attribute per section, every value of the type its field declares."""

    path: str | None = None
    gpu: GpuSection = GpuSection()
    log: LogSection = LogSection()
    state: StateSection = StateSection()
    check: CheckSection = CheckSection()
    hysteresis: HysteresisSection = HysteresisSection()
    links: LinksSection = LinksSection()
    slurm: SlurmSection = SlurmSection()
    remediation: RemediationSection = RemediationSection()
    requeue: RequeueSection = RequeueSection()
    repair: RepairSection = RepairSection()
    dcgm: DcgmSection = DcgmSection()
    sweep: SweepSection = SweepSection()
    isolate: IsolateSection = IsolateSection()
    metrics: MetricsSection = MetricsSection()
    watch: WatchSection = WatchSection()
    interop: InteropSection = InteropSection()
    notify: NotifySection = NotifySection()
    #: ``[expect]``: what every node should have where no group says otherwise.
    expect: Expectations = Expectations()
    groups: tuple[Group, ...] = ()
    #: The file's table as parsed: ``[bridge]`` is read from it (:mod:`slurm_hooks.bridge.settings`).
    raw: dict[str, Any] = field(default_factory=dict)
    #: The severity table with ``[severity.xid.<code>]`` / ``[severity.check.<rule>]`` overrides.
    severities: Severities = Severities()
    #: Where each key was written: errors found later (the ``[bridge]`` section) still name the line.
    where: Locator | None = field(default=None, repr=False, compare=False)

    def expectations_for(self, node: str) -> Expectations:
        """First group (in file order) whose ``nodes`` names this host wins."""
        for group in self.groups:
            if hostlist.matches(group.nodes, node):
                return group.expect
        return self.expect

    def group_for(self, node: str) -> str:
        for group in self.groups:
            if hostlist.matches(group.nodes, node):
                return group.name
        return "default"


#: Section name -> its class, in the file's order (the fields of :class:`Config` that are sections).
SECTIONS: dict[str, type] = {f.name: type(f.default) for f in fields(Config)
                             if f.name not in ("path", "groups", "raw", "severities", "where")}
#: Sections kept raw by :func:`parse` and validated on demand by their owner
#: (:func:`slurm_hooks.bridge.settings.from_config`), so that a bridge typo never fails a node's health check.
OPEN_SECTIONS = ("bridge",)
