"""What differs between the Slurm versions we support (22.05 and later), in one place.

A new quirk goes here as a named constant or a function of ``(major, minor)``; the
adapters and the testbed ask this module instead of comparing versions themselves.
"""

from __future__ import annotations

Version = tuple[int, int]

#: ``scontrol --json`` exists from 23.02 (sinfo/squeue have it from 22.05, in an older format);
#: older Slurm (the 22.05 testbed) keeps the ``scontrol -o`` one-line output.
SCONTROL_JSON_SINCE: Version = (23, 2)

#: ``CgroupPlugin=disabled`` exists from 24.05.
CGROUP_DISABLED_SINCE: Version = (24, 5)

#: Keys ``scontrol -o show node`` prints on 22.05 .. 24.11.
NODE_KEYS_BASE = frozenset(
    """NodeName Arch CpuBind CoresPerSocket CPUAlloc CPUEfctv CPUTot CPULoad AvailableFeatures ActiveFeatures
    Features Gres GresDrain GresUsed NodeAddr NodeHostName BcastAddr Port Version OS RealMemory AllocMem FreeMem
    Sockets Boards CoreSpecCount CPUSpecList MemSpecLimit RestrictedCoresPerGPU State ThreadsPerCore TmpDisk
    Weight Owner MCS_label NextState Partitions BootTime SlurmdStartTime LastBusyTime ResumeAfterTime CfgTRES
    AllocTRES CapWatts CurrentWatts AveWatts LowestJoules ConsumedJoules ExtSensorsJoules ExtSensorsWatts
    ExtSensorsTemp Reason Comment Extra InstanceId InstanceType ReservationName Topology TopologyQuality""".split()
)
#: Node keys a later Slurm added, by the version that added them; some follow ``Reason=``, so the
#: reason parser must know them (the bracketed ``[user@time]`` ends a reason whatever follows).
NODE_KEYS_ADDED: dict[Version, frozenset[str]] = {
    (25, 5): frozenset({"CertFlags", "TLSCertExpiration", "TLSCertTokenSet", "TLSCertLastRenewal"}),
    (25, 11): frozenset({"Parameters"}),
}
#: Every node key any supported version prints.
NODE_KEYS = NODE_KEYS_BASE.union(*NODE_KEYS_ADDED.values())


def scontrol_json(version: Version | None) -> bool:
    """Does this Slurm's ``scontrol`` take ``--json``? (None: unknown version, so no.)"""
    return version is not None and version >= SCONTROL_JSON_SINCE


def cgroup_disabled(version: Version) -> bool:
    """Does this Slurm know ``CgroupPlugin=disabled``?"""
    return version >= CGROUP_DISABLED_SINCE


# --- reasons and reboots, by version (DESIGN.md, "Where the field differs") ----------------

#: From 23.11, a node's reason outlives ``State=RESUME`` when no accounting plugin is
#: configured (``accounting_storage.c`` returns before freeing it; 22.05 frees it, and so
#: does any Slurm with slurmdbd): Slurm's own later drains and an admin's reboot then wear
#: the old text. Ownership therefore rests on what we recorded (hooks.marker), not the text.
REASON_KEPT_AFTER_RESUME_SINCE: Version = (23, 11)
#: ... until 26.05.0, which clears it again ("Resuming nodes clears reason without database").
REASON_KEPT_AFTER_RESUME_UNTIL: Version = (26, 5)

#: From 25.11, ``scontrol show job`` prints the job's ``SubmitLine`` (no slurmdbd needed).
SUBMIT_LINE_IN_SHOW_JOB_SINCE: Version = (25, 11)

#: From 24.11, ``scontrol reboot ASAP`` without ``nextstate=`` returns the node UNDRAINed
#: (earlier: RESUME); we always pass our ``nextstate`` (:func:`reboot_args`).
REBOOT_ASAP_UNDRAIN_SINCE: Version = (24, 11)

#: From 25.05, ``Kill task failed`` carries the step: ``Kill task failed (JobId=12 StepId=0)``.
KILL_TASK_JOBID_SINCE: Version = (25, 5)

#: From 25.11, setting a node IDLE (or RESUME) while it is ``REBOOT_ISSUED`` is refused.
IDLE_REFUSED_IN_REBOOT_ISSUED_SINCE: Version = (25, 11)

#: From 26.05, ``HealthCheckTimeout`` (seconds) bounds the health check; before it slurmd
#: kills the program at a fixed 60 s.
HEALTH_CHECK_TIMEOUT_SINCE: Version = (26, 5)
HEALTH_CHECK_KILL_S = 60.0
#: From 26.05, ``scontrol reboot FORCE`` reboots at once, killing the node's jobs: never ours
#: (a repair waits for the last job to leave; ASAP drains first).
REBOOT_FORCE_SINCE: Version = (26, 5)
#: From 26.05.2 (behind ``SlurmctldParameters=health_check_report``, default from 26.11),
#: the health check runs with ``SLURM_NODE_IS_HEALTHY=yes|no``: Slurm's own view, recorded.
NODE_IS_HEALTHY_ENV = "SLURM_NODE_IS_HEALTHY"


def reason_kept_after_resume(version: Version | None, accounting: bool) -> bool:
    """Does ``State=RESUME`` leave the reason on the node? 23.11 up to (not including) 26.05,
    without accounting. (Unknown version: assume it may.)"""
    if accounting:
        return False
    return version is None or REASON_KEPT_AFTER_RESUME_SINCE <= version < REASON_KEPT_AFTER_RESUME_UNTIL


def submit_line_in_show_job(version: Version | None) -> bool:
    """Does ``scontrol show job`` print ``SubmitLine``? (Unknown version: no, ask sacct.)"""
    return version is not None and version >= SUBMIT_LINE_IN_SHOW_JOB_SINCE


def reboot_args(version: Version | None, node: str, reason: str, nextstate: str) -> list[str]:
    """``scontrol`` arguments of our reboot: ASAP (drain, wait for the jobs), never FORCE, with
    ``nextstate`` always explicit (24.11 changed the default to UNDRAIN)."""
    return ["reboot", "ASAP", f"nextstate={nextstate}", f"reason={reason}", node]


def is_kill_task_failed(reason: str) -> bool:
    """Slurm's ``Kill task failed`` drain, with 25.05's ``(JobId=... StepId=...)`` or without."""
    return reason == "Kill task failed" or reason.startswith("Kill task failed (")


def may_set_idle(version: Version | None, state_flags: frozenset[str]) -> bool:
    """May a node be resumed now? Not while ``REBOOT_ISSUED`` on 25.11+ (Slurm refuses; the
    reboot's registration brings it back)."""
    return not ("REBOOT_ISSUED" in state_flags and (version is None or version >= IDLE_REFUSED_IN_REBOOT_ISSUED_SINCE))


def health_check_kill_s(version: Version | None, timeout_setting: str | None) -> float:
    """When slurmd kills the health check: ``HealthCheckTimeout`` on 26.05+ when set, else 60 s."""
    if timeout_setting and version is not None and version >= HEALTH_CHECK_TIMEOUT_SINCE:
        try:
            value = float(timeout_setting)
        except ValueError:
            return HEALTH_CHECK_KILL_S
        if value > 0:
            return value
    return HEALTH_CHECK_KILL_S


def node_is_healthy(env: dict[str, str] | None) -> str:
    """``yes``/``no`` from ``SLURM_NODE_IS_HEALTHY`` (26.05.2+), "" when Slurm did not say."""
    value = ((env or {}).get(NODE_IS_HEALTHY_ENV) or "").strip().lower()
    return value if value in ("yes", "no") else ""
