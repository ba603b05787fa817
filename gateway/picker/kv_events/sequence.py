"""One publisher's sequence numbers: in order, a duplicate, a gap or a restart (sans-IO).

vLLM's publisher numbers its batches from 0 and keeps the last ``buffer_steps`` for replay. A
subscriber that joins late, or misses batches, sees a gap; one whose engine restarted sees the
numbers start again from 0. After batches are lost for good the index cannot know what the engine
stored meanwhile, so the endpoint is out of step until the engine clears its cache, restarts, or
``resync_s`` passes (its cache has turned over: what was stored before is evicted by then).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from enum import Enum


class Verdict(Enum):
    IN_ORDER = "in_order"
    DUPLICATE = "duplicate"
    GAP = "gap"
    RESTART = "restart"


class SequenceTracker:
    def __init__(self, *, resync_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.last: int | None = None
        self.expected_before_gap = 0
        """The first missing number of the gap the last ``observe`` reported."""
        self._resync_s = resync_s
        self._clock = clock
        self._lost_at: float | None = None

    @property
    def in_step(self) -> bool:
        if self.last is None:
            return False
        if self._lost_at is None:
            return True
        if self._clock() - self._lost_at >= self._resync_s:
            self._lost_at = None
            return True
        return False

    def observe(self, seq: int) -> Verdict:
        last = self.last
        if last is None:
            self.last = seq
            if seq == 0:
                return Verdict.IN_ORDER
            self.expected_before_gap = 0  # joined late: what came before may be replayed
            return Verdict.GAP
        if seq == last + 1:
            self.last = seq
            return Verdict.IN_ORDER
        if seq > last + 1:
            self.expected_before_gap = last + 1
            self.last = seq
            return Verdict.GAP
        if seq == 0:
            self.last = 0
            self._lost_at = None
            return Verdict.RESTART
        return Verdict.DUPLICATE

    def lost(self) -> None:
        """The gap could not be filled."""
        self._lost_at = self._clock()

    def cleared(self) -> None:
        """The engine cleared its cache: the index (cleared with it) is exact again."""
        self._lost_at = None
