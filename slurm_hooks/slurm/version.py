"""Slurm's version, read from what its programs print (``scontrol --version``, ``slurmd -V``)."""

from __future__ import annotations

import re

#: ``slurm 22.05.8``, ``slurm-wlm 23.11.4``, ``25.11.0``: a two-digit major, then the minor.
_VERSION = re.compile(r"(?<![\d.])(\d{2})\.(\d{1,2})(?:\.\d+)?")


def parse_version(text: str) -> tuple[int, int] | None:
    """(major, minor) from a version line, e.g. (22, 5); None when there is none."""
    m = _VERSION.search(text or "")
    return (int(m.group(1)), int(m.group(2))) if m else None
