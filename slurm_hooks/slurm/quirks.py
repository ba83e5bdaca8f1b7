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
