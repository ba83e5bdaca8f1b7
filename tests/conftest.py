"""Shared fixtures.

The Slurm testbed is one real cluster per test session: slurmctld, two slurmd's
(``n1``, ``n2``, ``gpu:8`` each, simulated GPUs) and a private munged, brought up
by :mod:`slurm_hooks.lab.testbed` in a temporary directory with short timers and
taken down at the end. It needs root; on a fresh Debian machine it installs
slurmctld, slurmd, slurm-client and munge with apt-get first.

Tests ask for one of:

- ``clean_testbed``: hooks off (no Prolog/Epilog/HealthCheckProgram), for
  tests of the adapter or of a hook run by hand;
- ``hooked_testbed``: slurm-hooks wired in as Prolog, Epilog and
  HealthCheckProgram, the way a site runs it.

Both first restore the cluster: no jobs, every node IDLE without a reason,
healthy sim GPUs, an empty audit log and empty hook state. Switching hooks is an
``scontrol reconfigure`` (milliseconds), so tests of both kinds mix freely.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterator

import pytest

from slurm_hooks.lab.testbed import LabSettings, Testbed
from slurm_hooks.lab.waiting import poll

#: Short timers for fast tests; everything else as `slurm-hooks testbed up`.
TESTBED_SETTINGS = LabSettings(
    nodes=2,
    gpus=8,
    hooks=False,
    kill_wait=2,
    health_check_interval=30,
    slurmd_timeout=10,
    message_timeout=5,
    requeue_grace=3.0,
    up_timeout=60.0,
    # test_e2e_slurm rehearses a site without it: Slurm cancels a --no-requeue job the prolog refuses.
    force_requeue_on_fail=False,
)


class SlurmTestbed:
    """What a test needs from the running cluster.

    ``config_path`` (the slurm-hooks config.toml), ``env`` (a full environment
    with SLURM_CONF and SLURM_HOOKS_CONFIG), ``slurm`` (a ScontrolSlurm),
    ``nodes``, ``sim_dir``, ``audit_log``; every other attribute is the
    :class:`~slurm_hooks.lab.testbed.Testbed`'s own: ``sbatch``, ``wait_job``,
    ``wait_node``, ``job_output``, ``scontrol``, ``cancel_all``, ``reset``,
    ``set_hooks``.
    """

    def __init__(self, tb: Testbed):
        self.tb = tb
        self.state_dir = tb.state_dir
        self.config_path = tb.config_path
        self.slurm_conf = tb.slurm_conf
        self.sim_dir = tb.sim_dir
        self.audit_log = tb.audit_log
        self.nodes = list(tb.node_names)
        self.env = tb.env()
        self.slurm = tb.slurm()

    def __getattr__(self, name: str):
        return getattr(self.tb, name)

    def audit_events(self) -> list[dict]:
        """Every audit record written since the last reset."""
        return audit_records(self.audit_log)


def audit_records(path: str) -> list[dict]:
    """Every record of the audit log at ``path``; none while the hooks have not written it yet."""
    try:
        with open(path, encoding="utf-8") as fh:
            return [json.loads(line) for line in fh if line.strip()]
    except FileNotFoundError:
        return []


@contextlib.contextmanager
def own_testbed(tmp_path_factory, name: str, settings: LabSettings) -> Iterator[Testbed]:
    """A cluster up for as long as the block runs (a session's, or a module's with its own
    settings: ``with own_testbed(tmp_path_factory, "repairbed", SETTINGS) as tb: yield tb``)."""
    if os.geteuid() != 0:
        pytest.skip("the Slurm testbed needs root (it starts slurmctld/slurmd and makes /dev-style nodes with mknod)")
    tb = Testbed(str(tmp_path_factory.mktemp(name)), settings)
    try:
        tb.up()
    except BaseException:
        tb.down()
        raise
    try:
        yield tb
    finally:
        tb.down()


def module_testbed(name: str, settings: LabSettings):
    """The fixtures of a module with a cluster of its own: ``bed``, up for the module's tests, and
    ``tb``, the same cluster reset before each test. ``bed, tb = module_testbed("repairbed", SETTINGS)``."""

    @pytest.fixture(scope="module")
    def bed(tmp_path_factory):
        with own_testbed(tmp_path_factory, name, settings) as tb:
            yield tb

    @pytest.fixture
    def tb(bed):
        bed.reset()
        return bed

    return bed, tb


#: The repair ladder's modules: the health check every 2 s, so that a repair is driven the way a
#: site runs it (Slurm's HealthCheckProgram), and the testbed's RebootProgram, which reboots the
#: simulated node and restarts its slurmd with a new boot time.
REPAIR_SETTINGS = LabSettings(nodes=2, gpus=8, hooks=True, kill_wait=2, health_check_interval=2, requeue_grace=3.0,
                           repair=True)


def collect_events(source, stop_after: float = 1.0, until: int = 1) -> list:
    """What an event source's ``follow`` reports until ``until`` events came or ``stop_after`` s passed."""
    got, stop = [], threading.Event()

    def on_event(event):
        got.append(event)
        if len(got) >= until:
            stop.set()

    timer = threading.Timer(stop_after, stop.set)
    timer.start()
    try:
        source.follow(stop, on_event)
    finally:
        timer.cancel()
    return got


def wait_for(pred, timeout: float, what: str, interval: float = 0.1, seen=None):
    """``pred()``'s first truthy value, polled every ``interval`` s; AssertionError after ``timeout`` s
    (``seen()``: what to say of the state then)."""
    value = poll(pred, timeout, interval)
    if not value:
        raise AssertionError(f"not within {timeout:g}s: {what}" + (f"; {seen()}" if seen is not None else ""))
    return value


@pytest.fixture(scope="session")
def _empty_proc(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("proc"))


@pytest.fixture(autouse=True)
def _no_real_job_processes(request, monkeypatch, _empty_proc):
    """Tests off the testbed read a job's processes from an empty tree, not from /proc: there, the
    testbeds' real jobs carry the same job ids and node names (job 1 on n1) as a unit test's
    in-memory Slurm, and the requeue path would take them for its job's ranks, read what they
    declare, and signal them (it sent an elastic torchrun job's agent on a testbed's n1 SIGTERM).
    A test that builds its own tree passes it as ``proc``."""
    if request.node.get_closest_marker("slurm") is None:
        from slurm_hooks.remedy import checkpoint

        monkeypatch.setattr(checkpoint, "PROC_ROOT", _empty_proc)


@pytest.fixture(scope="session")
def testbed(tmp_path_factory) -> SlurmTestbed:
    """The session's cluster as it is (no cleaning); prefer clean_testbed or hooked_testbed."""
    with own_testbed(tmp_path_factory, "testbed", TESTBED_SETTINGS) as tb:
        yield SlurmTestbed(tb)


@pytest.fixture
def clean_testbed(testbed: SlurmTestbed) -> SlurmTestbed:
    """The cluster restored to a clean state, with slurm-hooks not wired in."""
    testbed.set_hooks(False)  # first: no hook of the last test's may drain a node after the reset
    testbed.reset()
    return testbed


@pytest.fixture
def hooked_testbed(testbed: SlurmTestbed) -> SlurmTestbed:
    """The cluster restored to a clean state, with slurm-hooks as Prolog, Epilog and HealthCheckProgram."""
    testbed.set_hooks(True)
    testbed.reset()
    return testbed
