"""GPU reset backends for the repair ladder: ``nvidia-smi --gpu-reset`` on a real node, the
simulated GPUs' reset on the testbed. Each also says which boot the node is in, so that a
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


class NvidiaSmiReset:
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
        from slurm_hooks.runner import run_command

        self.nvidia_smi = [nvidia_smi] if isinstance(nvidia_smi, str) else list(nvidia_smi)
        self.systemctl = [systemctl] if isinstance(systemctl, str) else list(systemctl)
        self.services = tuple(services)
        self.timeout = float(timeout)
        self._run = runner or run_command
        self.time_left = time_left
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
        from slurm_hooks.probes import sim

        try:
            return sim.boot_id(self.sim_dir, self.node)
        except sim.SimStateError:
            return ""


def from_config(config: Config, node: str, **kwargs: Any) -> NvidiaSmiReset:
    """The node's reset backend; ``kwargs``: ``time_left``, ``journal`` (see :class:`NvidiaSmiReset`)."""
    r = config.repair
    if config.gpu.backend == "sim":
        return SimReset(config.gpu.sim_dir, node, r.services, r.reset_timeout, **kwargs)
    return NvidiaSmiReset(r.nvidia_smi, r.systemctl, r.services, r.reset_timeout, **kwargs)
