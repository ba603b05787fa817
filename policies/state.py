"""What the scheduler remembers between requests, behind a small synchronous interface.

:class:`SchedulerState` holds the approximate prefix index, this picker's own in-flight requests
and tokens per endpoint (fresher than any scrape: they change at pick time), and session
affinity. It is synchronous on purpose: the shared implementation (Redis,
``gateway.picker.shared_state``) keeps a local mirror that these calls read and write, and syncs it
off the request path.

In-flight accounting cannot leak: each request's contribution is stored under its request id, so
``inflight_remove`` subtracts exactly what ``inflight_add`` added (and is idempotent), and
``forget_endpoint`` drops an endpoint's requests, prefix entries and sessions together.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from kvgate.policies.prefix_index import DEFAULT_MAX_ENTRIES, PrefixIndex


@dataclass(frozen=True, slots=True)
class InFlight:
    """This picker's requests on one endpoint: how many, and their estimated prefill tokens."""

    requests: int = 0
    tokens: int = 0


NO_INFLIGHT = InFlight()


@dataclass(frozen=True, slots=True)
class SessionCounts:
    """Session pins kept, and those dropped (least recent first) to stay within the bound: a
    dropped stored response's pin sends its continuation anywhere (the engine answers 404)."""

    kept: int = 0
    dropped: int = 0


class SchedulerState(Protocol):
    def prefix_match(self, hashes: Sequence[int]) -> Mapping[str, int]:
        """Leading blocks of ``hashes`` held per endpoint address (absent = none)."""
        ...

    def prefix_insert(self, address: str, hashes: Sequence[int], capacity: int) -> None: ...

    def inflight_add(self, request_id: str, address: str, tokens: int) -> None:
        """Count a request on ``address``; a second add for the same id moves it (no double count)."""
        ...

    def inflight_move(self, request_id: str, address: str) -> None:
        """The request is served by ``address`` instead (a fallback); no-op for unknown ids."""
        ...

    def inflight_remove(self, request_id: str) -> None:
        """Subtract exactly what the request added; idempotent."""
        ...

    def inflight(self, address: str) -> InFlight: ...

    def inflight_by_endpoint(self) -> Mapping[str, InFlight]:
        """Every endpoint with requests in flight (absent = none); read-only, for one pass per request."""
        ...

    def session_get(self, session_id: str) -> str | None: ...

    def session_set(self, session_id: str, address: str) -> None: ...

    def session_counts(self) -> SessionCounts:
        """Pins kept now, and pins dropped for room since the start (for metrics)."""
        ...

    def forget_endpoint(self, address: str) -> None:
        """The endpoint left its pool: drop its prefix entries, in-flight requests and sessions."""
        ...


DEFAULT_MAX_SESSIONS = 100_000
"""Session pins kept (a client's ``x-session-id``, a stored response's id), least recent dropped."""


class InProcessState:
    """The embedded default: plain dicts, bounded (prefix entries and sessions), no IO."""

    def __init__(self, *, max_prefix_entries: int = DEFAULT_MAX_ENTRIES,
                 max_sessions: int = DEFAULT_MAX_SESSIONS) -> None:
        self.prefix = PrefixIndex(max_prefix_entries)
        self.max_sessions = max_sessions
        self._requests: dict[str, tuple[str, int]] = {}
        self._per_endpoint: dict[str, InFlight] = {}
        self._sessions: OrderedDict[str, str] = OrderedDict()
        self._sessions_dropped = 0

    # prefix index
    def prefix_match(self, hashes: Sequence[int]) -> Mapping[str, int]:
        return self.prefix.match(hashes)

    def prefix_insert(self, address: str, hashes: Sequence[int], capacity: int) -> None:
        self.prefix.insert(address, hashes, capacity)

    # in-flight
    def inflight_add(self, request_id: str, address: str, tokens: int) -> None:
        self.inflight_remove(request_id)
        tokens = max(0, tokens)
        self._requests[request_id] = (address, tokens)
        self._bump(address, 1, tokens)

    def inflight_move(self, request_id: str, address: str) -> None:
        entry = self._requests.get(request_id)
        if entry is None or entry[0] == address:
            return
        self.inflight_add(request_id, address, entry[1])

    def inflight_remove(self, request_id: str) -> None:
        entry = self._requests.pop(request_id, None)
        if entry is not None:
            self._bump(entry[0], -1, -entry[1])

    def inflight(self, address: str) -> InFlight:
        return self._per_endpoint.get(address, NO_INFLIGHT)

    def inflight_by_endpoint(self) -> Mapping[str, InFlight]:
        return self._per_endpoint

    def inflight_requests(self) -> int:
        """Requests counted in flight across all endpoints (for tests and metrics)."""
        return len(self._requests)

    def _bump(self, address: str, requests: int, tokens: int) -> None:
        now = self._per_endpoint.get(address, NO_INFLIGHT)
        updated = InFlight(now.requests + requests, now.tokens + tokens)
        if updated.requests <= 0:
            self._per_endpoint.pop(address, None)
        else:
            self._per_endpoint[address] = updated

    # sessions
    def session_get(self, session_id: str) -> str | None:
        return self._sessions.get(session_id)

    def session_set(self, session_id: str, address: str) -> None:
        sessions = self._sessions
        sessions[session_id] = address
        sessions.move_to_end(session_id)
        while len(sessions) > self.max_sessions:
            sessions.popitem(last=False)
            self._sessions_dropped += 1

    def session_count(self) -> int:
        return len(self._sessions)

    def session_counts(self) -> SessionCounts:
        return SessionCounts(len(self._sessions), self._sessions_dropped)

    def forget_endpoint(self, address: str) -> None:
        self.prefix.forget(address)
        for request_id in [r for r, (a, _t) in self._requests.items() if a == address]:
            del self._requests[request_id]
        self._per_endpoint.pop(address, None)
        for session_id in [s for s, a in self._sessions.items() if a == address]:
            del self._sessions[session_id]
