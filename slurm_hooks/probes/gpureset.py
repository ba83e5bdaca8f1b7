"""GPU reset backends for the repair ladder: ``nvidia-smi --gpu-reset`` on an NVIDIA node,
``amdsmi_reset_gpu`` on an AMD one, the simulated GPUs' reset on the testbed (through the sim's
stand-in for each vendor's tool: ``nvidia-smi``, or ``amd-smi reset -G``). Each also says which boot the node is in, so that a
repair can tell a reboot that happened from one that is still to come.

A reset is refused while anything holds the GPU open, persistence mode included: the
nvidia-smi backend turns persistence off for the GPU, stops the configured services
(DCGM host engine, fabric manager, exporters), resets, and restores both, whatever the
reset did. Every command is an argv list with a timeout, cut to the repair worker's budget.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Callable, Protocol

from slurm_hooks.errors import CommandError, SlurmHooksError

if TYPE_CHECKING:
    from slurm_hooks.config import Config
    from slurm_hooks.runner import Runner


class ResetFailed(SlurmHooksError):
    """The GPU did not come back from its reset (or could not be reset at all)."""


class GpuResetter(Protocol):
    name: str

    def reset(self, indexes: Sequence[int]) -> None:
        """Reset these GPUs; :class:`ResetFailed` with one line on failure."""

    def boot_id(self) -> str:
        """Which boot the node is in: a new value after every reboot."""


#: A service restart after the worker's budget is spent still gets this long: a node left with
#: its fabric manager stopped is worse than a worker a few seconds late.
CLEANUP_S = 10.0
#: Below this much budget a call is not started at all.
MIN_CALL_S = 0.5


class _Bounded:
    """Runs a reset's commands, each bounded by ``timeout`` and by what is left of the caller's budget."""

    def __init__(self, timeout: float = 60.0, runner: Runner | None = None,
                 time_left: Callable[[], float] | None = None):
        from slurm_hooks.runner import run_command

        self.timeout = float(timeout)
        self._run = runner or run_command
        self.time_left = time_left

    def _call(self, argv: list[str], errors: list[str], floor: float = 0.0) -> bool:
        timeout = self.timeout
        if self.time_left is not None:
            timeout = min(timeout, max(self.time_left(), floor))
            if timeout < MIN_CALL_S:
                errors.append(f"{' '.join(argv)}: not run, the repair worker's budget is spent")
                return False
        try:
            self._run(argv, timeout)
        except CommandError as exc:
            errors.append(f"{' '.join(argv)}: {exc}")
            return False
        return True


class NvidiaSmiReset(_Bounded):
    """``nvidia-smi --gpu-reset``, with persistence off around it and the configured services
    stopped. ``nvidia_smi`` and ``systemctl`` are paths or argv prefixes (the sim's stand-ins).

    ``time_left``: the caller's budget (the repair worker's); every call gets at most what is
    left of it, so a hung step cannot outlive the worker. ``journal``: told the services that are
    stopped, before each stop and once all are running again, so that if this process dies
    in between, whoever reads the record restarts them (:func:`start_services`).
    """

    name = "nvidia-smi"

    def __init__(self, nvidia_smi: str | Sequence[str] = "/usr/bin/nvidia-smi",
                 systemctl: str | Sequence[str] = "/usr/bin/systemctl", services: Sequence[str] = (),
                 timeout: float = 60.0, runner: Runner | None = None,
                 time_left: Callable[[], float] | None = None,
                 journal: Callable[[list[str]], None] | None = None):
        super().__init__(timeout, runner, time_left)
        self.nvidia_smi = [nvidia_smi] if isinstance(nvidia_smi, str) else list(nvidia_smi)
        self.systemctl = [systemctl] if isinstance(systemctl, str) else list(systemctl)
        self.services = tuple(services)
        self.journal = journal

    def argv_plan(self, indexes: Sequence[int]) -> list[list[str]]:
        """Every command of one reset, in order (what ``--dry-run`` shows)."""
        plan = [[*self.systemctl, "stop", s] for s in self.services]
        for i in indexes:
            plan += [[*self.nvidia_smi, "-i", str(i), "-pm", "0"], [*self.nvidia_smi, "--gpu-reset", "-i", str(i)],
                     [*self.nvidia_smi, "-i", str(i), "-pm", "1"]]
        return plan + [[*self.systemctl, "start", s] for s in reversed(self.services)]

    def reset(self, indexes: Sequence[int]) -> None:
        errors: list[str] = []
        stopped: list[str] = []
        try:
            for service in self.services:
                if self.journal is not None:
                    self.journal([*stopped, service])  # recorded before the stop: a death after it is seen
                stopped.append(service)
                self._call([*self.systemctl, "stop", service], errors)
            for i in indexes:
                self._call([*self.nvidia_smi, "-i", str(i), "-pm", "0"], errors)
                reset_ok = self._call([*self.nvidia_smi, "--gpu-reset", "-i", str(i)], errors)
                self._call([*self.nvidia_smi, "-i", str(i), "-pm", "1"], errors)
                if not reset_ok:
                    raise ResetFailed(f"GPU {i}: {errors[-2] if len(errors) > 1 else errors[-1]}")
        finally:
            left = self.start_services(stopped, errors)
            if self.journal is not None and stopped:
                self.journal(left)
        if errors:
            raise ResetFailed("; ".join(errors))

    def start_services(self, services: Sequence[str], errors: list[str] | None = None) -> list[str]:
        """Start these services again, last stopped first; returns those that did not start."""
        errors = [] if errors is None else errors
        return [s for s in reversed(list(services))
                if not self._call([*self.systemctl, "start", s], errors, floor=CLEANUP_S)][::-1]

    def boot_id(self) -> str:
        from slurm_hooks.probes.kmsg import boot_id

        return boot_id()


class SimReset(NvidiaSmiReset):
    """The simulated GPUs' reset: the same steps through the sim's stand-ins for nvidia-smi and
    systemctl (:mod:`slurm_hooks.probes.simtools`), so a hang, a kill and the services stopped
    around it behave as on a node; the boot is the sim's."""

    name = "sim"

    def __init__(self, sim_dir: str, node: str, services: Sequence[str] = (), timeout: float = 60.0,
                 **kwargs: Any):
        from slurm_hooks.probes import simtools

        self.sim_dir, self.node = sim_dir, node
        super().__init__(simtools.argv("nvidia-smi", sim_dir, node), simtools.argv("systemctl", sim_dir, node),
                         services, timeout, **kwargs)

    def boot_id(self) -> str:
        return _sim_boot(self.sim_dir, self.node)


def _sim_boot(sim_dir: str, node: str) -> str:
    from slurm_hooks.probes import sim

    try:
        return sim.boot_id(sim_dir, node)
    except sim.SimStateError:
        return ""


class SimAmdReset(_Bounded):
    """An AMD sim node's reset, as :class:`AmdSmiReset` does it on a node: each GPU reset, no service
    stopped around it; through the sim's stand-in for ``amd-smi reset -G -g K``, so a hang or a GPU
    that does not come back behaves as on a node. The boot is the sim's."""

    name = "sim"

    def __init__(self, sim_dir: str, node: str, timeout: float = 60.0, **kwargs: Any):
        from slurm_hooks.probes import simtools

        self.sim_dir, self.node = sim_dir, node
        super().__init__(timeout, kwargs.get("runner"), kwargs.get("time_left"))  # nothing stopped: no journal
        self.amd_smi = simtools.argv("amd-smi", sim_dir, node)

    def argv_plan(self, indexes: Sequence[int]) -> list[list[str]]:
        return [[*self.amd_smi, "reset", "-G", "-g", str(i)] for i in indexes]

    def reset(self, indexes: Sequence[int]) -> None:
        errors: list[str] = []
        for argv in self.argv_plan(indexes):
            if not self._call(argv, errors):
                raise ResetFailed(f"GPU {argv[-1]}: {errors[-1]}")

    def start_services(self, services: Sequence[str], errors: list[str] | None = None) -> list[str]:
        """Nothing to start: this reset stops no service."""
        return []

    def boot_id(self) -> str:
        return _sim_boot(self.sim_dir, self.node)


def from_config(config: Config, node: str, **kwargs: Any) -> GpuResetter:
    """The node's reset backend; ``kwargs``: ``time_left``, ``journal`` (see :class:`NvidiaSmiReset`)."""
    r = config.repair
    if config.gpu.backend == "sim":
        from slurm_hooks.probes import sim

        if sim.vendor(config.gpu.sim_dir, node) == "amd":
            return SimAmdReset(config.gpu.sim_dir, node, r.reset_timeout, **kwargs)
        return SimReset(config.gpu.sim_dir, node, r.services, r.reset_timeout, **kwargs)
    if config.gpu.backend == "amdsmi" or (config.gpu.backend == "auto" and _amd_node()):
        return AmdSmiReset(**kwargs)
    return NvidiaSmiReset(r.nvidia_smi, r.systemctl, r.services, r.reset_timeout, **kwargs)


class AmdSmiReset:
    """``amdsmi_reset_gpu`` on each faulty GPU (once per board: a partition's reset is its board's).
    Refused, never tried, in a VM guest (the host owns the GPU) and where the library says the
    reset is not supported: :class:`ResetFailed`, so the ladder moves to its next rung."""

    name = "amdsmi"

    def __init__(self, amdsmi: Any = None, cpuinfo: str = "/proc/cpuinfo", **_: Any):
        self._smi = amdsmi
        self.cpuinfo = cpuinfo

    def reset(self, indexes: Sequence[int]) -> None:
        from slurm_hooks.probes import amdsmi as probe

        if _vm_guest(self.cpuinfo):
            raise ResetFailed("refused: a VM guest cannot reset its GPU (the host owns it)")
        try:
            smi = self._smi if self._smi is not None else probe.import_amdsmi()
        except Exception as exc:  # noqa: BLE001 - without libamd_smi the module fails at import
            raise ResetFailed(f"amdsmi not loadable ({' '.join(str(exc).split())})") from None
        try:
            probe.open_session(smi)
        except Exception as exc:
            raise ResetFailed(probe.node_error(smi, exc, "amdsmi_init")) from None
        try:
            handles = list(smi.amdsmi_get_processor_handles())
            for i in _boards(smi, handles, indexes):
                try:
                    smi.amdsmi_reset_gpu(handles[i])
                except Exception as exc:
                    status = probe.status_of(smi, exc)
                    what = "not supported" if status in ("NOT_SUPPORTED", "NOT_YET_IMPLEMENTED") else "failed"
                    raise ResetFailed(f"GPU {i}: amdsmi_reset_gpu {what} ({probe.describe(smi, exc)})") from None
        finally:
            probe.close_session(smi)

    def start_services(self, services: Sequence[str], errors: list[str] | None = None) -> list[str]:
        """Nothing to start: this reset stops no service."""
        return []

    def boot_id(self) -> str:
        from slurm_hooks.probes.kmsg import boot_id

        return boot_id()


def _boards(smi: Any, handles: list, indexes: Sequence[int]) -> list[int]:
    """The GPUs to reset for ``indexes``: each one's first partition on its board, once."""
    def device(i: int) -> str:
        try:
            return str(smi.amdsmi_get_gpu_device_bdf(handles[i])).rsplit(".", 1)[0].lower()
        except Exception:
            return f"#{i}"

    out: list[int] = []
    seen: set[str] = set()
    for i in sorted(indexes):
        if not 0 <= i < len(handles):
            raise ResetFailed(f"GPU {i}: not among the {len(handles)} amdsmi sees")
        board = device(i)
        if board in seen:
            continue
        seen.add(board)
        out.append(next(j for j in range(len(handles)) if device(j) == board))
    return out


def _vm_guest(cpuinfo: str) -> bool:
    """The CPU says it runs under a hypervisor (the ``hypervisor`` flag of /proc/cpuinfo)."""
    try:
        with open(cpuinfo, encoding="ascii", errors="replace") as fh:
            return any(line.startswith("flags") and " hypervisor" in line for line in fh)
    except OSError:
        return False


def _amd_node() -> bool:
    from slurm_hooks.probes.amdras import present

    return present()
