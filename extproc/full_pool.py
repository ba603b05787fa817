"""What a look for room that found a flow-controlled pool full learned, so that the next looks
check only the endpoints that could have room since.

The holding area looks for room at every request end and every few milliseconds while requests
wait (``extproc.holding``); a look that finds none passes over the whole pool (0.35-0.5 ms at 1,000
endpoints on the 2-core machine, ``bench/results/pick_cost.md``). While the pool stays full, room
can come back only where something changed: an endpoint's view (the snapshot names it:
``policies.pool_views``), this picker's request ending on an endpoint (the area is told which), or
another picker's requests ending (shared state: not told), so a full pass is made again at least
every ``RECHECK_S``, and whenever the snapshot cannot say what changed. Time alone takes room away
(stale metrics), never gives it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from kvgate.policies.pool_views import PoolViews
from kvgate.policies.types import EndpointView


class FullPool:
    """Sans-IO: the snapshot a full pass found full, and the endpoints freed since."""

    RECHECK_S = 0.02
    """A full pass at least this often while full: room that came back unseen (another picker's
    requests ended; a request moved off an endpoint by a fallback) waits at most this long."""

    __slots__ = ("_at", "_freed", "_positions", "_snapshot")

    def __init__(self) -> None:
        self._snapshot: Sequence[EndpointView] | None = None
        self._at = -math.inf
        self._positions: dict[str, int] = {}
        self._freed: set[str] = set()

    def forget(self) -> None:
        """Nothing known any more (a configuration change, an end somewhere unknown)."""
        self._snapshot = None

    def freed(self, address: str) -> None:
        """One of this picker's requests on ``address`` ended."""
        if self._snapshot is not None:
            self._freed.add(address)

    def still_full(self, endpoints: Sequence[EndpointView], now: float,
                   has_room: Callable[[EndpointView], bool]) -> bool | None:
        """True: still no room (the endpoints that could have it checked); False: one has room now;
        None: not known (pass over the pool, then :meth:`found_full` when it is full)."""
        last = self._snapshot
        if last is None or now - self._at >= self.RECHECK_S:
            return None
        changed: set[str] | None
        if endpoints is last:
            changed = set()
        elif isinstance(endpoints, PoolViews) and len(endpoints) == len(last):
            changed = endpoints.changed_since(last)
        else:
            changed = None
        if changed is None:
            return None
        positions = self._positions
        for address in changed | self._freed:
            i = positions.get(address)
            if i is None:
                if address in self._freed:
                    continue  # (a request that ended on an endpoint that has left the pool)
                return None
            view = endpoints[i]
            if view.address != address:
                return None
            if has_room(view):
                self.forget()
                return False
        self._snapshot = endpoints
        self._freed = set()
        return True

    def found_full(self, endpoints: Sequence[EndpointView], now: float) -> None:
        """A pass over ``endpoints`` at ``now`` found no room (a pass already: the positions too)."""
        self._positions = {view.address: i for i, view in enumerate(endpoints)}
        self._snapshot = endpoints
        self._at = now
        self._freed = set()
