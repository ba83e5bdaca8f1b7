"""Which Slurm node are we? ``--node``, then SLURMD_NODENAME, then the short hostname."""

from __future__ import annotations

import os
import socket


def resolve(explicit: str | None = None) -> str:
    if explicit:
        return explicit
    env = os.environ.get("SLURMD_NODENAME")
    if env:
        return env
    return socket.gethostname().split(".")[0]
