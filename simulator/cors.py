"""CORS as vLLM's API server answers it by default (Starlette's ``CORSMiddleware`` with
``--allowed-origins '["*"]'``, methods and headers ``*``, no credentials): a browser's preflight
(``OPTIONS`` with ``access-control-request-method``) is answered 200 ``OK`` by the server itself, and
every answer to a request that names an ``origin`` allows any origin. A gateway in front must let
the preflight through to the server (kvgate did not: ``extproc/inference_paths.py``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

ALL_METHODS = "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT"
MAX_AGE_S = "600"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def cors(request: web.Request, handler: Handler) -> web.StreamResponse:
    origin = request.headers.get("origin")
    if origin is None:
        return await handler(request)
    if request.method == "OPTIONS" and "access-control-request-method" in request.headers:
        headers = {"access-control-allow-origin": "*", "access-control-allow-methods": ALL_METHODS,
                   "access-control-max-age": MAX_AGE_S}
        wanted = request.headers.get("access-control-request-headers")
        if wanted:
            headers["access-control-allow-headers"] = wanted
        return web.Response(text="OK", headers=headers)
    response = await handler(request)
    if not response.prepared:
        response.headers["access-control-allow-origin"] = "*"
    return response
