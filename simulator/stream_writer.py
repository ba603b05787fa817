"""A streamed answer on the wire: what goes out before the prefill, the first token at once, then
runs of ``stream_interval`` tokens as the engine makes them, and the closing events (or a 503
event when the replica stops). The ``cut_streams`` fault aborts the connection halfway, as a dead
engine process would."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from aiohttp import web

from kvgate.simulator.driver import Delivery
from kvgate.simulator.openai_api import InferenceRequest
from kvgate.simulator.openai_replies import StreamFormat


async def stream_reply(
    request: web.Request, parsed: InferenceRequest, delivery: Delivery, sse: StreamFormat,
    headers: dict[str, str], *, stream_interval: int, cut_streams: Callable[[], bool],
    on_cut: Callable[[], None],
) -> web.StreamResponse:
    """Write ``delivery``'s tokens to the client as ``sse`` formats them."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                           "Cache-Control": "no-cache", **headers})
    await response.prepare(request)
    with contextlib.suppress(ConnectionResetError):  # the client went away; the caller aborts
        await response.write(sse.preamble())
        if await _write_tokens(response, parsed, delivery, sse, stream_interval, cut_streams):
            on_cut()
            if request.transport is not None:
                request.transport.abort()
    return response


async def _write_tokens(response: web.StreamResponse, parsed: InferenceRequest, delivery: Delivery,
                        sse: StreamFormat, stream_interval: int, cut_streams: Callable[[], bool]) -> bool:
    """The stream to its end (True: cut halfway by the fault, the connection to abort)."""
    sent = 0
    while True:
        await delivery.wait()
        if delivery.error is not None:
            await response.write(sse.error_event(503, str(delivery.error)))
            break
        made = delivery.tokens_made
        finished = delivery.finished
        parts: list[bytes] = []
        if finished is None and sent > 0 and made - sent < stream_interval:
            continue  # wait for a whole chunk (the first token goes out at once, as in vLLM)
        if made > sent:
            if sent == 0:
                parts.append(sse.opening())
            parts.append(sse.token_chunks(sent, made - sent, finished is not None))
            sent = made
        if finished is not None:
            parts.append(sse.closing(parsed, finished))
            await response.write(b"".join(parts))
            break
        if parts:
            await response.write(b"".join(parts))
            if cut_streams() and 2 * sent >= parsed.max_tokens:
                return True
    await response.write_eof()
    return False
