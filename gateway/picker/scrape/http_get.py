"""One keep-alive HTTP/1.1 connection per replica for its ``/metrics`` page, one GET at a time.

Why not aiohttp, which kvgate uses everywhere else: the scraper makes 20 requests a second to every
replica (GIE's 50 ms), and per request aiohttp's client machinery (request and response objects,
connector bookkeeping, tracing hooks, header multidicts) cost about 2.7 times the CPU of the plain
protocol below on the same page (``python -m kvgate.bench.scrape_client``: bench/results/scrape_client.md),
which every picker process pays whether traffic flows or not. The scraper needs none of what aiohttp
adds: plain HTTP to one known host, a GET with no body, one request in flight per connection.

What is supported: ``Content-Length`` bodies, ``Transfer-Encoding: chunked`` bodies (trailers
ignored), bodies ended by the connection's close, ``Connection: close`` answers (the connection is
opened again on the next GET), IPv6 hosts. Anything else (a malformed status line or header block,
a body cut short) is a :class:`HttpGetError` of kind ``http``; refused or reset connections are kind
``connection``; the caller bounds each GET with its own timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import cast

MAX_HEADER_BYTES = 64 * 1024
MAX_BODY_BYTES = 64 * 1024 * 1024


class HttpGetError(Exception):
    """``kind``: ``connection`` (no connection, or it broke) or ``http`` (not a readable answer)."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind


class _Reader(asyncio.Protocol):
    def __init__(self) -> None:
        self.buffer = bytearray()
        self.closed = False
        self.waiter: asyncio.Future[None] | None = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream transport (not an isinstance check: uvloop's TCPTransport does not derive from
        # asyncio.Transport, and every scrape failed on it)
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self._wake()

    def eof_received(self) -> bool | None:
        self.closed = True
        self._wake()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def more(self) -> None:
        """Wait for more bytes (or the close)."""
        if self.closed:
            raise HttpGetError("connection", "the connection closed before the answer was complete")
        self.waiter = asyncio.get_running_loop().create_future()
        try:
            await self.waiter
        finally:
            self.waiter = None


class MetricsConnection:
    """GETs of one URL path on one ``host:port`` over a kept-alive connection."""

    def __init__(self, host: str, port: int, path: str, accept: str) -> None:
        self._host = host.strip("[]")
        self._port = port
        authority = f"[{self._host}]:{port}" if ":" in self._host else f"{self._host}:{port}"
        self._request = (
            f"GET {path} HTTP/1.1\r\nHost: {authority}\r\nAccept: {accept}\r\n"
            "User-Agent: kvgate-scraper\r\n\r\n"
        ).encode("latin-1")
        self._reader: _Reader | None = None

    async def get(self) -> tuple[int, bytes]:
        """The status and body of one GET. Cancel it (a timeout) and the connection is dropped."""
        reader = self._reader
        if reader is None or reader.closed:
            reader = await self._connect()
        ok = False
        try:
            assert reader.transport is not None
            reader.transport.write(self._request)
            status, body, keep = await _read_response(reader)
            ok = keep
            return status, body
        finally:
            if not ok:
                self.close()

    async def _connect(self) -> _Reader:
        loop = asyncio.get_running_loop()
        try:
            _, reader = await loop.create_connection(_Reader, self._host, self._port)
        except OSError as exc:
            raise HttpGetError("connection", repr(exc)) from None
        self._reader = reader
        return reader

    def close(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None and reader.transport is not None:
            with contextlib.suppress(Exception):
                reader.transport.close()


async def _read_response(reader: _Reader) -> tuple[int, bytes, bool]:
    """(status, body, whether the connection may be reused)."""
    buffer = reader.buffer
    while (end := buffer.find(b"\r\n\r\n")) < 0:
        if len(buffer) > MAX_HEADER_BYTES:
            raise HttpGetError("http", "header block too large")
        await reader.more()
    head = bytes(buffer[:end]).decode("latin-1")
    del buffer[: end + 4]
    status_line, _, header_text = head.partition("\r\n")
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise HttpGetError("http", f"not an HTTP/1.x status line: {status_line[:80]!r}")
    status = int(parts[1])
    headers: dict[str, str] = {}
    for line in header_text.split("\r\n") if header_text else ():
        name, sep, value = line.partition(":")
        if not sep:
            raise HttpGetError("http", f"malformed header line: {line[:80]!r}")
        headers[name.strip().lower()] = value.strip()
    keep = parts[0] == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return status, await _read_chunked(reader), keep
    length = headers.get("content-length")
    if length is not None:
        if not length.isdigit() or int(length) > MAX_BODY_BYTES:
            raise HttpGetError("http", f"bad content-length: {length[:40]!r}")
        size = int(length)
        while len(buffer) < size:
            await reader.more()
        body = bytes(buffer[:size])
        del buffer[:size]
        return status, body, keep
    while not reader.closed:  # no length: the body ends with the connection
        if len(buffer) > MAX_BODY_BYTES:
            raise HttpGetError("http", "body too large")
        with contextlib.suppress(HttpGetError):
            await reader.more()
    body = bytes(buffer)
    buffer.clear()
    return status, body, False


async def _read_chunked(reader: _Reader) -> bytes:
    buffer = reader.buffer
    body = bytearray()
    while True:
        while (end := buffer.find(b"\r\n")) < 0:
            await reader.more()
        size_text = bytes(buffer[:end]).split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise HttpGetError("http", f"bad chunk size: {size_text[:20]!r}") from None
        del buffer[: end + 2]
        if size == 0:
            while (end := buffer.find(b"\r\n")) != 0:  # trailers, up to the empty line
                if end > 0:
                    del buffer[: end + 2]
                else:
                    await reader.more()
            del buffer[:2]
            return bytes(body)
        while len(buffer) < size + 2:
            await reader.more()
        body += buffer[:size]
        del buffer[: size + 2]
        if len(body) > MAX_BODY_BYTES:
            raise HttpGetError("http", "body too large")
