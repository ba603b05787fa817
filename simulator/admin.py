"""The fleet admin HTTP server (``--admin-port``): stop/start replicas, set faults, read stats.

Endpoints (JSON in and out; errors as ``{"error": {"message", "type", "param", "code"}}``):

- ``GET  /health`` → 200.
- ``GET  /replicas`` → ``[{"index", "url", "listening"}, …]``.
- ``POST /replicas/{i}/stop`` → the replica's listener closes (connections refused), its in-flight
  requests end with an error; answers ``{"index", "url", "listening": false}``. Idempotent.
- ``POST /replicas/{i}/start`` → listens again on the same address; ``{"index", "url", "listening": true}``.
- ``POST /replicas/{i}/restart`` → the replica's process restarts: in-flight requests end with an
  error, its KV cache, counters and KV-event sequence start from empty on the same addresses.
- ``GET  /replicas/{i}/faults`` / ``POST /replicas/{i}/faults`` (body: any of ``error_rate``, ``hang``,
  ``slowdown``, ``metrics_delay_s``, ``metrics_frozen``) → the replica's faults after the change.
- ``GET  /stats?window_s=60`` → ``{"replicas": [per-replica /sim/stats + url, listening], "totals": {…},
  "loop_lag": {"samples", "p50_ms", "p99_ms", "max_ms", "mean_ms"}}``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from kvgate.simulator.http_replies import json_response
from kvgate.simulator.openai_api import decode_json_object
from kvgate.simulator.request_fields import ApiError

if TYPE_CHECKING:
    from kvgate.simulator.fleet import Fleet, ReplicaListener

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def make_admin_app(fleet: Fleet) -> web.Application:
    app = web.Application()

    def guarded(handler: Callable[[web.Request], Awaitable[Any]]) -> Handler:
        async def wrapper(request: web.Request) -> web.StreamResponse:
            try:
                return json_response(await handler(request))
            except ApiError as err:
                return json_response(err.body(), err.status)

        return wrapper

    def listener_of(request: web.Request) -> ReplicaListener:
        try:
            return fleet.listener(int(request.match_info["index"]))
        except (KeyError, ValueError) as exc:
            raise ApiError(404, f"no such replica: {request.match_info['index']}", "index") from exc

    def describe(listener: ReplicaListener) -> dict[str, Any]:
        return {"index": listener.replica.config.index, "url": listener.url, "listening": listener.running}

    async def health(request: web.Request) -> web.StreamResponse:
        return web.Response(status=200)

    async def replicas(request: web.Request) -> Any:
        return [describe(listener) for listener in fleet.listeners]

    async def stop(request: web.Request) -> Any:
        listener = listener_of(request)
        await listener.stop()
        return describe(listener)

    async def start(request: web.Request) -> Any:
        listener = listener_of(request)
        try:
            await listener.start()
        except OSError as exc:
            raise ApiError(500, f"cannot listen on {listener.url}: {exc}") from exc
        return describe(listener)

    async def restart(request: web.Request) -> Any:
        listener = listener_of(request)
        try:
            return describe(await fleet.restart(fleet.listeners.index(listener)))
        except OSError as exc:
            raise ApiError(500, f"cannot listen on {listener.url}: {exc}") from exc

    async def get_faults(request: web.Request) -> Any:
        return listener_of(request).replica.faults.to_json()

    async def post_faults(request: web.Request) -> Any:
        listener = listener_of(request)
        body = decode_json_object(await request.read())
        try:
            return listener.replica.set_faults(body).to_json()
        except ValueError as exc:
            raise ApiError(400, str(exc)) from exc

    async def stats(request: web.Request) -> Any:
        try:
            window = float(request.query.get("window_s", "60"))
        except ValueError as exc:
            raise ApiError(400, "window_s must be a number", "window_s") from exc
        return fleet.stats(window)

    app.router.add_get("/health", health)
    app.router.add_get("/replicas", guarded(replicas))
    app.router.add_post("/replicas/{index}/stop", guarded(stop))
    app.router.add_post("/replicas/{index}/start", guarded(start))
    app.router.add_post("/replicas/{index}/restart", guarded(restart))
    app.router.add_get("/replicas/{index}/faults", guarded(get_faults))
    app.router.add_post("/replicas/{index}/faults", guarded(post_faults))
    app.router.add_get("/stats", guarded(stats))
    return app

