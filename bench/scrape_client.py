"""The scraper's HTTP client: aiohttp against kvgate's own keep-alive GET, CPU per request, one run.

``python -m kvgate.bench.scrape_client [--requests 3000] [--rounds 3] [--output FILE]``

A loopback aiohttp server (its own process) serves two pages: the small page of the data-path
benchmark's upstream (what a picker scrapes in ``bench.datapath.onepass``) and a vLLM 0.11 page of
one engine as vLLM renders it (``bench.metrics_pages.vllm_page``, ~64 KB). For each page this process
GETs it ``--requests`` times in a row with aiohttp's ``ClientSession`` (kept-alive connector, what the
scraper used before) and with :class:`gateway.picker.scrape.http_get.MetricsConnection` (what it
uses now), alternated over ``--rounds``, and reports the client's CPU (user + system) per request:
the median over the rounds. The server's CPU is not counted. The scraper does this 20 times a
second per replica in every picker process.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import aiohttp
from aiohttp import web

from kvgate.bench.datapath.full_duplex import machine
from kvgate.bench.metrics_pages import vllm_page
from kvgate.gateway.picker.scrape.http_get import MetricsConnection

SMALL = "# HELP vllm:num_requests_waiting x\n# TYPE vllm:num_requests_waiting gauge\n" + "".join(
    f'vllm:{name}{{model_name="m"}} {value}\n'
    for name, value in (
        ("num_requests_waiting", 1), ("num_requests_running", 2), ("kv_cache_usage_perc", 0.5)
    )
) * 6
PAGES = {"small page": SMALL, "vLLM 0.11 page": vllm_page(1)}


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _serve(page: str) -> tuple[web.AppRunner, int]:
    body = page.encode()

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=body, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, port


async def _per_request(get: Callable[[], Awaitable[int]], requests: int) -> float:
    for _ in range(50):
        await get()
    started = _cpu()
    for _ in range(requests):
        await get()
    return (_cpu() - started) / requests * 1e6


async def _measure(port: int, requests: int) -> dict[str, float]:
    url = f"http://127.0.0.1:{port}/metrics"
    out: dict[str, float] = {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        async def with_aiohttp() -> int:
            async with session.get(url) as response:
                return len(await response.read())

        out["aiohttp"] = await _per_request(with_aiohttp, requests)
    connection = MetricsConnection("127.0.0.1", port, "/metrics", "text/plain")

    async def with_own() -> int:
        _, body = await connection.get()
        return len(body)

    out["MetricsConnection"] = await _per_request(with_own, requests)
    connection.close()
    return out


def _server_main(page_name: str) -> None:
    async def run() -> None:
        runner, port = await _serve(PAGES[page_name])
        print(port, flush=True)
        await asyncio.Event().wait()
        await runner.cleanup()

    asyncio.run(run())


async def run(args: argparse.Namespace) -> str:
    lines = ["# The scraper's HTTP client: CPU per GET (issue 19)", "",
             f"- command: python -m kvgate.bench.scrape_client {' '.join(sys.argv[1:])}".rstrip(),
             *(f"- machine {k}: {v}" for k, v in machine().items()),
             f"- aiohttp: {aiohttp.__version__}", "",
             "| page | bytes | client | µs CPU per GET (median) | rounds | × aiohttp |",
             "|---|---|---|---|---|---|"]
    for name, page in PAGES.items():
        server = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "kvgate.bench.scrape_client", "--serve", name,
            stdout=asyncio.subprocess.PIPE)
        assert server.stdout is not None
        port = int((await server.stdout.readline()).decode())
        try:
            samples: dict[str, list[float]] = {"aiohttp": [], "MetricsConnection": []}
            for _ in range(args.rounds):
                for client, value in (await _measure(port, args.requests)).items():
                    samples[client].append(value)
        finally:
            server.terminate()
            await server.wait()
        base = statistics.median(samples["aiohttp"])
        for client, values in samples.items():
            median = statistics.median(values)
            rounds = ", ".join(f"{v:.0f}" for v in values)
            lines.append(f"| {name} | {len(page.encode()):,} | {client} | {median:.0f} | {rounds} | "
                         f"{median / base:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kvgate.bench.scrape_client", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--serve", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve is not None:
        _server_main(args.serve)
        return
    text = asyncio.run(run(args))
    print(text)
    if args.output is not None:
        args.output.write_text(text)


if __name__ == "__main__":
    main()
