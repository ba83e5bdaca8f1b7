"""Polling for the lab, its tests and its benchmarks: one loop, so that each caller only says
what it waits for and how it fails."""

from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")


def poll(predicate: Callable[[], T], timeout: float, interval: float = 0.05) -> T | None:
    """``predicate()``'s first truthy value, asked every ``interval`` s; None once ``timeout`` s
    have passed (it is asked once more at the deadline)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            return None
        time.sleep(interval)
