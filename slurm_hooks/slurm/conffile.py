"""Slurm's config-file syntax, shared by every reader of slurm.conf and gres.conf.

Followed from Slurm's ``parse_config.c``: keys are case-insensitive, ``#`` starts a
comment unless written ``\\#``, a trailing backslash joins the next line,
``key=value`` pairs may share a line and values may be double-quoted,
``Include``/``include`` takes a path relative to the including file's directory
and may be a glob.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterator

ENV_VAR = "SLURM_CONF"
#: Tried in order when neither an explicit path nor SLURM_CONF names slurm.conf. The last
#: two are where configless slurmd (``slurmd -Z``, Slinky) caches the file.
DEFAULT_PATHS = (
    "/etc/slurm/slurm.conf",
    "/etc/slurm-llnl/slurm.conf",
    "/run/slurm/conf/slurm.conf",
    "/var/spool/slurmd/conf-cache/slurm.conf",
)



class HealthCheckNodeState:
    """The words of slurm.conf's ``HealthCheckNodeState``: the nodes slurmd runs the health check on."""

    ALLOC = "ALLOC"
    ANY = "ANY"
    CYCLE = "CYCLE"
    IDLE = "IDLE"
    NONDRAINED_IDLE = "NONDRAINED_IDLE"
    MIXED = "MIXED"
    START_ONLY = "START_ONLY"
    ALL = (ALLOC, ANY, CYCLE, IDLE, NONDRAINED_IDLE, MIXED, START_ONLY)


_PAIR = re.compile(r'\s*([A-Za-z0-9_.]+)\s*=\s*(?:"([^"]*)"|(\S*))(?=\s|$)')
INCLUDE = re.compile(r"^\s*include\s+(.+?)\s*$", re.IGNORECASE)


def resolve_path(explicit: str | None = None) -> str:
    """slurm.conf: ``explicit``, then $SLURM_CONF, then the first default that exists."""
    if explicit:
        return explicit
    env = os.environ.get(ENV_VAR)
    if env:
        return env
    for path in DEFAULT_PATHS:
        if os.path.exists(path):
            return path
    return DEFAULT_PATHS[0]


def logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """(first physical line number, text) with comments stripped and continuations joined."""
    start, buf = None, ""
    for no, raw in enumerate(text.splitlines(), 1):
        line = strip_comment(raw).rstrip()
        if start is None:
            start = no
        if line.endswith("\\"):
            buf += line[:-1]
            continue
        buf += line
        if buf.strip():
            yield start, buf
        start, buf = None, ""
    if buf.strip() and start is not None:
        yield start, buf


def strip_comment(line: str) -> str:
    out, quoted, i = [], False, 0
    while i < len(line):
        ch = line[i]
        if ch == "\\" and i + 1 < len(line) and line[i + 1] == "#":
            out.append("#")
            i += 2
            continue
        if ch == '"':
            quoted = not quoted
        elif ch == "#" and not quoted:
            break
        out.append(ch)
        i += 1
    return "".join(out)


def split_pairs(text: str) -> list[tuple[str, str]]:
    """``A=1 B="x y"`` -> [("A", "1"), ("B", "x y")]; ValueError on anything else."""
    pairs, pos = [], 0
    rest = text.rstrip()
    while pos < len(rest):
        m = _PAIR.match(rest, pos)
        if not m:
            raise ValueError(f"cannot parse {rest[pos:].strip()!r} (expected Key=Value)")
        value = m.group(2) if m.group(2) is not None else m.group(3)
        pairs.append((m.group(1), value))
        pos = m.end()
    return pairs


def include_paths(value: str, including: str) -> list[str]:
    """The files an ``Include <value>`` line in ``including`` names (a glob: its matches, sorted)."""
    target = value.strip().strip('"')
    if not os.path.isabs(target):
        target = os.path.join(os.path.dirname(os.path.abspath(including)), target)
    paths = sorted(glob.glob(target)) if glob.has_magic(target) else [target]
    return [p for p in paths if not os.path.isdir(p)]


def global_values(keys: tuple[str, ...], path: str | None = None) -> dict[str, str]:
    """Global ``keys`` of slurm.conf (lowercased names; its includes followed), e.g. ``ClusterName``
    for the alerts' ``cluster`` label (slurmd gives a health check only ``SLURMD_NODENAME``),
    ``ResumeTimeout``, ``PrologFlags``. Empty where slurm.conf cannot be read: a default, never an error."""
    wanted = {k.lower() for k in keys}
    found: dict[str, str] = {}

    def read(file: str, depth: int) -> None:
        try:
            with open(file, encoding="utf-8", errors="replace") as fh:
                text = fh.read(4 << 20)
        except OSError:
            return
        for _, line in logical_lines(text):
            inc = INCLUDE.match(line)
            if inc:
                if depth < 8:
                    for p in include_paths(inc.group(1), file):
                        read(p, depth + 1)
                continue
            try:
                pairs = split_pairs(line)
            except ValueError:
                continue
            if pairs and pairs[0][0].lower() in ("nodename", "partitionname", "nodeset", "downnodes"):
                continue
            for key, value in pairs:
                if key.lower() in wanted:
                    found[key.lower()] = value

    read(resolve_path(path), 0)
    return found
