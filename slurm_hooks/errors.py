"""Error hierarchy. Only the CLI turns these into exit codes and messages."""

from __future__ import annotations


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
