"""InfiniBand/RoCE ports: gathered once per run from ``/sys/class/infiniband/*/ports/*``.

A counter means something only as a rate over enough time, and a drop only if it lasts: every
port's readings (its counters' running totals, when it went down, its recent flaps) are kept in
the state dir, keyed by the kernel's boot id, so each run judges the growth over a window of at
least ``[links] rate_window`` of real time, and a reboot (counters back at zero) starts afresh.
:func:`advance` is that step as a pure function of the reading, the kept memory and the clock;
:class:`LinkGatherer` adds the files around it.

What is read depends on the port's ``link_layer``. An InfiniBand port: the four PMA error
counters under ``counters/``. An Ethernet (RoCE) port: its own signals instead, the mlx5
``hw_counters/`` that count lost or retransmitted packets (kernel ``drivers/infiniband/hw/mlx5/
counters.c``) and its network interface's carrier counters, which count every link drop
without the 8-bit ceiling of ``link_downed``.
"""

from __future__ import annotations

import errno
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence

from slurm_hooks import fsutil
from slurm_hooks.models import IbPort, LinkPorts

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing (~3 ms of each start)
if TYPE_CHECKING:
    from typing import Any

SYSFS_ROOT = "/sys/class/infiniband"

#: The PMA counters of an InfiniBand port judged (slurm_hooks.checks.links), with their width in
#: bits: PortCounters saturate at 2**bits - 1 and never wrap. Only these are read: on some
#: converged systems every counter read costs the driver a firmware command (gpud 1164,
#: ``ACCESS_REG failed``).
COUNTERS = {"symbol_error": 16, "link_downed": 8, "port_rcv_errors": 16, "excessive_buffer_overrun_errors": 4}
#: A RoCE port's mlx5 ``hw_counters`` judged (names as counters.c gives them). The firmware keeps
#: them in 32 bits that wrap (a wrap reads as a reset: growth is under-, never over-counted).
HW_COUNTERS = ("out_of_sequence", "packet_seq_err", "implied_nak_seq_err", "local_ack_timeout_err",
               "req_transport_retries_exceeded", "roce_adp_retrans_to", "rx_icrc_encapsulated")
#: A RoCE port's link drops, read from its network interface: ``carrier_down_count`` (Linux 4.16+,
#: one per drop) or else ``carrier_changes`` (one per drop and one per return).
CARRIER = ("carrier_down_count", "carrier_changes")
#: The counter each kind of port counts its drops with.
DROPS = ("link_downed", "carrier_down_count", "carrier_changes")

#: A drop shorter than this is no flap (gpud's ``ib-port-drop-threshold``).
FLAP_DOWN_S = 25.0
#: Flaps are kept this long (the flap window of the check).
FLAP_KEEP_S = 12 * 3600.0
#: The default ``[links] rate_window``: a rate is judged over at least this much real time.
RATE_WINDOW_S = 600.0
#: Readings are kept this far apart at least (a window's start is then at most this late).
KEEP_EVERY = 1 / 8
#: What the kernel says of a counter it will not read on this port (not "try again").
_REFUSED = frozenset({errno.EINVAL, errno.EOPNOTSUPP})

RawPort = dict  # {"device", "port", "state", "phys_state", "rate_gbps", "link_layer", "counters", "refused", "netdev"}


def _read(path: str) -> str:
    """A small sysfs file's text; "" when it cannot be read. (``os.read``: a third of ``open()``'s cost,
    and a health check reads some 80 of these.)"""
    return _read_or_errno(path)[0]


def _read_or_errno(path: str) -> tuple[str, int]:
    """(text, 0), or ("", errno) when the file cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        return "", exc.errno or -1
    try:
        return os.read(fd, 256).decode("ascii", "replace").strip(), 0
    except OSError as exc:
        return "", exc.errno or -1
    finally:
        os.close(fd)


def state_word(text: str) -> str:
    """``"4: ACTIVE"`` -> ``"ACTIVE"``, ``"5: LinkUp"`` -> ``"LinkUp"`` (sysfs prefixes the number)."""
    head, sep, tail = text.partition(":")
    return tail.strip() if sep and head.strip().isdigit() else text.strip()


def parse_rate(text: str) -> float | None:
    """``"400 Gb/sec (4X NDR)"`` -> 400.0; ``"2.5 Gb/sec (1X SDR)"`` -> 2.5."""
    word = text.strip().split(" ", 1)[0]
    try:
        return float(word)
    except ValueError:
        return None


def netdev_dir(root: str, device: str, base: str) -> tuple[str, str]:
    """(name, sysfs directory) of the network interface behind a RoCE port: the PCI function's own
    (``<device>/device/net/<if>``, the physical link), else the port's GID table's
    (``ports/N/gid_attrs/ndevs/0``, e.g. a bond, under ``/sys/class/net``); ("", "") for none."""
    net = os.path.join(root, device, "device", "net")
    try:
        names = sorted(os.listdir(net))
    except OSError:
        names = []
    if names:
        return names[0], os.path.join(net, names[0])
    name = _read(os.path.join(base, "gid_attrs", "ndevs", "0"))
    if name:
        return name, os.path.join(os.path.dirname(os.path.abspath(root)), "net", name)
    return "", ""


def _counter(path: str, key: str, values: dict[str, int], refused: list[str]) -> None:
    text, err = _read_or_errno(path)
    if text.isdigit():
        values[key] = int(text)
    elif err in _REFUSED:
        refused.append(key)


def read_ports(root: str = SYSFS_ROOT, counters: bool = True, skip: frozenset[str] = frozenset()) -> list[RawPort]:
    """Every port under ``root`` (``<device>/ports/<n>/``), sorted; none when there is no such tree.
    ``skip``: ``"<device>:<port>:<counter>"`` not to read (refused earlier on this boot)."""
    out: list[RawPort] = []
    try:
        devices = sorted(os.listdir(root))
    except OSError:
        return out
    for device in devices:
        ports_dir = os.path.join(root, device, "ports")
        try:
            ports = sorted((p for p in os.listdir(ports_dir) if p.isdigit()), key=int)
        except OSError:
            continue
        for port in ports:
            base = os.path.join(ports_dir, port)
            state = _read(os.path.join(base, "state"))
            if not state and not os.path.isdir(base):
                continue  # gone between the listing and the read (an adapter reset): not there, not down
            layer = _read(os.path.join(base, "link_layer"))
            raw: RawPort = {"device": device, "port": int(port),
                            "state": state_word(state),  # "": unreadable, judged as unknown, never as down
                            "phys_state": state_word(_read(os.path.join(base, "phys_state"))),
                            "rate_gbps": parse_rate(_read(os.path.join(base, "rate"))),
                            "link_layer": layer, "counters": {}, "refused": [], "netdev": ""}
            out.append(raw)
            if counters:
                _read_counters(root, raw, base, f"{device}:{port}:", skip)
    return out


def _read_counters(root: str, raw: RawPort, base: str, prefix: str, skip: frozenset[str]) -> None:
    values, refused = raw["counters"], raw["refused"]
    if raw["link_layer"] != "Ethernet":
        for name in COUNTERS:
            if prefix + name not in skip:
                _counter(os.path.join(base, "counters", name), name, values, refused)
        return
    for name in HW_COUNTERS:
        if prefix + name not in skip:
            _counter(os.path.join(base, "hw_counters", name), name, values, refused)
    raw["netdev"], where = netdev_dir(root, raw["device"], base)
    for name in CARRIER if where else ():
        _counter(os.path.join(where, name), name, values, refused)
        if name in values:
            break


def port_states(root: str = SYSFS_ROOT) -> dict[str, str]:
    """``"mlx5_0:1"`` -> ``"ACTIVE/LinkUp"``: two small reads a port, what the watcher polls."""
    return {f"{p['device']}:{p['port']}": f"{p['state']}/{p['phys_state']}" for p in read_ports(root, False)}


def _up(raw: Mapping[str, Any]) -> bool:
    return str(raw.get("state", "")).upper() == "ACTIVE" and str(raw.get("phys_state", "")).lower() in ("linkup", "")


#: An mlx5 kernel line counts this long after we first saw it (the ring buffer keeps it till reboot).
EVENT_KEEP_S = 3600.0


def device_pci(root: str, device: str) -> str:
    """The PCI function of ``device`` (``/sys/class/infiniband/<device>/device`` links to it), as
    kmsg.normalize_pci writes it; "" when there is no such link (a captured tree, the sim)."""
    try:
        target = os.readlink(os.path.join(root, device, "device"))
    except OSError:
        return ""
    from slurm_hooks.probes.kmsg import normalize_pci

    return normalize_pci(os.path.basename(target))


def fresh_events(lines: Sequence[tuple[str, str, Any, Any, str]], memory: Mapping[str, Any] | None, now: float,
                 boot: str) -> tuple[list[tuple[str, str, str]], dict[str, float]]:
    """The mlx5 lines (``kmsg.read_mlx5``) seen within :data:`EVENT_KEEP_S` of when we first saw
    them: (rule, PCI function or "", line); and the first-seen times to keep. A line is named by
    its boot, sequence number (or time) and text, so the same line read again is the same event."""
    seen_before = dict((memory or {}).get("events", {})) if (memory or {}).get("boot") == boot else {}
    seen: dict[str, float] = {}
    out: list[tuple[str, str, str]] = []
    for rule, pci, ts, seq, text in lines:
        key = f"{seq if seq is not None else ts}:{text}"
        first = float(seen_before.get(key, now))
        # Kept while the line is in the log, past its hour too: forgotten, it would be new again.
        seen[key] = first
        if now - first < EVENT_KEEP_S:
            out.append((rule, pci, text))
    return out, seen


def _grown(old: int, new: int) -> int:
    """A counter's growth between two readings; one that went down was cleared (``perfquery -R``, a
    driver reload, a 32-bit wrap) and has grown by its new value since."""
    return new - old if new >= old else new


def _saturated(name: str, value: int) -> bool:
    bits = COUNTERS.get(name)
    return bits is not None and value >= (1 << bits) - 1


def advance(ports: Sequence[RawPort], memory: Mapping[str, Any] | None, now: float, boot: str,
            rate_window: float = RATE_WINDOW_S) -> tuple[tuple[IbPort, ...], dict[str, Any]]:
    """The ports with their counters' growth over the rate window, and the memory to keep.

    Counters count from the last boot: a memory of another boot (or none) gives no growth, only
    a new baseline. Each counter's running total adds its growth between readings (a decrease is
    a reset, the new value its growth since); readings of the totals are kept at least
    ``rate_window * KEEP_EVERY`` apart, and the window runs from the newest kept reading at least
    ``rate_window`` old (or, until there is one, the oldest: a short window the check only warns
    on). A drop is a flap once the port comes back after at least :data:`FLAP_DOWN_S`; a drop
    counter (``link_downed``, a RoCE interface's carrier) that grew by N between two readings
    that both saw the port up is N drops that came and went unseen: N flaps. A port seen on this
    boot that is no longer there is kept as gone (``present=False``), with how long.
    """
    memory = dict(memory or {})
    same_boot = bool(memory) and memory.get("boot") == boot
    kept = memory.get("ports", {}) if same_boot and isinstance(memory.get("ports"), dict) else {}
    said = set(memory.get("said", ())) if same_boot else set()
    refused = set(memory.get("refused", ())) if same_boot else set()
    step = rate_window * KEEP_EVERY
    out: list[IbPort] = []
    new_ports: dict[str, Any] = {}
    for raw in ports:
        key = f"{raw['device']}:{raw['port']}"
        before = kept.get(key, {}) if isinstance(kept.get(key), dict) else {}
        counters = {k: int(v) for k, v in raw.get("counters", {}).items()}
        last = {k: int(v) for k, v in before.get("last", {}).items()}
        totals = {k: int(v) for k, v in before.get("totals", {}).items()}
        grown = {k: _grown(last[k], v) for k, v in counters.items() if k in last}
        for k in counters:
            totals[k] = totals.get(k, 0) + grown.get(k, 0)
        readings = [(float(t), {k: int(v) for k, v in tot.items()}) for t, tot in before.get("readings", ())]
        readings = [r for r in readings if r[0] <= now] or [(now, dict(totals))]
        if now - readings[-1][0] >= step:
            readings.append((now, dict(totals)))
        old = [r for r in readings if now - r[0] >= rate_window]
        start_at, start = old[-1] if old else readings[0]
        readings = readings[len(old) - 1:] if old else readings
        window = now - start_at
        deltas = {k: v - start[k] for k, v in totals.items() if k in start} if window > 0 else {}
        flaps = [float(t) for t in before.get("flaps", ()) if now - float(t) < FLAP_KEEP_S]
        down_since = before.get("down_since")
        up = _up(raw)
        known = bool(raw.get("state"))  # a state that could not be read neither starts nor ends a drop
        if up and down_since is None and before.get("up"):
            drops = next((grown[k] for k in DROPS if k in grown), 0)
            if "carrier_changes" in grown and "carrier_down_count" not in grown:
                drops = (drops + 1) // 2  # a drop and its return are two changes
            flaps.extend([now] * drops)  # drops between two readings that both saw it up
        if not known:
            pass
        elif not up and down_since is None:
            down_since = now
        elif up and down_since is not None:
            if now - float(down_since) >= FLAP_DOWN_S:
                flaps.append(now)
            down_since = None
        refused.update(f"{key}:{name}" for name in raw.get("refused", ()))
        unjudged = tuple(f"{k} at {v}, its maximum" for k, v in sorted(counters.items()) if _saturated(k, v)) + \
            tuple(f"{name} refused by the kernel" for name in sorted(
                r.rsplit(":", 1)[1] for r in refused if r.startswith(key + ":")))
        fresh = {f"{key}:{u}" for u in unjudged} - said
        said |= fresh
        out.append(IbPort(raw["device"], int(raw["port"]), raw.get("state", ""), raw.get("phys_state", ""),
                          raw.get("rate_gbps"), raw.get("link_layer", ""),
                          counters=tuple(sorted(counters.items())), deltas=tuple(sorted(deltas.items())),
                          window_s=window, rate_window_s=rate_window, flaps=tuple(flaps),
                          down_s=0.0 if down_since is None else max(now - float(down_since), 0.0),
                          netdev=raw.get("netdev", ""), unjudged=unjudged, unjudged_new=bool(fresh)))
        new_ports[key] = {"last": counters, "totals": totals, "readings": readings, "up": up,
                          "down_since": down_since, "flaps": flaps, "link_layer": raw.get("link_layer", ""),
                          "rate_gbps": raw.get("rate_gbps")}
    for key, before in kept.items():
        if key in new_ports or not isinstance(before, dict):
            continue
        gone_since = float(before.get("gone_since", now))
        device, _, port = key.rpartition(":")
        out.append(IbPort(device, int(port), link_layer=str(before.get("link_layer", "")),
                          rate_gbps=before.get("rate_gbps"), present=False, down_s=max(now - gone_since, 0.0),
                          rate_window_s=rate_window))
        new_ports[key] = {**before, "gone_since": gone_since}
    return tuple(out), {"boot": boot, "at": now, "ports": new_ports, "said": sorted(said),
                        "refused": sorted(refused)}


class LinkGatherer:
    """The gather step the engine calls once per run: read the ports, advance the kept memory.

    ``root`` may hold ``%n`` (the node's name: the sim lays one tree per node). Memory lives in
    ``<state_dir>/ib-<node>.json``; a memory that cannot be read is a fresh start, never a failed
    run, and one that cannot be written is said (``LinkPorts.memory_error``): without it no rate
    is ever seen."""

    def __init__(self, root: str, state_dir: str, node: str, boot: Callable[[], str] | None = None,
                 clock: Callable[[], float] = time.time, kmsg: str = "", rate_window: float = RATE_WINDOW_S):
        self.root = root.replace("%n", node)
        self.path = os.path.join(state_dir, f"ib-{node}.json")
        self._boot = boot
        self._clock = clock
        #: Where the mlx5 kernel lines are read ("" : not read).
        self.kmsg = kmsg
        self.rate_window = rate_window

    def boot(self) -> str:
        if self._boot is not None:
            return self._boot()
        from slurm_hooks.probes.kmsg import boot_id

        return boot_id()

    def load(self) -> dict[str, Any] | None:
        data = fsutil.read_json(self.path, missing=None, error=None)
        return data if isinstance(data, dict) else None

    def __call__(self) -> LinkPorts | None:
        """The ports, or ``None`` when this node has none (no tree, none seen on this boot: nothing
        to judge)."""
        before, now, boot = self.load(), self._clock(), self.boot()
        if before is not None and before.get("boot") != boot:
            before = None
        skip = before.get("refused", ()) if before is not None else ()
        raw = read_ports(self.root, skip=frozenset(x for x in skip if isinstance(x, str)))
        if not raw and not os.path.isdir(self.root) and not (before or {}).get("ports"):
            return None
        try:
            ports, memory = advance(raw, before, now, boot, self.rate_window)
        except (TypeError, ValueError, KeyError, AttributeError):
            # A memory we cannot make sense of (edited, torn by a crash, another version) is a fresh
            # baseline, never a failed gather (that would drain the node on our own garbage).
            before = None
            ports, memory = advance(raw, None, now, boot, self.rate_window)
        if self.kmsg and ports:
            ports, memory["events"] = self._with_events(ports, before, now, boot)
        error = ""
        try:
            fsutil.atomic_write(self.path, json.dumps(memory, sort_keys=True), mode=0o600, durable=False)
        except OSError as exc:
            error = f"{self.path}: {exc.strerror or exc}"
        return LinkPorts(ports, memory_error=error)

    def _with_events(self, ports: tuple[IbPort, ...], before: Mapping[str, Any] | None, now: float,
                     boot: str) -> tuple[tuple[IbPort, ...], dict[str, float]]:
        """Each port with its adapter's recent mlx5 lines: a line goes with the RDMA device whose PCI
        function it names (``<device>/device``), and with none when it names another adapter (an
        Ethernet-only ConnectX) or none at all. An unreadable kernel log adds nothing."""
        import dataclasses

        from slurm_hooks.errors import ProbeError
        from slurm_hooks.probes import kmsg

        try:
            lines = kmsg.read_mlx5(self.kmsg)
        except ProbeError:
            return ports, {}
        try:
            events, seen = fresh_events(lines, before, now, boot)
        except (TypeError, ValueError, AttributeError):
            events, seen = fresh_events(lines, None, now, boot)
        if not events:
            return ports, seen
        pci = {p.device: device_pci(self.root, p.device) for p in ports}
        out = []
        for p in ports:
            mine = tuple((rule, text) for rule, where, text in events if where and where == pci[p.device])
            out.append(dataclasses.replace(p, events=mine) if mine else p)
        return tuple(out), seen


def from_config(config: Any, node: str) -> LinkGatherer:
    """The gatherer for ``[links]``; with simulated GPUs, the sim's ports and boot id (unless
    ``sysfs_root`` says otherwise)."""
    boot, root, kmsg = None, config.links.sysfs_root, config.watch.kmsg
    if config.gpu.backend == "sim":
        from slurm_hooks.probes import sim

        sim_dir = config.gpu.sim_dir
        if root == SYSFS_ROOT:
            root = os.path.join(sim_dir, "ib", node)  # the ports `sim init --ib` lays
        kmsg = sim.ib_kmsg(sim_dir, node)  # the mlx5 lines `sim inject --ib ... --event` writes

        def boot() -> str:
            try:
                return sim.boot_id(sim_dir, node)
            except Exception:  # noqa: BLE001 - no sim state: no boot to key on
                return ""
    return LinkGatherer(root, config.state.dir, node, boot=boot, kmsg=kmsg, rate_window=config.links.rate_window)
