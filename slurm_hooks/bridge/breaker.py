"""Circuit breaker: the bridge never takes out more than a small part of the cluster.

At most ``max_percent`` of all nodes and at most ``max_nodes`` (the smaller,
never below one) may be taken by the bridge inside a sliding ``window``, and
no more than that many may be held at once, however slowly they came: a
cluster-wide drain (a config typo, a driver rollout) must not be worked
through one window at a time by a controller nobody is watching. The first
node over either cap trips the breaker: from then on no node is newly taken
until an admin resets it (``slurm-hooks bridge reset-breaker``) or ``window``
seconds pass (and then only while fewer than the cap are held). Nodes already taken keep being worked on (they were admitted
under the cap) and recovered nodes are always given back: both only ever
restore capacity or finish what was started.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from slurm_hooks.bridge.settings import BreakerSection
from slurm_hooks.bridge.state import BreakerState


@dataclass(frozen=True)
class Decision:
    admitted: bool
    #: True only for the decision that tripped the breaker (the loud one).
    tripped: bool = False
    reason: str = ""


class CircuitBreaker:
    def __init__(self, settings: BreakerSection, state: BreakerState):
        self.settings = settings
        self.state = state
        self._cache: tuple[tuple[float, int], set[str], set[str]] | None = None

    def limit(self, total_nodes: int) -> int:
        share = math.floor(total_nodes * self.settings.max_percent / 100.0)
        return max(1, min(self.settings.max_nodes, share))

    def is_open(self, now: float) -> bool:
        t = self.state.tripped_at
        return t is not None and now - t < self.settings.window

    def expire(self, now: float) -> bool:
        """Forget what left the window, close a latch older than the window; True if anything changed."""
        changed = False
        horizon = now - self.settings.window
        old = [node for node, ts in self.state.taken.items() if ts <= horizon]
        for node in old:
            del self.state.taken[node]
            changed = True
        if self.state.tripped_at is not None and not self.is_open(now):
            self.state.tripped_at = None
            self.state.trip_reason = ""
            self.state.blocked = ()
            changed = True
        return changed

    def in_window(self, now: float, owned_since: dict[str, float] | None = None) -> dict[str, float]:
        """Nodes taken inside the window: our own record joined with the nodes' annotations."""
        horizon = max(now - self.settings.window, self.state.reset_at or -math.inf)
        recent = {n: ts for n, ts in self.state.taken.items() if ts > horizon}
        for node, ts in (owned_since or {}).items():
            if ts > horizon:
                recent[node] = max(ts, recent.get(node, ts))
        return recent

    def _counts(self, now: float, owned_since: dict[str, float] | None) -> tuple[set[str], set[str]]:
        """(nodes taken in the window, nodes held since the last reset), computed once per pass
        and kept up to date by :meth:`admit`: a pass admitting 500 nodes stays linear."""
        key = (now, id(owned_since))
        if self._cache is None or self._cache[0] != key:
            # An admin's reset accepts what is held now: only nodes taken since then count.
            since_reset = self.state.reset_at if self.state.reset_at is not None else -math.inf
            held = {n for n, ts in (owned_since or {}).items() if ts > since_reset}
            self._cache = (key, set(self.in_window(now, owned_since)), held)
        return self._cache[1], self._cache[2]

    def admit(self, node: str, total_nodes: int, now: float, owned_since: dict[str, float] | None = None) -> Decision:
        if self.is_open(now):
            return Decision(False, reason=f"circuit breaker open since {self.state.trip_reason}")
        recent, held = self._counts(now, owned_since)
        cap = self.limit(total_nodes)
        if node not in held and len(held) >= cap:
            self.state.tripped_at = now
            self.state.trip_reason = (
                f"{len(held)} node(s) already held, cap {cap} "
                f"(max {self.settings.max_percent:g}% of {total_nodes}, max {self.settings.max_nodes})"
            )
            return Decision(False, tripped=True, reason=self.state.trip_reason)
        if node not in recent and len(recent) >= cap:
            self.state.tripped_at = now
            self.state.trip_reason = (
                f"{len(recent)} node(s) taken in {self.settings.window:g} s, cap {cap} "
                f"(max {self.settings.max_percent:g}% of {total_nodes}, max {self.settings.max_nodes})"
            )
            return Decision(False, tripped=True, reason=self.state.trip_reason)
        self.state.taken[node] = now
        recent.add(node)
        if owned_since is not None:  # the caller holds it from now on (it adds it to owned_since too)
            held.add(node)
        return Decision(True)

    def reset(self, now: float) -> None:
        self._cache = None
        self.state.reset_at = now
        self.state.taken.clear()
        self.state.tripped_at = None
        self.state.trip_reason = ""
        self.state.blocked = ()
