"""How long one attempt of a non-streamed request may take before the data plane tries the next
endpoint (issue 14: a replica that accepts a request and never answers).

A streamed request has an idle bound on its route (``per_try_idle_timeout``: a replica silent for
that long, no token, is abandoned). A non-streamed request is silent until its whole generation ends,
so no fixed idle bound fits it: a long answer would be cut and sent again to a second replica. What
bounds it is what the request asks for: ``base_s`` (queueing and prefill) plus ``per_token_s`` for
each of its ``max_tokens``. The picker writes the bound into Envoy's router header
``x-envoy-upstream-rq-per-try-timeout-ms``, which the router consumes (it never reaches the replica);
the routes kvgate writes then retry the request on the next ranked endpoint, as for a connect failure.

A request without ``max_tokens`` gets no bound (vLLM then generates up to the context length, and
no duration is too long for that); neither does a streamed one (its route's idle bound applies).
The defaults are generous on purpose: 30 s plus 0.1 s a token is ten tokens a second, slower than
any healthy replica decodes (an H100 takes 2-30 ms a decode step for 1B-32B models, measured), even
with prefills interleaved, so a busy-but-healthy replica's request is not duplicated elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass

ATTEMPT_TIMEOUT_HEADER = "x-envoy-upstream-rq-per-try-timeout-ms"
"""Envoy's router header: the per-try timeout of this request, in milliseconds."""


@dataclass(frozen=True, slots=True)
class AttemptTimeout:
    base_s: float = 30.0
    per_token_s: float = 0.1

    def __post_init__(self) -> None:
        if self.base_s <= 0 or self.per_token_s < 0:
            raise ValueError("an attempt timeout needs base_s > 0 and per_token_s >= 0")

    def milliseconds(self, max_tokens: int | None, *, streamed: bool) -> int | None:
        """The bound of one attempt, or None where none applies (streamed, or no ``max_tokens``)."""
        if streamed or max_tokens is None or max_tokens < 1:
            return None
        return max(1, round((self.base_s + self.per_token_s * max_tokens) * 1000))
