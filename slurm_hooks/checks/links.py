"""InfiniBand/RoCE links: ports down or slow, error counters growing, ports that flap.

Thresholds, from the tools that check the same ports (gpud, NVSentinel, gcm, aznhc):
``symbol_error`` above 120 an hour is a bit error rate past 1e-12 (fatal), above 10 a second a
degraded link; ``port_rcv_errors`` above 10 a second degraded; any ``excessive_buffer_overrun_errors``
fatal. A port down at least 25 s that comes back is a flap: one is a warning, three within
12 hours take the node out (gpud). A drop that came back is judged as a flap, not by
``link_downed`` alone, which would drain on every single drop (gpud 1247, azurehpc 628).
"""

from __future__ import annotations

from collections.abc import Iterator

from slurm_hooks.models import Action, CheckInput, Finding, IbPort, Severity

SYMBOL_ERRORS_FATAL_PER_HOUR = 120.0
SYMBOL_ERRORS_DEGRADED_PER_S = 10.0
RCV_ERRORS_DEGRADED_PER_S = 10.0
FLAPS_FATAL = 3
#: Where the PortCounters of the IB spec stop (they saturate, never wrap): a counter there grows no
#: more, so a rate over it reads 0 however bad the link (the captured H100 tree has link_downed at 255).
SATURATED = {"symbol_error": 0xFFFF, "link_downed": 0xFF, "port_rcv_errors": 0xFFFF,
             "excessive_buffer_overrun_errors": 0xF}
#: As long as slurm_hooks.probes.ib keeps a flap (its FLAP_KEEP_S).
FLAP_WINDOW_S = 12 * 3600.0


def _enough(ports: list[IbPort], want: int | None, ok) -> bool:
    """With an expected count, enough ports pass (a spare port may be slow or down); else every one must."""
    return want is not None and sum(1 for p in ports if ok(p)) >= want


def check_ports(inp: CheckInput) -> Iterator[Finding]:
    """Ports down, missing, or trained below the expected rate."""
    if inp.links is None:
        return
    ports = list(inp.links)
    want, rate = inp.expect.ib_ports, inp.expect.ib_rate_gbps
    if want is not None and len(ports) < want:
        yield Finding("links", Severity.FAIL, Action.DRAIN,
                      f"{len(ports)} InfiniBand/RoCE port(s) present, {want} expected", None,
                      f"IB {len(ports)} of {want} ports", config_based=True, rule="ib-ports")
    if not _enough(ports, want, lambda p: p.up):
        for p in ports:
            if not p.up and not p.state:
                # An unreadable state (the port vanishing mid-read, a driver error) is no reading: never a drain.
                yield Finding("links", Severity.WARN, Action.WARN,
                              f"IB {p.name}: its state could not be read; not judged this time", None,
                              f"IB {p.name} unreadable", rule="ib-degraded")
            elif not p.up:
                yield Finding("links", Severity.FAIL, Action.DRAIN,
                              f"IB {p.name}: state {p.state or '?'}, physical state {p.phys_state or '?'} "
                              f"(expected ACTIVE/LinkUp)", None, f"IB {p.name} down", rule="ib-down")
    if rate and not _enough(ports, want, lambda p: p.up and (p.rate_gbps or 0) >= rate):
        for p in ports:
            if p.up and p.rate_gbps is not None and p.rate_gbps < rate:
                yield Finding("links", Severity.FAIL, Action.DRAIN,
                              f"IB {p.name}: rate {p.rate_gbps:g} Gb/s, expected {rate} Gb/s", None,
                              f"IB {p.name} at {p.rate_gbps:g} Gb/s", config_based=True, rule="ib-rate")


def check_counters(inp: CheckInput) -> Iterator[Finding]:
    """Error counters over the real time since the last reading (none on a first reading)."""
    for p in inp.links or ():
        if p.window_s <= 0:
            continue
        values = dict(p.counters)
        stuck = [f"{name} at {top}" for name, top in SATURATED.items() if values.get(name) == top]
        if stuck:
            yield Finding("link-errors", Severity.WARN, Action.WARN,
                          f"IB {p.name}: {', '.join(stuck)}, the counter's maximum: its growth cannot be seen "
                          "(clear the port's counters, e.g. perfquery -R)", None, f"IB {p.name} counters saturated",
                          rule="ib-degraded")
        overrun = p.delta("excessive_buffer_overrun_errors") or 0
        if overrun > 0:
            yield Finding("link-errors", Severity.FAIL, Action.DRAIN,
                          f"IB {p.name}: {overrun} excessive buffer overrun error(s) in {_span(p.window_s)}", None,
                          f"IB {p.name} buffer overruns", rule="ib-errors")
        symbols = p.delta("symbol_error") or 0
        per_hour = symbols * 3600.0 / p.window_s
        if per_hour > SYMBOL_ERRORS_FATAL_PER_HOUR:
            yield Finding("link-errors", Severity.FAIL, Action.DRAIN,
                          f"IB {p.name}: {symbols} symbol errors in {_span(p.window_s)} ({per_hour:.0f}/h, "
                          f"limit {SYMBOL_ERRORS_FATAL_PER_HOUR:g}/h)", None, f"IB {p.name} symbol errors",
                          rule="ib-errors")
        if symbols / p.window_s > SYMBOL_ERRORS_DEGRADED_PER_S:
            yield Finding("link-errors", Severity.WARN, Action.WARN,
                          f"IB {p.name}: {symbols / p.window_s:.1f} symbol errors/s "
                          f"(degraded above {SYMBOL_ERRORS_DEGRADED_PER_S:g}/s)", None,
                          f"IB {p.name} degraded", rule="ib-degraded")
        rcv = p.delta("port_rcv_errors") or 0
        if rcv / p.window_s > RCV_ERRORS_DEGRADED_PER_S:
            yield Finding("link-errors", Severity.WARN, Action.WARN,
                          f"IB {p.name}: {rcv / p.window_s:.1f} receive errors/s "
                          f"(degraded above {RCV_ERRORS_DEGRADED_PER_S:g}/s)", None,
                          f"IB {p.name} degraded", rule="ib-degraded")


def check_flaps(inp: CheckInput) -> Iterator[Finding]:
    """Drops of at least 25 s that came back, within the last 12 hours (the gather step keeps no older)."""
    for p in inp.links or ():
        recent = p.flaps
        if len(recent) >= FLAPS_FATAL:
            yield Finding("link-flaps", Severity.FAIL, Action.DRAIN,
                          f"IB {p.name}: {len(recent)} flaps in {_span(FLAP_WINDOW_S)} (limit {FLAPS_FATAL})", None,
                          f"IB {p.name} flapping", rule="ib-flaps")
        elif recent:
            yield Finding("link-flaps", Severity.WARN, Action.WARN,
                          f"IB {p.name}: {len(recent)} flap(s) in {_span(FLAP_WINDOW_S)} "
                          f"({FLAPS_FATAL} take the node out)", None, f"IB {p.name} flapped", rule="ib-flap")


def _span(seconds: float) -> str:
    if seconds >= 3600:
        return f"{round(seconds / 3600, 1):g} h"
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"


#: mlx5 kernel lines -> what they say, as the drain reason names them.
_EVENT_WORDS = {"ib-module-temperature": "cable module overheating", "ib-power": "slot short of power",
                "ib-access-reg": "ACCESS_REG refused"}


def check_kernel_events(inp: CheckInput) -> Iterator[Finding]:
    """mlx5 kernel lines seen within the last hour: one finding per adapter and kind."""
    done: set[tuple[str, str]] = set()
    for p in inp.links or ():
        for rule, text in p.events:
            if (rule, p.device) in done:
                continue
            done.add((rule, p.device))
            warn = rule == "ib-access-reg"
            yield Finding("link-events", Severity.WARN if warn else Severity.FAIL, Action.WARN if warn else Action.DRAIN,
                          f"IB {p.device}: kernel: {text}", None, f"IB {p.device} {_EVENT_WORDS.get(rule, rule)}",
                          rule=rule)

