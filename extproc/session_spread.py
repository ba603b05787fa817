"""Realtime sessions spread over a pool: the endpoints that took the fewest sessions lately first.

A WebSocket session (``extproc.upgrades``) is released as soon as it is picked: Envoy ends the
ext_proc stream there, so the scheduler's in-flight counts never hold it, and a session carries no
prompt for its scorers to weigh. Picked on the scheduler's scores alone, a burst of sessions landed
13 / 0 / 0 / 7 on four idle replicas (20 at once through ``kvgate up --sim 4``). So each session's
pick keeps (the scheduler's ``keep``) the endpoints that took the fewest sessions in the last
``WINDOW_S`` in this process, and the profile chooses among them; after the window the replicas'
own metrics show the sessions' transcriptions running. Sans-IO: times come from the caller.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from kvgate.policies.types import EndpointView

WINDOW_S = 60.0
"""How long a session's pick counts against its endpoint (a realtime session lasts minutes; its
first transcription shows in the replica's metrics within seconds of its first audio)."""
MAX_TRACKED = 100_000
"""Picks remembered per pool at most (a bound on memory under any session rate)."""


class RecentSessions:
    """Session picks per pool and endpoint over the last ``window_s`` (one per picker process)."""

    def __init__(self, window_s: float = WINDOW_S, max_tracked: int = MAX_TRACKED) -> None:
        self.window_s = window_s
        self._max = max_tracked
        self._picks: dict[str, deque[tuple[float, str]]] = {}
        self._counts: dict[str, dict[str, int]] = {}

    def _expire(self, pool: str, now: float) -> dict[str, int]:
        picks = self._picks.setdefault(pool, deque())
        counts = self._counts.setdefault(pool, {})
        horizon = now - self.window_s
        while picks and (picks[0][0] <= horizon or len(picks) > self._max):
            _, address = picks.popleft()
            left = counts[address] - 1
            if left:
                counts[address] = left
            else:
                del counts[address]
        return counts

    def picked(self, pool: str, address: str, now: float) -> None:
        counts = self._expire(pool, now)
        self._picks[pool].append((now, address))
        counts[address] = counts.get(address, 0) + 1

    def fewest(self, pool: str, endpoints: Sequence[EndpointView], now: float) -> Sequence[EndpointView]:
        """The endpoints that took the fewest sessions lately (all of them when none took any)."""
        counts = self._expire(pool, now)
        if not counts or not endpoints:
            return endpoints
        least = min(counts.get(view.address, 0) for view in endpoints)
        return [view for view in endpoints if counts.get(view.address, 0) == least]
