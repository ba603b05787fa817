"""Keep ``kvgate up``'s Envoy running, and say so when it is not.

Envoy is the data plane: when it exits (a crash, the OOM killer, its admin's ``/quitquitquit``) no
request is served, and nothing else in ``kvgate up`` would notice. :class:`EnvoySupervisor` waits on
the process: when it exits it logs an error with Envoy's last lines, reports itself not serving
(``kvgate up``'s ``/readyz`` answers 503 meanwhile), and starts Envoy again after a short pause
(the same bootstrap: it takes its configuration from kvgate's ADS server again). When Envoy exits
:data:`MAX_EXITS` times within :data:`EXIT_WINDOW_S`, or a restart fails, it gives up and sets
:attr:`EnvoySupervisor.failed`: ``kvgate up`` then stops with that message and a non-zero exit status,
so that whatever runs it (systemd, Kubernetes) restarts the whole gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable

from kvgate.gateway.processes.envoy_process import EnvoyProcess

log = logging.getLogger(__name__)

MAX_EXITS = 3
EXIT_WINDOW_S = 60.0
RESTART_PAUSE_S = (0.5, 1.0, 2.0)


class EnvoySupervisor:
    """Watches a started :class:`EnvoyProcess` until :meth:`stop` (``ready``: awaited after each
    restart before Envoy counts as serving again, e.g. its listeners bound)."""

    def __init__(
        self,
        envoy: EnvoyProcess,
        *,
        ready: Callable[[], Awaitable[None]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._envoy = envoy
        self._ready = ready
        self._clock = clock
        self.serving = True
        """False from Envoy's exit until it serves again."""
        self.failed: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        """Set to the reason when Envoy cannot be kept running."""
        self.restarts = 0
        self._exits: deque[float] = deque()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._watch())

    def not_ready(self) -> str | None:
        """A readiness check: why the gateway does not serve now (None: it does)."""
        return None if self.serving else "Envoy is not running (restarting it)"

    async def _watch(self) -> None:
        while True:
            code = await self._envoy.wait()
            self.serving = False
            now = self._clock()
            self._exits.append(now)
            while self._exits and now - self._exits[0] > EXIT_WINDOW_S:
                self._exits.popleft()
            tail = self._envoy.log_tail().strip().splitlines()[-5:]
            log.error("Envoy exited with status %s; its last lines:\n%s", code, "\n".join(tail) or "(none)")
            if len(self._exits) >= MAX_EXITS:
                self._give_up(f"Envoy exited {len(self._exits)} times within {EXIT_WINDOW_S:g} s "
                              f"(last status {code}); stopping")
                return
            pause = RESTART_PAUSE_S[min(len(self._exits) - 1, len(RESTART_PAUSE_S) - 1)]
            await asyncio.sleep(pause)
            try:
                await self._envoy.start()
                if self._ready is not None:
                    await self._ready()
            except Exception as exc:  # a restart that fails ends the gateway, with the reason
                self._give_up(f"Envoy could not be restarted: {exc}")
                return
            self.restarts += 1
            self.serving = True
            log.warning("Envoy restarted (pid %s) and serves again", self._envoy.pid)

    def _give_up(self, reason: str) -> None:
        log.error("%s", reason)
        if not self.failed.done():
            self.failed.set_result(reason)

    async def stop(self) -> None:
        """Stop watching (before Envoy is stopped on purpose)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
