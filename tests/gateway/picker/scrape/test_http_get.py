"""The scraper's HTTP/1.1 GET client against loopback servers that answer byte for byte as told."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from kvgate.gateway.picker.scrape.http_get import HttpGetError, MetricsConnection

Answer = Callable[[int], bytes]
"""The bytes to send for the n-th request (0-based) on the server; b"" sends nothing (a hang)."""


class Server:
    def __init__(self, answer: Answer, close_after: bool = False) -> None:
        self.answer = answer
        self.close_after = close_after
        self.connections = 0
        self.requests: list[bytes] = []
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.requests.append(head)
                reply = self.answer(len(self.requests) - 1)
                if not reply:
                    await asyncio.sleep(3600)
                writer.write(reply)
                await writer.drain()
                if self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()


StartServer = Callable[..., Awaitable[Server]]


@pytest.fixture
async def serve() -> AsyncIterator[StartServer]:
    started: list[Server] = []

    async def start(answer: Answer, close_after: bool = False) -> Server:
        server = Server(answer, close_after)
        await server.start()
        started.append(server)
        return server

    yield start
    for server in started:
        await server.stop()


def _fixed(body: bytes, status: str = "200 OK", extra: str = "") -> Answer:
    return lambda _: f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


async def test_content_length_bodies_over_one_kept_alive_connection(serve: StartServer) -> None:
    server = await serve(lambda n: _fixed(f"page {n}".encode())(n))
    connection = MetricsConnection("127.0.0.1", server.port, "/metrics", "text/plain")
    assert await connection.get() == (200, b"page 0")
    assert await connection.get() == (200, b"page 1")
    assert server.connections == 1
    first = server.requests[0].decode()
    assert first.startswith("GET /metrics HTTP/1.1\r\n")
    assert f"Host: 127.0.0.1:{server.port}\r\n" in first
    assert "Accept: text/plain\r\n" in first
    connection.close()


async def test_chunked_bodies_with_extensions_and_trailers(serve: StartServer) -> None:
    chunked = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: 1\r\n\r\n")
    server = await serve(lambda _: chunked)
    connection = MetricsConnection("127.0.0.1", server.port, "/metrics", "text/plain")
    assert await connection.get() == (200, b"hello world")
    assert await connection.get() == (200, b"hello world")  # the trailers were consumed
    assert server.connections == 1
    connection.close()


async def test_connection_close_and_bodies_ended_by_the_close(serve: StartServer) -> None:
    closing = await serve(_fixed(b"x", extra="Connection: close\r\n"), close_after=True)
    connection = MetricsConnection("127.0.0.1", closing.port, "/metrics", "text/plain")
    assert await connection.get() == (200, b"x")
    assert await connection.get() == (200, b"x")
    assert closing.connections == 2  # opened again after the server said close
    unbounded = await serve(lambda _: b"HTTP/1.0 200 OK\r\n\r\nuntil the end", close_after=True)
    old = MetricsConnection("127.0.0.1", unbounded.port, "/metrics", "text/plain")
    assert await old.get() == (200, b"until the end")
    connection.close()
    old.close()


async def test_an_error_status_is_returned_with_its_body(serve: StartServer) -> None:
    server = await serve(_fixed(b"down", status="503 Service Unavailable"))
    connection = MetricsConnection("127.0.0.1", server.port, "/metrics", "text/plain")
    assert await connection.get() == (503, b"down")
    connection.close()


@pytest.mark.parametrize("reply", [
    b"SSH-2.0-OpenSSH\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: many\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
])
async def test_what_is_not_http_is_an_http_error(serve: StartServer, reply: bytes) -> None:
    server = await serve(lambda _: reply)
    connection = MetricsConnection("127.0.0.1", server.port, "/metrics", "text/plain")
    with pytest.raises(HttpGetError) as failed:
        await connection.get()
    assert failed.value.kind == "http"


async def test_refused_and_cut_short_are_connection_errors(serve: StartServer) -> None:
    server = await serve(lambda _: b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort", close_after=True)
    connection = MetricsConnection("127.0.0.1", server.port, "/metrics", "text/plain")
    with pytest.raises(HttpGetError) as cut:
        await connection.get()
    assert cut.value.kind == "connection"
    await server.stop()
    await asyncio.sleep(0.05)
    refused = MetricsConnection("127.0.0.1", server.port, "/metrics", "text/plain")
    with pytest.raises(HttpGetError) as failed:
        await refused.get()
    assert failed.value.kind == "connection"


async def test_a_timed_out_get_drops_its_connection(serve: StartServer) -> None:
    server = await serve(lambda n: b"" if n == 0 else _fixed(b"ok")(n))  # the first request hangs
    connection = MetricsConnection("127.0.0.1", server.port, "/metrics", "text/plain")
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.2):
            await connection.get()
    assert await connection.get() == (200, b"ok")  # a fresh connection: no stale bytes read
    assert server.connections == 2
    connection.close()
