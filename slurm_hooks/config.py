"""TOML configuration: load, validate against a schema, and say where an error is.

Every error names the file, the line and the key, so that a typo is found by
``slurm-hooks validate`` and never drains a node. Unknown keys are errors too.
"""

from __future__ import annotations

import math
import os
import re
import sys
from types import SimpleNamespace

from slurm_hooks.errors import ConfigError
from slurm_hooks.models import Action, Expectations, Scope, Urgency
from slurm_hooks.severity import CHECK_RULES, OVERRIDE_KEYS, Severities, xid_rule_key
from slurm_hooks.slurm import hostlist
from slurm_hooks.urlsecret import URL, bad_url
from slurm_hooks.values import compile_later, dataclass, field, fields, replace

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing (~3 ms of each start)
if TYPE_CHECKING:
    from typing import Any

DEFAULT_PATH = "/etc/slurm-hooks/config.toml"
ENV_VAR = "SLURM_HOOKS_CONFIG"

_Num = (int, float)

#: section -> key -> (accepted types, default). The single source of defaults;
#: the example config (slurm_hooks/templates/install/config.toml, laid by `install`) mirrors it and a
#: test keeps the two equal.
SCHEMA: dict[str, dict[str, tuple[Any, Any]]] = {
    "gpu": {
        "backend": (str, "nvml"),
        "sim_dir": (str, "/var/lib/slurm-hooks/sim"),
        "probe_timeout": (_Num, 20.0),
        "gres_conf": (str, ""),
        "gres_source": (str, "gres.conf"),
        "slurmd": (str, "/usr/sbin/slurmd"),
        "mig_minors": (str, "/proc/driver/nvidia-caps/mig-minors"),
    },
    "log": {
        "audit": (str, "/var/log/slurm-hooks/audit.jsonl"),
    },
    "state": {
        "dir": (str, "/var/lib/slurm-hooks/state"),
    },
    "check": {
        "deadline": (_Num, 45.0),
        "drain": (bool, True),
        "on_check_error": (str, "drain"),
        "drain_guard": (int, 3),
    },
    #: Hysteresis of the threshold checks (slurm_hooks.checks.hysteresis): take the node out only
    #: on K bad of the last N readings ("2/3"), resume only after this many good ones in a row.
    "hysteresis": {
        "confirm": (str, "1/1"),
        "resume_after": (int, 1),
        #: ... and hold it at least this many seconds after its last bad reading (0: no such window).
        "sticky": (_Num, 0.0),
    },
    #: InfiniBand/RoCE ports (slurm_hooks.probes.ib, slurm_hooks.checks.links); ``%n``: the node's name.
    "links": {
        "sysfs_root": (str, "/sys/class/infiniband"),
    },
    "slurm": {
        "backend": (str, "auto"),
        "bin_dir": (str, "/usr/bin"),
        "timeout": (_Num, 10.0),
    },
    "remediation": {
        "requeue": (bool, True),
        "requeue_grace": (_Num, 120.0),
    },
    #: A job's own checkpoint signal (``--signal``), delivered before we requeue it
    #: (:mod:`slurm_hooks.remedy.checkpoint`).
    "requeue": {
        #: Site policy for jobs that declare no ``--signal``: a spec (``USR1``, ``B:USR1@90``); "" = none.
        "signal": (str, ""),
        #: Partition -> spec, over ``signal`` for that partition's jobs ("" = none there).
        "partitions": (dict, {}),
        #: Longest wait after the signal for the job to requeue itself or end; never past
        #: the job's own ``@TIME`` nor KillWait.
        "checkpoint_grace": (_Num, 90.0),
        #: Deliver with ``scancel --full`` (batch shell, its children and every step) instead
        #: of Slurm's own way (steps; the batch shell for ``B:``).
        "full": (bool, False),
        #: SlurmdSpoolDir (``%n``: the node's name): the batch host's copy of a job's script.
        "spool_dir": (str, "/var/spool/slurmd"),
        #: Also read ``sacct -o SubmitLine`` (needs slurmdbd): the command line's ``--signal`` wins.
        "submit_line": (bool, True),
    },
    "repair": {
        "enabled": (bool, True),
        "reset": (bool, True),
        "reboot": (bool, True),
        "window": (_Num, 86400.0),
        "attempts": (int, 1),
        "reboot_timeout": (_Num, 900.0),
        "reset_timeout": (_Num, 60.0),
        "dcgm_level": (int, 2),
        "validate_timeout": (_Num, 1800.0),
        "worker_timeout": (_Num, 3600.0),
        "nvidia_smi": (str, "/usr/bin/nvidia-smi"),
        "systemctl": (str, "/usr/bin/systemctl"),
        "services": (tuple, ()),
    },
    "dcgm": {
        "dcgmi": (str, "/usr/bin/dcgmi"),
        "timeout": (_Num, 30.0),
    },
    "sweep": {
        "level": (int, 2),
        "max_parallel": (str, "1"),
        "job_timeout": (_Num, 3600.0),
        "nvbandwidth": (str, "/usr/bin/nvbandwidth"),
        "all_reduce_perf": (str, "/usr/bin/all_reduce_perf"),
    },
    "isolate": {
        "mode": (str, "bisect"),
        "command": (tuple, ()),
        "python": (str, "/usr/bin/python3"),
        "ratio": (_Num, 0.5),
        "test_timeout": (_Num, 120.0),
        "budget": (_Num, 1800.0),
        "max_tests": (int, 64),
        "output_dir": (str, ""),
        "auto": (bool, False),
        "window": (_Num, 86400.0),
    },
    "metrics": {
        "textfile_dir": (str, ""),
    },
    "watch": {
        "kmsg": (str, "/dev/kmsg"),
        "poll_interval": (_Num, 0.5),
    },
    "notify": {
        "syslog": (bool, False),
        "outbox": (str, ""),
        "settle": (_Num, 2.0),
        "reminder_after": (_Num, 14400.0),
        "timeout": (_Num, 5.0),
        "retry_max": (_Num, 300.0),
        "flush_timeout": (_Num, 5.0),
        #: The ``cluster`` label of every alert and the name in every message ("" = $SLURM_CLUSTER_NAME).
        "cluster": (str, ""),
        #: Messages waiting per receiver at most; the oldest go first (counted, and said in the next one).
        "max_queued": (int, 500),
        #: A message not delivered within this many seconds is dropped (counted, and said in the next one).
        "max_age": (_Num, 259200.0),
        #: Requests per second to one receiver at most (Slack takes about one per webhook).
        "rate": (_Num, 1.0),
        #: An open incident's alerts are posted again this often; each post's endsAt holds it max(4x, 15 min).
        "alert_repost": (_Num, 60.0),
        #: A line every alert and message carries: where the on-call finds what to do.
        "runbook": (str, ""),
        "webhook": (list, ()),
        "alertmanager": (list, ()),
    },
}

_ENUMS = {
    ("gpu", "backend"): ("nvml", "sim"),
    ("gpu", "gres_source"): ("gres.conf", "slurmd"),
    ("check", "on_check_error"): ("drain", "warn"),
    ("slurm", "backend"): ("auto", "scontrol", "pyslurm"),
    ("isolate", "mode"): ("bisect", "pairwise"),
}


#: ``[expect]``'s accepted types, declared; its defaults are :class:`Expectations`' own.
_EXPECT_TYPES: dict[str, Any] = {
    "gpus": int, "model": str, "pcie_gen": int, "pcie_width": int, "nvlinks": int,
    "temp_warn_c": int, "temp_fail_c": int,
    "ecc_uncorrectable_volatile_max": int, "ecc_uncorrectable_aggregate_max": int,
    "nvlink_crc_max": int, "nvlink_replay_max": int,
    "persistence_mode": bool, "fabric_manager": bool,
    "xid_repeat_count": int, "xid_repeat_window_s": int,
    "dcgm_level_prolog": int, "dcgm_level_epilog": int, "dcgm_level_check": int, "dcgm_level_after_failure": int,
    "ib_ports": int, "ib_rate_gbps": int,
}


def _expect_schema() -> dict[str, tuple[Any, Any]]:
    return {f.name: (_EXPECT_TYPES[f.name], f.default) for f in fields(Expectations)}


SCHEMA["expect"] = _expect_schema()

def parse_share(text: str) -> tuple[int, bool]:
    """``"4"`` -> (4, False): four nodes; ``"10%"`` -> (10, True): a tenth of the nodes chosen."""
    value = str(text).strip()
    percent = value.endswith("%")
    digits = value[:-1].strip() if percent else value
    if not digits.isdigit() or int(digits) < 1 or (percent and int(digits) > 100):
        raise ValueError(f"must be a count of nodes (1, 2, ...) or a share (1%..100%), not {text!r}")
    return int(digits), percent


def parse_confirm(text: str) -> tuple[int, int] | None:
    """``"2/3"`` -> (2, 3): bad in 2 of the last 3 readings; ``None`` if it is no such ratio."""
    k, _, n = str(text).partition("/")
    if not (k.strip().isdigit() and n.strip().isdigit()) or not 1 <= int(k) <= int(n) <= 20:
        return None
    return int(k), int(n)


#: slurmd kills HealthCheckProgram at 60 s (hard-coded in slurmd, not configurable).
HEALTH_CHECK_KILL_S = 60.0


@dataclass(frozen=True)
class _Range:
    """The values a number can take and still work; ``open`` ends exclude the bound itself."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    why: str = ""

    def admits(self, value: float) -> bool:
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return not (self.high is not None and (value >= self.high if self.high_open else value > self.high))

    def describe(self) -> str:
        parts = []
        if self.low is not None:
            parts.append(f"{'>' if self.low_open else '>='} {self.low:g}")
        if self.high is not None:
            parts.append(f"{'<' if self.high_open else '<='} {self.high:g}")
        return "must be " + " and ".join(parts) + (f" ({self.why})" if self.why else "")


_POSITIVE = _Range(0, low_open=True)
_TEMPERATURE = _Range(1, 150, why="degrees C, as NVML reports them")
_DCGM_LEVEL = _Range(0, 4, why="0 = off, 1..4 = dcgmi diag -r level")

#: (section, key) -> the values that can work; numbers not named here only must not be negative.
#: ``expect`` ranges hold for ``[groups.*]`` overrides too.
_RANGES: dict[tuple[str, str], _Range] = {
    ("gpu", "probe_timeout"): _POSITIVE,
    ("check", "deadline"): _Range(0, HEALTH_CHECK_KILL_S, low_open=True, high_open=True,
                                  why=f"slurmd kills the health check at {HEALTH_CHECK_KILL_S:g} s"),
    ("slurm", "timeout"): _POSITIVE,
    ("dcgm", "timeout"): _POSITIVE,
    ("watch", "poll_interval"): _POSITIVE,
    ("notify", "timeout"): _POSITIVE,
    ("notify", "retry_max"): _POSITIVE,
    ("notify", "flush_timeout"): _POSITIVE,
    ("requeue", "checkpoint_grace"): _Range(0, 3600, why="0 = no grace: requeue at once after the signal"),
    ("notify", "max_queued"): _Range(1, 100000),
    ("notify", "max_age"): _POSITIVE,
    ("notify", "rate"): _POSITIVE,
    ("notify", "alert_repost"): _Range(1, 3600, why="each post holds the alert open (endsAt) for "
                                                     "max(4 x alert_repost, 15 min); a longer gap risks a flap"),
    ("repair", "window"): _POSITIVE,
    ("repair", "attempts"): _Range(1, 10),
    ("repair", "reboot_timeout"): _POSITIVE,
    ("repair", "reset_timeout"): _POSITIVE,
    ("repair", "dcgm_level"): _DCGM_LEVEL,
    ("repair", "validate_timeout"): _POSITIVE,
    ("repair", "worker_timeout"): _POSITIVE,
    ("sweep", "level"): _Range(1, 4, why="dcgmi diag -r level"),
    ("sweep", "job_timeout"): _POSITIVE,
    ("isolate", "ratio"): _Range(0, 1, low_open=True, high_open=True, why="a share of the peers' bandwidth"),
    ("isolate", "test_timeout"): _POSITIVE,
    ("isolate", "budget"): _POSITIVE,
    ("isolate", "max_tests"): _Range(2, 10000),
    ("isolate", "window"): _POSITIVE,
    ("expect", "gpus"): _Range(0, 1024),
    ("expect", "pcie_gen"): _Range(1, 10),
    ("expect", "pcie_width"): _Range(1, 32),
    ("expect", "nvlinks"): _Range(0, 36, why="NVML knows at most 36 links per GPU"),
    ("expect", "temp_warn_c"): _TEMPERATURE,
    ("expect", "temp_fail_c"): _TEMPERATURE,
    ("expect", "xid_repeat_window_s"): _POSITIVE,
    ("expect", "dcgm_level_prolog"): _DCGM_LEVEL,
    ("expect", "dcgm_level_epilog"): _DCGM_LEVEL,
    ("expect", "dcgm_level_check"): _DCGM_LEVEL,
    ("expect", "dcgm_level_after_failure"): _DCGM_LEVEL,
    ("expect", "ib_ports"): _Range(0, 64),
    ("expect", "ib_rate_gbps"): _Range(1, 3200, why="Gb/s, as /sys/class/infiniband/*/ports/*/rate says"),
    ("hysteresis", "resume_after"): _Range(1, 100),
}
_GROUP_KEYS = {"nodes": (str, None), **SCHEMA["expect"]}
#: Sections kept raw by :func:`parse` and validated on demand against :data:`BRIDGE_SCHEMA`
#: (:meth:`Config.bridge_values`), so that a bridge typo never fails a node's health check.
OPEN_SECTIONS = ("bridge",)


@dataclass(frozen=True)
class Group:
    name: str
    nodes: str
    expect: Expectations


@dataclass(frozen=True)
class Config:
    path: str | None
    sections: dict[str, SimpleNamespace]
    groups: tuple[Group, ...]
    default_expect: Expectations
    raw: dict[str, Any]
    #: The severity table with ``[severity.xid.<code>]`` / ``[severity.check.<rule>]`` overrides.
    severities: Severities = Severities()
    #: Where each key was written: errors found later (the ``[bridge]`` section) still name the line.
    where: _Locator | None = field(default=None, repr=False, compare=False)

    def __getattr__(self, name: str) -> SimpleNamespace:
        try:
            return self.sections[name]
        except KeyError:
            raise AttributeError(name) from None

    def expectations_for(self, node: str) -> Expectations:
        """First group (in file order) whose ``nodes`` names this host wins."""
        for group in self.groups:
            if hostlist.matches(group.nodes, node):
                return group.expect
        return self.default_expect

    def bridge_values(self) -> dict[str, dict[str, Any]]:
        """The ``[bridge]`` section validated against :data:`BRIDGE_SCHEMA`; see :func:`check_bridge`."""
        return check_bridge(self.raw.get("bridge", {}) or {}, self.where or _Locator("", self.path))

    def group_for(self, node: str) -> str:
        for group in self.groups:
            if hostlist.matches(group.nodes, node):
                return group.name
        return "default"


def resolve_path(explicit: str | None = None) -> tuple[str, bool]:
    """Return (path, must_exist): an explicit or env path must exist, the default may not."""
    if explicit:
        return explicit, True
    env = os.environ.get(ENV_VAR)
    if env:
        return env, True
    return DEFAULT_PATH, False


def load(explicit: str | None = None) -> Config:
    path, must_exist = resolve_path(explicit)
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        if must_exist:
            raise ConfigError("file not found", path) from None
        return parse("", None)
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror}", path) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not UTF-8 (byte {exc.start})", path) from None
    from slurm_hooks import confcache  # the table parsed from this same text by an earlier run

    raw = confcache.read(path, text)
    if raw is None:
        raw = _toml(text, path)
        confcache.write(path, text, raw)
    return parse(text, path, raw)


def _toml(text: str, path: str | None) -> dict[str, Any]:
    # Imported here: a run whose parsed config is cached (slurm_hooks.confcache) needs no parser.
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on the 3.9 CI job
        import tomli as tomllib
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        msg, line = _toml_error(str(exc))
        raise ConfigError(msg, path, line) from None


def parse(text: str, path: str | None = "<string>", raw: dict[str, Any] | None = None) -> Config:
    """``raw``: the table already parsed from ``text`` (by :func:`load`), else it is parsed here."""
    if raw is None:
        raw = _toml(text, path)
    where = _Locator(text, path)
    sections: dict[str, SimpleNamespace] = {}
    for name, table in raw.items():
        if name in SCHEMA or name in OPEN_SECTIONS or name in ("groups", "severity"):
            if not isinstance(table, dict):
                where.fail(name, None, "must be a table")
        else:
            where.fail(name, None, f"unknown section (known: {', '.join(sorted([*SCHEMA, 'groups', 'severity', *OPEN_SECTIONS]))})")
    for name, keys in SCHEMA.items():
        table = raw.get(name, {})
        if any(accepted is tuple and isinstance(table.get(k), list) for k, (accepted, _) in keys.items()):
            table = {k: tuple(v) if keys.get(k, (None,))[0] is tuple and isinstance(v, list) else v
                     for k, v in table.items()}  # TOML gives a list; the value kept is a tuple
        values = _check_table(table, keys, name, where)
        for (sec, key), allowed in _ENUMS.items():
            if sec == name and values[key] not in allowed:
                where.fail(name, key, f"must be one of {', '.join(allowed)}, not {values[key]!r}")
        sections[name] = SimpleNamespace(**values)
    _check_together(sections, raw, where)
    services = sections["repair"].services
    if not all(isinstance(x, str) and x.strip() and not x.startswith("-") for x in services):
        where.fail("repair", "services", f"must be a list of service names, got {services!r}")
    try:
        parse_share(sections["sweep"].max_parallel)
    except ValueError as exc:
        where.fail("sweep", "max_parallel", str(exc))
    for kind in DESTINATION_KEYS:
        setattr(sections["notify"], kind, _check_destinations(kind, raw.get("notify", {}).get(kind, ()), where))
    _check_requeue_signals(sections["requeue"], where)
    if parse_confirm(sections["hysteresis"].confirm) is None:
        where.fail("hysteresis", "confirm",
                   f'must be "K/N" with 1 <= K <= N <= 20 (e.g. "2/3"), not {sections["hysteresis"].confirm!r}')
    default_expect = Expectations(**vars(sections["expect"]))
    _check_temperatures(default_expect, raw.get("expect", {}), "expect", where)
    groups = []
    for gname, table in raw.get("groups", {}).items():
        section = f"groups.{gname}"
        if not isinstance(table, dict):
            where.fail(section, None, "must be a table")
        values = _check_table(table, _GROUP_KEYS, section, where)
        if values["nodes"] is not None and not values["nodes"].strip():
            where.fail(section, "nodes", "is empty: name the nodes (e.g. \"gpu[001-128]\") or remove the group")
        if values["nodes"] is None:
            where.fail(section, None, "needs a 'nodes' hostlist (e.g. \"gpu[001-128]\")")
        try:
            hostlist.validate(values["nodes"])
        except ValueError as exc:
            where.fail(section, "nodes", str(exc))
        overrides = {k: v for k, v in table.items() if k != "nodes"}
        expect = replace(default_expect, **overrides)
        _check_temperatures(expect, table, section, where)
        groups.append(Group(gname, values.pop("nodes"), expect))
    for name in OPEN_SECTIONS:
        sections[name] = SimpleNamespace(**raw.get(name, {}))
    severities = _check_severity(raw.get("severity", {}), where)
    return Config(path, sections, tuple(groups), default_expect, raw, where=where, severities=severities)


#: ``[severity.*.*]`` key -> the values it takes.
_SEVERITY_VALUES = {"scope": tuple(s.value for s in Scope), "urgency": tuple(u.value for u in Urgency),
                    "action": tuple(a.value for a in Action)}
#: XID codes are 1..this (NVIDIA's catalogue stops in the 100s; room for newer drivers).
MAX_XID = 999


def _check_severity(table: dict, where: _Locator) -> Severities:
    """``[severity.xid.<code>]`` and ``[severity.check.<rule>]`` tables of scope/urgency/action."""
    overrides: dict[str, dict[str, str]] = {}
    for kind, rows in table.items():
        if kind not in ("xid", "check"):
            first = next(iter(rows), None) if isinstance(rows, dict) else None
            at = f"severity.{kind}" if first is None or where.line_of(f"severity.{kind}", None) else \
                f"severity.{kind}.{first}"
            where.fail(at, None, "unknown table (known: [severity.xid.<code>], [severity.check.<rule>])")
        if not isinstance(rows, dict):
            where.fail(f"severity.{kind}", None, "must be a table of tables, e.g. [severity.xid.79]")
        for name, row in rows.items():
            section = f"severity.{kind}.{name}"
            if kind == "xid":
                if not (name.isdigit() and 1 <= int(name) <= MAX_XID):
                    where.fail(section, None, f"XID must be a number 1..{MAX_XID}, not {name!r}")
                key = xid_rule_key(int(name))
            else:
                if name not in CHECK_RULES:
                    where.fail(section, None, f"unknown check rule (known: {', '.join(sorted(CHECK_RULES))})")
                key = name
            if not isinstance(row, dict):
                where.fail(section, None, f"must be a table: [{section}] with {' / '.join(OVERRIDE_KEYS)} = ...")
            for field_name, value in row.items():
                allowed = _SEVERITY_VALUES.get(field_name)
                if allowed is None:
                    where.fail(section, field_name, f"unknown key (known: {', '.join(OVERRIDE_KEYS)})")
                if value not in allowed:
                    where.fail(section, field_name, f"must be one of {', '.join(allowed)}, not {value!r}")
            overrides[key] = dict(row)
    return Severities(overrides)


def _check_table(table: dict, keys: dict, section: str, where: _Locator, skip: tuple[str, ...] = ()) -> dict:
    values = {}
    for key, value in table.items():
        if key in skip:
            continue
        if key not in keys:
            where.fail(section, key, f"unknown key (known: {', '.join(sorted([*keys, *skip]))})")
        accepted, _ = keys[key]
        if isinstance(value, bool) and accepted is not bool:
            ok = False
        else:
            ok = isinstance(value, accepted)
        if not ok:
            where.fail(section, key, f"expected {_type_name(accepted)}, got {type(value).__name__} {value!r}")
        if isinstance(value, float) and not math.isfinite(value):
            where.fail(section, key, f"must be a finite number, got {value!r}")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if value < 0:
                where.fail(section, key, f"must not be negative, got {value!r}")
            allowed = _RANGES.get(("expect" if section.startswith("groups.") else section, key))
            if allowed is not None and not allowed.admits(value):
                where.fail(section, key, f"{allowed.describe()}, got {value!r}")
    for key, (_, default) in keys.items():
        values[key] = table.get(key, default)
    return values


def _check_together(sections: dict[str, SimpleNamespace], raw: dict, where: _Locator) -> None:
    """Values that each work alone but not with each other: every wait must fit in the deadline."""
    deadline = sections["check"].deadline
    for section, key in (("gpu", "probe_timeout"), ("slurm", "timeout")):
        value = getattr(sections[section], key)
        if value >= deadline:
            # Blame the key the admin wrote: the other one is at its default.
            blamed = (section, key) if key in raw.get(section, {}) or "deadline" not in raw.get("check", {}) \
                else ("check", "deadline")
            where.fail(*blamed, f"[{section}] {key} = {value:g} s must be shorter than [check] deadline = "
                                f"{deadline:g} s: the run would end before the call")


def _check_requeue_signals(section: SimpleNamespace, where: _Locator) -> None:
    """``[requeue] signal`` and each ``partitions`` value: a ``--signal`` spec or ""."""

    def check(value: Any, key: str, label: str) -> None:
        if not isinstance(value, str):
            where.fail("requeue", key, f"{label}: expected a --signal spec string, got {value!r}")
        if value:
            from slurm_hooks.slurm.jobsignal import parse_spec  # (with shlex) only for a spec to read

            try:
                parse_spec(value)
            except ValueError as exc:
                where.fail("requeue", key, f"{label}: {exc}")

    check(section.signal, "signal", "signal")
    for name, value in section.partitions.items():
        check(value, "partitions", f"partition {name!r}")
    section.partitions = dict(section.partitions)


def _check_temperatures(expect: Expectations, table: dict, section: str, where: _Locator) -> None:
    if expect.temp_warn_c > expect.temp_fail_c:
        key = "temp_warn_c" if "temp_warn_c" in table or "temp_fail_c" not in table else "temp_fail_c"
        where.fail(section, key, f"temp_warn_c = {expect.temp_warn_c} is above temp_fail_c = "
                                 f"{expect.temp_fail_c}: the warning must come first")


#: ``[[notify.<kind>]]`` keys -> (accepted type, default). The URL is a credential (a Slack webhook
#: URL is all it takes to post): exactly one of ``url``, ``url_file`` (a 0600 file holding it) or
#: ``url_env`` (an environment variable holding it).
_URL_KEYS: dict[str, tuple[Any, Any]] = {"url": (str, ""), "url_file": (str, ""), "url_env": (str, ""),
                                         "name": (str, "")}
DESTINATION_KEYS: dict[str, dict[str, tuple[Any, Any]]] = {
    "webhook": {**_URL_KEYS, "format": (str, "json")},
    #: ``auth_file``: a file holding the Authorization header's value ("Bearer ...", "Basic ..."),
    #: or a bare token (sent as Bearer).
    "alertmanager": {**_URL_KEYS, "auth_file": (str, "")},
}
WEBHOOK_FORMATS = ("slack", "json")


def _check_destinations(kind: str, tables: Any, where: _Locator) -> tuple[dict[str, str], ...]:
    """Each ``[[notify.<kind>]]`` table: where its URL comes from, and a known format; errors name the
    table's line and never print the URL."""
    keys = DESTINATION_KEYS[kind]
    out = []
    for n, table in enumerate(tables if isinstance(tables, (list, tuple)) else [tables]):
        at = where.nth_table_line(f"notify.{kind}", n)

        def fail(message: str, key: str | None = None, at: int | None = at, n: int = n) -> None:
            raise ConfigError(message, where.path, where.key_line_after(at, key) if key else at,
                              f"[[notify.{kind}]] #{n + 1}" + (f" {key}" if key else ""))

        if not isinstance(table, dict):
            fail(f"must be a table: [[notify.{kind}]] with url_file = \"/etc/slurm-hooks/{kind}.url\"")
        for key, value in table.items():
            if key not in keys:
                fail(f"unknown key (known: {', '.join(sorted(keys))})", key)
            if not isinstance(value, str):
                shown = "a value" if key == "url" else repr(value)
                fail(f"expected a string, got {type(value).__name__} {shown}", key)
        values = {k: table.get(k, default) for k, (_, default) in keys.items()}
        given = [k for k in ("url", "url_file", "url_env") if values[k]]
        if len(given) != 1:
            fail("needs exactly one of url_file (a 0600 file holding the URL), url_env or url"
                 + (f", not {' and '.join(given)}" if given else ""))
        if values["url"] and not URL.match(values["url"]):
            fail(bad_url(values["url"]), "url")
        if kind == "webhook" and values["format"] not in WEBHOOK_FORMATS:
            fail(f"must be one of {', '.join(WEBHOOK_FORMATS)}, not {values['format']!r}", "format")
        out.append(values)
    return tuple(out)


# --- [bridge] ------------------------------------------------------------------------
#
# The bridge's section is declared here with the rest, but validated on demand (by the bridge
# and by ``validate``), never on the node side's path: a typo in it must stop the bridge, not
# fail the health check of every node that shares the file.

#: table -> key -> (accepted types, default). ``tuple`` means a TOML list (of strings).
BRIDGE_SCHEMA: dict[str, dict[str, tuple[Any, Any]]] = {
    "bridge": {
        "interval": (_Num, 30.0),
        #: Actions in our drain reason (``[replace]``) that mean "cordon, drain, replace".
        "trigger_actions": (tuple, ("reboot", "replace")),
        "mapping": (str, "auto"),
        "slinky_namespace": (str, "slurm"),
        "taint_key": (str, "slurm-hooks.io/gpu-unhealthy"),
        "condition_type": (str, "GpuHealthy"),
        "event_namespace": (str, "default"),
        #: A pod carrying this label (or annotation) = "true" opts its node out of drain and replacement.
        "opt_out_label": (str, "slurm-hooks.io/do-not-remediate"),
        "drain": (bool, True),
        #: Longest wait, from the take, for Slurm's jobs to leave the node before its pods are
        #: evicted and the replacement is requested anyway; 0 = wait for ever. The default is
        #: KillWait (120 s recommended) + [remediation] requeue_grace (120 s) + a minute.
        "max_job_wait": (_Num, 300.0),
        #: kubectl drain --force: also evict pods that no controller would recreate.
        "drain_force": (bool, False),
        #: kubectl drain --delete-emptydir-data: also evict pods with emptyDir volumes (their data is lost).
        "drain_delete_emptydir_data": (bool, False),
        "drain_timeout": (_Num, 600.0),
        #: Seconds one pass may spend retrying blocked evictions on one node before moving on.
        "drain_pass_budget": (_Num, 30.0),
        "request_timeout": (_Num, 10.0),
        "retries": (int, 3),
        "state_file": (str, "/var/lib/slurm-hooks/bridge-state.json"),
        #: One bridge acts: a coordination.k8s.io Lease; the breaker's state lives in it
        #: (``false``: one process only, the breaker's state in ``state_file``).
        "leader_election": (bool, True),
        #: The Lease's namespace; "" = the pod's own namespace (in a cluster), else "default".
        "lease_namespace": (str, ""),
        "lease_name": (str, "slurm-hooks-bridge"),
        #: Seconds without a renewal after which a standby bridge takes over.
        "lease_duration": (_Num, 60.0),
        "kubeconfig": (str, ""),
        "context": (str, ""),
        #: Seconds the bridge may hold a machine before it counts in
        #: ``slurm_hooks_bridge_held_too_long_nodes`` and is alerted.
        "held_alert_after": (_Num, 86400.0),
    },
    "bridge.breaker": {
        #: At most this share of all nodes may be taken by the bridge in one window...
        "max_percent": (_Num, 20.0),
        #: ...and at most this many, whichever is smaller (never below one node).
        "max_nodes": (int, 10),
        #: Sliding window, seconds; a tripped breaker also stays open this long.
        "window": (_Num, 600.0),
    },
    "bridge.replace": {
        "backend": (str, "condition"),
        "karpenter_version": (str, "v1"),
        "capi_version": (str, "v1beta1"),
        #: backend = "template": a jinja2 template rendering one object (YAML or JSON).
        "template": (str, ""),
        #: backend = "template": the resource's plural name, needed for its URL.
        "plural": (str, ""),
        #: backend = "template" / "capi": withdraw the request when the node recovers first.
        "cancel_on_recovery": (bool, True),
    },
    #: How a node drained ``[reboot]`` is asked to reboot: ``none`` (like ``[replace]``, through the
    #: replacement backend), ``template`` (a custom resource: NVSentinel RebootNode, medik8s
    #: SelfNodeRemediation), ``annotation`` (an annotation on the node).
    "bridge.reboot": {
        "backend": (str, "none"),
        "template": (str, ""),
        "plural": (str, ""),
        "annotation": (str, "slurm-hooks.io/reboot-requested"),
        "cancel_on_recovery": (bool, True),
    },
    #: Cluster API in its own management cluster: where its Machines (and MachineHealthChecks) live.
    "bridge.capi": {
        #: The management cluster's kubeconfig ("" = this cluster: a self-hosted management cluster).
        "kubeconfig": (str, ""),
        "context": (str, ""),
    },
}
#: ``[bridge.nodes]``: Slurm node name -> Kubernetes node name, for bare metal where they differ.
BRIDGE_SUBTABLES = ("breaker", "replace", "reboot", "capi", "nodes")
BRIDGE_ENUMS = {
    ("bridge", "mapping"): ("auto", "slinky", "name"),
    ("bridge.replace", "backend"): ("condition", "karpenter", "capi", "template"),
    ("bridge.reboot", "backend"): ("none", "template", "annotation"),
}
#: The actions ``trigger_actions`` may name (:class:`slurm_hooks.models.Action` values).
_ACTIONS = tuple(a.value for a in Action)


def bridge_default(table: str, key: str) -> Any:
    """The one default of ``[table] key`` in :data:`BRIDGE_SCHEMA`."""
    return BRIDGE_SCHEMA[table][key][1]


def check_bridge(raw: dict, where: _Locator | None = None) -> dict[str, dict[str, Any]]:
    """``[bridge]``'s tables (``bridge``, ``bridge.breaker``, ``bridge.replace``, ``bridge.nodes``) with
    defaults filled in; a bad value raises :class:`ConfigError` naming file, line and key."""
    import copy  # here: copy (with weakref) costs ~2 ms, and a health check reads no [bridge]

    where = copy.copy(where or _Locator("", None))
    where.header_fallback = True  # a key left at its default is blamed on its table's header
    fail = where.fail

    for name in BRIDGE_SUBTABLES:
        if name in raw and not isinstance(raw[name], dict):
            fail(f"bridge.{name}", None, "must be a table")
    top = dict(raw)
    if isinstance(top.get("trigger_actions"), list):  # TOML gives a list; the value kept is a tuple
        top["trigger_actions"] = tuple(top["trigger_actions"])
    tables = {"bridge": top}
    tables.update({f"bridge.{n}": raw.get(n, {}) for n in ("breaker", "replace", "reboot", "capi")})
    values = {}
    for table, keys in BRIDGE_SCHEMA.items():
        skip = BRIDGE_SUBTABLES if table == "bridge" else ()
        values[table] = _check_table(tables[table], keys, table, where, skip)
    for (table, key), allowed in BRIDGE_ENUMS.items():
        if values[table][key] not in allowed:
            fail(table, key, f"must be one of {', '.join(allowed)}, not {values[table][key]!r}")

    top = values["bridge"]
    for item in top["trigger_actions"]:
        if item not in _ACTIONS:
            fail("bridge", "trigger_actions", f"unknown action {item!r} (known: {', '.join(_ACTIONS)})")
    if not top["trigger_actions"]:
        fail("bridge", "trigger_actions", "must name at least one action (e.g. [\"replace\"])")
    for key in ("interval", "request_timeout", "drain_timeout", "lease_duration"):
        if top[key] <= 0:
            fail("bridge", key, f"must be greater than 0, got {top[key]!r}")
    for key in ("taint_key", "condition_type", "opt_out_label", "event_namespace"):
        if not top[key]:
            fail("bridge", key, "must not be empty")

    breaker = values["bridge.breaker"]
    if not 0 < breaker["max_percent"] <= 100:
        fail("bridge.breaker", "max_percent", f"must be in (0, 100], got {breaker['max_percent']!r}")
    if breaker["max_nodes"] < 1:
        fail("bridge.breaker", "max_nodes", "must be at least 1 (the breaker cannot be switched off)")
    if breaker["window"] <= 0:
        fail("bridge.breaker", "window", f"must be greater than 0, got {breaker['window']!r}")

    for table in ("bridge.replace", "bridge.reboot"):
        chosen = values[table]
        if chosen["backend"] == "template":
            if not chosen["template"]:
                fail(table, "template", "backend = \"template\" needs a template path")
            if not chosen["plural"]:
                fail(table, "plural", "backend = \"template\" needs the resource's plural name")
            _check_template(chosen["template"], fail, table)
    if values["bridge.reboot"]["backend"] == "annotation" and "/" not in values["bridge.reboot"]["annotation"]:
        fail("bridge.reboot", "annotation", "must be a prefixed key (example.org/name), not "
                                            f"{values['bridge.reboot']['annotation']!r}")

    nodes = raw.get("nodes", {})
    for key, value in nodes.items():
        if not isinstance(value, str) or not value:
            fail("bridge.nodes", key, f"expected a Kubernetes node name, got {value!r}")
    values["bridge.nodes"] = dict(nodes)
    return values


def _check_template(path: str, fail: Any, table: str = "bridge.replace") -> None:
    import jinja2  # the bridge's dependency; never imported on the node side's path

    try:
        with open(path, encoding="utf-8") as fh:
            source = fh.read()
    except OSError as exc:
        fail(table, "template", f"cannot read {path}: {exc.strerror}")
        return
    try:
        jinja2.Environment(undefined=jinja2.StrictUndefined).parse(source)
    except jinja2.TemplateSyntaxError as exc:
        fail(table, "template", f"{path}:{exc.lineno}: {exc.message}")


def _type_name(accepted: Any) -> str:
    if accepted is _Num:
        return "a number"
    return {str: "a string", int: "an integer", bool: "true or false", list: "a list of tables",
            tuple: "a list", dict: "a table"}.get(accepted, str(accepted))


def _toml_error(text: str) -> tuple[str, int | None]:
    m = re.search(r"\(at line (\d+), column \d+\)", text)
    if m:
        return text[: m.start()].strip(), int(m.group(1))
    return text, None


class _Locator:
    """Finds the line of a ``[section]`` header or of ``key =`` inside it."""

    _HEADER = compile_later(r"^\s*\[\s*([^\[\]]+?)\s*\]\s*(#.*)?$")
    _KEY = compile_later(r"^\s*\"?([A-Za-z0-9_.-]+)\"?\s*=")

    def __init__(self, text: str, path: str | None, header_fallback: bool = False):
        self.lines = text.splitlines()
        self.path = path
        #: Blame a key that is not written on its table's header line (else: no line).
        self.header_fallback = header_fallback

    def line_of(self, section: str, key: str | None) -> int | None:
        current, header_line = "", None
        for no, line in enumerate(self.lines, 1):
            m = self._HEADER.match(line)
            if m:
                current = m.group(1).replace('"', "").replace(" ", "")
                if current == section and key is None:
                    return no
                continue
            m = self._KEY.match(line)
            if m and key is not None:
                name = m.group(1)
                if (current == section and name == key) or (current == "" and name == f"{section}.{key}"):
                    return no
            if m and key is None and current == "" and m.group(1).split(".")[0] == section:
                header_line = header_line or no
            if m and key is None and "." in section:
                parent, child = section.rsplit(".", 1)
                if current == parent and m.group(1) == child:
                    return no
        return header_line

    def nth_table_line(self, name: str, n: int) -> int | None:
        """Line of the ``n``-th ``[[name]]`` header (0-based)."""
        seen = -1
        for no, line in enumerate(self.lines, 1):
            if re.match(rf"^\s*\[\[\s*{re.escape(name)}\s*\]\]", line):
                seen += 1
                if seen == n:
                    return no
        return None

    def key_line_after(self, start: int | None, key: str) -> int | None:
        """Line of ``key =`` in the table whose header is on line ``start``."""
        if start is None:
            return None
        for no in range(start + 1, len(self.lines) + 1):
            line = self.lines[no - 1]
            if self._HEADER.match(line) or line.lstrip().startswith("[["):
                break
            m = self._KEY.match(line)
            if m and m.group(1) == key:
                return no
        return start

    def fail(self, section: str, key: str | None, message: str) -> None:
        line = self.line_of(section, key)
        if line is None and key is not None and self.header_fallback:
            line = self.line_of(section, None)
        label = f"[{section}] {key}" if key else f"[{section}]"
        raise ConfigError(message, self.path, line, label)
