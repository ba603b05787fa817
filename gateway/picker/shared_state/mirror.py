"""``MirroredState``: the scheduler's state served from a local mirror that peers feed (no IO).

It implements ``policies.state.SchedulerState``. Every read is served from memory: an
``InProcessState`` holds this picker's own in-flight requests, the prefix index and the session
pins; peers' in-flight counts per endpoint are kept beside it and summed in. Writes land locally
at once and, for what peers need (prefix insertions, session pins), are queued in a bounded
outbox that the IO shell (``gateway.picker.shared_state.sync``) drains to Redis. A full outbox drops the
event and counts it: sharing is best effort, routing never waits for it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence

from kvgate.gateway.picker.shared_state.codec import PrefixInsert, SessionPin, SharedEvent
from kvgate.policies.prefix_index import DEFAULT_MAX_ENTRIES
from kvgate.policies.state import (
    DEFAULT_MAX_SESSIONS,
    NO_INFLIGHT,
    InFlight,
    InProcessState,
    SessionCounts,
)


class MirroredState:
    def __init__(
        self,
        *,
        outbox_limit: int = 10_000,
        max_prefix_entries: int = DEFAULT_MAX_ENTRIES,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
    ) -> None:
        self.local = InProcessState(max_prefix_entries=max_prefix_entries, max_sessions=max_sessions)
        self.outbox_limit = outbox_limit
        self.dropped = 0
        """Events not shared because the outbox was full."""
        self._outbox: deque[SharedEvent] = deque()
        self._where: dict[str, str] = {}
        self._peer_totals: dict[str, InFlight] = {}
        self._merged: dict[str, InFlight] = {}

    # --- SchedulerState: prefix index --------------------------------------------------------
    def prefix_match(self, hashes: Sequence[int]) -> Mapping[str, int]:
        return self.local.prefix_match(hashes)

    def prefix_insert(self, address: str, hashes: Sequence[int], capacity: int) -> None:
        self.local.prefix_insert(address, hashes, capacity)
        if hashes:
            self._share(PrefixInsert(address, tuple(hashes), capacity))

    # --- SchedulerState: in-flight ------------------------------------------------------------
    def inflight_add(self, request_id: str, address: str, tokens: int) -> None:
        previous = self._where.get(request_id)
        self.local.inflight_add(request_id, address, tokens)
        self._where[request_id] = address
        if previous is not None and previous != address:
            self._refresh(previous)
        self._refresh(address)

    def inflight_move(self, request_id: str, address: str) -> None:
        previous = self._where.get(request_id)
        if previous is None or previous == address:
            return
        self.local.inflight_move(request_id, address)
        self._where[request_id] = address
        self._refresh(previous)
        self._refresh(address)

    def inflight_remove(self, request_id: str) -> None:
        previous = self._where.pop(request_id, None)
        self.local.inflight_remove(request_id)
        if previous is not None:
            self._refresh(previous)

    def inflight(self, address: str) -> InFlight:
        return self._merged.get(address, NO_INFLIGHT)

    def inflight_by_endpoint(self) -> Mapping[str, InFlight]:
        return self._merged

    # --- SchedulerState: sessions -------------------------------------------------------------
    def session_get(self, session_id: str) -> str | None:
        return self.local.session_get(session_id)

    def session_set(self, session_id: str, address: str) -> None:
        changed = self.local.session_get(session_id) != address
        self.local.session_set(session_id, address)
        if changed:
            self._share(SessionPin(session_id, address))

    def session_counts(self) -> SessionCounts:
        return self.local.session_counts()

    def forget_endpoint(self, address: str) -> None:
        self.local.forget_endpoint(address)
        for request_id in [r for r, a in self._where.items() if a == address]:
            del self._where[request_id]
        self._peer_totals.pop(address, None)
        self._merged.pop(address, None)

    # --- what the IO shell calls --------------------------------------------------------------
    def own_inflight(self) -> Mapping[str, InFlight]:
        """This picker's own contribution per endpoint (what it publishes)."""
        return self.local.inflight_by_endpoint()

    def take_outbox(self, limit: int) -> list[SharedEvent]:
        outbox = self._outbox
        return [outbox.popleft() for _ in range(min(limit, len(outbox)))]

    @property
    def outbox_size(self) -> int:
        return len(self._outbox)

    def apply_peer_events(self, events: Sequence[SharedEvent]) -> None:
        """Peers' prefix insertions and session pins, applied to the mirror (not re-shared)."""
        for event in events:
            if isinstance(event, PrefixInsert):
                self.local.prefix_insert(event.address, event.hashes, event.capacity)
            else:
                self.local.session_set(event.session_id, event.address)

    def set_peer_inflight(self, peers: Sequence[Mapping[str, InFlight]]) -> None:
        """Replace every peer's contribution with the latest read (an empty list forgets them all)."""
        totals: dict[str, InFlight] = {}
        for contribution in peers:
            for address, value in contribution.items():
                now = totals.get(address, NO_INFLIGHT)
                totals[address] = InFlight(now.requests + value.requests, now.tokens + value.tokens)
        stale = self._peer_totals.keys() - totals.keys()
        self._peer_totals = totals
        for address in stale | totals.keys():
            self._refresh(address)

    def peer_inflight(self) -> Mapping[str, InFlight]:
        return self._peer_totals

    # --- internals ----------------------------------------------------------------------------
    def _share(self, event: SharedEvent) -> None:
        if len(self._outbox) >= self.outbox_limit:
            self.dropped += 1
            return
        self._outbox.append(event)

    def _refresh(self, address: str) -> None:
        own = self.local.inflight(address)
        peer = self._peer_totals.get(address, NO_INFLIGHT)
        requests = own.requests + peer.requests
        if requests <= 0:
            self._merged.pop(address, None)
        elif peer is NO_INFLIGHT:
            self._merged[address] = own
        else:
            self._merged[address] = InFlight(requests, own.tokens + peer.tokens)
