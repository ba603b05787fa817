"""Where the engines keep stored responses (the Responses API's ``previous_response_id``).

vLLM with ``VLLM_ENABLE_RESPONSES_API_STORE`` keeps each response, and the conversation that led
to it, on the replica that served it, and answers a request that continues it
(``previous_response_id``) only there: every other replica answers 404. In a pool of N replicas a
picker that does not know where a response is stored loses (N - 1) / N of such requests.

``stored-response-recorder`` pins each request's response id (``InferenceRequest.response_id``: the
client's ``request_id``, or one the picker adds to the body, the id vLLM stores the response under)
to the endpoint that served it, in the scheduler's state (the session pins: shared with other
pickers through Redis as sessions are, bounded as they are). ``stored-response-filter`` keeps, for
a request that continues a stored response, the endpoint that stored it, before any other filter
(above the candidate set's threshold, a large pool's candidates might not include it; a busy or
unhealthy endpoint is still the only one that can answer). A response whose endpoint is not known
(stored before this picker or Redis saw it, forgotten, its endpoint gone) leaves the request to the
profile as any other: the engine answers 404 where it is not stored.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvgate.policies.feedback import FeedbackEnv, FeedbackPlugin
from kvgate.policies.framework import STORED_RESPONSES, SchedulingContext
from kvgate.policies.types import Endpoint, EndpointView, InferenceRequest

KEY_PREFIX = "response:"
"""Stored responses' pins among the state's session pins (a client's session id cannot collide)."""


class StoredResponseFilter:
    """Keeps the endpoint that stored the response this request continues, where it is known."""

    consumes = frozenset({STORED_RESPONSES})

    def filter(self, ctx: SchedulingContext, endpoints: Sequence[EndpointView]) -> Sequence[EndpointView]:
        previous = ctx.request.previous_response_id
        if previous is None:
            return endpoints
        address = ctx.state.session_get(KEY_PREFIX + previous)
        if address is None:
            return endpoints
        kept = [view for view in endpoints if view.address == address]
        if not kept:
            return endpoints
        return tuple(kept) if isinstance(endpoints, tuple) else kept


class StoredResponseRecorder(FeedbackPlugin):
    """Pins each request's response id to the endpoint that served it."""

    produces = frozenset({STORED_RESPONSES})

    def __init__(self, env: FeedbackEnv) -> None:
        self._env = env

    def on_picked(self, request: InferenceRequest, endpoint: Endpoint, now: float) -> None:
        self._pin(request, endpoint.address)

    def on_served(self, request: InferenceRequest, endpoint: Endpoint, now: float) -> None:
        self._pin(request, endpoint.address)  # a fallback served it: stored there

    def _pin(self, request: InferenceRequest, address: str) -> None:
        if request.response_id is not None:
            self._env.state.session_set(KEY_PREFIX + request.response_id, address)
