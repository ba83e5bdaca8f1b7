"""TOML configuration: load, validate against the sections' classes, and say where an error is.

Every key is a field of its section's class in :mod:`.sections` (:func:`~slurm_hooks.values.setting`: its type,
default, the values it can take and what it does); a new key is a new field, and
``tools/gen_config_doc.py`` writes the example config and docs/configuration.md from them.
Every error names the file, the line and the key, so that a typo is found by
``slurm-hooks validate`` and never drains a node. Unknown keys are errors too.
"""

from __future__ import annotations

import math
import os
import re
import sys

from slurm_hooks.config.sections import (  # noqa: F401  (the sections are the config's names)
    DEFAULT_PATH,
    DESTINATION_KEYS,
    ENV_VAR,
    HEALTH_CHECK_KILL_S,
    OPEN_SECTIONS,
    SECTIONS,
    WEBHOOK_FORMATS,
    CheckSection,
    Config,
    DcgmSection,
    GpuSection,
    Group,
    HysteresisSection,
    IsolateSection,
    LinksSection,
    LogSection,
    MetricsSection,
    NotifySection,
    RemediationSection,
    RepairSection,
    RequeueSection,
    SlurmSection,
    StateSection,
    SweepSection,
    WatchSection,
)
from slurm_hooks.errors import ConfigError
from slurm_hooks.models import Action, Expectations, Scope, Urgency
from slurm_hooks.severity import CHECK_RULES, OVERRIDE_KEYS, Severities, xid_rule_key
from slurm_hooks.slurm import hostlist
from slurm_hooks.urlsecret import URL, bad_url
from slurm_hooks.values import MISSING, Range, compile_later, fields, replace

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing (~3 ms of each start)
if TYPE_CHECKING:
    from typing import Any


_Num = (int, float)


#: A field's declared type -> (the TOML values it accepts, what the value kept is made with).
_KINDS: dict[str, tuple[Any, Any]] = {
    "str": (str, None), "int": (int, None), "bool": (bool, None), "float": (_Num, float),
    "tuple[str, ...]": (tuple, tuple), "dict[str, str]": (dict, dict), "tuple[dict[str, str], ...]": (list, None),
}
_SPECS: dict[tuple[type, tuple[str, ...]], dict[str, tuple[Any, Any, Any, Any]]] = {}


def spec(cls: type, tables: tuple[str, ...] = ()) -> dict[str, tuple[Any, Any, Range | None, Any]]:
    """A section's keys -> (accepted TOML types, default, range, maker of the value kept), from its fields;
    ``tables``: fields that are tables of their own, not keys."""
    out = _SPECS.get((cls, tables))
    if out is None:
        out = {}
        for f in fields(cls):
            if f.name in tables:
                continue
            accepted, make = _KINDS[f.type[:-7] if f.type.endswith(" | None") else f.type]
            default = f.default_factory() if f.default is MISSING else f.default
            out[f.name] = (accepted, default, (f.metadata or {}).get("range"), make)
        _SPECS[(cls, tables)] = out
    return out


def choices(cls: type) -> dict[str, tuple[str, ...]]:
    """A section's keys that take one of a few words -> those words."""
    return {f.name: f.metadata["choices"] for f in fields(cls) if f.metadata and "choices" in f.metadata}


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
    from slurm_hooks.config import cache as confcache  # the table parsed from this same text by an earlier run

    raw = confcache.read(path, text)
    if raw is None:
        raw = _toml(text, path)
        confcache.write(path, text, raw)
    return parse(text, path, raw)


def _toml(text: str, path: str | None) -> dict[str, Any]:
    # Imported here: a run whose parsed config is cached (slurm_hooks.config.cache) needs no parser.
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
    where = Locator(text, path)
    for name, table in raw.items():
        if name in SECTIONS or name in OPEN_SECTIONS or name in ("groups", "severity"):
            if not isinstance(table, dict):
                where.fail(name, None, "must be a table")
        else:
            where.fail(name, None, f"unknown section (known: {', '.join(sorted([*SECTIONS, 'groups', 'severity', *OPEN_SECTIONS]))})")
    sections: dict[str, dict[str, Any]] = {}
    for name, cls in SECTIONS.items():
        values = sections[name] = check_table(raw.get(name, {}), spec(cls), name, where)
        for key, allowed in choices(cls).items():
            if values[key] not in allowed:
                where.fail(name, key, f"must be one of {', '.join(allowed)}, not {values[key]!r}")
    _check_together(sections, raw, where)
    services = sections["repair"]["services"]
    if not all(isinstance(x, str) and x.strip() and not x.startswith("-") for x in services):
        where.fail("repair", "services", f"must be a list of service names, got {services!r}")
    try:
        parse_share(sections["sweep"]["max_parallel"])
    except ValueError as exc:
        where.fail("sweep", "max_parallel", str(exc))
    for kind in DESTINATION_KEYS:
        tables = raw.get("notify", {}).get(kind, ())
        sections["notify"][kind] = _check_destinations(kind, tables, where) if tables else ()
    _check_requeue_signals(sections["requeue"], where)
    confirm = sections["hysteresis"]["confirm"]
    if parse_confirm(confirm) is None:
        where.fail("hysteresis", "confirm", f'must be "K/N" with 1 <= K <= N <= 20 (e.g. "2/3"), not {confirm!r}')
    made = {name: cls(*sections[name].values()) for name, cls in SECTIONS.items()}  # fields in order: no kwargs
    default_expect = made["expect"]
    _check_temperatures(default_expect, raw.get("expect", {}), "expect", where)
    groups = []
    group_keys = {"nodes": (str, None, None, None), **spec(Expectations)}
    for gname, table in raw.get("groups", {}).items():
        section = f"groups.{gname}"
        if not isinstance(table, dict):
            where.fail(section, None, "must be a table")
        values = check_table(table, group_keys, section, where)
        if values["nodes"] is not None and not values["nodes"].strip():
            where.fail(section, "nodes", "is empty: name the nodes (e.g. \"gpu[001-128]\") or remove the group")
        if values["nodes"] is None:
            where.fail(section, None, "needs a 'nodes' hostlist (e.g. \"gpu[001-128]\")")
        try:
            hostlist.validate(values["nodes"])
        except ValueError as exc:
            where.fail(section, "nodes", str(exc))
        expect = replace(default_expect, **{k: values[k] for k in table if k != "nodes"})
        _check_temperatures(expect, table, section, where)
        groups.append(Group(gname, values["nodes"], expect))
    severities = _check_severity(raw.get("severity", {}), where)
    return Config(path, **made, groups=tuple(groups), raw=raw, severities=severities, where=where)


#: ``[severity.*.*]`` key -> the values it takes.
_SEVERITY_VALUES = {"scope": tuple(s.value for s in Scope), "urgency": tuple(u.value for u in Urgency),
                    "action": tuple(a.value for a in Action)}
#: XID codes are 1..this (NVIDIA's catalogue stops in the 100s; room for newer drivers).
MAX_XID = 999


def _check_severity(table: dict, where: Locator) -> Severities:
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


def check_table(table: dict, keys: dict, section: str, where: Locator, skip: tuple[str, ...] = ()) -> dict:
    """``table``'s values checked against ``keys`` (:func:`spec`), the defaults filled in, each value kept
    as its field declares (a number for a ``float`` field as a float, a list for a tuple as a tuple)."""
    for key, value in table.items():
        if key in skip:
            continue
        if key not in keys:
            where.fail(section, key, f"unknown key (known: {', '.join(sorted([*keys, *skip]))})")
        accepted, _, allowed, _ = keys[key]
        if accepted is tuple:
            ok = isinstance(value, (list, tuple))  # TOML gives a list; the value kept is a tuple
        elif isinstance(value, bool) and accepted is not bool:
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
            if allowed is not None and not allowed.admits(value):
                where.fail(section, key, f"{allowed.describe()}, got {value!r}")
    values = {}
    for key, (_, default, _, make) in keys.items():
        if key in table:
            value = table[key]
            values[key] = value if make is None else make(value)
        else:
            values[key] = default
    return values


def _check_together(sections: dict[str, dict[str, Any]], raw: dict, where: Locator) -> None:
    """Values that each work alone but not with each other: every wait must fit in the deadline."""
    deadline = sections["check"]["deadline"]
    for section, key in (("gpu", "probe_timeout"), ("slurm", "timeout")):
        value = sections[section][key]
        if value >= deadline:
            # Blame the key the admin wrote: the other one is at its default.
            blamed = (section, key) if key in raw.get(section, {}) or "deadline" not in raw.get("check", {}) \
                else ("check", "deadline")
            where.fail(*blamed, f"[{section}] {key} = {value:g} s must be shorter than [check] deadline = "
                                f"{deadline:g} s: the run would end before the call")


def _check_requeue_signals(section: dict[str, Any], where: Locator) -> None:
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

    check(section["signal"], "signal", "signal")
    for name, value in section["partitions"].items():
        check(value, "partitions", f"partition {name!r}")


def _check_temperatures(expect: Expectations, table: dict, section: str, where: Locator) -> None:
    if expect.temp_warn_c > expect.temp_fail_c:
        key = "temp_warn_c" if "temp_warn_c" in table or "temp_fail_c" not in table else "temp_fail_c"
        where.fail(section, key, f"temp_warn_c = {expect.temp_warn_c} is above temp_fail_c = "
                                 f"{expect.temp_fail_c}: the warning must come first")


def _check_destinations(kind: str, tables: Any, where: Locator) -> tuple[dict[str, str], ...]:
    """Each ``[[notify.<kind>]]`` table: where its URL comes from, and a known format; errors name the
    table's line and never print the URL."""
    from slurm_hooks.config.receivers import TABLES

    keys = spec(TABLES[kind])
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
        values = {k: table.get(k, default) for k, (_, default, _, _) in keys.items()}
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


class Locator:
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
