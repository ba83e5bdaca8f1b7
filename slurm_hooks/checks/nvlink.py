"""NVLink: links down, and CRC / replay error counters above threshold: one finding per GPU
naming its links (a GPU has up to 18; one per link and counter was 36 lines for one fault)."""

from __future__ import annotations

from collections.abc import Iterator

from slurm_hooks.models import Action, CheckInput, Finding, Severity

#: Links whose counts one finding spells out; the rest are named in the link list and counted.
_SHOWN = 4


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
        errors = _errors(gpu.nvlinks, exp.nvlink_crc_max, exp.nvlink_replay_max)
        if errors:
            if len(errors) == 1:
                what = f"link {errors[0][0]}: {errors[0][1]}"
            else:
                more = f"; +{len(errors) - _SHOWN} more" if len(errors) > _SHOWN else ""
                what = (f"links {_fmt([link for link, _ in errors])}: "
                        + "; ".join(f"link {link} {counts}" for link, counts in errors[:_SHOWN]) + more)
            yield Finding("nvlink", Severity.WARN, Action.WARN,
                          f"NVLink errors on {what} (max {exp.nvlink_crc_max} CRC, {exp.nvlink_replay_max} replay)",
                          gpu.index, f"NVLink errors on GPU {gpu.index}", rule="nvlink-errors")


def _errors(links, crc_max: int, replay_max: int) -> list[tuple[int, str]]:
    """(link, "1873 CRC, 212 replay") for each link with a counter above its maximum."""
    out = []
    for link in links:
        over = []
        if link.crc_errors is not None and link.crc_errors > crc_max:
            over.append(f"{link.crc_errors} CRC")
        if link.replay_errors is not None and link.replay_errors > replay_max:
            over.append(f"{link.replay_errors} replay")
        if over:
            out.append((link.link, ", ".join(over)))
    return out


def _fmt(links: list[int]) -> str:
    return ",".join(str(n) for n in links) or "none"
