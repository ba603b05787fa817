"""One keep-alive HTTP/1.1 connection per replica for its ``/metrics`` page, one GET at a time.

Why not aiohttp, which kvgate uses everywhere else: the scraper makes 20 requests a second to every
replica (GIE's 50 ms), and per request aiohttp's client machinery (request and response objects,
connector bookkeeping, tracing hooks, header multidicts) cost about 2.7 times the CPU of the plain
protocol below on the same page (``python -m kvgate.bench.scrape_client``: bench/results/scrape_client.md),
which every picker process pays whether traffic flows or not. The scraper needs none of what aiohttp
adds: plain HTTP to one known host, a GET with no body, one request in flight per connection.

What is supported: HTTP and HTTPS (a client context given), ``Content-Length`` bodies,
``Transfer-Encoding: chunked`` bodies (trailers ignored), bodies ended by the connection's close,
``Connection: close`` answers (the connection is opened again on the next GET), IPv6 hosts.
Anything else (a malformed status line or header block, a body cut short) is a
:class:`HttpGetError` of kind ``http``; refused or reset connections, and failed TLS handshakes,
are kind ``connection``; the caller bounds each GET with its own timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Callable
from typing import cast

MAX_HEADER_BYTES = 64 * 1024
MAX_BODY_BYTES = 64 * 1024 * 1024


class HttpGetError(Exception):
    """``kind``: ``connection`` (no connection, or it broke) or ``http`` (not a readable answer)."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind


class _Reader(asyncio.Protocol):
    """The connection's protocol: bytes into the buffer, each arrival handed to its owner."""

    def __init__(self, owner: MetricsConnection) -> None:
        self.owner = owner
        self.buffer = bytearray()
        self.closed = False
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream transport (not an isinstance check: uvloop's TCPTransport does not derive from
        # asyncio.Transport, and every scrape failed on it)
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self.owner._arrived(self)

    def eof_received(self) -> bool | None:
        self.closed = True
        self.owner._arrived(self)
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed:
            self.closed = True
            self.owner._arrived(self)


Answered = Callable[[object, int, bytes], None]
"""``answered(tag, status, body)``: a GET's answer."""
Failed = Callable[[object, str, str], None]
"""``failed(tag, kind, detail)``: a GET that got no answer (kind ``connection`` or ``http``)."""


class MetricsConnection:
    """GETs of one URL path on one ``host:port`` over a kept-alive connection.

    :meth:`send` starts a GET whose answer (or failure) comes to a callback from the protocol's
    own callbacks: no task, no future, no timer per GET (the scraper's loop makes 20 a second per
    replica; bench/results/scrape_engine.md). The caller bounds each GET: :meth:`close` drops one
    that took too long, and its callbacks are never called. :meth:`get` is the same as a coroutine.
    """

    def __init__(self, host: str, port: int, path: str, accept: str,
                 tls: ssl.SSLContext | None = None) -> None:
        """``tls``: HTTPS with this client context (a model server started with TLS)."""
        self._host = host.strip("[]")
        self._port = port
        self._tls = tls
        authority = f"[{self._host}]:{port}" if ":" in self._host else f"{self._host}:{port}"
        self._request = (
            f"GET {path} HTTP/1.1\r\nHost: {authority}\r\nAccept: {accept}\r\n"
            "User-Agent: kvgate-scraper\r\n\r\n"
        ).encode("latin-1")
        self._reader: _Reader | None = None
        self._connecting: asyncio.Task[None] | None = None
        self._pending: tuple[Answered, Failed, object] | None = None

    @property
    def busy(self) -> bool:
        """A GET is in flight (sent, or waiting for the connection)."""
        return self._pending is not None

    def send(self, answered: Answered, failed: Failed, tag: object) -> None:
        """Start a GET (one at a time): ``answered(tag, status, body)`` or ``failed(tag, kind,
        detail)`` follows, once, unless :meth:`close` comes first."""
        if self._pending is not None:
            raise RuntimeError("a GET is already in flight on this connection")
        self._pending = (answered, failed, tag)
        reader = self._reader
        if reader is not None and not reader.closed and reader.transport is not None:
            reader.transport.write(self._request)
        elif self._connecting is None:
            self._connecting = asyncio.get_running_loop().create_task(self._connect())

    async def get(self) -> tuple[int, bytes]:
        """The status and body of one GET. Cancel it (a timeout) and the connection is dropped."""
        future: asyncio.Future[tuple[int, bytes]] = asyncio.get_running_loop().create_future()

        def answered(_: object, status: int, body: bytes) -> None:
            if not future.done():
                future.set_result((status, body))

        def failed(_: object, kind: str, detail: str) -> None:
            if not future.done():
                future.set_exception(HttpGetError(kind, detail))

        self.send(answered, failed, None)
        try:
            return await future
        except BaseException:
            if self._pending is not None or not future.done():
                self.close()
            raise

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, reader = await loop.create_connection(lambda: _Reader(self), self._host, self._port,
                                                     ssl=self._tls)
        except OSError as exc:  # (ssl.SSLError too: a failed handshake)
            self._connecting = None
            self._fail("connection", repr(exc))
            return
        finally:
            self._connecting = None
        self._reader = reader
        if self._pending is None:  # closed while connecting
            reader.closed = True
            if reader.transport is not None:
                reader.transport.close()
            self._reader = None
            return
        assert reader.transport is not None
        reader.transport.write(self._request)

    def _arrived(self, reader: _Reader) -> None:
        if reader is not self._reader:
            return  # a connection dropped before: its last bytes are nobody's
        if self._pending is None:
            if reader.closed:
                self._reader = None
            return
        try:
            answer = parse_response(reader.buffer, reader.closed)
        except HttpGetError as exc:
            self.close_transport()
            self._fail(exc.kind, str(exc))
            return
        if answer is None:
            if reader.closed:
                self.close_transport()
                self._fail("connection", "the connection closed before the answer was complete")
            return
        status, body, keep = answer
        if not keep:
            self.close_transport()
        answered, _, tag = self._pending
        self._pending = None
        answered(tag, status, body)

    def _fail(self, kind: str, detail: str) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending[1](pending[2], kind, detail)

    def close_transport(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.closed = True
            if reader.transport is not None:
                with contextlib.suppress(Exception):
                    reader.transport.close()

    def close(self) -> None:
        """Drop the connection and any GET in flight (its callbacks are not called)."""
        self._pending = None
        connecting, self._connecting = self._connecting, None
        if connecting is not None:
            connecting.cancel()
        self.close_transport()


def parse_response(buffer: bytearray, closed: bool) -> tuple[int, bytes, bool] | None:
    """One answer from the start of ``buffer`` (taken out of it): (status, body, whether the
    connection may be reused), or None while incomplete (``closed``: no more bytes will come, so a
    body without a length ends here). Raises :class:`HttpGetError` (``http``) for a malformed one."""
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        if len(buffer) > MAX_HEADER_BYTES:
            raise HttpGetError("http", "header block too large")
        return None
    head = bytes(buffer[:end]).decode("latin-1")
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
    start = end + 4
    if "chunked" in headers.get("transfer-encoding", "").lower():
        chunked = _parse_chunked(buffer, start)
        if chunked is None:
            return None
        body, used = chunked
        del buffer[:used]
        return status, body, keep
    length = headers.get("content-length")
    if length is not None:
        if not length.isdigit() or int(length) > MAX_BODY_BYTES:
            raise HttpGetError("http", f"bad content-length: {length[:40]!r}")
        size = int(length)
        if len(buffer) - start < size:
            return None
        body = bytes(buffer[start : start + size])
        del buffer[: start + size]
        return status, body, keep
    if len(buffer) - start > MAX_BODY_BYTES:  # no length: the body ends with the connection
        raise HttpGetError("http", "body too large")
    if not closed:
        return None
    body = bytes(buffer[start:])
    buffer.clear()
    return status, body, False


def _parse_chunked(buffer: bytearray, start: int) -> tuple[bytes, int] | None:
    """A chunked body from ``start``: (body, bytes used up to the end of its trailers), or None."""
    body = bytearray()
    at = start
    while True:
        end = buffer.find(b"\r\n", at)
        if end < 0:
            return None
        size_text = bytes(buffer[at:end]).split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise HttpGetError("http", f"bad chunk size: {size_text[:20]!r}") from None
        at = end + 2
        if size == 0:
            while True:  # trailers, up to the empty line
                end = buffer.find(b"\r\n", at)
                if end < 0:
                    return None
                if end == at:
                    return bytes(body), at + 2
                at = end + 2
        if len(buffer) < at + size + 2:
            return None
        body += buffer[at : at + size]
        at += size + 2
        if len(body) > MAX_BODY_BYTES:
            raise HttpGetError("http", "body too large")
