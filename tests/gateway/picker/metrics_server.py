"""A /metrics server a test steers, and helpers to read a scraper's views (the scraper's tests and
the shared-scrapes tests use them)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from aiohttp import web

from kvgate.gateway.picker.scraper import MetricsScraper
from kvgate.policies.types import EndpointView

EVENTUALLY_S = 5.0


def vllm_text(waiting: int, running: int = 1, kv: float = 0.5) -> str:
    return (
        "# TYPE vllm:num_requests_waiting gauge\n"
        f'vllm:num_requests_waiting{{model_name="m"}} {waiting}.0\n'
        f'vllm:num_requests_running{{model_name="m"}} {running}.0\n'
        f'vllm:kv_cache_usage_perc{{model_name="m"}} {kv}\n'
    )


class MetricsServer:
    """A tiny /metrics server whose page, status and delay a test changes while it runs."""

    def __init__(self, text: str, path: str = "/metrics") -> None:
        self.text = text
        self.path = path
        self.status = 200
        self.hold = False  # answer only once released (a hung replica)
        self.hits = 0
        self.arrivals: list[float] = []
        """The event loop's time at each request (the server runs in the test's loop)."""
        self.port = 0
        self._release = asyncio.Event()
        self._runner: web.AppRunner | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def _handle(self, request: web.Request) -> web.Response:
        self.hits += 1
        self.arrivals.append(asyncio.get_running_loop().time())
        if self.hold:
            await self._release.wait()
        return web.Response(text=self.text, status=self.status, content_type="text/plain")

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get(self.path, self._handle)
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=0.5)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port, reuse_address=True).start()
        self.port = runner.addresses[0][1]
        self._runner = runner

    async def stop(self) -> None:
        self._release.set()
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()


ServerFactory = Callable[..., Awaitable[MetricsServer]]


async def eventually(check: Callable[[], bool], what: str, within: float = EVENTUALLY_S) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not check():
        if loop.time() > deadline:
            raise AssertionError(f"not within {within}s: {what}")
        await asyncio.sleep(0.01)


def view(scraper: MetricsScraper, pool: str, address: str) -> EndpointView | None:
    return next((v for v in scraper.snapshot().endpoints(pool) if v.address == address), None)


def healthy(scraper: MetricsScraper, pool: str, address: str) -> bool:
    found = view(scraper, pool, address)
    return found is not None and found.healthy


def waiting_of(scraper: MetricsScraper, pool: str, address: str) -> int | None:
    found = view(scraper, pool, address)
    return None if found is None or found.metrics is None else found.metrics.waiting
