"""A real ``redis-server`` for tests: started on a free loopback port, stopped (killed) at teardown.

``RedisServer.start()`` / ``kill()`` / ``start()`` again reuse the same port, so a test can take
Redis away mid-run and bring it back. The ``start_redis`` / ``redis_server`` fixtures live in
``tests/conftest.py`` (usable from every test package).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field

from kvgate.gateway.processes.child_process import ChildProcess
from kvgate.gateway.processes.envoy_process import free_port

REDIS_BINARY = shutil.which("redis-server") or "/usr/bin/redis-server"
READY_LINE = r".*Ready to accept connections"


@dataclass
class RedisServer:
    port: int = field(default_factory=free_port)
    child: ChildProcess | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return self.child is not None and self.child.running

    async def start(self, timeout_s: float = 10.0) -> None:
        """Start (or restart) on ``port``; returns once it accepts connections."""
        if self.running:
            return
        self.child = ChildProcess([
            REDIS_BINARY, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
        ], name=f"redis-server :{self.port}", keep_lines=100)
        await self.child.start()
        try:
            await self.child.wait_for_line(READY_LINE, timeout_s)
        except BaseException:
            await self.child.kill()
            raise

    async def kill(self) -> None:
        """SIGKILL: Redis vanishes at once, as in a crash (no persistence: its data is gone)."""
        if self.child is not None:
            await self.child.kill()
