"""A stand-in for llm-d's routing sidecar (``llm-d-routing-sidecar``, a Go binary no machine here has,
so the drop-in tests use this): a reverse proxy in front of one decode replica that, when a request
carries ``x-prefiller-host-port``, first sends its prefill half to that endpoint (vLLM's
NixlConnector protocol, ``extproc.pd_bodies``) and forwards the decode half with the prefill's
``kv_transfer_params``; everything else (``/metrics``, ``/v1/models``, other requests) passes through.
It records the prefiller header of each request it saw."""

from __future__ import annotations

from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from kvgate.extproc.pd_bodies import decode_body, prefill_body, transfer_params

PREFILLER = "x-prefiller-host-port"
_HOP = {"host", "content-length", "transfer-encoding", "connection", PREFILLER}


@dataclass
class Sidecar:
    upstream: str  # the decode replica, http://ip:port
    seen: list[str | None] = field(default_factory=list)
    runner: web.AppRunner | None = None
    port: int = 0

    async def start(self, host: str = "127.0.0.1") -> str:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._proxy)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, host, 0)
        await site.start()
        self.port = self.runner.addresses[0][1]
        self._http = aiohttp.ClientSession()
        return f"{host}:{self.port}"

    async def stop(self) -> None:
        await self._http.close()
        if self.runner is not None:
            await self.runner.cleanup()

    async def _proxy(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        prefiller = request.headers.get(PREFILLER)
        if request.method == "POST":
            self.seen.append(prefiller)
        if prefiller and request.path.endswith("completions"):
            async with self._http.post(f"http://{prefiller}{request.path_qs}", data=prefill_body(body),
                                       headers={**headers, "content-type": "application/json"}) as answer:
                if answer.status == 200:
                    body = decode_body(body, transfer_params(await answer.read()))
        async with self._http.request(request.method, self.upstream + request.path_qs, data=body,
                                      headers=headers) as upstream:
            response = web.StreamResponse(status=upstream.status, headers={
                k: v for k, v in upstream.headers.items() if k.lower() not in _HOP})
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response
