"""Which Slurm node are we? ``--node``, then SLURMD_NODENAME, then the short hostname."""

from __future__ import annotations

import os


def resolve(explicit: str | None = None) -> str:
    if explicit:
        return explicit
    env = os.environ.get("SLURMD_NODENAME")
    if env:
        return env
    return os.uname().nodename.split(".")[0]  # what socket.gethostname() returns, without importing socket
