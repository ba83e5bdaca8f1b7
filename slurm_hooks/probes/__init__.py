"""GPU probes: one snapshot of every GPU on this node per run.

The engine reaches a probe only through :class:`Probe`; the wiring picks one
from the config (``[gpu] backend``). Only ``probes.nvml`` imports pynvml.
"""

from __future__ import annotations

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing (~3 ms of each start)
if TYPE_CHECKING:
    from typing import Protocol

    from slurm_hooks.config import Config
    from slurm_hooks.models import NodeSnapshot
else:
    Protocol = object  # the classes below are interfaces only


class Probe(Protocol):
    name: str

    def snapshot(self) -> NodeSnapshot:
        """Return one snapshot; node-level failures go in ``NodeSnapshot.error``."""


def from_config(config: Config, node: str) -> Probe:
    if config.gpu.backend == "sim":
        from slurm_hooks.probes.sim import SimProbe

        return SimProbe(config.gpu.sim_dir, node)
    from slurm_hooks.probes.identity import store_path
    from slurm_hooks.probes.nvml import NvmlProbe

    return NvmlProbe(node, kmsg_path=config.watch.kmsg, gpu_map_path=store_path(config.state.dir, node))
