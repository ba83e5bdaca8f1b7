"""The bridge's loop: lead (or stand by), run a pass every ``interval``, renew the Lease in between."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from slurm_hooks.bridge.leader import LeaderElector
from slurm_hooks.bridge.reconciler import PassResult, Reconciler


def serve(
    reconciler: Reconciler,
    elector: LeaderElector | None,
    stop: threading.Event,
    interval: float,
    *,
    once: bool = False,
    on_pass: Callable[[PassResult], None] = lambda result: None,
    on_error: Callable[[Exception], None] | None = None,
    on_leading: Callable[[bool, str], None] = lambda leading, holder: None,
    monotonic: Callable[[], float] = time.monotonic,
) -> PassResult | None:
    """Run until ``stop`` is set (``once``: one attempt, one pass at most); the last pass's result.

    Without an elector every pass runs (one process, ``leader_election = false``). With one, a
    pass runs only while this process holds the Lease; between passes it renews every
    ``retry_period``, and a standby tries to take over as often. A clean stop releases the Lease.
    """
    last: PassResult | None = None
    leading: bool | None = None
    next_pass = monotonic()
    try:
        while not stop.is_set():
            if elector is not None:
                now_leading = elector.try_acquire_or_renew()
                if now_leading != leading:
                    on_leading(now_leading, elector.holder)
                leading = now_leading
                if not leading:
                    if once:
                        return None
                    stop.wait(elector.retry_period)
                    continue
            if monotonic() >= next_pass:
                try:
                    last = reconciler.run_pass()
                except Exception as exc:  # a controller outlives one bad pass; --once reports it
                    if once or on_error is None:
                        raise
                    on_error(exc)
                else:
                    on_pass(last)
                next_pass = monotonic() + interval
                if once:
                    return last
            wait = next_pass - monotonic()
            if elector is not None:
                wait = min(wait, elector.retry_period)
            stop.wait(max(wait, 0.0))
        return last
    finally:
        if elector is not None:
            elector.release()


def identity(hostname: str, pid: int, token: Any) -> str:
    """client-go's ``<hostname>_<uuid>``, with the pid for a person reading the Lease."""
    return f"{hostname}_{pid}_{str(token)[:8]}"
