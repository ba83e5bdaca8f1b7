"""InfiniBand/RoCE ports: gathered once per run from ``/sys/class/infiniband/*/ports/*``.

A counter means something only as a rate, and a drop only if it lasts: the last reading of
every port (its counters, when it went down, its recent flaps) is kept in the state dir, keyed
by the kernel's boot id, so each run judges the growth over the real time since the one
before, and a reboot (counters back at zero) starts afresh. :func:`advance` is that step as a
pure function of the reading, the kept memory and the clock; :class:`LinkGatherer` adds the
files around it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping, Sequence

from slurm_hooks import fsutil
from slurm_hooks.models import IbPort

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing (~3 ms of each start)
if TYPE_CHECKING:
    from typing import Any

SYSFS_ROOT = "/sys/class/infiniband"

#: The counters judged (slurm_hooks.checks.links). Only these are read: on some converged systems
#: every counter read costs the driver a firmware command (gpud 1164, ``ACCESS_REG failed``).
COUNTERS = ("symbol_error", "link_downed", "port_rcv_errors", "excessive_buffer_overrun_errors")

#: A drop shorter than this is no flap (gpud's ``ib-port-drop-threshold``).
FLAP_DOWN_S = 25.0
#: Flaps are kept this long (the flap window of the check).
FLAP_KEEP_S = 12 * 3600.0
#: Two readings closer than this are one reading (the re-judge of one run, a fast watcher poll):
#: the rates of the earlier window stand.
MIN_WINDOW_S = 1.0

RawPort = dict  # {"device", "port", "state", "phys_state", "rate_gbps", "link_layer", "counters": {...}}


def _read(path: str) -> str:
    """A small sysfs file's text; "" when it cannot be read. (``os.read``: a third of ``open()``'s cost,
    and a health check reads some 80 of these.)"""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return ""
    try:
        return os.read(fd, 256).decode("ascii", "replace").strip()
    except OSError:
        return ""
    finally:
        os.close(fd)


def state_word(text: str) -> str:
    """``"4: ACTIVE"`` -> ``"ACTIVE"``, ``"5: LinkUp"`` -> ``"LinkUp"`` (sysfs prefixes the number)."""
    head, sep, tail = text.partition(":")
    return tail.strip() if sep and head.strip().isdigit() else text.strip()


def parse_rate(text: str) -> float | None:
    """``"400 Gb/sec (4X NDR)"`` -> 400.0; ``"2.5 Gb/sec (1X SDR)"`` -> 2.5; ibstat's ``"400"`` -> 400.0."""
    word = text.strip().split(" ", 1)[0]
    try:
        return float(word)
    except ValueError:
        return None


def read_ports(root: str = SYSFS_ROOT, counters: Sequence[str] = COUNTERS) -> list[RawPort]:
    """Every port under ``root`` (``<device>/ports/<n>/``), sorted; none when there is no such tree."""
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
            values: dict[str, int] = {}
            for name in counters:
                text = _read(os.path.join(base, "counters", name))
                if text.isdigit():
                    values[name] = int(text)
            out.append({"device": device, "port": int(port),
                        "state": state_word(state),  # "": unreadable, judged as unknown, never as down
                        "phys_state": state_word(_read(os.path.join(base, "phys_state"))),
                        "rate_gbps": parse_rate(_read(os.path.join(base, "rate"))),
                        "link_layer": _read(os.path.join(base, "link_layer")),
                        "counters": values})
    return out


def port_states(root: str = SYSFS_ROOT) -> dict[str, str]:
    """``"mlx5_0:1"`` -> ``"ACTIVE/LinkUp"``: two small reads a port, what the watcher polls."""
    return {f"{p['device']}:{p['port']}": f"{p['state']}/{p['phys_state']}" for p in read_ports(root, ())}


def parse_ibstat(text: str) -> list[RawPort]:
    """``ibstat`` output as :func:`read_ports` gives it (no counters): for captured outputs."""
    out: list[RawPort] = []
    device = ""
    current: RawPort | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("CA '") and line.endswith("'"):
            device, current = line[4:-1], None
        elif line.startswith("Port ") and line.endswith(":") and line[5:-1].isdigit():
            current = {"device": device, "port": int(line[5:-1]), "state": "", "phys_state": "",
                       "rate_gbps": None, "link_layer": "", "counters": {}}
            out.append(current)
        elif current is not None and ":" in line:
            key, _, value = line.partition(":")
            value = value.strip()
            if key == "State":
                current["state"] = value.upper()
            elif key == "Physical state":
                current["phys_state"] = value
            elif key == "Rate":
                current["rate_gbps"] = parse_rate(value)
            elif key == "Link layer":
                current["link_layer"] = value
    return out


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


def advance(ports: Sequence[RawPort], memory: Mapping[str, Any] | None, now: float,
            boot: str) -> tuple[tuple[IbPort, ...], dict[str, Any]]:
    """The ports with their counters' growth since the last reading, and the memory to keep.

    Counters count from the last boot: a memory of another boot (or none) gives no growth, only
    a new baseline. A counter that went backwards (a driver reload) starts afresh too. A drop is
    a flap once the port comes back after at least :data:`FLAP_DOWN_S`; a ``link_downed`` that
    grew between two readings that both saw the port up is a drop that came and went unseen,
    and counts as a flap too.
    """
    memory = dict(memory or {})
    same_boot = bool(memory) and memory.get("boot") == boot
    last_at = float(memory.get("at", 0.0)) if same_boot else 0.0
    kept = memory.get("ports", {}) if isinstance(memory.get("ports"), dict) else {}
    too_soon = same_boot and now - last_at < MIN_WINDOW_S
    out: list[IbPort] = []
    new_ports: dict[str, Any] = {}
    for raw in ports:
        key = f"{raw['device']}:{raw['port']}"
        before = kept.get(key, {}) if isinstance(kept.get(key), dict) else {}
        counters = {k: int(v) for k, v in raw.get("counters", {}).items()}
        flaps = [float(t) for t in before.get("flaps", ()) if now - float(t) < FLAP_KEEP_S]
        down_since = before.get("down_since")
        up = _up(raw)
        known = bool(raw.get("state"))  # a state that could not be read neither starts nor ends a drop
        if too_soon:
            deltas, window, base = dict(before.get("deltas", {})), float(before.get("window", 0.0)), \
                dict(before.get("counters", {}))
        else:
            base = counters
            window = now - last_at if same_boot and before.get("counters") is not None else 0.0
            deltas = {}
            if window > 0:
                old = before.get("counters", {})
                deltas = {k: v - int(old[k]) for k, v in counters.items() if k in old and v >= int(old[k])}
            if up and down_since is None and before.get("up") and deltas.get("link_downed", 0) > 0:
                flaps.append(now)  # a drop between two readings that both saw it up
        if not known:
            pass
        elif not up and down_since is None:
            down_since = now
        elif up and down_since is not None:
            if now - float(down_since) >= FLAP_DOWN_S:
                flaps.append(now)
            down_since = None
        out.append(IbPort(raw["device"], int(raw["port"]), raw.get("state", ""), raw.get("phys_state", ""),
                          raw.get("rate_gbps"), raw.get("link_layer", ""),
                          counters=tuple(sorted(counters.items())), deltas=tuple(sorted(deltas.items())),
                          window_s=window, flaps=tuple(flaps),
                          down_s=0.0 if down_since is None else max(now - float(down_since), 0.0)))
        new_ports[key] = {"counters": base, "deltas": deltas, "window": window, "up": up,
                          "down_since": down_since, "flaps": flaps}
    return tuple(out), {"boot": boot, "at": last_at if too_soon else now, "ports": new_ports}


class LinkGatherer:
    """The gather step the engine calls once per run: read the ports, advance the kept memory.

    ``root`` may hold ``%n`` (the node's name: the sim lays one tree per node). Memory lives in
    ``<state_dir>/ib-<node>.json``; a memory that cannot be read or written is a fresh start, never
    a failed run (the next run has a baseline again)."""

    def __init__(self, root: str, state_dir: str, node: str, boot: Callable[[], str] | None = None,
                 clock: Callable[[], float] = time.time, kmsg: str = ""):
        self.root = root.replace("%n", node)
        self.path = os.path.join(state_dir, f"ib-{node}.json")
        self._boot = boot
        self._clock = clock
        #: Where the mlx5 kernel lines are read ("" : not read).
        self.kmsg = kmsg

    def boot(self) -> str:
        if self._boot is not None:
            return self._boot()
        from slurm_hooks.probes.kmsg import boot_id

        return boot_id()

    def load(self) -> dict[str, Any] | None:
        data = fsutil.read_json(self.path, missing=None, error=None)
        return data if isinstance(data, dict) else None

    def __call__(self) -> tuple[IbPort, ...] | None:
        """The ports, or ``None`` when this node has none (no tree: nothing to judge)."""
        raw = read_ports(self.root)
        if not raw and not os.path.isdir(self.root):
            return None
        before, now, boot = self.load(), self._clock(), self.boot()
        try:
            ports, memory = advance(raw, before, now, boot)
        except (TypeError, ValueError, KeyError, AttributeError):
            # A memory we cannot make sense of (edited, torn by a crash, another version) is a fresh
            # baseline, never a failed gather (that would drain the node on our own garbage).
            before = None
            ports, memory = advance(raw, None, now, boot)
        if self.kmsg and ports:
            ports, memory["events"] = self._with_events(ports, before, now, boot)
        try:
            fsutil.atomic_write(self.path, json.dumps(memory, sort_keys=True), mode=0o600, durable=False)
        except OSError:
            pass
        return ports


    def _with_events(self, ports: tuple[IbPort, ...], before: Mapping[str, Any] | None, now: float,
                     boot: str) -> tuple[tuple[IbPort, ...], dict[str, float]]:
        """Each port with its adapter's recent mlx5 lines; a line that names no adapter we can tell
        goes with every port (it is the node's). An unreadable kernel log adds nothing."""
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
        known = set(pci.values()) - {""}
        out = []
        for p in ports:
            mine = tuple((rule, text) for rule, where, text in events if where == pci[p.device] or where not in known)
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
    return LinkGatherer(root, config.state.dir, node, boot=boot, kmsg=kmsg)
