"""GPU probes: one snapshot of every GPU on this node per run.

The engine reaches a probe only through :class:`Probe`; the wiring picks one
from the config (``[gpu] backend``). A vendor is a probe filling the same snapshot:
``probes.nvml`` (the only importer of pynvml), ``probes.amdsmi`` (the only importer of
amdsmi, with ``probes.amdras``, the amdgpu driver's RAS files, where amdsmi is missing).
"""

from __future__ import annotations

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing (~3 ms of each start)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, Protocol

    from slurm_hooks.config import Config
    from slurm_hooks.models import NodeSnapshot
else:
    Protocol = object  # the classes below are interfaces only


class Probe(Protocol):
    name: str

    def snapshot(self) -> NodeSnapshot:
        """Return one snapshot; node-level failures go in ``NodeSnapshot.error``."""


def from_config(config: Config, node: str) -> Probe:
    backend = config.gpu.backend
    if backend == "sim":
        from slurm_hooks.probes.sim import SimProbe

        return SimProbe(config.gpu.sim_dir, node)
    from slurm_hooks.probes.identity import store_path

    kmsg_path, gpu_map_path = config.watch.kmsg, store_path(config.state.dir, node)
    if backend == "amdsmi":
        return _amd(node, kmsg_path, gpu_map_path)
    from slurm_hooks.probes.nvml import NvmlProbe

    nvml = NvmlProbe(node, kmsg_path=kmsg_path, gpu_map_path=gpu_map_path)
    if backend != "auto":
        return nvml
    return AutoProbe(nvml, node, amd=lambda: _amd(node, kmsg_path, gpu_map_path))


def _amd(node: str, kmsg_path: str, gpu_map_path: str) -> Probe:
    from slurm_hooks.probes.amdsmi import AmdSmiProbe

    return AmdSmiProbe(node, kmsg_path=kmsg_path, gpu_map_path=gpu_map_path)


class AutoProbe:
    """NVML where it loads; where it does not (no library, no driver, no binding), amdsmi where the
    amdgpu driver runs GPUs. A node whose NVML fails for any other reason, or that has no AMD GPU
    either, gets NVML's own error: a broken NVIDIA node is never read as an empty AMD one."""

    name = "auto"

    def __init__(self, nvml: Any, node: str, amd: Callable[[], Probe] | None = None):
        self.nvml, self.node, self._amd = nvml, node, amd

    def snapshot(self) -> NodeSnapshot:
        snap = self.nvml.snapshot()
        if snap.error is None or not getattr(self.nvml, "unloadable", False):
            return snap
        if self._amd is not None:
            amd = self._amd()
        else:
            from slurm_hooks.probes.amdsmi import AmdSmiProbe

            amd = AmdSmiProbe(self.node)
        other = amd.snapshot()
        return other if other.error is None and other.gpus else snap


def library_events(config: Config, poll: float) -> tuple[Any, bool]:
    """The GPU library's event source for the watcher, and whether it runs beside the kernel log
    (True: amdsmi's events, which are not the kernel's lines) or in its place where it works
    (False: NVML's XID events, the very XIDs the kernel logs)."""
    if _reads_amd(config):
        from slurm_hooks.probes.amdsmi_events import AmdSmiEventSource

        return AmdSmiEventSource(poll=poll), True
    from slurm_hooks.probes.nvml_events import NvmlEventSource

    return NvmlEventSource(poll=poll), False


def _reads_amd(config: Config, node: str = "") -> bool:
    """The backend reads AMD GPUs: ``amdsmi``, ``auto`` where the amdgpu driver runs them, ``sim``
    where ``node``'s simulated GPUs are AMD's."""
    backend = config.gpu.backend
    return (backend == "amdsmi" or backend == "auto" and _amd_gpus()
            or backend == "sim" and _amd_sim(config, node))


def diag_runner(config: Config, max_timeout: float | None = None, node: str = "") -> Callable[[int, float], Any]:
    """The node's GPU diagnostic at DCGM's levels, ``(level, timeout) -> DcgmResult``: dcgmi, or
    RVS where the backend reads AMD GPUs (``auto``: where the amdgpu driver runs them; ``sim``:
    where ``node``'s simulated GPUs are AMD's, through the sim's stand-ins the config names)."""
    if _reads_amd(config, node):
        from slurm_hooks.probes.rvs import make_runner as rvs

        return rvs(config.dcgm.rvs, max_timeout=max_timeout)
    from slurm_hooks.probes.dcgm import make_runner

    return make_runner(config.dcgm.dcgmi, max_timeout=max_timeout)


def _amd_sim(config: Config, node: str) -> bool:
    from slurm_hooks.probes import sim

    return bool(node) and sim.vendor(config.gpu.sim_dir, node) == "amd"


def diagnostic(config: Config, node: str = "") -> tuple[str, str]:
    """The node's GPU diagnostic as reasons and audit lines name it, and its command before the
    level: ``("DCGM diag", "dcgmi diag -r")``, or ``("RVS diagnostic", "rvs -r")`` where the backend
    reads AMD GPUs (:func:`diag_runner`'s choice)."""
    if _reads_amd(config, node):
        from slurm_hooks.probes import rvs

        return rvs.NAME, "rvs -r"
    from slurm_hooks.probes import dcgm

    return dcgm.NAME, "dcgmi diag -r"


def _amd_gpus() -> bool:
    from slurm_hooks.probes.amdras import present

    return present()
