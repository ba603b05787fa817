"""A real ``redis-server`` for tests: started on a free loopback port, stopped (killed) at teardown.

``RedisServer.start()`` / ``kill()`` / ``start()`` again reuse the same port, so a test can take
Redis away mid-run and bring it back. The ``start_redis`` / ``redis_server`` fixtures live in
``tests/conftest.py`` (usable from every test package).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import socket
import time
from dataclasses import dataclass, field

REDIS_BINARY = shutil.which("redis-server") or "/usr/bin/redis-server"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class RedisServer:
    port: int = field(default_factory=free_port)
    process: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    async def start(self, timeout_s: float = 10.0) -> None:
        """Start (or restart) on ``port``; returns once it answers PING."""
        if self.running:
            return
        self.process = await asyncio.create_subprocess_exec(
            REDIS_BINARY, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
            stdin=asyncio.subprocess.DEVNULL, start_new_session=True,
        )
        deadline = time.monotonic() + timeout_s
        while not await self._pings():
            if self.process.returncode is not None:
                raise RuntimeError(f"redis-server exited with {self.process.returncode} (port {self.port})")
            if time.monotonic() > deadline:
                await self.kill()
                raise RuntimeError(f"redis-server did not answer on port {self.port}")
            await asyncio.sleep(0.02)

    async def _pings(self) -> bool:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        except OSError:
            return False
        try:
            writer.write(b"PING\r\n")
            await writer.drain()
            line = await asyncio.wait_for(reader.readline(), 1.0)
            return line.startswith(b"+PONG")
        except (OSError, TimeoutError):
            return False
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def kill(self) -> None:
        """SIGKILL: Redis vanishes at once, as in a crash (no persistence: its data is gone)."""
        process = self.process
        if process is None or process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGKILL)
        await process.wait()
