"""The simulated replica's JSON answers (aiohttp responses; the error body is vLLM's)."""

from __future__ import annotations

import json

from aiohttp import web

from kvgate.simulator.request_fields import ApiError


def json_response(data: object, status: int = 200) -> web.Response:
    return web.Response(body=json.dumps(data).encode(), status=status, content_type="application/json")


def json_text_response(text: str) -> web.Response:
    """JSON already serialised (a long prompt's token list is kept serialised: ``EncodeMemo``)."""
    return web.Response(body=text.encode(), content_type="application/json")


def error_response(err: ApiError) -> web.Response:
    return json_response(err.body(), err.status)


def local_address(request: web.Request) -> tuple[str, int]:
    """The address this replica answered on (a prefill names it as ``remote_host``/``remote_port``)."""
    sockname = request.transport.get_extra_info("sockname") if request.transport is not None else None
    if isinstance(sockname, tuple) and len(sockname) >= 2:
        return str(sockname[0]), int(sockname[1])
    return "", 0
