"""PCIe link trained below its maximum generation or width."""

from __future__ import annotations

from collections.abc import Iterator

from slurm_hooks.models import Action, CheckInput, Finding, Severity


def check_link(inp: CheckInput) -> Iterator[Finding]:
    for gpu in inp.selected():
        want_width = inp.expect.pcie_width or gpu.pcie_width_max
        if gpu.pcie_width is not None and want_width and gpu.pcie_width < want_width:
            yield Finding("pcie", Severity.FAIL, Action.DRAIN,
                          f"PCIe link width x{gpu.pcie_width}, expected x{want_width}", gpu.index,
                          f"PCIe x{gpu.pcie_width} on GPU {gpu.index}",
                          # at its own maximum, below only the configured width: the config may be wrong
                          config_based=gpu.pcie_width_max is None or gpu.pcie_width >= gpu.pcie_width_max)
        # An idle GPU downclocks its link generation to save power, so a lower
        # current gen alone is only a warning unless the group pins one.
        want_gen = inp.expect.pcie_gen
        max_gen = gpu.pcie_gen_max
        if gpu.pcie_gen_max is not None and want_gen and gpu.pcie_gen_max < want_gen:
            yield Finding("pcie", Severity.FAIL, Action.DRAIN,
                          f"PCIe max gen {gpu.pcie_gen_max}, expected gen {want_gen}", gpu.index,
                          f"PCIe gen{gpu.pcie_gen_max} on GPU {gpu.index}", config_based=True)
        elif gpu.pcie_gen is not None and max_gen and gpu.pcie_gen < max_gen and gpu.processes:
            yield Finding("pcie", Severity.WARN, Action.WARN,
                          f"PCIe gen {gpu.pcie_gen} while busy, max gen {max_gen}", gpu.index,
                          f"PCIe gen{gpu.pcie_gen} on GPU {gpu.index}")
