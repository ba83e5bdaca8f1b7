"""Prometheus text for node_exporter's textfile collector: the breaker and the last pass.

Formatted and written by :mod:`slurm_hooks.metrics`, the node side's writer.
"""

from __future__ import annotations

from slurm_hooks.metrics import exposition, sample, write_textfile

FILENAME = "slurm_hooks_bridge.prom"

_HELP = {
    "slurm_hooks_bridge_breaker_open": "1 while the circuit breaker refuses to take new nodes.",
    "slurm_hooks_bridge_breaker_taken_in_window": "Nodes taken by the bridge inside the breaker's sliding window.",
    "slurm_hooks_bridge_breaker_limit": "How many nodes the breaker allows inside the window.",
    "slurm_hooks_bridge_breaker_blocked_nodes": "Bad nodes the open breaker keeps the bridge from taking.",
    "slurm_hooks_bridge_owned_nodes": "Kubernetes nodes carrying the bridge's ownership annotation.",
    "slurm_hooks_bridge_waiting_nodes": "Nodes taken and waiting for their Slurm jobs to leave before the drain.",
    "slurm_hooks_bridge_detached_nodes": "Owned nodes no Slurm node maps to any more (Slinky pod moved away).",
    "slurm_hooks_bridge_pass_errors": "Errors in the last pass (retried on the next one).",
    "slurm_hooks_bridge_pass_duration_seconds": "Duration of the last pass.",
    "slurm_hooks_bridge_last_pass_timestamp_seconds": "When the last pass ended.",
}


def render(values: dict[str, float]) -> str:
    """One gauge per value, in the order given."""
    return exposition((name, "gauge", _HELP.get(name, name), [sample(name, {}, value)])
                      for name, value in values.items())


def write(directory: str, values: dict[str, float]) -> str | None:
    """Write atomically (node_exporter must never read half a file); ``None`` when disabled."""
    if not directory:
        return None
    return write_textfile(directory, FILENAME, render(values))
