"""A fast stand-in model server for the data-path benchmark: ``python -m kvgate.bench.datapath.upstream``.

It answers every POST at once with a small OpenAI completion (usage included, so the picker's
response path parses it), or, when the body says ``"stream": true``, with ``max_tokens`` SSE chunks
of one token each, written as fast as the socket takes them (vLLM's default stream interval: one
chunk per token), then ``data: [DONE]``. It serves a minimal vLLM ``/metrics`` page (idle replica, live
running count) so the picker's scraper accepts it and full scheduling runs. aiohttp's low-level server (C
HTTP parser, no routing or middleware) keeps it far from being the bottleneck. Prints
``datapath-upstream ready URL...`` once listening; stops on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
from collections.abc import Sequence

from aiohttp import web

READY_PREFIX = "datapath-upstream ready"

COMPLETION = json.dumps(
    {
        "id": "cmpl-bench",
        "object": "text_completion",
        "created": 0,
        "model": "bench-model",
        "choices": [{"index": 0, "text": "ok", "finish_reason": "stop", "logprobs": None}],
        "usage": {"prompt_tokens": 256, "completion_tokens": 1, "total_tokens": 257},
    },
    separators=(",", ":"),
).encode()

_METRICS_TEMPLATE = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="bench-model"}} {running}.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="bench-model"}} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="bench-model"}} 0.05
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{{block_size="16",cache_dtype="auto",enable_prefix_caching="True",\
engine="0",num_gpu_blocks="31250"}} 1.0
"""


def metrics_page(running: int) -> bytes:
    """A minimal vLLM 0.11 metrics page: an idle replica with ``running`` requests in flight."""
    return _METRICS_TEMPLATE.format(running=running).encode()


class FastUpstream:
    """The request handler; counts requests and in-flight ones (shown on the metrics page)."""

    def __init__(self) -> None:
        self.requests = 0
        self.running = 0

    async def __call__(self, request: web.BaseRequest) -> web.StreamResponse:
        if request.method == "GET":
            if request.path == "/metrics":
                return web.Response(body=metrics_page(self.running), content_type="text/plain")
            return web.Response(body=b"ok", content_type="text/plain")
        self.running += 1
        try:
            body = await request.read()  # drain the body (chunked from the ext_proc path, sized direct)
            self.requests += 1
            if b'"stream":true' not in body and b'"stream": true' not in body:
                return web.Response(body=COMPLETION, content_type="application/json")
            return await self._stream(request, _max_tokens(body))
        finally:
            self.running -= 1

    async def _stream(self, request: web.BaseRequest, tokens: int) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for index in range(tokens):
            await response.write(CHUNK % index)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


CHUNK = (
    b'data: {"id":"cmpl-bench","object":"text_completion","created":0,"model":"bench-model",'
    b'"choices":[{"index":0,"text":" t%d","logprobs":null,"finish_reason":null}]}\n\n'
)


def _max_tokens(body: bytes) -> int:
    try:
        value = json.loads(body).get("max_tokens", 16)
    except (ValueError, AttributeError):
        return 16
    return value if isinstance(value, int) and 0 < value <= 4096 else 16


async def serve(host: str, ports: Sequence[int]) -> None:
    """Listen on every port of ``ports`` (0 = any free) with one handler; each port is one endpoint."""
    server = web.Server(FastUpstream(), access_log=None)
    runner = web.ServerRunner(server, handle_signals=False)
    await runner.setup()
    for port in ports:
        await web.TCPSite(runner, host, port, backlog=1024).start()
    urls = " ".join(f"http://{address[0]}:{address[1]}" for address in runner.addresses)
    print(f"{READY_PREFIX} {urls}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kvgate.bench.datapath.upstream", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, action="append", help="a port to listen on (repeatable)")
    parser.add_argument("--endpoints", type=int, default=1, help="with no --port: this many free ports")
    args = parser.parse_args(argv)
    ports = args.port or [0] * args.endpoints
    asyncio.run(serve(args.host, ports))


if __name__ == "__main__":
    main()
