"""The HTTP side of ``GET /v1/models``: a loopback aiohttp server that Envoy's ``/v1/models`` routes
lead to (the picker's ext_proc filter is off on them, no replica is asked). The route tells which
Gateway listener port the request came in on (``x-kvgate-listener-port``); the answer is the
catalog of that port (:mod:`gateway.controlplane.models.catalog`) over the latest configuration and reports.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping

from aiohttp import web

from kvgate.extproc.names import LISTENER_PORT_HEADER
from kvgate.gateway.controlplane.models.catalog import ModelEntry, catalog, model_list, model_object
from kvgate.gateway.controlplane.resources import ValidatedConfig
from kvgate.gateway.picker.replica_models import PoolModels
from kvgate.policies.errors import KvgateError, ModelNotFoundError


def _json(body: object, status: int = 200) -> web.Response:
    return web.Response(
        status=status, text=json.dumps(body, separators=(",", ":")), content_type="application/json"
    )


def _error(error: KvgateError) -> web.Response:
    return _json(error.to_openai(), error.status)


class ModelsServer:
    def __init__(
        self,
        config: Callable[[], ValidatedConfig | None],
        reports: Callable[[], Mapping[str, PoolModels]],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self._config = config
        self._reports = reports
        self._host = host
        self._port = port
        self._started = int(time.time())
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def address(self) -> str:
        return f"{self._host}:{self.port}"

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self._list)
        app.router.add_get("/v1/models/{model:.+}", self._retrieve)
        return app

    async def start(self) -> None:
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port)
        await site.start()
        sockets = getattr(site._server, "sockets", None) or []
        self.port = int(sockets[0].getsockname()[1]) if sockets else self._port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _list(self, request: web.Request) -> web.Response:
        config = self._config()
        if config is None:
            return _json(model_list((), self._started))
        return _json(model_list(self._catalog(config, request), self._started))

    async def _retrieve(self, request: web.Request) -> web.Response:
        model = request.match_info["model"]
        config = self._config()
        entries = self._catalog(config, request) if config is not None else ()
        for entry in entries:
            if entry.id == model:
                return _json(model_object(entry, self._started))
        return _error(ModelNotFoundError.of(model))

    def _catalog(self, config: ValidatedConfig, request: web.Request) -> tuple[ModelEntry, ...]:
        try:
            port = int(request.headers.get(LISTENER_PORT_HEADER, ""))
        except ValueError:  # not through a route kvgate wrote: the lowest listener port
            ports = sorted({a.port for r in config.routes for a in r.attachments})
            port = ports[0] if ports else 0
        return catalog(config, port, self._reports())
