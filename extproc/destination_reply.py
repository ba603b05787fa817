"""The picker's answer once it has picked: the request headers that send the request to the pick
(the destination, the model and stream marks, the attempt timeout, the outcome mark, forged system
headers removed), the ``envoy.lb`` metadata naming the pick and its fallbacks, and in full-duplex
mode the body re-sent in chunks."""

from __future__ import annotations

from collections.abc import Mapping

from kvgate.extproc import names
from kvgate.extproc.actions import ContinueBody, ContinueHeaders, HeaderEdit, Phase, StreamBody
from kvgate.extproc.attempt_timeout import ATTEMPT_TIMEOUT_HEADER
from kvgate.extproc.decision import Decision
from kvgate.extproc.lifecycle_config import LifecycleConfig


def destination_edit(
    decision: Decision, config: LifecycleConfig, strip: tuple[str, ...], outcome: str | None, *,
    content_length: bool,
) -> HeaderEdit:
    """``strip``: the system-owned headers the client sent; ``outcome``: the ``x-kvgate-outcome``
    mark when Envoy reports this request's outcome (``extproc.outcomes``); ``content_length``: the
    body changed, so its length goes too."""
    request = decision.request
    set_headers = [(names.DESTINATION_HEADER, decision.result.pick.address)]
    if request.model:
        set_headers.append((names.MODEL_NAME_HEADER, request.model))
    if request.stream:
        set_headers.append((names.STREAM_HEADER, "1"))
    bound = config.attempt_timeout
    if bound is not None:
        ms = bound.milliseconds(request.max_tokens, streamed=request.stream)
        if ms is not None:
            cap = config.attempt_cap_ms  # (the route's backendRequest: the header would override it)
            set_headers.append((ATTEMPT_TIMEOUT_HEADER, str(ms if cap is None else min(ms, cap))))
    if outcome is not None:
        set_headers.append((names.OUTCOME_HEADER, outcome))
    prefiller = decision.sidecar_prefill
    if prefiller is not None:
        set_headers.append((names.PREFILLER_HEADER, prefiller))
    if content_length:
        set_headers.append(("content-length", str(len(decision.body))))
    # a client's copy of a header set here is overwritten; any other is removed (Envoy would also
    # remove the one this reply sets)
    set_names = {name for name, _ in set_headers}
    remove = tuple(h for h in strip if h not in set_names)
    return HeaderEdit(set=tuple(set_headers), remove=remove)


def destination_metadata(decision: Decision, fallback_count: int) -> Mapping[str, Mapping[str, str]]:
    """``envoy.lb``: the pick, then up to ``fallback_count - 1`` fallbacks, comma-separated."""
    ranked = decision.result.ranked[: max(1, fallback_count)]
    return {names.LB_NAMESPACE: {names.DESTINATION_HEADER: ",".join(e.address for e in ranked)}}


def body_reply(
    decision: Decision, config: LifecycleConfig, strip: tuple[str, ...], outcome: str | None, *,
    replace_body: bool,
) -> ContinueBody:
    """The reply to a request body (BUFFERED or STREAMED): the destination, and the rewritten body
    when it was rewritten and ``replace_body`` (a BUFFERED body; a STREAMED one has gone on)."""
    body = decision.body if decision.body_rewritten and replace_body else None
    return ContinueBody(
        Phase.REQUEST,
        body=body,
        edit=destination_edit(decision, config, strip, outcome, content_length=body is not None),
        clear_route_cache=True,
        metadata=destination_metadata(decision, config.fallback_count),
    )


def header_reply(
    decision: Decision, config: LifecycleConfig, strip: tuple[str, ...], outcome: str | None, *,
    streamed_body: bool,
) -> ContinueHeaders:
    """The reply to held request headers (full duplex, or a bodyless request): the destination."""
    content_length = streamed_body and (decision.body_rewritten or bool(decision.body))
    return ContinueHeaders(
        Phase.REQUEST,
        destination_edit(decision, config, strip, outcome, content_length=content_length),
        clear_route_cache=True,
        metadata=destination_metadata(decision, config.fallback_count),
    )


def streamed_body(body: bytes, end_of_stream: bool, chunk_bytes: int) -> list[StreamBody]:
    """The body re-sent as ``streamed_response`` chunks of at most ``chunk_bytes`` (full duplex)."""
    if not body:
        return [StreamBody(Phase.REQUEST, b"", end_of_stream)]
    last = len(body) - 1
    return [
        StreamBody(Phase.REQUEST, body[at : at + chunk_bytes], end_of_stream and at + chunk_bytes > last)
        for at in range(0, len(body), chunk_bytes)
    ]
