"""The picker's admin HTTP server: Prometheus metrics, liveness, readiness, pool debug view.

``GET /metrics`` (Prometheus text), ``GET /healthz`` (the process is up), ``GET /readyz`` (200 once
the ext_proc server serves and every configured pool has at least one endpoint with fresh metrics,
and, unless ``pools_required`` is off, there is a pool; 503 with the reason otherwise),
``GET /debug/pools`` (JSON: pools, endpoints, metrics, in-flight),
``GET /status`` (JSON from ``status_provider``, the control plane's resource conditions and xDS
state; 404 when no control plane runs in this process).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from kvgate.gateway.picker.telemetry import GatewayTelemetry
from kvgate.policies.errors import ConfigError


class AdminSource(Protocol):
    @property
    def telemetry(self) -> GatewayTelemetry: ...

    @property
    def grpc_port(self) -> int: ...

    def pool_report(self) -> list[dict[str, object]]: ...


def readiness_problems(report: list[dict[str, object]], *, pools_required: bool = True) -> list[str]:
    problems: list[str] = []
    if not report and pools_required:
        problems.append("no pools configured")
    for pool in report:
        endpoints = pool["endpoints"]
        assert isinstance(endpoints, list)
        if not any(e["healthy"] and e["waiting"] is not None for e in endpoints):
            problems.append(f"pool {pool['name']}: no endpoint with fresh metrics")
    return problems


class AdminServer:
    def __init__(self, source: AdminSource, *, host: str, port: int) -> None:
        self._source = source
        self._host = host
        self._port = port
        self._runner: web.AppRunner | None = None
        self.port = 0
        self.status_provider: Callable[[], Mapping[str, Any]] | None = None
        """Set by the composition root when a control plane runs (``kvgate up``)."""
        self.pools_required = True
        """A picker with no pool is not ready; a gateway whose routes name Services alone is
        (``kvgate up`` turns it off)."""
        self.readiness_checks: list[Callable[[], str | None]] = []
        """More reasons not to be ready, asked on each ``/readyz`` (the composition root's: e.g.
        ``kvgate up``'s Envoy not running); each answers None when all is well."""
        self.envoy_stats_url: str | None = None
        """Envoy's admin ``/stats/prometheus`` (``kvgate up``): served at ``/metrics/envoy``, so
        Envoy's own metrics (requests, upstream errors, TLS handshakes) are scraped where kvgate's
        are (Envoy's admin listens on loopback only)."""
        self.metrics_auth: Callable[[str | None], Awaitable[bool]] | None = None
        """Set to require a bearer token on ``/metrics`` (``--metrics-endpoint-auth``): called with
        the token (None: no Authorization header); False answers 401 (no token) or 403."""

    def _app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/metrics/envoy", self._envoy_metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/debug/pools", self._pools)
        app.router.add_get("/status", self._status)
        return app

    async def _status(self, _: web.Request) -> web.Response:
        if self.status_provider is None:
            return web.json_response({"error": "no control plane runs in this process"}, status=404)
        return web.json_response(dict(self.status_provider()))

    async def _refused(self, request: web.Request) -> web.Response | None:
        """401 (no token) or 403 when ``metrics_auth`` refuses the request, else None."""
        if self.metrics_auth is None:
            return None
        token = _bearer(request)
        if await self.metrics_auth(token):
            return None
        status, error = (401, "unauthorized") if token is None else (403, "forbidden")
        return web.json_response({"error": error}, status=status)

    async def _metrics(self, request: web.Request) -> web.Response:
        refused = await self._refused(request)
        if refused is not None:
            return refused
        body = self._source.telemetry.exposition()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _envoy_metrics(self, request: web.Request) -> web.Response:
        refused = await self._refused(request)
        if refused is not None:
            return refused
        if self.envoy_stats_url is None:
            return web.json_response({"error": "no Envoy runs beside this process"}, status=404)
        try:
            timeout = aiohttp.ClientTimeout(total=5.0)
            async with aiohttp.ClientSession(timeout=timeout) as session, session.get(
                    self.envoy_stats_url) as answer:
                body = await answer.read()
                status = answer.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            return web.json_response({"error": f"Envoy's admin did not answer: {exc!r}"}, status=503)
        if status != 200:
            return web.json_response({"error": f"Envoy's admin answered {status}"}, status=503)
        return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def _healthz(self, _: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _readyz(self, _: web.Request) -> web.Response:
        problems = [] if self._source.grpc_port else ["ext_proc server not started"]
        problems += readiness_problems(self._source.pool_report(), pools_required=self.pools_required)
        problems += [problem for check in self.readiness_checks if (problem := check()) is not None]
        if problems:
            return web.json_response({"status": "not ready", "problems": problems}, status=503)
        return web.json_response({"status": "ready"})

    async def _pools(self, _: web.Request) -> web.Response:
        return web.json_response({"pools": self._source.pool_report()})

    async def start(self) -> None:
        self._runner = web.AppRunner(self._app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            self._runner = None
            raise ConfigError(
                f"the admin port {self._host}:{self._port} cannot be bound ({exc.strerror}): "
                "choose another (--admin-port; 0: any free)"
            ) from None
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        self.port = sockets[0].getsockname()[1] if sockets else self._port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


def _bearer(request: web.Request) -> str | None:
    header = request.headers.get("Authorization", "")
    return header[7:].strip() if header.lower().startswith("bearer ") else None
