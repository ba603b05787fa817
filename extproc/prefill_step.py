"""The picker's prefill step of a disaggregated request (``pdExecution: picker``), sans IO.

When the scheduler gives a request a prefill endpoint, the lifecycle holds its reply to the body and
returns a :class:`~extproc.actions.RunPrefill` instead: the servicer (the IO shell) sends the
prefill half (``extproc.pd_bodies.prefill_body``) to the prefill endpoint
(``extproc.prefill_client``) and hands the outcome back as a :class:`~extproc.events.PrefillDone`
event; the lifecycle then releases the request to its decode endpoint with the prefill's
``kv_transfer_params`` in the body (:func:`decode_decision`), or, when the prefill failed,
unchanged: the decode endpoint then computes the prompt itself (aggregated serving; never a lost
request). The response never passes through the picker: Envoy streams it from the decode endpoint
as any other.
"""

from __future__ import annotations

import dataclasses
import ssl
from collections.abc import Mapping

from kvgate.extproc.actions import RunPrefill
from kvgate.extproc.decision import Decision
from kvgate.extproc.events import PrefillDone
from kvgate.extproc.pd_bodies import decode_body, prefill_body

FORWARDED_HEADERS = ("authorization", "x-request-id", "traceparent", "tracestate")
"""The client's headers the prefill half carries too (its credentials, its ids for tracing)."""


def prefill_step(decision: Decision, headers: Mapping[str, str],
                 tls: ssl.SSLContext | None = None) -> RunPrefill:
    """The prefill half of ``decision`` (which has a prefill pick), sent on the client's path
    (over HTTPS with ``tls``: the pool's model servers serve TLS)."""
    prefill = decision.result.prefill
    assert prefill is not None
    forwarded = tuple((name, headers[name]) for name in FORWARDED_HEADERS if name in headers)
    return RunPrefill(prefill.endpoint.address, headers.get(":path", ""), prefill_body(decision.body),
                      forwarded, tls)


def decode_decision(decision: Decision, done: PrefillDone) -> Decision:
    """``decision`` with the body its decode endpoint gets: the prefill's ``kv_transfer_params`` when
    it answered; unchanged when it failed (the decode endpoint prefills)."""
    if done.params is None:
        return decision
    return dataclasses.replace(decision, body=decode_body(decision.body, done.params), body_rewritten=True)
