"""Slurm hostlist expressions (``gpu[001-128,200]``) and globs, as NHC host masks."""

from __future__ import annotations

from slurm_hooks.values import compile_later

_BRACKET = compile_later(r"\[([^\]]*)\]")


def expand(expr: str) -> list[str]:
    """Expand ``a[1-3],b[01-02]x`` into hostnames; raises ValueError when malformed."""
    hosts: list[str] = []
    for part in _split_top(expr):
        hosts.extend(_expand_one(part))
    return hosts


def _split_top(expr: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in expr:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in {expr!r}")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise ValueError(f"unbalanced '[' in {expr!r}")
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def _expand_one(part: str) -> list[str]:
    m = _BRACKET.search(part)
    if not m:
        return [part]
    prefix, suffix = part[: m.start()], part[m.end() :]
    out = []
    for rng in m.group(1).split(","):
        rng = rng.strip()
        if "-" in rng:
            lo, hi = rng.split("-", 1)
            if not (lo.isdigit() and hi.isdigit()) or int(lo) > int(hi):
                raise ValueError(f"bad range {rng!r} in {part!r}")
            width = len(lo)
            values = [str(i).zfill(width) for i in range(int(lo), int(hi) + 1)]
        elif rng.isdigit():
            values = [rng]
        else:
            raise ValueError(f"bad range {rng!r} in {part!r}")
        for v in values:
            out.extend(_expand_one(prefix + v + suffix))
    return out


def matches(expr: str, host: str) -> bool:
    """True when ``host`` is named by a hostlist expression or a glob (``*``, ``?``)."""
    for part in _split_top(expr):
        if any(c in part for c in "*?") and "[" not in part:
            import fnmatch  # a glob only (most configs name nodes by hostlist)

            if fnmatch.fnmatchcase(host, part):
                return True
        elif host in _expand_one(part):
            return True
    return False


def validate(expr: str) -> None:
    """Raise ValueError when the expression cannot be parsed."""
    for part in _split_top(expr):
        if not (any(c in part for c in "*?") and "[" not in part):
            _expand_one(part)
