"""Debian packages the lab needs: install them with apt-get when a program is missing (root only)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from typing import Callable

from slurm_hooks.errors import CommandError
from slurm_hooks.runner import run_command


def missing(programs: Iterable[str]) -> list[str]:
    return [prog for prog in programs if not os.access(prog, os.X_OK)]


def ensure(programs: Iterable[str], packages: tuple[str, ...], error: type[Exception],
           progress: Callable[[str], None] | None = None) -> None:
    """``apt-get install packages`` when any of ``programs`` is missing; ``error`` says what went wrong.

    An install that fails is tried once more after ``apt-get update`` (a machine whose package
    lists were never fetched)."""
    absent = missing(programs)
    if not absent:
        return
    names = " ".join(packages)
    if os.geteuid() != 0:
        raise error(f"missing {', '.join(absent)}; run as root to install {names} with apt-get, "
                    "or install them yourself")
    apt = shutil.which("apt-get") or "/usr/bin/apt-get"
    if not os.access(apt, os.X_OK):
        raise error(f"missing {', '.join(absent)} and no apt-get to install {names}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = [apt, "install", "-y", "-q", "--no-install-recommends", *packages]
    (progress or (lambda m: None))(f"installing {names} with apt-get")
    try:
        run_command(install, 900, env=env)
    except CommandError:
        run_command([apt, "update", "-q"], 300, env=env, check=False)
        try:
            run_command(install, 900, env=env)
        except CommandError as exc:
            raise error(f"apt-get install {names} failed: {exc}") from None
    still = missing(programs)
    if still:
        raise error(f"installed {names} but still missing {', '.join(still)}")
