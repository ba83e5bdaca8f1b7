"""Error hierarchy, and what an error means to the process: :func:`guard` (used only by the
entry point and the CLI) turns these into exit codes and one-line messages."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable


class SlurmHooksError(Exception):
    """Base class: carries a one-line message fit for an admin."""


class ConfigError(SlurmHooksError):
    """The configuration is wrong; nothing is acted upon."""

    def __init__(self, message: str, path: str | None = None, line: int | None = None, key: str | None = None):
        self.path, self.line, self.key = path, line, key
        where = path or "<config>"
        if line is not None:
            where += f":{line}"
        if key:
            where += f": {key}"
        super().__init__(f"{where}: {message}")


class TransientError(SlurmHooksError):
    """Might work on the next try: timeouts, a daemon that is down, HTTP 429/5xx."""


class PermanentError(SlurmHooksError):
    """Will not get better by retrying."""


class ProbeError(SlurmHooksError):
    """The GPU probe could not produce a snapshot at all."""


class SimStateError(ProbeError):
    """A simulated GPU state file is missing or corrupt."""


class CommandError(SlurmHooksError):
    """A subprocess failed; keeps argv, exit code and output for the audit log."""

    def __init__(self, argv: list[str], returncode: int | None, stdout: str, stderr: str, timed_out: bool = False):
        self.argv, self.returncode, self.stdout, self.stderr, self.timed_out = argv, returncode, stdout, stderr, timed_out
        what = "timed out" if timed_out else f"exited {returncode}"
        detail = (stderr or stdout).strip().splitlines()
        tail = f": {detail[-1]}" if detail else ""
        super().__init__(f"{argv[0]} {what}{tail}")


class CommandTimeout(CommandError, TransientError):
    pass


# --- what an error means to the process: exit codes, and one line on stderr ----------------------

EXIT_OK, EXIT_UNHEALTHY, EXIT_USAGE, EXIT_UNAVAILABLE, EXIT_INTERNAL = 0, 1, 2, 3, 4
#: Under the programs ``slurm-hooks install`` lays (which set WRAPPER_ENV), the verdict "unhealthy"
#: exits this instead of 1: Python's own failures (no module, a traceback) exit 1 too, and the wrapper
#: must tell our verdict from our breakage.
EXIT_WRAPPED_UNHEALTHY = 99
WRAPPER_ENV = "SLURM_HOOKS_WRAPPER"
#: ``isolate``: a test failed and no node could be named for it (or the search could not finish).
EXIT_INCONCLUSIVE = 5


def guard(fn: Callable[[], int | None]) -> int:
    """Run ``fn``; turn every error into one line on stderr and a defined exit code."""
    rc = _guarded(fn)
    if rc == EXIT_UNHEALTHY and os.environ.get(WRAPPER_ENV):
        return EXIT_WRAPPED_UNHEALTHY
    return rc


def _guarded(fn: Callable[[], int | None]) -> int:
    try:
        rc = fn()
    except ConfigError as exc:
        return _fail(f"config error: {exc}", EXIT_USAGE)
    except TransientError as exc:
        return _fail(str(exc), EXIT_UNAVAILABLE)
    except SlurmHooksError as exc:
        return _fail(str(exc), EXIT_USAGE)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a bug of ours: one line for the admin, the traceback on request
        if os.environ.get("SLURM_HOOKS_DEBUG"):
            raise
        where = exc.__traceback__
        while where is not None and where.tb_next is not None:
            where = where.tb_next
        loc = f" at {os.path.basename(where.tb_frame.f_code.co_filename)}:{where.tb_lineno}" if where else ""
        return _fail(f"internal error: {type(exc).__name__}: {exc}{loc} (set SLURM_HOOKS_DEBUG=1 for the traceback)",
                     EXIT_INTERNAL)
    return rc if isinstance(rc, int) else EXIT_OK


def _fail(message: str, code: int) -> int:
    print(f"slurm-hooks: {message}", file=sys.stderr)
    return code
