"""A real Slurm cluster on this one machine, for tests, demos and fault rehearsals.

N slurmd's (``n1..nN``) run beside one slurmctld and a private munged, each on
its own port, all files under one state directory. Every node has ``gpu:8``
backed by char devices made with mknod, and simulated GPUs for slurm-hooks.
Nothing here touches a real cluster: the cluster name, ports (never 6817/6818),
munge socket and key are the testbed's own.

Runs as root (daemons, mknod). The Debian packages are installed with apt-get
when missing.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import stat
import sys
import time
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Callable

import jinja2

import slurm_hooks
from slurm_hooks import fsutil
from slurm_hooks.errors import CommandError, SlurmHooksError
from slurm_hooks.install import layout
from slurm_hooks.lab import accounting, packages
from slurm_hooks.lab import nhc as nhc_lab
from slurm_hooks.lab.accounting import Accounting
from slurm_hooks.lab.waiting import poll
from slurm_hooks.probes import sim, sim_amd, simtools
from slurm_hooks.runner import run_command, spawn_detached
from slurm_hooks.slurm import JobInfo, JobState, NodeInfo, quirks
from slurm_hooks.slurm.errors import SlurmNotFound
from slurm_hooks.slurm.scontrol import ScontrolSlurm
from slurm_hooks.slurm.version import parse_version

#: Where ``testbed up`` keeps a cluster when no --state-dir is given: one per user (default_state_dir).
STATE_ROOT = "/var/lib/slurm-hooks"
CLUSTER = "shtest"
PARTITION = "gpu"
PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
#: program -> package that ships it
PROGRAMS = {
    "/usr/sbin/slurmctld": "slurmctld",
    "/usr/sbin/slurmd": "slurmd",
    "/usr/bin/scontrol": "slurm-client",
    "/usr/bin/sbatch": "slurm-client",
    "/usr/bin/squeue": "slurm-client",
    "/usr/bin/scancel": "slurm-client",
    "/usr/sbin/munged": "munge",
}
SBIN, BIN = "/usr/sbin", "/usr/bin"
#: Names the prefix of another Slurm install (``configure --prefix``: its bin/, sbin/, lib/) that
#: every testbed started from this environment runs instead of Debian's packages; ``testbed up
#: --slurm-prefix`` says the same for one cluster.
SLURM_PREFIX_ENV = "SLURM_HOOKS_SLURM_PREFIX"
NVIDIA_MAJOR = 195
#: The DRM subsystem's major: an AMD GPU's render node, /dev/dri/renderD<minor> (what gres.conf names).
DRM_MAJOR = 226
#: The nvidia-caps devices' major (the driver's is dynamic, from /proc/devices): any free one will do.
NVIDIA_CAPS_MAJOR = 509
#: Ports are picked from here (below Linux's ephemeral range, away from 6817/6818).
PORT_FIRST, PORT_BLOCKS, PORT_BLOCK = 20000, 120, 100
#: One port per slurmd in a block, after slurmctld's: what bounds ``--nodes`` (memory comes next:
#: an idle slurmd holds about 6 MiB resident).
MAX_NODES = PORT_BLOCK - 1
#: Faults the kernel makes on one node's traffic (:meth:`Testbed.set_fault`, with ``own_addresses``):
#: nftables rules on that node's address only, in a table of the testbed's own.
NET_FAULTS = ("net-drop", "net-slow", "net-loss")
#: What ``testbed fault`` puts on a node: a kernel-made fault, or ``hang``, a file (``faults/<node>``)
#: that only test-side wrappers read (no shipped program does).
FAULTS = ("hang", *NET_FAULTS)
NFT = "/usr/sbin/nft"
#: Environment marker on every daemon we start; slurmstepd inherits it, so ``down``
#: finds the step daemons of running jobs too.
MARKER = "SLURM_HOOKS_TESTBED"
#: The line of the testbed's config.toml below which an admin's own lines are kept by every ``up``.
KEEP_BELOW = "# ---- yours: the lines below are kept by `slurm-hooks testbed up` (receivers, [notify], ...) ----"
HOOKS = ("healthcheck", "prolog", "epilog")
HOOK_COMMAND = {"healthcheck": "check", "prolog": "prolog", "epilog": "epilog"}

Progress = Callable[[str], None]
#: PrologFlags=ForceRequeueOnFail is Slurm 23.02's (NEWS 23.02.0): 22.05's slurmd and scontrol exit
#: "fatal: PrologFlags invalid" on a slurm.conf that names it, so older testbeds go without.
FORCE_REQUEUE_ON_FAIL_SINCE = (23, 2)
#: How long a testbed reboot waits before the new boot begins (see Testbed.reboot_node).
REBOOT_SETTLE_S = 2.0


class TestbedError(SlurmHooksError):
    """The testbed could not be brought up, checked or taken down."""

    __test__ = False  # not a pytest test class


@dataclass(frozen=True)
class LabSettings:
    """What ``up`` builds. Saved as ``testbed.json`` so ``down``/``status`` need only the directory."""

    nodes: int = 2
    gpus: int = 8
    cpus: int = 8
    memory_mb: int = 8000
    hooks: bool = True
    #: KillWait: what ``slurm-hooks install`` recommends (120 s, above ``checkpoint_grace``), so that
    #: ``testbed up`` and the demo rehearse what validate passes. Tests pass a few seconds: a requeued
    #: job that ignores SIGTERM is SIGKILLed only after KillWait, and 120 s per such requeue would
    #: make the suite minutes slower for nothing it asserts.
    kill_wait: int = 120
    #: ReturnToService: 1, as validate recommends (2 brings a node our reboot left DOWN back before
    #: the check on its new boot judged it). A test that needs 2 passes it.
    return_to_service: int = 1
    #: ``PrologFlags=ForceRequeueOnFail`` (Slurm 23.02+), as validate recommends: a ``--no-requeue``
    #: batch job our prolog refuses is requeued, not cancelled. ``testbed up`` turns it on; off here so
    #: that the suite's clusters run the same prolog timing on every Slurm (the flag implies
    #: ``PrologFlags=Alloc``) and rehearse a site without it (Slurm cancels such a job).
    force_requeue_on_fail: bool = False
    health_check_interval: int = 30
    prolog_epilog_timeout: int = 60
    slurmd_timeout: int = 10
    message_timeout: int = 5
    min_job_age: int = 300
    #: How long slurmctld waits for a node asked to reboot (`scontrol reboot`) to come back.
    resume_timeout: int = 60
    requeue_grace: float = 3.0
    #: [requeue] checkpoint_grace: how long a job that got its own --signal has to requeue itself.
    checkpoint_grace: float = 90.0
    #: [interop] in_job_grace: how long a job that heals in place has to leave a node we drained.
    in_job_grace: float = 180.0
    up_timeout: float = 60.0
    #: Also a private MariaDB and slurmdbd (slurm_hooks.lab.accounting).
    accounting: bool = False
    #: The repair ladder ([repair] enabled in the testbed's config.toml). Off by default, so that
    #: a drained node stays drained for the tests and demos that look at it.
    repair: bool = False
    #: ``[repair] reset_timeout``: how long one nvidia-smi / systemctl call of a reset may take.
    reset_timeout: float = 60.0
    #: The prefix of a ``slurm-hooks install`` whose programs slurm.conf names (rehearse a roll-out:
    #: the wheel in its own venv, ``install --prefix P --config <testbed config> --env SLURM_CONF=...``);
    #: "" for the testbed's own wrappers, which run this checkout.
    programs: str = ""
    #: RebootProgram in slurm.conf. Off (``testbed up --no-reboot-program``) as on sites that never
    #: set one: ``scontrol reboot`` is then refused ("Unspecified error").
    reboot_program: bool = True
    #: LBNL NHC as HealthCheckProgram, run from this source (its tarball or tree; "" = slurm-hooks
    #: itself), with our check in its scripts dir (slurm_hooks.lab.nhc).
    nhc: str = ""
    #: Our line in NHC's nhc.conf (``check_slurm_hooks -r``: report mode).
    nhc_check: str = nhc_lab.CHECK
    #: gres.conf's File= order, as device numbers (``--gres-order 7,6,...``): GRES index i is
    #: /dev/nvidia<gres_order[i]>, the sim GPU with that minor number. Empty: 0..gpus-1.
    gres_order: tuple[int, ...] = ()
    #: Shards of each GPU declared to Slurm (``--shards``, gres/shard, Slurm 22.05+); 0: none.
    shards: int = 0
    #: MIG instances per GPU (``--mig``): the sim's GPUs get them, and gres.conf declares each to
    #: Slurm as its own GPU (``MultipleFiles=`` the GPU's file and the instance's nvidia-cap file).
    mig: int = 0
    #: Each node on a loopback address of its own (``NodeAddr=127.1.B.K``, B from the testbed's port
    #: block, so two testbeds never share one), so that a fault can be put on one node's traffic.
    #: Off (the default): every node is ``localhost``.
    own_addresses: bool = False
    #: Another Slurm's install prefix (``/opt/slurm-25.11``: a build from SchedMD's source with
    #: ``--enable-multiple-slurmd``), whose slurmctld, slurmd and commands run this cluster instead
    #: of Debian's; "" for Debian's. Default: $SLURM_HOOKS_SLURM_PREFIX.
    slurm_prefix: str = field(default_factory=lambda: os.environ.get(SLURM_PREFIX_ENV, ""))
    #: ``[slurm] backend`` in the testbed's config.toml: what the hooks that slurmd runs use.
    slurm_backend: str = "scontrol"
    #: Who makes every node's simulated GPUs ("nvidia", "amd": MI300X boards), and the nodes that
    #: differ (``{"n2": "amd"}``: one AMD Instinct node beside NVIDIA ones). An AMD node's gres.conf
    #: line names render nodes (``File=<state>/dev/dri/renderD128,...``), as ``AutoDetect=rsmi``
    #: sites write them by hand.
    vendor: str = "nvidia"
    vendors: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.slurm_prefix and not os.path.isabs(self.slurm_prefix):
            raise TestbedError(f"--slurm-prefix must be an absolute path, got {self.slurm_prefix!r}")
        if self.slurm_prefix and self.accounting:
            raise TestbedError("--slurm-prefix and --accounting: the accounting lab runs Debian's slurmdbd")
        if self.slurm_backend not in ("auto", "scontrol", "pyslurm"):
            raise TestbedError(f"--slurm-backend must be auto, scontrol or pyslurm, got {self.slurm_backend!r}")
        object.__setattr__(self, "gres_order", tuple(int(m) for m in self.gres_order))
        try:
            vendors = dict(self.vendors)  # a mapping, or (node, vendor) pairs as testbed.json keeps them
        except (TypeError, ValueError):
            raise TestbedError(f"vendors must map node names to vendors, got {self.vendors!r}") from None
        object.__setattr__(self, "vendors", tuple(sorted((str(k), str(v)) for k, v in vendors.items())))
        for node, vendor in ((None, self.vendor), *self.vendors):
            if vendor not in sim.VENDORS:
                raise TestbedError(f"--vendor must be one of {', '.join(sim.VENDORS)}, got {vendor!r}"
                                   + (f" for {node}" if node else ""))
            if node is not None and node not in self.node_names:
                raise TestbedError(f"--vendor {node}={vendor}: no node {node!r} (nodes: n1..n{self.nodes})")
        if self.mig and "amd" in (self.vendor_of(n) for n in self.node_names):
            raise TestbedError("--mig is NVIDIA's: an AMD node's GPUs are split by their compute partition")
        if self.return_to_service not in (0, 1, 2):
            raise TestbedError(f"ReturnToService must be 0, 1 or 2, got {self.return_to_service}")
        if not 0 <= self.mig <= 7:
            raise TestbedError(f"--mig must be 0..7 instances per GPU, got {self.mig}")
        if self.mig and self.shards:
            raise TestbedError("--mig and --shards: pick one")
        if not 0 <= self.shards <= 64:
            raise TestbedError(f"--shards must be 0..64, got {self.shards}")
        if self.gres_order and sorted(self.gres_order) != list(range(self.gpus)):
            raise TestbedError(f"--gres-order must list 0..{self.gpus - 1} once each, got "
                               f"{','.join(map(str, self.gres_order))}")
        if not 1 <= self.nodes <= MAX_NODES:
            raise TestbedError(f"--nodes must be 1..{MAX_NODES}, got {self.nodes}")
        if not 1 <= self.gpus <= 64:
            raise TestbedError(f"--gpus must be 1..64, got {self.gpus}")

    @property
    def node_names(self) -> list[str]:
        return [f"n{k}" for k in range(1, self.nodes + 1)]

    def vendor_of(self, node: str) -> str:
        """Who makes ``node``'s simulated GPUs."""
        return dict(self.vendors).get(node, self.vendor)


@dataclass(frozen=True)
class Status:
    state_dir: str
    up: bool
    #: daemon label ("munged", "slurmctld", "slurmd n1", ...) -> pid, or None when not running
    daemons: dict[str, int | None]
    nodes: list[NodeInfo] = field(default_factory=list)
    error: str = ""


class Testbed:
    """A local Slurm cluster rooted at ``state_dir``; see the module docstring.

    ``Testbed(dir).up()`` is idempotent; ``down()`` leaves no process of ours
    behind; ``env()`` is what a subprocess needs to talk to this cluster.
    """

    __test__ = False  # not a pytest test class

    def __init__(self, state_dir: str | None = None, settings: LabSettings | None = None,
                 progress: Progress | None = None):
        self.state_dir = os.path.abspath(state_dir or default_state_dir())
        saved = self._load_saved()
        self.settings = settings or saved.get("settings") or LabSettings()
        self._ports: dict[str, int] = saved.get("ports", {})
        self.progress = progress or (lambda msg: None)
        self.last_up_seconds: float | None = None

    # -- paths

    def path(self, *parts: str) -> str:
        return os.path.join(self.state_dir, *parts)

    @property
    def slurm_conf(self) -> str:
        return self.path("slurm.conf")

    @property
    def config_path(self) -> str:
        return self.path("config.toml")

    @property
    def sim_dir(self) -> str:
        return self.path("sim")

    @property
    def audit_log(self) -> str:
        return self.path("audit.jsonl")

    @property
    def hooks_state_dir(self) -> str:
        return self.path("state")

    @property
    def jobs_dir(self) -> str:
        return self.path("jobs")

    @property
    def faults_dir(self) -> str:
        """One file per node with a simulated traffic fault (:meth:`set_fault`)."""
        return self.path("faults")

    def node_addr(self, name: str) -> str:
        """The node's NodeAddr: ``localhost``, or its own 127.1.B.K with ``own_addresses``."""
        if not self.settings.own_addresses:
            return "localhost"
        if name not in self.node_names:
            raise TestbedError(f"no node {name!r} in this testbed ({', '.join(self.node_names)})")
        block = (self._ports.get("slurmctld", PORT_FIRST) - PORT_FIRST) // PORT_BLOCK
        return f"127.1.{block}.{self.node_names.index(name) + 1}"

    def set_fault(self, node: str, fault: str = "") -> None:
        """Put a fault on ``node``, or clear it (``""``). Kernel-made, on the node's own address
        (``own_addresses``), by nftables rules in the table :meth:`nft_table`: ``net-drop`` (every
        packet to or from it), ``net-slow KBPS`` (over KBPS kbytes/s each way, dropped: TCP backs
        off), ``net-loss PCT`` (PCT% of its packets dropped at random). Slurm's own traffic to the
        node's slurmd port is spared, so the node stays up and schedulable, as a fabric fault leaves
        the management network. ``hang``: a file, ``faults/<node>``, that test-side wrappers read."""
        if node not in self.node_names:
            raise TestbedError(f"no node {node!r} in this testbed ({', '.join(self.node_names)})")
        words = fault.split()
        if words:
            _check_fault(words)
            if words[0] in NET_FAULTS and not self.settings.own_addresses:
                raise TestbedError(f"{words[0]} needs nodes on their own addresses: testbed up --own-addresses")
            if words[0] in NET_FAULTS and not os.access(NFT, os.X_OK):
                raise TestbedError(f"{words[0]} needs nftables ({NFT}): apt-get install nftables")
        path = os.path.join(self.faults_dir, node)
        if not words:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        else:
            _mkdir(self.faults_dir, 0o755)
            fsutil.atomic_write(path, " ".join(words) + "\n", mode=0o644)
        self._apply_net_faults()

    def faults(self) -> dict[str, str]:
        """node -> its fault."""
        out = {}
        for name in self.node_names:
            with contextlib.suppress(OSError):
                with open(os.path.join(self.faults_dir, name), encoding="utf-8") as fh:
                    out[name] = fh.read().strip()
        return out

    @property
    def nft_table(self) -> str:
        """The nftables table (family inet) holding this testbed's network faults, named by its state dir."""
        return f"slurm_hooks_testbed_{zlib.crc32(self.state_dir.encode()):08x}"

    def net_rules(self) -> list[str]:
        """The rules of :meth:`nft_table`'s output chain, one per fault and direction: each names
        the node's own address, and spares its slurmd port."""
        rules = []
        for node, fault in sorted(self.faults().items()):
            words = fault.split()
            if not words or words[0] not in NET_FAULTS:
                continue
            addr, port = self.node_addr(node), self._ports.get(node, 0)
            if words[0] == "net-slow":
                action = f"limit rate over {int(words[1])} kbytes/second drop"
            elif words[0] == "net-loss":
                action = f"numgen random mod 100 < {int(words[1])} drop"
            else:
                action = "drop"
            rules.append(f"ip daddr {addr} tcp dport != {port} {action}")
            rules.append(f"ip saddr {addr} tcp sport != {port} {action}")
            rules.append(f"ip daddr {addr} ip protocol != tcp {action}")
        return rules

    def _apply_net_faults(self) -> None:
        rules = self.net_rules()
        if not rules:
            self.clear_net_faults()
            return
        table = self.nft_table
        script = "\n".join([f"table inet {table}", f"delete table inet {table}", f"table inet {table} {{",
                             "  chain out {", "    type filter hook output priority 0; policy accept;",
                             *(f"    {r}" for r in rules), "  }", "}", ""])
        try:
            run_command([NFT, "-f", "-"], 10, input=script)
        except SlurmHooksError as exc:
            raise TestbedError(f"nft refused the testbed's fault rules: {exc}") from None

    def clear_net_faults(self) -> None:
        """Delete :meth:`nft_table` (``down`` and ``up`` do): no rule of ours is left in the kernel."""
        if not os.access(NFT, os.X_OK):
            return
        with contextlib.suppress(SlurmHooksError):
            run_command([NFT, "delete", "table", "inet", self.nft_table], 10, check=False)

    @property
    def munge_socket(self) -> str:
        return self.path("munge", "munge.socket")

    @property
    def node_names(self) -> list[str]:
        return self.settings.node_names

    @property
    def nhc(self) -> nhc_lab.NhcTree:
        """NHC's files (``<state>/nhc``), used when ``settings.nhc`` names NHC's source."""
        return nhc_lab.NhcTree(self.path("nhc"))

    @property
    def syslog(self) -> str:
        """The nodes' syslog under NHC (what NHC and check_slurm_hooks send to ``logger``)."""
        return self.path("log", "syslog")

    def ports(self) -> dict[str, int]:
        """The ports this testbed picked ("slurmctld", each node's name), as saved by its last ``up``."""
        return dict(self._ports)

    def exports(self) -> dict[str, str]:
        """Only what this cluster adds to an environment (``slurm-hooks testbed env``): with another
        Slurm's prefix, its commands first on PATH (a job's ``srun`` too)."""
        out = {"SLURM_CONF": self.slurm_conf, "SLURM_HOOKS_CONFIG": self.config_path}
        if self.settings.slurm_prefix:
            out["PATH"] = os.pathsep.join([self.slurm_bin, self.slurm_sbin, os.environ.get("PATH", os.defpath)])
        return out

    def env(self) -> dict[str, str]:
        """A full environment for a subprocess that talks to this cluster."""
        env = {k: v for k, v in os.environ.items() if k != MARKER}
        env.update(self.exports())
        env["SLURM_HOOKS_FAULT_DIR"] = self.faults_dir  # a job submitted with it honours set_fault
        return env

    def slurm(self, timeout: float = 10.0) -> ScontrolSlurm:
        return ScontrolSlurm(bin_dir=self.slurm_bin, timeout=timeout, env=self.exports())

    @property
    def slurm_bin(self) -> str:
        """Where this cluster's Slurm commands are (Debian's, or ``<slurm_prefix>/bin``)."""
        return os.path.join(self.settings.slurm_prefix, "bin") if self.settings.slurm_prefix else BIN

    @property
    def slurm_sbin(self) -> str:
        """Where this cluster's slurmctld and slurmd are."""
        return os.path.join(self.settings.slurm_prefix, "sbin") if self.settings.slurm_prefix else SBIN

    @property
    def slurm_version(self) -> tuple[int, int]:
        """(major, minor) of the slurmd this cluster runs."""
        return slurm_version(self.slurm_sbin)

    # -- up

    def up(self) -> Status:
        """Install what is missing, write the config, start the daemons, wait for IDLE nodes."""
        started = time.monotonic()
        _require_root("testbed up")
        ensure_packages(self.progress, self.settings.slurm_prefix)
        current = self.status()
        if current.up:
            self.progress(f"testbed already up in {self.state_dir} ({len(current.nodes)} nodes)")
            if self._saved_hooks() != self.settings.hooks:
                self.set_hooks(self.settings.hooks)
            self._switch_nhc()
            self.last_up_seconds = time.monotonic() - started
            return self.status()
        if any(pid for pid in current.daemons.values()):
            dead = [label for label, pid in current.daemons.items() if not pid]
            why = "; ".join(filter(None, [f"not running: {', '.join(dead)}" if dead else "", current.error]))
            self.progress(f"testbed only partly up ({why}): stopping it to start afresh")
            self.down()
        if self.settings.accounting:
            # MariaDB and slurmdbd are installed first (minutes on a fresh machine): the ports are
            # picked after that, not minutes before slurmctld binds them.
            accounting.ensure_packages(self.progress)
        self.progress(f"preparing {self.state_dir}")
        self.clear_net_faults()  # a killed testbed's rules, and its fault files, go with it
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(self.faults_dir)
        self._prepare()
        try:
            self._start_daemons()
            self.progress("waiting for nodes to register")
            self.wait_ready(self.settings.up_timeout)
        except TestbedError as exc:
            if not self._port_taken(exc):
                raise
            # Another cluster on this host took a port between our pick and our bind: pick again, once.
            self.progress("a port was taken meanwhile: starting afresh on other ports")
            self.down()
            self._prepare()
            self._start_daemons()
            self.wait_ready(self.settings.up_timeout)
        if self.settings.accounting:
            Accounting(self.state_dir, self.progress).wait_registered(CLUSTER, self.env())
            # A clean slurmctld logs a "cold-start" event for every node in slurmdbd as it starts.
            # slurmdbd keys node events by node and start time in whole seconds, and a second event
            # in the same second only reopens that row: a drain right after `up` was lost. Every
            # cold-start row is older than now, so from the next whole second on, events are new rows.
            time.sleep(1.0 - time.time() % 1.0 + 0.01)
        self.last_up_seconds = time.monotonic() - started
        self.progress(f"testbed up: {', '.join(self.node_names)} with gpu:{self.settings.gpus} "
                      f"in {self.last_up_seconds:.1f}s (SLURM_CONF={self.slurm_conf})")
        return self.status()

    def _prepare(self) -> None:
        s = self.settings
        for sub, mode in (("", 0o755), ("spool", 0o755), ("spool/ctld", 0o700), ("run", 0o755), ("log", 0o755),
                          ("bin", 0o755), ("dev", 0o755), ("munge", 0o755), ("sim", 0o755), ("state", 0o700),
                          ("jobs", 0o755), ("faults", 0o755)):
            _mkdir(self.path(sub), mode)
        for name in s.node_names:
            _mkdir(self.path("spool", name), 0o755)
        if not self._alive("slurmctld"):
            # A fresh controller restarts job ids at 1: old outputs would be mistaken for new ones.
            for entry in os.listdir(self.jobs_dir):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(self.jobs_dir, entry))
        vendors = {s.vendor_of(n) for n in s.node_names}
        if "nvidia" in vendors:
            for i in range(s.gpus):
                _mknod(self.path("dev", f"nvidia{i}"), i)
        if "amd" in vendors:
            _mkdir(self.path("dev", "dri"), 0o755)
            for i in range(s.gpus):
                _mknod(self.path("dev", "dri", f"renderD{sim_amd.RENDER_MINOR_BASE + i}"),
                       sim_amd.RENDER_MINOR_BASE + i, DRM_MAJOR)
        if s.mig:
            _mkdir(self.path("dev", "nvidia-caps"), 0o755)
            for i in range(s.gpus):
                for gi in range(1, s.mig + 1):
                    _mknod(self.path("dev", "nvidia-caps", f"nvidia-cap{sim.cap_minor(i, gi)}"), sim.cap_minor(i, gi),
                           NVIDIA_CAPS_MAJOR)
        fsutil.atomic_write(self.path("mig-minors"), sim.mig_minors(list(range(s.gpus)), s.mig), mode=0o644)
        key = self.path("munge", "munge.key")
        if not os.path.exists(key):
            fsutil.atomic_write(key, os.urandom(1024), mode=0o600)
        if len(self.munge_socket) > 100:
            raise TestbedError(f"state directory path too long for a unix socket: {self.munge_socket}")
        self._ports = self._pick_ports()
        ctx = self._template_context()
        self._render("slurm.conf.j2", self.slurm_conf, ctx)
        self._render("gres.conf.j2", self.path("gres.conf"), ctx)
        self._render("cgroup.conf.j2", self.path("cgroup.conf"), ctx)
        self._write_config(ctx)
        if s.nhc:
            self._write_nhc()
        for hook in HOOKS:
            self._write_hook(hook)
        self._write_reboot_program()
        simtools.install(self.path("bin"), self.sim_dir, python=hook_interpreter())
        for name in s.node_names:
            if not os.path.exists(sim.state_path(self.sim_dir, name)) or sim.vendor(self.sim_dir, name) != s.vendor_of(name):
                self._sim_init(name)
        self._save_settings()

    def _sim_init(self, node: str) -> None:
        """The node's simulated GPUs, healthy, of its vendor."""
        s = self.settings
        sim.init(self.sim_dir, node, s.gpus, mig=s.mig, vendor=s.vendor_of(node))

    def gres_files(self, node: str) -> list[str]:
        """The device files gres.conf gives ``node``, in GRES index order: /dev/nvidia<m> on an
        NVIDIA node, /dev/dri/renderD<128+m> on an AMD one (m: ``gres_order``, else 0..gpus-1)."""
        s = self.settings
        order = s.gres_order or range(s.gpus)
        if s.vendor_of(node) == "amd":
            return [self.path("dev", "dri", f"renderD{sim_amd.RENDER_MINOR_BASE + m}") for m in order]
        return [self.path("dev", f"nvidia{m}") for m in order]

    def _gres_groups(self) -> list[dict]:
        """One gres.conf group per vendor: its nodes, their GPU files and (NVIDIA) MIG instances' files."""
        s = self.settings
        groups: dict[str, dict] = {}
        for name in s.node_names:
            vendor = s.vendor_of(name)
            if vendor not in groups:
                files = self.gres_files(name)
                mig = [[f, self.path("dev", "nvidia-caps", f"nvidia-cap{sim.cap_minor(m, gi)}")]
                       for f, m in zip(files, s.gres_order or range(s.gpus)) for gi in range(1, s.mig + 1)]
                groups[vendor] = {"vendor": vendor, "names": [], "files": files, "mig_files": mig}
            groups[vendor]["names"].append(name)
        return [{**g, "nodes": ",".join(g["names"])} for g in groups.values()]

    def _template_context(self, hooks: bool | None = None) -> dict:
        s = self.settings
        return {
            **asdict(s),
            "hooks": s.hooks if hooks is None else hooks,
            "programs": self._programs(),
            "cluster": CLUSTER,
            "partition": PARTITION,
            "state_dir": self.state_dir,
            "bin_dir": self.path("bin"),
            "dev_dir": self.path("dev"),
            "munge_socket": self.munge_socket,
            "ctld_port": self._ports["slurmctld"],
            "nodes": [{"name": n, "port": self._ports[n], "addr": self.node_addr(n)} for n in s.node_names],
            "cgroup_disabled": quirks.cgroup_disabled(self.slurm_version),
            "force_requeue_on_fail": s.force_requeue_on_fail and self.slurm_version >= FORCE_REQUEUE_ON_FAIL_SINCE,
            "sim_dir": self.sim_dir,
            "gres_groups": self._gres_groups(),
            "gres_conf": self.path("gres.conf"),
            "mig_minors": self.path("mig-minors"),
            "audit": self.audit_log,
            "hooks_state_dir": self.hooks_state_dir,
            "spool_dir": os.path.join(self.state_dir, "spool", "%n"),
            "slurm_bin_dir": self.slurm_bin,
            "accounting_lines": Accounting(self.state_dir).slurm_conf_lines(self.munge_socket) if s.accounting else [],
        }

    def _programs(self) -> dict[str, str]:
        """hook -> the program slurm.conf names: the testbed's own wrapper, or an install's."""
        programs = {hook: self.path("bin", hook) for hook in HOOKS}
        if self.settings.programs:
            programs.update({hook: layout.program_path(hook, self.settings.programs) for hook in HOOKS})
        if self.settings.nhc:
            programs["healthcheck"] = self.path("bin", "healthcheck")  # NHC's wrapper: NHC runs our check
        return programs

    def _write_config(self, ctx: dict) -> None:
        """config.toml: ours rendered afresh, then what an admin added below :data:`KEEP_BELOW` (a
        receiver, ``[notify]``, a group), kept as it was. The whole must load: a kept line that
        clashes with ours (a table we write, given again) stops ``up`` with the error, nothing replaced."""
        from slurm_hooks import config as config_mod
        from slurm_hooks.errors import ConfigError

        kept = self.kept_config()
        text = f"{self._text('config.toml.j2', ctx).rstrip()}\n\n{KEEP_BELOW}\n{kept}"
        try:
            config_mod.parse(text, self.config_path)
        except ConfigError as exc:
            raise TestbedError(f"{exc}: the lines kept below {KEEP_BELOW!r} clash with the testbed's own "
                               f"(a table it writes given again?); edit {self.config_path}") from None
        fsutil.atomic_write(self.config_path, text, mode=0o600)

    def kept_config(self) -> str:
        """What follows :data:`KEEP_BELOW` in the testbed's config.toml ("" when none)."""
        try:
            with open(self.config_path, encoding="utf-8") as fh:
                text = fh.read()
        except FileNotFoundError:
            return ""
        _, sep, kept = text.partition(KEEP_BELOW + "\n")
        return kept if sep else ""

    def _render(self, template: str, dest: str, ctx: dict, mode: int = 0o644) -> None:
        fsutil.atomic_write(dest, self._text(template, ctx), mode=mode)

    def _text(self, template: str, ctx: dict) -> str:
        env = jinja2.Environment(
            loader=jinja2.PackageLoader("slurm_hooks", "templates/testbed"),
            undefined=jinja2.StrictUndefined,
            keep_trailing_newline=True,
            trim_blocks=True,
            lstrip_blocks=True,
            autoescape=False,
        )
        return env.get_template(template).render(**ctx)

    def _write_hook(self, hook: str) -> None:
        package_parent = os.path.dirname(os.path.dirname(os.path.abspath(slurm_hooks.__file__)))
        if hook == "healthcheck" and self.settings.nhc:
            dest = self.path("bin", hook)
            fsutil.atomic_write(dest, self.nhc.wrapper(slurm_conf=self.slurm_conf, pythonpath=package_parent,
                                                       logdir=self.path("log")), mode=0o755)
            os.chown(dest, 0, 0)
            return
        ctx = {
            "command": HOOK_COMMAND[hook],
            "config": shlex.quote(self.config_path),
            "slurm_conf": shlex.quote(self.slurm_conf),
            "pythonpath": shlex.quote(package_parent),
            "python": shlex.quote(hook_interpreter()),
        }
        dest = self.path("bin", hook)
        self._render("hook.sh.j2", dest, ctx, mode=0o755)
        os.chown(dest, 0, 0)

    def _write_nhc(self) -> None:
        """NHC's tree, its scripts dir with our check, nhc.conf with our line, every site check passing."""
        tree = self.nhc
        try:
            tree.unpack(self.settings.nhc)
            tree.prepare(self.syslog)
        except (OSError, nhc_lab.NhcError) as exc:
            raise TestbedError(f"cannot set up NHC from {self.settings.nhc}: {exc}") from None
        tree.link_check(self.install(hook_interpreter()))
        tree.write_conf(self.settings.nhc_check)
        for name in self.node_names:
            tree.site_fault(name, False)

    @property
    def install_prefix(self) -> str:
        return self.path("install")

    def install(self, python: str) -> str:
        """``slurm-hooks install --prefix <state>/install`` for ``python`` (an interpreter that has
        slurm-hooks, or, to rehearse a bad push, one that has not); returns the NHC check it laid."""
        from slurm_hooks.install import apply, layout

        inputs = layout.Inputs(prefix=self.install_prefix, python=python, config=self.config_path,
                               state_dir=self.hooks_state_dir, audit=self.audit_log,
                               scontrol=os.path.join(self.slurm_bin, "scontrol"), env=(("SLURM_CONF", self.slurm_conf),))
        apply.install(inputs, write_config=False)
        return os.path.join(self.install_prefix, layout.NHC)

    def _switch_nhc(self) -> None:
        """On a running testbed, NHC (or slurm-hooks itself) as HealthCheckProgram as ``up`` was asked:
        slurm.conf names the same program either way, so no reconfigure is needed."""
        saved = self._load_saved().get("settings")
        if saved is None or (saved.nhc, saved.nhc_check) == (self.settings.nhc, self.settings.nhc_check):
            return
        self.settings = _replace(saved, nhc=self.settings.nhc, nhc_check=self.settings.nhc_check)
        if self.settings.nhc:
            self._write_nhc()
        self._write_hook("healthcheck")
        self._save_settings()

    def _save_settings(self) -> None:
        """``testbed.json``: what ``down``, ``status`` and the next ``up`` read back."""
        fsutil.atomic_write(self.path("testbed.json"),
                            json.dumps({"settings": asdict(self.settings), "ports": self._ports}, indent=1))

    def set_nhc_check(self, line: str) -> None:
        """Our line in nhc.conf (``check_slurm_hooks``, ``check_slurm_hooks -r``...): NHC reads it on its next run."""
        if not self.settings.nhc:
            raise TestbedError("NHC is not this testbed's HealthCheckProgram (testbed up --nhc SOURCE)")
        self.settings = _replace(self.settings, nhc_check=line)
        self.nhc.write_conf(line)
        self._save_settings()

    def nhc_site_fault(self, node: str, failing: bool) -> None:
        """NHC's own site check fails (``failing``) or passes again on ``node``."""
        if node not in self.node_names:
            raise TestbedError(f"no node {node!r} in this testbed ({', '.join(self.node_names)})")
        self.nhc.site_fault(node, failing)

    def _write_reboot_program(self) -> None:
        package_parent = os.path.dirname(os.path.dirname(os.path.abspath(slurm_hooks.__file__)))
        ctx = {"pythonpath": shlex.quote(package_parent), "python": shlex.quote(hook_interpreter()),
               "state_dir": shlex.quote(self.state_dir)}
        dest = self.path("bin", "reboot")
        self._render("reboot.sh.j2", dest, ctx, mode=0o755)
        os.chown(dest, 0, 0)

    # -- reboots

    def reboot_program(self) -> str:
        """What RebootProgram does: find the node from the slurmd that runs us, and hand its reboot
        to a detached helper (slurmd is stopped by it). Idempotent: slurmd runs this again every few
        seconds until the node is back. Returns what it did, one line."""
        found = slurmd_ancestor(os.getpid())
        if found is None:
            return "no slurmd among my ancestors: not rebooting anything"
        pid, node, cmdline = found
        if node not in self.node_names or self.state_dir.encode() not in b"\0".join(cmdline):
            return f"slurmd {pid} (node {node!r}) is not one of this testbed's: not rebooting it"
        marker = self.path("run", f"rebooting-{node}")
        with fsutil.locked(marker):
            with contextlib.suppress(OSError, ValueError):
                with open(marker, encoding="ascii") as fh:
                    helper = int(fh.read().strip() or 0)
                if helper > 0 and _stat(helper) is not None and _stat(helper)[2] != "Z":
                    return f"{node}: reboot already under way (helper {helper})"
            argv = [hook_interpreter(), "-m", "slurm_hooks", "testbed", "reboot-node", "--state-dir", self.state_dir,
                    "--node", node, "--slurmd-pid", str(pid)]
            env = self._daemon_env()
            env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(slurm_hooks.__file__)))
            spawned = spawn_detached(argv, env=env, output=self.path("log", f"reboot-{node}.log"))
            if not spawned.started or spawned.proc is None:
                return f"{node}: reboot helper did not start: {spawned.error}"
            fsutil.atomic_write(marker, str(spawned.proc.pid), mode=0o644)
        return f"{node}: rebooting (helper {spawned.proc.pid})"

    def reboot_node(self, node: str, slurmd_pid: int, timeout: float = 15.0) -> None:
        """The reboot itself: the node's simulated GPUs reboot, its slurmd stops, and starts again
        in a new time namespace whose boot time is now, so that slurmctld sees BootTime move and
        completes the reboot (a plain restart leaves the node "reboot issued" until ResumeTimeout)."""
        label = f"slurmd {node}"
        if node not in self.node_names:
            raise TestbedError(f"no node {node!r} in this testbed ({', '.join(self.node_names)})")
        sim.reboot(self.sim_dir, node)
        if self._pid(label) == slurmd_pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(slurmd_pid, signal.SIGTERM)
            if not poll(lambda: not self._alive(label), timeout):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(slurmd_pid, signal.SIGKILL)
                poll(lambda: not self._alive(label), 5)
        # slurmctld takes the reboot as done only for a BootTime (whole seconds) after its request:
        # the new boot is at least a second younger than the request, whatever the rounding.
        time.sleep(REBOOT_SETTLE_S)
        up = int(_host_uptime())
        argv = ["/usr/bin/unshare", "--time", "--boottime", f"-{up}",
                os.path.join(self.slurm_sbin, "slurmd"), "-N", node, "-f", self.slurm_conf]
        try:
            run_command(argv, 30, env=self._daemon_env())
        except CommandError as exc:
            raise TestbedError(f"{label} did not start again after the reboot: {exc}{self._log_tail(label)}") from None
        if not poll(lambda: self._alive(label), 10):
            raise TestbedError(f"{label} started again but wrote no live pid file{self._log_tail(label)}")

    def _pick_ports(self) -> dict[str, int]:
        names = ["slurmctld", *self.node_names]
        if self._ports and all(n in self._ports for n in names) and all(accounting.port_free(self._ports[n], "0.0.0.0") for n in names):
            return {n: self._ports[n] for n in names}
        first = zlib.crc32(self.state_dir.encode()) % PORT_BLOCKS
        for step in range(PORT_BLOCKS):
            base = PORT_FIRST + ((first + step) % PORT_BLOCKS) * PORT_BLOCK
            ports = {"slurmctld": base, **{n: base + k for k, n in enumerate(self.node_names, 1)}}
            if all(accounting.port_free(p, "0.0.0.0") for p in ports.values()):
                return ports
        raise TestbedError(f"no free block of {len(names)} ports in {PORT_FIRST}..{PORT_FIRST + PORT_BLOCKS * PORT_BLOCK}")

    def _daemon_env(self) -> dict[str, str]:
        env = self.env()
        env[MARKER] = self.state_dir
        return env

    def _start_daemons(self) -> None:
        env = self._daemon_env()
        if not self._alive("munged"):
            self.progress("starting munged")
            self._start(["munged", "--force", f"--socket={self.munge_socket}",
                         f"--key-file={self.path('munge', 'munge.key')}", f"--pid-file={self._pidfile('munged')}",
                         f"--log-file={self.path('log', 'munged.log')}", f"--seed-file={self.path('munge', 'seed')}"],
                        env, "munged")
        if not self._alive("slurmctld"):
            self._stop_strays("slurmctld")
            if self.settings.accounting:  # slurmctld registers with slurmdbd as it starts
                Accounting(self.state_dir, self.progress).start(CLUSTER, self.munge_socket, self.env())
            self.progress("starting slurmctld")
            # -c: a fresh cluster every time: no jobs or node states from before the last `down`.
            self._start(["slurmctld", "-c", "-f", self.slurm_conf], env, "slurmctld")
        for name in self.node_names:
            if not self._alive(f"slurmd {name}"):
                self.progress(f"starting slurmd {name}")
                self._start(["slurmd", "-N", name, "-f", self.slurm_conf], env, f"slurmd {name}")

    def _start(self, argv: list[str], env: Mapping[str, str], label: str) -> None:
        argv = [os.path.join(SBIN if argv[0] == "munged" else self.slurm_sbin, argv[0]), *argv[1:]]
        try:
            run_command(argv, 30, env=env)
        except CommandError as exc:
            raise TestbedError(f"{label} did not start: {exc}{self._log_tail(label)}") from None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self._alive(label):
                return
            time.sleep(0.05)
        raise TestbedError(f"{label} started but wrote no live pid file{self._log_tail(label)}")

    def _port_taken(self, exc: Exception) -> bool:
        """Whether slurmctld (or a slurmd) could not bind its port (22.05 writes its pid file first)."""
        logs = [self.path("log", "slurmctld.log"), *(self.path("log", f"slurmd-{n}.log") for n in self.node_names)]
        for log in logs:
            try:
                with open(log, "rb") as fh:
                    fh.seek(max(0, os.path.getsize(log) - 4096))
                    if b"Address already in use" in fh.read():
                        return True
            except OSError:
                continue
        return "Address already in use" in str(exc)

    def wait_ready(self, timeout: float = 30.0, idle: bool = True) -> list[NodeInfo]:
        """Until every node is IDLE (or, with ``idle=False``, registered and responding).

        On timeout the error carries the state of every node and the slurmd log tail; a
        slurmctld that died meanwhile fails it at once.
        """
        slurm = self.slurm(timeout=5)
        deadline = time.monotonic() + timeout
        nodes: list[NodeInfo] = []
        last_error = ""
        while True:
            if last_error and not self._alive("slurmctld"):
                raise TestbedError(f"slurmctld died: {last_error}{self._log_tail('slurmctld')}")
            try:
                nodes = slurm.nodes()
                last_error = ""
            except SlurmHooksError as exc:
                last_error = str(exc)
            if nodes and all(n.ready if idle else n.responding for n in nodes):
                return nodes
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        states = ", ".join(f"{n.name}={n.state}" + (f" ({n.reason})" if n.reason else "") for n in nodes)
        bad = next((n.name for n in nodes if not n.ready), self.node_names[0])
        raise TestbedError(f"nodes not IDLE after {timeout:g}s: {states or last_error}"
                           f"{self._log_tail(f'slurmd {bad}')}")

    # -- hooks on/off

    def set_hooks(self, enabled: bool) -> None:
        """Wire Prolog/Epilog/HealthCheckProgram in or out of the running cluster.

        One ``scontrol reconfigure``; returns once every slurmd has re-read its
        configuration (it logs a fixed line on each read), so the next job sees it.
        """
        if self._saved_hooks() == enabled:
            return
        self._reconfigure(_replace(self.settings, hooks=enabled))

    def set_programs(self, prefix: str) -> None:
        """Name the programs a ``slurm-hooks install --prefix`` laid in slurm.conf ("" for the
        testbed's own wrappers): one ``scontrol reconfigure``, as :meth:`set_hooks`."""
        if self.settings.programs == prefix:
            return
        self._reconfigure(_replace(self.settings, programs=prefix))

    def _reconfigure(self, settings: LabSettings) -> None:
        self.settings = settings
        self._render("slurm.conf.j2", self.slurm_conf, self._template_context())
        self._save_settings()
        if not self._alive("slurmctld"):
            return
        logs = {name: self.path("log", f"slurmd-{name}.log") for name in self.node_names}
        sizes = {name: _size(log) for name, log in logs.items()}
        self.scontrol("reconfigure")
        poll(lambda: all(_log_grew(logs[n], sizes[n], _RECONFIG_MARKS) for n in self.node_names), 10)

    def _saved_hooks(self) -> bool | None:
        try:
            with open(self.slurm_conf, encoding="utf-8") as fh:
                return "\nProlog=" in fh.read()
        except OSError:
            return None

    # -- down

    def down(self, timeout: float = 15.0) -> list[int]:
        """Stop every daemon of this testbed and the jobs they run. Returns the pids stopped."""
        _require_root("testbed down")
        self.clear_net_faults()
        Accounting(self.state_dir, self.progress).stop()
        victims = self._our_processes()
        if not victims:
            self.progress(f"testbed not running in {self.state_dir}")
            return []
        self.progress(f"stopping {len(victims)} process(es)")
        if self._alive("slurmctld"):
            with contextlib.suppress(SlurmHooksError):
                run_command([os.path.join(self.slurm_bin, "scontrol"), "shutdown"], 10, env=self.env())
        slurm_daemons = [label for label in self._labels() if label != "munged"]
        poll(lambda: not any(self._alive(lbl) for lbl in slurm_daemons), min(timeout, 10))
        victims |= self._our_processes()
        daemons = {pid for pid in (self._pid(label) for label in self._labels()) if pid}
        munged = self._pid("munged")
        # Job processes and step daemons die at once; slurm daemons get SIGTERM first, munged goes last.
        _terminate({p for p in victims if p[0] not in daemons}, timeout=3, signals=(signal.SIGKILL,))
        _terminate({p for p in victims if p[0] in daemons and p[0] != munged}, timeout=3)
        _terminate({p for p in victims if p[0] == munged}, timeout=3)
        survivors = [pid for pid, _ in victims if _same_process(pid, dict(victims)[pid])]
        for label in self._labels():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._pidfile(label))
        if survivors:
            raise TestbedError(f"still running after down: pids {survivors}")
        self.progress(f"testbed down ({len(victims)} process(es) stopped)")
        return sorted(pid for pid, _ in victims)

    def _our_processes(self) -> set[tuple[int, int]]:
        """(pid, start time) of our daemons, processes carrying our marker, and their descendants."""
        roots = {pid for pid in (self._pid(label) for label in self._labels()) if pid}
        marker = f"{MARKER}={self.state_dir}".encode()
        children: dict[int, list[int]] = {}
        for pid in _pids():
            info = _stat(pid)
            if info is None:
                continue
            children.setdefault(info[0], []).append(pid)
            with contextlib.suppress(OSError):
                with open(f"/proc/{pid}/environ", "rb") as fh:
                    # Same root only: a testbed in a chroot (fresh-root) has our state dir's name too.
                    if marker in fh.read().split(b"\0") and _same_root(pid):
                        roots.add(pid)
                        continue
                # Newer slurmd's (24.11) start slurmstepd with a clean environment, detached:
                # it is ours when it holds a file under our state dir (its spool socket).
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    if fh.read().startswith(b"slurmstepd:") and self._holds_our_file(pid) and _same_root(pid):
                        roots.add(pid)
        found: set[int] = set()
        todo = list(roots)
        while todo:
            pid = todo.pop()
            if pid in found or pid == os.getpid():
                continue
            found.add(pid)
            todo.extend(children.get(pid, []))
        out = set()
        for pid in found:
            info = _stat(pid)
            if info is not None:
                out.add((pid, info[1]))
        return out

    def _stop_strays(self, program: str, timeout: float = 10.0) -> None:
        """Stop our ``program`` processes that no pid file names: 24.11's `scontrol reconfigure`
        hands slurmctld over to a new process, and when that one cannot bind (seen under load)
        a leftover keeps the port, so that every later start fails "Address already in use"."""
        strays = set()
        for pid, start in self._our_processes():
            with contextlib.suppress(OSError):
                with open(f"/proc/{pid}/comm", encoding="utf-8") as fh:
                    if fh.read().strip() == program:
                        strays.add((pid, start))
        if strays:
            self.progress(f"stopping {len(strays)} stray {program} process(es) of this testbed")
            _terminate(strays, timeout)

    def _holds_our_file(self, pid: int) -> bool:
        prefix = os.path.join(self.state_dir, "")
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(prefix):
                        return True
        return False

    # -- status

    def status(self) -> Status:
        """Up: every daemon runs and every node is registered with slurmctld and responding."""
        daemons = {label: self._pid(label) for label in self._labels()}
        up = all(daemons.values())
        nodes: list[NodeInfo] = []
        error = ""
        if daemons.get("slurmctld"):
            try:
                nodes = self.slurm(timeout=5).nodes()
            except SlurmHooksError as exc:
                error, up = str(exc), False
            else:
                known = {n.name: n for n in nodes}
                missing = [f"{name} not known to slurmctld" if name not in known else
                           f"{name} not registered or not responding ({known[name].state})"
                           for name in self.node_names if name not in known or not known[name].registered]
                if missing:
                    error, up = "; ".join(missing), False
        return Status(self.state_dir, up, daemons, nodes, error)

    def _labels(self) -> list[str]:
        return ["munged", "slurmctld", *(f"slurmd {n}" for n in self.node_names)]

    def _pidfile(self, label: str) -> str:
        return self.path("run", label.replace(" ", "-") + ".pid")

    def _pid(self, label: str) -> int | None:
        """The daemon's pid when its pid file names a live process started on our files."""
        try:
            with open(self._pidfile(label), encoding="ascii") as fh:
                pid = int(fh.read().strip() or 0)
        except (OSError, ValueError):
            return None
        if pid <= 0:
            return None
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmdline = fh.read().split(b"\0")
        except OSError:
            return None
        program = os.path.basename(cmdline[0].decode(errors="replace")) if cmdline else ""
        if program != label.split()[0] or not any(self.state_dir.encode() in arg for arg in cmdline):
            return None
        if _stat(pid) is None or _stat(pid)[2] == "Z":
            return None
        return pid

    def _alive(self, label: str) -> bool:
        return self._pid(label) is not None

    def _log_tail(self, label: str, lines: int = 15) -> str:
        log = self.path("log", label.replace(" ", "-") + ".log")
        try:
            with open(log, encoding="utf-8", errors="replace") as fh:
                tail = fh.read().splitlines()[-lines:]
        except OSError:
            return f" (no log at {log})"
        return f"\n--- last lines of {log}:\n" + "\n".join(tail)

    def _load_saved(self) -> dict:
        data = fsutil.read_json(os.path.join(self.state_dir, "testbed.json"), missing=None, error=None)
        if data is None:
            return {}
        try:
            known = {f.name for f in fields(LabSettings)}
            return {"settings": LabSettings(**{k: v for k, v in data.get("settings", {}).items() if k in known}),
                    "ports": {str(k): int(v) for k, v in data.get("ports", {}).items()}}
        except (ValueError, TypeError):
            return {}

    # -- helpers for tests and demos

    def scontrol(self, *args: str, timeout: float = 10.0) -> str:
        return run_command([os.path.join(self.slurm_bin, "scontrol"), *args], timeout, env=self.env()).stdout

    def sbatch(self, script: str, *args: str, timeout: float = 10.0) -> int:
        """Submit ``script`` (text) with extra sbatch ``args``; output goes to ``jobs/<id>.out``."""
        argv = [os.path.join(self.slurm_bin, "sbatch"), "--parsable", f"--chdir={self.jobs_dir}",
                f"--output={self.jobs_dir}/%j.out", *args]
        out = run_command(argv, timeout, env=self.env(), input=script).stdout.strip()
        try:
            return int(out.split(";")[0])
        except ValueError:
            raise TestbedError(f"sbatch printed {out!r}, not a job id") from None

    def job_output(self, job_id: int) -> str:
        try:
            with open(os.path.join(self.jobs_dir, f"{job_id}.out"), encoding="utf-8", errors="replace") as fh:
                return fh.read()
        except FileNotFoundError:
            return ""

    def wait_job(self, job_id: int, states: Iterable[str] = (JobState.RUNNING,), timeout: float = 30.0,
                 interval: float = 0.1) -> JobInfo:
        """Poll until the job's state is one of ``states``; TestbedError with the last state on timeout."""
        wanted = {s.upper() for s in states}
        slurm = self.slurm()
        deadline = time.monotonic() + timeout
        job: JobInfo | None = None
        while True:
            with contextlib.suppress(SlurmNotFound):
                job = slurm.job(job_id)
                if job.base_state in wanted:
                    return job
            if time.monotonic() > deadline:
                last = f"{job.state} ({job.reason})" if job else "not found"
                raise TestbedError(f"job {job_id} not in {sorted(wanted)} after {timeout:g}s: {last}")
            time.sleep(interval)

    def wait_node(self, name: str, predicate: Callable[[NodeInfo], bool], timeout: float = 30.0,
                  interval: float = 0.1) -> NodeInfo:
        slurm = self.slurm()
        deadline = time.monotonic() + timeout
        while True:
            node = slurm.node(name)
            if predicate(node):
                return node
            if time.monotonic() > deadline:
                raise TestbedError(f"node {name} did not reach the expected state after {timeout:g}s: "
                                   f"{node.state} ({node.reason or 'no reason'})")
            time.sleep(interval)

    def cancel_all(self, timeout: float = 30.0) -> None:
        """Cancel every job and wait until the queue is empty.

        Cancels again whatever is still queued each second (a hook's requeue or a reboot racing the
        first scancel must not leave a job PENDING for Slurm's requeue delay). On failure it says
        which jobs are left, in which state, where and why. Half-way, the nodes of jobs still COMPLETING are
        set DOWN (an epilog's reboot request in flight, a slow slurmd: what an admin does with a
        stuck CG job); the reset that called us resumes them.
        """
        deadline = time.monotonic() + timeout
        half_way = time.monotonic() + timeout / 2
        downed: set[str] = set()
        next_cancel = 0.0
        while True:
            queue = self._queue_rows()
            if not queue:
                return
            now = time.monotonic()
            if now > deadline:
                left = "; ".join(f"{job} {state} on {nodes or '-'} ({why})" for job, state, nodes, why in queue)
                with contextlib.suppress(SlurmHooksError):
                    left += "; nodes: " + ", ".join(f"{n.name} {n.state}" for n in self.slurm(timeout=5).nodes())
                raise TestbedError(f"jobs still queued {timeout:g}s after scancel: {left}")
            if now >= next_cancel:
                ids = [job for job, *_ in queue]
                run_command([os.path.join(self.slurm_bin, "scancel"), "--signal=KILL", "--full", *ids], 10, env=self.env(),
                            check=False)
                run_command([os.path.join(self.slurm_bin, "scancel"), *ids], 10, env=self.env(), check=False)
                next_cancel = now + 1.0
            stuck = {nodes for _, state, nodes, _ in queue if state == JobState.COMPLETING and nodes} - downed
            if now > half_way and stuck:
                for nodes in sorted(stuck):
                    self.progress(f"jobs still completing on {nodes}: setting it DOWN")
                    done = run_command([os.path.join(self.slurm_bin, "scontrol"), "update", f"NodeName={nodes}", "State=DOWN",
                                        "Reason=testbed reset: job stuck completing"], 10, env=self.env(), check=False)
                    if done.returncode != 0:
                        self.progress(f"setting {nodes} DOWN failed: {done.stderr.strip()}")
                    downed.add(nodes)
                self._restart_dead_daemons()  # a slurmd a reboot helper stopped and did not start again
            time.sleep(0.05)

    def _restart_dead_daemons(self) -> None:
        """Start again whichever of our daemons is not running (``_start_daemons`` skips live ones)."""
        for label in self._labels():
            if not self._alive(label):
                self.progress(f"restarting {label}")
                self._start_daemons()
                return

    def _queue_rows(self) -> list[tuple[str, str, str, str]]:
        """(job id, state, nodes, reason) of every job slurmctld still holds."""
        out = run_command([os.path.join(self.slurm_bin, "squeue"), "-h", "-o", "%i|%T|%N|%r"], 10, env=self.env()).stdout
        return [tuple((line.split("|") + ["", "", ""])[:4]) for line in out.splitlines() if line.strip()]

    def reset(self, timeout: float = 30.0) -> None:
        """Back to a clean cluster: no jobs, every node IDLE with no reason, healthy GPUs, empty logs.

        Returns only once that holds with no hook of ours still running, so no check
        started before the reset (on a GPU still faulty then) can drain a node after it.
        TestbedError, with what is still unclean, when that takes longer than ``timeout``.
        """
        self._restart_dead_daemons()
        # Healthy GPUs and no hook state first: a hook that runs from here on finds nothing to drain.
        for name in self.node_names:
            self._sim_init(name)
            self.set_fault(name, "")
        if self.settings.nhc:
            self._write_nhc()  # our check as installed, our nhc.conf line, every site check passing
        self.stop_repair_workers()
        self._clear_hook_state()
        self.cancel_all(timeout)
        slurm = self.slurm(timeout=5)
        deadline = time.monotonic() + timeout
        while True:
            unclean = self._unclean(slurm)
            if not unclean:
                break
            if time.monotonic() > deadline:
                raise TestbedError(f"testbed not clean {timeout:g}s into reset: "
                                   f"{'; '.join(unclean.values())}")
            if self._stale_reasons(slurm) and set(unclean) <= set(self.node_names):
                # Slurm 23.11+ keeps a resumed node's reason and refuses to clear it on an IDLE
                # node: only a fresh controller (slurmctld -c) forgets it.
                self.progress(f"restarting the cluster to clear stale node reasons: {'; '.join(unclean.values())}")
                self.down()
                self.up()
                continue
            for name in unclean:
                if name in self.node_names:
                    with contextlib.suppress(SlurmHooksError):
                        self.scontrol("update", f"NodeName={name}", "State=RESUME")
            time.sleep(0.2)
        self._clear_hook_state()  # again: what a hook that ran during the reset wrote

    def stop_repair_workers(self) -> list[int]:
        """Kill this testbed's repair workers (a test's hung reset must not outlive it)."""
        killed = []
        for pid, argv in self._our_programs():
            if b"repair-worker" in argv:
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)
                    killed.append(pid)
        return killed

    def _clear_hook_state(self) -> None:
        shutil.rmtree(self.hooks_state_dir, ignore_errors=True)
        _mkdir(self.hooks_state_dir, 0o700)
        for log in (self.audit_log, self.syslog):
            with contextlib.suppress(FileNotFoundError):
                os.truncate(log, 0)

    @property
    def keeps_reasons(self) -> bool:
        """Whether this cluster's Slurm leaves a resumed node's reason in place (23.11+ without
        accounting: Debian 13's 24.11; :func:`.quirks.reason_kept_after_resume`)."""
        return quirks.reason_kept_after_resume(self.slurm_version, self.settings.accounting)

    def _stale_reasons(self, slurm: ScontrolSlurm) -> list[str]:
        """Nodes IDLE, not drained, yet with a reason (left by a resume on newer Slurm)."""
        with contextlib.suppress(SlurmHooksError):
            return [n.name for n in slurm.nodes() if n.ready and n.reason]
        return []

    def _unclean(self, slurm: ScontrolSlurm) -> dict[str, str]:
        """What keeps the cluster from being clean, by node name (or "jobs", "hooks", "slurmctld").

        Clean: every node IDLE without a reason, no job, no hook of ours running.
        """
        try:
            nodes = {n.name: n for n in slurm.nodes()}
            jobs = self._queue()
        except SlurmHooksError as exc:
            return {"slurmctld": f"slurmctld: {exc}"}
        out = {}
        for name in self.node_names:
            node = nodes.get(name)
            if node is None:
                out[name] = f"{name} not known to slurmctld"
            elif not node.ready or node.reason:
                out[name] = f"{name} {node.state}" + (f" ({node.reason})" if node.reason else "")
        if jobs:
            out["jobs"] = f"jobs {', '.join(jobs)}"
        hooks = self._hook_runs()
        if hooks:
            out["hooks"] = f"hooks still running (pids {', '.join(map(str, hooks))})"
        return out

    def _queue(self) -> list[str]:
        """Every job slurmctld still holds (completing ones too), as "ID:STATE"."""
        return [f"{job}:{state}" for job, state, _, _ in self._queue_rows()]

    def _hook_runs(self) -> list[int]:
        """Pids of slurm-hooks programs our slurmd's are running (prolog, epilog, health check; NHC too)."""
        return sorted(pid for pid, _ in self._our_programs())

    def _our_programs(self) -> list[tuple[int, list[bytes]]]:
        """(pid, argv) of our processes that run slurm-hooks (or NHC) with this testbed's config."""
        marks = {self.config_path.encode(), self.nhc.conf.encode()}
        found = []
        for pid, _ in self._our_processes():
            with contextlib.suppress(OSError):
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    argv = fh.read().split(b"\0")
                if marks & set(argv):
                    found.append((pid, argv))
        return found

    def stop_controller(self, timeout: float = 15.0) -> None:
        """Stop slurmctld alone (an outage): slurmd's and running jobs carry on without it."""
        pid = self._pid("slurmctld")
        if pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        if not poll(lambda: not self._alive("slurmctld"), timeout):
            raise TestbedError(f"slurmctld (pid {pid}) still running {timeout:g}s after SIGTERM")

    def start_controller(self, timeout: float = 30.0) -> None:
        """Start slurmctld again after :meth:`stop_controller`, keeping its saved jobs and node
        states (no ``-c``), and return once it answers and every slurmd responds to it again.

        A restarted slurmctld takes the nodes it had not heard from as not responding until their
        slurmd answers its ping: seconds in which no job can start anywhere. That is Slurm's own
        return, not ours to time (seen: a job eligible on the healthy node still PENDING, "Nodes
        required for job are DOWN...", 8 s after slurmctld answered)."""
        if not self._alive("slurmctld"):
            self._stop_strays("slurmctld")
            self._start(["slurmctld", "-f", self.slurm_conf], self._daemon_env(), "slurmctld")
        slurm = self.slurm(timeout=5)

        def answers() -> bool:
            try:
                slurm.nodes()
            except SlurmHooksError:
                return False
            return True

        if not poll(answers, timeout, interval=0.1):
            raise TestbedError(f"slurmctld does not answer {timeout:g}s after start{self._log_tail('slurmctld')}")
        self.wait_ready(timeout, idle=False)


# --- where a testbed lives ----------------------------------------------------------


def default_state_dir(environ: Mapping[str, str] | None = None, euid: int | None = None) -> str:
    """The state directory of the user who runs ``testbed up``, so that two people on one host
    (both root through sudo) never share, and take down, one cluster.

    ``$XDG_RUNTIME_DIR/slurm-hooks-testbed`` when that directory is ours (a root that kept another
    user's XDG_RUNTIME_DIR through sudo would write root's hook programs into a directory that user
    owns); otherwise ``/var/lib/slurm-hooks/testbed-<uid>``, the uid being sudo's caller's (SUDO_UID)
    or ours: a root-owned parent, never a guessable name under /tmp that anyone could create first.
    """
    environ = os.environ if environ is None else environ
    euid = os.geteuid() if euid is None else euid
    runtime = environ.get("XDG_RUNTIME_DIR", "")
    if os.path.isabs(runtime):
        with contextlib.suppress(OSError):
            st = os.stat(runtime)
            if stat.S_ISDIR(st.st_mode) and st.st_uid == euid and not st.st_mode & 0o022:
                return os.path.join(runtime, "slurm-hooks-testbed")
    uid = environ.get("SUDO_UID", "")
    return os.path.join(STATE_ROOT, f"testbed-{uid if uid.isdigit() else euid}")


# --- packages ----------------------------------------------------------------


def missing_programs(slurm_prefix: str = "") -> list[str]:
    return packages.missing(_programs_of(slurm_prefix))


def ensure_packages(progress: Progress | None = None, slurm_prefix: str = "") -> None:
    """apt-get install the Slurm and munge packages when a program is missing (root only); with
    another Slurm's prefix only munge, and that prefix must hold Slurm's programs."""
    if not slurm_prefix:
        packages.ensure(PROGRAMS, PACKAGES, TestbedError, progress)
        return
    absent = missing_programs(slurm_prefix)
    munge = [p for p, package in PROGRAMS.items() if package == "munge"]
    if [p for p in absent if p not in munge]:
        raise TestbedError(f"--slurm-prefix {slurm_prefix}: missing {', '.join(absent)} (build and install Slurm "
                           "there first: docs/dev/testing.md)")
    packages.ensure(munge, ("munge",), TestbedError, progress)


def _programs_of(slurm_prefix: str) -> dict[str, str]:
    """:data:`PROGRAMS` with Slurm's own under ``slurm_prefix`` ("" : Debian's)."""
    if not slurm_prefix:
        return dict(PROGRAMS)
    return {(os.path.join(slurm_prefix, os.path.relpath(p, "/usr")) if package != "munge" else p): package
            for p, package in PROGRAMS.items()}


_VERSIONS: dict[str, tuple[int, int]] = {}


def slurm_version(sbin: str = SBIN) -> tuple[int, int]:
    """(major, minor) of the slurmd in ``sbin`` (Debian's by default), e.g. (22, 5)."""
    if sbin not in _VERSIONS:
        out = run_command([os.path.join(sbin, "slurmd"), "-V"], 10).stdout
        version = parse_version(out)
        if version is None:
            raise TestbedError(f"cannot read a Slurm version from {out.strip()!r}")
        _VERSIONS[sbin] = version
    return _VERSIONS[sbin]


# --- small process and file helpers ------------------------------------------------


def hook_interpreter() -> str:
    """The interpreter the hook wrappers run: this one, as it was invoked.

    A virtualenv's ``bin/python`` is a symlink to the base interpreter, and only the
    unresolved path finds the venv (its ``pyvenv.cfg``) and so click and slurm_hooks.
    """
    return os.path.abspath(sys.executable)


def _require_root(what: str) -> None:
    if os.geteuid() != 0:
        raise TestbedError(f"{what} needs root (it starts slurmctld/slurmd and makes device nodes)")


#: slurmd logs one of these every time it reads slurm.conf (config_overrides, no CpuFreq settings).
_RECONFIG_MARKS = (b"Node configuration differs from hardware", b"CPU frequency setting not configured")


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _log_grew(path: str, offset: int, marks: tuple[bytes, ...]) -> bool:
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            new = fh.read()
    except OSError:
        return False
    return any(mark in new for mark in marks)


def _host_uptime() -> float:
    """Seconds since the machine booted, also from inside a time namespace (an earlier testbed
    reboot's slurmd runs in one, and so does everything it starts): the offsets of a new time
    namespace count from the machine's clocks, not from ours."""
    with open("/proc/uptime", encoding="ascii") as fh:
        up = float(fh.read().split()[0])
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open("/proc/self/timens_offsets", encoding="ascii") as fh:
            for line in fh:
                parts = line.split()
                if parts and parts[0] == "boottime":
                    up -= int(parts[1]) + int(parts[2]) / 1e9
    return up


def slurmd_ancestor(pid: int) -> tuple[int, str, list[bytes]] | None:
    """(pid, node, cmdline) of the nearest ``slurmd -N <node>`` among ``pid``'s ancestors; ``None``
    when there is none (a detached child is re-parented to PID 1)."""
    seen = set()
    while pid > 1 and pid not in seen:
        seen.add(pid)
        info = _stat(pid)
        if info is None:
            return None
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmdline = fh.read().split(b"\0")
            if cmdline and os.path.basename(cmdline[0]) == b"slurmd" and b"-N" in cmdline:
                at = cmdline.index(b"-N")
                if at + 1 < len(cmdline) and cmdline[at + 1]:
                    return pid, cmdline[at + 1].decode(errors="replace"), cmdline
        pid = info[0]
    return None


def _check_fault(words: list[str]) -> None:
    kind, args = words[0], words[1:]
    want = {"hang": 0, "net-drop": 0, "net-slow": 1, "net-loss": 1}.get(kind)
    if want is None or len(args) != want:
        raise TestbedError(f"fault must be hang, net-drop, net-slow KBPS or net-loss PCT, got {' '.join(words)!r}")
    if args:
        try:
            value = int(args[0])
        except ValueError:
            value = -1
        if kind == "net-slow" and value < 1:
            raise TestbedError(f"net-slow KBPS must be a whole number of kbytes/s >= 1, got {args[0]!r}")
        if kind == "net-loss" and not 1 <= value <= 100:
            raise TestbedError(f"net-loss PCT must be 1..100, got {args[0]!r}")


def _replace(settings: LabSettings, **changes) -> LabSettings:
    return LabSettings(**{**asdict(settings), **changes})


def _mkdir(path: str, mode: int) -> None:
    os.makedirs(path, mode=mode, exist_ok=True)
    os.chmod(path, mode)


def _mknod(path: str, minor: int, major: int = NVIDIA_MAJOR) -> None:
    want = os.makedev(major, minor)
    try:
        st = os.lstat(path)
        if stat.S_ISCHR(st.st_mode) and st.st_rdev == want:
            return
        os.unlink(path)
    except FileNotFoundError:
        pass
    try:
        os.mknod(path, 0o600 | stat.S_IFCHR, want)
    except OSError as exc:
        raise TestbedError(f"mknod {path} c {major} {minor}: {exc.strerror}") from None


def _pids() -> list[int]:
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def _stat(pid: int) -> tuple[int, int, str] | None:
    """(ppid, start time in ticks, state letter) from /proc/PID/stat, or None when gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            data = fh.read()
    except OSError:
        return None
    rest = data[data.rfind(")") + 2 :].split()
    try:
        return int(rest[1]), int(rest[19]), rest[0]
    except (IndexError, ValueError):
        return None


def _same_root(pid: int) -> bool:
    """The process sees the same ``/`` as we do (it is not in a chroot, nor are we outside its)."""
    try:
        theirs, ours = os.stat(f"/proc/{pid}/root"), os.stat("/")
    except OSError:
        return False
    return (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino)


def _same_process(pid: int, start: int) -> bool:
    info = _stat(pid)
    return info is not None and info[1] == start and info[2] != "Z"


def _terminate(procs: set[tuple[int, int]], timeout: float,
               signals: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGKILL)) -> None:
    """SIGTERM, wait, SIGKILL: only processes that are still the ones we listed."""
    for sig in signals:
        for pid, start in procs:
            if _same_process(pid, start):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
        if poll(lambda: not any(_same_process(p, s) for p, s in procs), timeout):
            return
