"""InfiniBand/RoCE links: ports down, gone or slow, error counters growing, ports that flap.

InfiniBand ports (``link_layer`` InfiniBand) and Ethernet ones (RoCE) are judged apart, each
against its own ``[expect]`` count and rate (gpud counts only InfiniBand ports against its
thresholds; gcm's ibstat check looks at IB links only by default): a storage or management RoCE
port at 200 Gb/s never stands in for a compute port down, nor fails the compute ports' rate.

How each draining rule keeps off a healthy node:

- a port down or gone drains only when fewer ports than ``[expect]`` are up (a spare may be
  down); a port whose state cannot be read is no reading, a warning; a gone port drains only
  once it has been gone :data:`~slurm_hooks.probes.ib.FLAP_DOWN_S` (an adapter reset comes back
  within seconds);
- an error rate is judged over at least ``[links] rate_window`` of real time (default 10 min),
  never extrapolated from a shorter one: a burst that a short window shows is a warning until the
  window confirms it. The symbol-error limit is a bit error rate of :data:`SYMBOL_BER` of the
  port's own rate (1,440/h at 400 Gb/s), not the 120/h of a QDR link;
- a counter stuck at its maximum or refused by the kernel is said once per boot as "cannot be
  judged", never judged as zero growth nor as a fault; a counter that went down was cleared and
  has grown by its new value since;
- flaps: a drop that lasts 25 s and comes back, or a drop counter's growth between two readings
  that both saw the port up; one or two in 12 h warn, three drain (gpud).

RoCE transport counters (retransmits, lost packets) also grow when a peer dies or the fabric is
congested: they only ever warn.
"""

from __future__ import annotations

from collections.abc import Iterator

from slurm_hooks.models import Action, CheckInput, Finding, IbPort, Severity

#: The symbol errors a healthy link may show, as a bit error rate: 1e-12 is the IBTA's BER floor
#: for a link (120/h was this rate on a ~33 Gb/s QDR link; 1,440/h at NDR's 400 Gb/s).
SYMBOL_BER = 1e-12
#: A port whose rate is unknown is held to the QDR-era limit.
SYMBOL_ERRORS_FALLBACK_PER_HOUR = 120.0
SYMBOL_ERRORS_DEGRADED_PER_S = 10.0
RCV_ERRORS_DEGRADED_PER_S = 10.0
#: A RoCE transport counter above this rate warns (packets lost or retransmitted; never a drain).
ROCE_DEGRADED_PER_S = 1.0
FLAPS_FATAL = 3
#: As long as slurm_hooks.probes.ib keeps a flap (its FLAP_KEEP_S).
FLAP_WINDOW_S = 12 * 3600.0
#: A port gone this long drains (slurm_hooks.probes.ib's FLAP_DOWN_S: an adapter reset comes back sooner).
GONE_S = 25.0

#: Every counter judged, and how (docs/severity.md has this table): "any growth" drains at the
#: first increment; "flaps" feeds the flap rule; "rate" is judged over the rate window.
COUNTER_RULES: dict[str, str] = {
    "excessive_buffer_overrun_errors": "any growth: drain (ib-errors)",
    "link_downed": "flaps: each drop between two up readings is one (ib-flap, ib-flaps)",
    "symbol_error": "rate: above the BER limit drains (ib-errors), above 10/s warns (ib-degraded)",
    "port_rcv_errors": "rate: above 10/s warns (ib-degraded)",
    "carrier_down_count": "flaps of a RoCE port (roce-flap, roce-flaps); carrier_changes / 2 where absent",
    **{name: f"rate: above {ROCE_DEGRADED_PER_S:g}/s warns (roce-degraded)" for name in (
        "out_of_sequence", "packet_seq_err", "implied_nak_seq_err", "local_ack_timeout_err",
        "req_transport_retries_exceeded", "roce_adp_retrans_to", "rx_icrc_encapsulated")},
}


def symbol_limit_per_hour(rate_gbps: float | None) -> float:
    """Symbol errors an hour at :data:`SYMBOL_BER` of ``rate_gbps`` (bits an hour times the BER)."""
    if not rate_gbps:
        return SYMBOL_ERRORS_FALLBACK_PER_HOUR
    return SYMBOL_BER * rate_gbps * 1e9 * 3600.0


def _enough(ports: list[IbPort], want: int | None, ok) -> bool:
    """With an expected count, enough ports pass (a spare port may be slow or down); else every one must."""
    return want is not None and sum(1 for p in ports if ok(p)) >= want


def _prefix(p: IbPort) -> str:
    return "roce" if p.roce else "ib"


def check_ports(inp: CheckInput) -> Iterator[Finding]:
    """Ports down, missing, gone since boot, or trained below the expected rate: InfiniBand and
    RoCE ports each against their own expectation."""
    if inp.links is None:
        return
    e = inp.expect
    for roce, want, rate in ((False, e.ib_ports, e.ib_rate_gbps), (True, e.roce_ports, e.roce_rate_gbps)):
        yield from _judge_ports([p for p in inp.links if p.roce == roce], roce, want, rate)


def _judge_ports(ports: list[IbPort], roce: bool, want: int | None, rate: int | None) -> Iterator[Finding]:
    kind, prefix, words = ("RoCE", "roce", "RoCE") if roce else ("IB", "ib", "InfiniBand")
    present = [p for p in ports if p.present]
    gone = [p for p in ports if not p.present]
    short = want is not None and len(present) < want
    if short:
        names = f" ({', '.join(p.name for p in gone)} gone since boot)" if gone else ""
        yield Finding("links", Severity.FAIL, Action.DRAIN,
                      f"{len(present)} {words} port(s) present, {want} expected{names}", None,
                      f"{kind} {len(present)} of {want} ports", config_based=True, rule=f"{prefix}-ports")
    spare = _enough(present, want, lambda p: p.up)
    if not spare:
        for p in present:
            if not p.up and not p.state:
                # An unreadable state (the port vanishing mid-read, a driver error) is no reading: never a drain.
                yield Finding("links", Severity.WARN, Action.WARN,
                              f"{kind} {p.name}: its state could not be read; not judged this time", None,
                              f"{kind} {p.name} unreadable", subject=p.name, rule=f"{prefix}-degraded")
            elif not p.up:
                yield Finding("links", Severity.FAIL, Action.DRAIN,
                              f"{kind} {p.name}: state {p.state or '?'}, physical state {p.phys_state or '?'} "
                              f"(expected ACTIVE/LinkUp)", None, f"{kind} {p.name} down", subject=p.name, rule=f"{prefix}-down")
    for p in gone if not short else ():
        if spare or p.down_s < GONE_S:
            yield Finding("links", Severity.WARN, Action.WARN,
                          f"{kind} {p.name}: seen on this boot, gone for {_span(p.down_s)}"
                          + (" (enough ports are up)" if spare else f"; drains if still gone after {GONE_S:g} s"),
                          None, f"{kind} {p.name} gone", subject=p.name, rule=f"{prefix}-degraded")
        else:
            yield Finding("links", Severity.FAIL, Action.DRAIN,
                          f"{kind} {p.name}: seen on this boot, gone for {_span(p.down_s)} (its adapter left the "
                          "bus or its driver?)", None, f"{kind} {p.name} gone", subject=p.name, rule=f"{prefix}-gone")
    if rate and not _enough(present, want, lambda p: p.up and (p.rate_gbps or 0) >= rate):
        for p in present:
            if p.up and p.rate_gbps is not None and p.rate_gbps < rate:
                yield Finding("links", Severity.FAIL, Action.DRAIN,
                              f"{kind} {p.name}: rate {p.rate_gbps:g} Gb/s, expected {rate} Gb/s", None,
                              f"{kind} {p.name} at {p.rate_gbps:g} Gb/s", config_based=True, subject=p.name, rule=f"{prefix}-rate")


def check_counters(inp: CheckInput) -> Iterator[Finding]:
    """Error counters over the rate window; counters that cannot be judged, once per boot; and a
    counter memory that cannot be written (no rate, no flap could ever be seen)."""
    if inp.links is None:
        return
    error = getattr(inp.links, "memory_error", "")
    if error:
        yield Finding("link-errors", Severity.WARN, Action.WARN,
                      f"{_unremembered(error)}; no error rate or unseen flap can be judged until "
                      "it can (a full or read-only disk?)", None, "IB link counters not remembered",
                      rule="links-memory")
    for p in inp.links:
        if not p.present:
            continue
        if p.unjudged_new:
            yield Finding("link-errors", Severity.WARN, Action.WARN,
                          f"{_unjudged(p)} (clear a saturated counter with perfquery -R)", None,
                          f"{p.kind} {p.name} counters cannot be judged", subject=p.name, rule=f"{_prefix(p)}-unjudged")
        if p.window_s > 0:
            yield from (_roce_counters(p) if p.roce else _ib_counters(p))


def _ib_counters(p: IbPort) -> Iterator[Finding]:
    overrun = p.delta("excessive_buffer_overrun_errors") or 0
    if overrun > 0:  # fatal at any growth: no window needed
        yield Finding("link-errors", Severity.FAIL, Action.DRAIN,
                      f"IB {p.name}: {overrun} excessive buffer overrun error(s) in {_span(p.window_s)}", None,
                      f"IB {p.name} buffer overruns", subject=p.name, rule="ib-errors")
    limit = symbol_limit_per_hour(p.rate_gbps)
    yield from _rate(p, "symbol_error", "symbol errors", limit / 3600.0, Severity.FAIL, "ib-errors",
                     f"{limit:,.0f}/h, a BER of {SYMBOL_BER:g} at {p.rate_gbps or 0:g} Gb/s",
                     f"IB {p.name} symbol errors")
    yield from _rate(p, "symbol_error", "symbol errors", SYMBOL_ERRORS_DEGRADED_PER_S, Severity.WARN, "ib-degraded",
                     f"degraded above {SYMBOL_ERRORS_DEGRADED_PER_S:g}/s", f"IB {p.name} degraded", burst=False)
    yield from _rate(p, "port_rcv_errors", "receive errors", RCV_ERRORS_DEGRADED_PER_S, Severity.WARN,
                     "ib-degraded", f"degraded above {RCV_ERRORS_DEGRADED_PER_S:g}/s", f"IB {p.name} degraded")


def _roce_counters(p: IbPort) -> Iterator[Finding]:
    for name, _ in p.deltas:
        if COUNTER_RULES.get(name, "").endswith("(roce-degraded)"):
            yield from _rate(p, name, name, ROCE_DEGRADED_PER_S, Severity.WARN, "roce-degraded",
                             f"warns above {ROCE_DEGRADED_PER_S:g}/s: packets lost or retransmitted",
                             f"RoCE {p.name} degraded")


def _rate(p: IbPort, counter: str, words: str, limit_per_s: float, severity: Severity, rule: str, why: str,
          summary: str, burst: bool = True) -> Iterator[Finding]:
    """One counter's rate against its limit, over a window of at least the port's rate window. In a
    shorter window, growth past what the whole window may hold is a burst: a warning until the
    window confirms it (``burst=False``: not said, another rule of the counter says it)."""
    grown = p.delta(counter) or 0
    if grown <= 0:
        return
    if p.window_s >= p.rate_window_s:
        per_s = grown / p.window_s
        if per_s > limit_per_s:
            action = Action.DRAIN if severity is Severity.FAIL else Action.WARN
            yield Finding("link-errors", severity, action,
                          f"{p.kind} {p.name}: {grown:,} {words} in {_span(p.window_s)} ({_per(per_s)}; {why})",
                          None, summary, subject=p.name, rule=rule)
    elif burst and grown > limit_per_s * p.rate_window_s:
        yield Finding("link-errors", Severity.WARN, Action.WARN,
                      f"{p.kind} {p.name}: burst of {grown:,} {words} in {_span(p.window_s)} ({why}); judged once "
                      f"{_span(p.rate_window_s)} of readings confirm it", None, f"{p.kind} {p.name} error burst",
                      subject=p.name, rule=f"{_prefix(p)}-degraded")


def _per(per_s: float) -> str:
    return f"{per_s:.1f}/s" if per_s >= 1 else f"{per_s * 3600:,.0f}/h"


def check_flaps(inp: CheckInput) -> Iterator[Finding]:
    """Drops of at least 25 s that came back, and drops counted between two up readings, within
    the last 12 hours (the gather step keeps no older)."""
    for p in inp.links or ():
        recent = p.flaps
        if len(recent) >= FLAPS_FATAL:
            yield Finding("link-flaps", Severity.FAIL, Action.DRAIN,
                          f"{p.kind} {p.name}: {len(recent)} flaps in {_span(FLAP_WINDOW_S)} (limit {FLAPS_FATAL})",
                          None, f"{p.kind} {p.name} flapping", subject=p.name, rule=f"{_prefix(p)}-flaps")
        elif recent:
            yield Finding("link-flaps", Severity.WARN, Action.WARN,
                          f"{p.kind} {p.name}: {len(recent)} flap(s) in {_span(FLAP_WINDOW_S)} "
                          f"({FLAPS_FATAL} take the node out)", None, f"{p.kind} {p.name} flapped",
                          subject=p.name, rule=f"{_prefix(p)}-flap")


def _span(seconds: float) -> str:
    if seconds >= 3600:
        return f"{round(seconds / 3600, 1):g} h"
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"


#: mlx5 kernel lines -> what they say, as the drain reason names them.
_EVENT_WORDS = {"ib-module-temperature": "cable module overheating", "ib-power": "slot short of power",
                "ib-access-reg": "ACCESS_REG refused"}


def check_kernel_events(inp: CheckInput) -> Iterator[Finding]:
    """mlx5 kernel lines seen within the last hour: one finding per adapter and kind (the gather
    step gives a line only to the RDMA device whose PCI function it names)."""
    done: set[tuple[str, str]] = set()
    for p in inp.links or ():
        for rule, text in p.events:
            if (rule, p.device) in done:
                continue
            done.add((rule, p.device))
            warn = rule == "ib-access-reg"
            yield Finding("link-events", Severity.WARN if warn else Severity.FAIL, Action.WARN if warn else Action.DRAIN,
                          f"IB {p.device}: kernel: {text}", None, f"IB {p.device} {_EVENT_WORDS.get(rule, rule)}",
                          subject=p.device, rule=rule)


def standing(links) -> list[tuple[str, str]]:
    """What stands against judging these ports, however long ago it was first said, and how an
    admin mends it: a counter memory that cannot be written and the counters that cannot be
    judged on this boot. ``validate`` and ``status`` say it every time they are asked; the health
    check says each once per boot."""
    if links is None:
        return []
    error = getattr(links, "memory_error", "")
    out = [(_unremembered(error), "free the disk of [state] dir, or mount it read-write")] if error else []
    for p in links:
        if p.present and p.unjudged:
            fix = "clear the port's counters: perfquery -R (infiniband-diags), or reboot" \
                if any(u.endswith("its maximum") for u in p.unjudged) else "none: the driver refuses them on this port"
            out.append((_unjudged(p), fix))
    return out


def _unremembered(error: str) -> str:
    """What the health check and :func:`standing` say of a counter memory that cannot be written."""
    return f"cannot remember link counters: {error}"


def _unjudged(p) -> str:
    """What the health check and :func:`standing` say of a port's counters this boot cannot judge."""
    return f"{p.kind} {p.name}: {'; '.join(p.unjudged)}: cannot be judged on this boot"
