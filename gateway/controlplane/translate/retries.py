"""A rule's ``retry`` (GEP-1731, the Gateway API's HTTPRouteRetry) as Envoy's retry policy, beside
the picker's own.

A pool whose cluster follows the picker's fallbacks retries without any rule asking
(``envoy_config.pool_retry_policy``: a replica's 5xx or no answer at all, on the next endpoint the
picker ranked, at most ``--retries`` times): that is how a dead or overloaded replica costs no
request. A rule's ``retry`` adjusts it: ``attempts`` bounds the retries (0: none, the first answer
goes to the client), ``codes`` adds status codes to retry on (a 429 or another 4xx: every 5xx is
retried already, for the reason above, even when ``codes`` names only some), ``backoff`` waits
between tries (Envoy's ``retry_back_off``; its maximum is Envoy's default, ten times the base).

For any other route (Service backends, or a pool whose retries are off) the rule's retry is the
whole policy: its ``codes``, or the four every implementation must retry (500, 502, 503, 504) when
it names none; connection failures, refused streams and resets before a response, which GEP-1731
leaves to the implementation and which no backend can have answered; ``attempts`` retries (Envoy's
one when unset).
"""

from __future__ import annotations

from typing import Any

from kvgate.gateway.controlplane import envoy_config as ec
from kvgate.gateway.controlplane.resources.gateway_api import HTTPRouteRetry

JsonDict = dict[str, Any]
REQUIRED_CODES = (500, 502, 503, 504)
"""The codes GEP-1731 says every implementation retries when a rule asks for retries."""
CONNECTION_ERRORS = "connect-failure,refused-stream,reset"


def with_rule_retry(base: JsonDict | None, retry: HTTPRouteRetry | None) -> JsonDict | None:
    """The retry policy of a route whose own is ``base`` (the pool's, or None) and whose rule asks
    for ``retry``; None: no retries."""
    if retry is None:
        return base
    if retry.attempts == 0:
        return None
    if base is None:
        policy: JsonDict = {
            "retry_on": f"{CONNECTION_ERRORS},retriable-status-codes",
            "retriable_status_codes": list(retry.codes or REQUIRED_CODES),
            "num_retries": 1 if retry.attempts is None else retry.attempts,
        }
    else:
        policy = dict(base)
        more = sorted({code for code in retry.codes if code < 500})
        if more:
            policy["retry_on"] = f"{policy['retry_on']},retriable-status-codes"
            policy["retriable_status_codes"] = more
        if retry.attempts is not None:
            policy["num_retries"] = retry.attempts
    backoff = retry.backoff_seconds
    if backoff:
        policy["retry_back_off"] = {"base_interval": ec.duration(backoff)}
    return policy
