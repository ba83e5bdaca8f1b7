"""Small doubles for the bridge's tests: a clock that only moves when told (Slurm is tests/fakes/slurm.py)."""

from __future__ import annotations

from typing import Any

from slurm_hooks.observe.audit import AuditLog


class Clock:
    """Wall and monotonic time that only moves when a test (or a backoff sleep) says so."""

    def __init__(self, start: float = 1_700_000_000.0):
        self.now = start
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds

    def advance(self, seconds: float) -> None:
        self.now += seconds


def read_audit(path: str) -> list[dict[str, Any]]:
    return list(AuditLog(path).read())


def controlled_by(kind: str = "ReplicaSet", name: str = "train", **metadata: Any) -> dict[str, Any]:
    """Pod metadata naming its controller (``controller: true``), as a Deployment's or a Job's pods have."""
    ref = {"apiVersion": "apps/v1", "kind": kind, "name": name, "uid": f"uid-{kind}-{name}", "controller": True}
    return {"metadata": {**metadata, "ownerReferences": [ref]}}
