"""Slurm's failures as the project's typed errors, and the Slurm error texts that say which is which."""

from __future__ import annotations

from slurm_hooks.errors import PermanentError, TransientError

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing (~3 ms of each start)
if TYPE_CHECKING:
    from slurm_hooks.slurm import NodeInfo


class SlurmUnavailable(TransientError):
    """The controller did not answer (down, restarting, or too slow)."""


class SlurmTimeout(SlurmUnavailable):
    """A Slurm command ran past its timeout and was killed."""


class SlurmCommandFailed(PermanentError):
    """Slurm refused the request; retrying the same request will not help."""

    def __init__(self, message: str, argv: list[str] | None = None, stderr: str = ""):
        self.argv, self.stderr = argv or [], stderr
        super().__init__(message)


class SlurmNotFound(SlurmCommandFailed):
    """No such node or job (a finished job is forgotten after MinJobAge)."""


class AlreadyRequeued(SlurmCommandFailed):
    """``scontrol requeue`` of a job that is PENDING again: it requeued itself, or another
    run (the watcher, the check on the job's other node) requeued it a moment ago."""


#: What ``scontrol requeue`` prints for a job that is already back in the queue.
_ALREADY_REQUEUED = ("pending",)


def requeue_refused(text: str) -> bool:
    """Whether Slurm refused a requeue because the job is already PENDING again."""
    return any(s in text.lower() for s in _ALREADY_REQUEUED)


class ReasonNotOurs(PermanentError):
    """Another party's drain reason is on the node: we neither overwrite nor resume it.

    Callers record it ("not drained: already drained by someone else with
    reason X") rather than treat it as a failure of the health check.
    """

    def __init__(self, node: NodeInfo, wanted: str):
        self.node, self.reason, self.wanted = node, node.reason, wanted
        verb = "drained" if wanted == "drain" else "resumed"
        super().__init__(f"{node.name}: not {verb}: already drained by someone else with reason {node.reason!r}")


def check_drain(current: NodeInfo, reason: str) -> None:
    """The one gate before any backend drains ``current``: raise :class:`ReasonNotOurs` when another
    party's reason is on it (:func:`slurm_hooks.slurm.may_drain`), :class:`SlurmCommandFailed` for a
    reason Slurm would mangle."""
    from slurm_hooks.slurm import may_drain

    if not may_drain(current):
        raise ReasonNotOurs(current, "drain")
    if not reason or "\n" in reason:
        raise SlurmCommandFailed(f"{current.name}: refusing to drain with an empty or multi-line reason")


#: What Slurm's commands print when the controller cannot be reached (retry later)...
_UNAVAILABLE = (
    "unable to contact slurm controller",
    "socket timed out",
    "zero bytes were transmitted or received",
    "slurm backup controller in standby mode",
    "slurmctld is not responding",
    "communication connection failure",
    "connection refused",
    "resource temporarily unavailable",
    "munge",
    # libslurm found no slurm.conf to read (configless: slurmctld could not be asked for one).
    "could not establish a configuration source",
)
#: ...and when the node or job named does not exist (pyslurm's ``Node.load``: ``Node 'n9' does not exist``).
_NOT_FOUND = ("invalid job id", "invalid node name", "not found", "no nodes in the system", "does not exist")


def classify_message(text: str) -> str | None:
    """``"unavailable"`` (retry later), ``"not_found"``, or None for Slurm's error text."""
    low = text.lower()
    if any(s in low for s in _UNAVAILABLE):
        return "unavailable"
    if any(s in low for s in _NOT_FOUND):
        return "not_found"
    return None
