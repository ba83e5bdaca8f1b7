"""The ROCm Validation Suite (``rvs -r LEVEL``), AMD GPUs' diagnostic at DCGM's levels: the same
``(level, timeout) -> DcgmResult`` the engine runs dcgmi through. Absent, or cut short, it did not
run: ``available`` False or ``passed`` None, never a pass."""

from __future__ import annotations

import os

from slurm_hooks.errors import CommandError, CommandTimeout
from slurm_hooks.models import DcgmResult
from slurm_hooks.runner import run_command

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from slurm_hooks.runner import Runner

DEFAULT_RVS = "/opt/rocm/bin/rvs"
#: What reasons call it (``DcgmResult.tool``).
NAME = "RVS diagnostic"
_SHOWN = 3


def run_diag(level: int, timeout: float, rvs: str = DEFAULT_RVS, runner: Runner = run_command) -> DcgmResult:
    """Run one level; never raises for anything rvs does."""
    if not (os.path.isfile(rvs) and os.access(rvs, os.X_OK)):
        return DcgmResult(level, available=False, reason=f"rvs not installed at {rvs}", tool=NAME)
    argv = [rvs, "-r", str(level)]
    try:
        done = runner(argv, timeout, check=False)
    except CommandTimeout:
        return DcgmResult(level, True, None, reason=f"rvs -r {level} did not finish within our {timeout:g}s budget",
                          tool=NAME)
    except CommandError as exc:
        return DcgmResult(level, exc.returncode is not None, None, reason=f"rvs -r {level} could not run: {exc}",
                          tool=NAME)
    return parse(level, done.stdout, done.returncode)


def parse(level: int, stdout: str, returncode: int) -> DcgmResult:
    """Exit 0 with no test saying FAIL passed; anything else failed, naming the lines that say so."""
    failed = [" ".join(line.split()) for line in stdout.splitlines() if "FAIL" in line.upper().split()
              or " FAIL" in line.upper() or "fail:" in line.lower()]
    if returncode == 0 and not failed:
        return DcgmResult(level, True, True, tool=NAME)
    shown = failed[:_SHOWN] or [f"rvs exited {returncode}"]
    return DcgmResult(level, True, False, failures=tuple((None, line[:200]) for line in shown),
                      reason=f"rvs -r {level} failed", tool=NAME)


def make_runner(rvs: str = DEFAULT_RVS, runner: Runner = run_command,
                max_timeout: float | None = None) -> Callable[[int, float], DcgmResult]:
    def run(level: int, timeout: float) -> DcgmResult:
        if max_timeout is not None:
            timeout = min(timeout, max_timeout)
        return run_diag(level, timeout, rvs=rvs, runner=runner)

    return run
