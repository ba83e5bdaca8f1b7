"""GPU reset backends for the repair ladder: ``nvidia-smi --gpu-reset`` on a real node, the
simulated GPUs' reset on the testbed. Each also says which boot the node is in, so that a
repair can tell a reboot that happened from one that is still to come.

A reset is refused while anything holds the GPU open, persistence mode included: the
nvidia-smi backend turns persistence off for the GPU, stops the configured services
(DCGM host engine, fabric manager, exporters), resets, and restores both, whatever the
reset did. Every command is an argv list with a timeout.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

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


class NvidiaSmiReset:
    name = "nvidia-smi"

    def __init__(self, nvidia_smi: str = "/usr/bin/nvidia-smi", systemctl: str = "/usr/bin/systemctl",
                 services: Sequence[str] = (), timeout: float = 60.0, runner: Runner | None = None):
        from slurm_hooks.runner import run_command

        self.nvidia_smi, self.systemctl = nvidia_smi, systemctl
        self.services = tuple(services)
        self.timeout = float(timeout)
        self._run = runner or run_command

    def argv_plan(self, indexes: Sequence[int]) -> list[list[str]]:
        """Every command of one reset, in order (what ``--dry-run`` shows)."""
        plan = [[self.systemctl, "stop", s] for s in self.services]
        for i in indexes:
            plan += [[self.nvidia_smi, "-i", str(i), "-pm", "0"], [self.nvidia_smi, "--gpu-reset", "-i", str(i)],
                     [self.nvidia_smi, "-i", str(i), "-pm", "1"]]
        return plan + [[self.systemctl, "start", s] for s in reversed(self.services)]

    def reset(self, indexes: Sequence[int]) -> None:
        errors: list[str] = []
        stopped = []
        try:
            for service in self.services:
                self._call([self.systemctl, "stop", service], errors)
                stopped.append(service)
            for i in indexes:
                self._call([self.nvidia_smi, "-i", str(i), "-pm", "0"], errors)
                reset_ok = self._call([self.nvidia_smi, "--gpu-reset", "-i", str(i)], errors)
                self._call([self.nvidia_smi, "-i", str(i), "-pm", "1"], errors)
                if not reset_ok:
                    raise ResetFailed(f"GPU {i}: {errors[-2] if len(errors) > 1 else errors[-1]}")
        finally:
            for service in reversed(stopped):
                self._call([self.systemctl, "start", service], errors)
        if errors:
            raise ResetFailed("; ".join(errors))

    def _call(self, argv: list[str], errors: list[str]) -> bool:
        try:
            self._run(argv, self.timeout)
        except CommandError as exc:
            errors.append(f"{' '.join(argv)}: {exc}")
            return False
        return True

    def boot_id(self) -> str:
        from slurm_hooks.probes.kmsg import boot_id

        return boot_id()


class SimReset:
    """The simulated GPUs' reset (``slurm-hooks sim reset``): what the testbed repairs with."""

    name = "sim"

    def __init__(self, sim_dir: str, node: str):
        self.sim_dir, self.node = sim_dir, node

    def reset(self, indexes: Sequence[int]) -> None:
        from slurm_hooks.probes import sim

        for i in indexes:
            try:
                sim.reset(self.sim_dir, self.node, i)
            except sim.SimStateError as exc:
                raise ResetFailed(str(exc)) from None

    def boot_id(self) -> str:
        from slurm_hooks.probes import sim

        try:
            return sim.boot_id(self.sim_dir, self.node)
        except sim.SimStateError:
            return ""


def from_config(config: Config, node: str) -> GpuResetter:
    if config.gpu.backend == "sim":
        return SimReset(config.gpu.sim_dir, node)
    r = config.repair
    return NvidiaSmiReset(r.nvidia_smi, r.systemctl, r.services, r.reset_timeout)
