"""NVLink: links down, and CRC / replay error counters above threshold."""

from __future__ import annotations

from collections.abc import Iterator

from slurm_hooks.models import Action, CheckInput, Finding, Severity


def check_links(inp: CheckInput) -> Iterator[Finding]:
    exp = inp.expect
    for gpu in inp.selected():
        if gpu.nvlinks is None:
            continue
        active = [link for link in gpu.nvlinks if link.active]
        down = [link.link for link in gpu.nvlinks if link.active is False]
        unknown = sum(1 for link in gpu.nvlinks if link.active is None)  # unreadable: the probe check warns
        if exp.nvlinks is not None and len(active) + unknown < exp.nvlinks:
            yield Finding("nvlink", Severity.FAIL, Action.RESET,
                          f"{len(active)} NVLinks active, {exp.nvlinks} expected (down: {_fmt(down)})", gpu.index,
                          f"NVLink down on GPU {gpu.index}", config_based=not down)
        elif exp.nvlinks is None and down and active:
            yield Finding("nvlink", Severity.FAIL, Action.RESET,
                          f"NVLink(s) {_fmt(down)} down while {len(active)} are up", gpu.index,
                          f"NVLink {_fmt(down)} down on GPU {gpu.index}")
        for link in gpu.nvlinks:
            if link.crc_errors is not None and link.crc_errors > exp.nvlink_crc_max:
                yield Finding("nvlink", Severity.WARN, Action.WARN,
                              f"NVLink {link.link}: {link.crc_errors} CRC errors (max {exp.nvlink_crc_max})", gpu.index,
                              f"NVLink CRC errors on GPU {gpu.index}", rule="nvlink-errors")
            if link.replay_errors is not None and link.replay_errors > exp.nvlink_replay_max:
                yield Finding("nvlink", Severity.WARN, Action.WARN,
                              f"NVLink {link.link}: {link.replay_errors} replay errors (max {exp.nvlink_replay_max})",
                              gpu.index, f"NVLink replay errors on GPU {gpu.index}", rule="nvlink-errors")


def _fmt(links: list[int]) -> str:
    return ",".join(str(n) for n in links) or "none"
