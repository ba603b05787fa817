"""The file provider: a directory of manifests, watched, published as validated snapshots.

``FileProvider.load()`` reads once (raising ConfigError, for a fail-fast start). ``updates()``
is an async iterator: the current snapshot first (when there is one), then a new one after each
change of the directory's manifests, bursts of changes debounced into one reload. When a change
cannot be loaded, the last good snapshot stays current and ``status()`` reports the error until
a later change loads.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from watchfiles import Change, awatch

from kvgate.gateway.controlplane.resources.loader import MANIFEST_SUFFIXES, ResourceSet, load_directory
from kvgate.gateway.controlplane.resources.resolved import ValidatedConfig
from kvgate.gateway.controlplane.resources.validate import ValidationOptions, validate
from kvgate.policies.errors import ConfigError

log = logging.getLogger(__name__)

Publish = Callable[["ConfigSnapshot"], Awaitable[None]]
_IDLE_TIMEOUT_MS = 200
"""How long the watcher waits before saying "no change" (its first such answer starts the load)."""


@dataclass(frozen=True, slots=True)
class ConfigSnapshot:
    """One published configuration. ``version`` grows by one per publish; ``content_hash`` is
    the manifests' hash (equal hashes, equal content)."""

    version: int
    content_hash: str
    resources: ResourceSet
    config: ValidatedConfig
    loaded_at: float


@dataclass(frozen=True, slots=True)
class ProviderStatus:
    directory: str
    version: int
    content_hash: str
    last_error: str | None
    last_error_at: float | None
    loaded_at: float | None


def _is_manifest(change: Change, path: str) -> bool:
    """Manifests, anything deleted, and new folders (files created in a new folder right away
    can come before the watch on that folder does)."""
    name = Path(path).name
    if name.startswith("."):
        return False
    return name.endswith(MANIFEST_SUFFIXES) or change is Change.deleted or Path(path).is_dir()


class ConfigProvider(Protocol):
    """Where the configuration comes from (files, a Kubernetes cluster), as the control plane sees it."""

    @property
    def current(self) -> ConfigSnapshot | None: ...

    def status(self) -> ProviderStatus: ...

    async def first(self) -> ConfigSnapshot: ...

    def updates(self, stop: asyncio.Event | None = None) -> AsyncIterator[ConfigSnapshot]: ...


class FileProvider:
    def __init__(
        self,
        directory: Path,
        *,
        options: ValidationOptions | None = None,
        quiet_ms: int = 100,
        max_batch_ms: int = 800,
        force_polling: bool | None = None,
    ) -> None:
        """``quiet_ms``: reload once no change has been seen for this long; ``max_batch_ms``:
        reload at the latest this long after the first change of a burst."""
        self._directory = directory
        self._options = options or ValidationOptions()
        self._quiet_ms = quiet_ms
        self._max_batch_ms = max_batch_ms
        self._force_polling = force_polling
        self._current: ConfigSnapshot | None = None
        self._last_error: str | None = None
        self._last_error_at: float | None = None

    @property
    def current(self) -> ConfigSnapshot | None:
        return self._current

    def status(self) -> ProviderStatus:
        current = self._current
        return ProviderStatus(
            directory=str(self._directory),
            version=current.version if current else 0,
            content_hash=current.content_hash if current else "",
            last_error=self._last_error,
            last_error_at=self._last_error_at,
            loaded_at=current.loaded_at if current else None,
        )

    async def first(self) -> ConfigSnapshot:
        """:meth:`load`, off the event loop."""
        return await asyncio.to_thread(self.load)

    def load(self) -> ConfigSnapshot:
        """Load now; on success the result is current. Raises ConfigError (and records it)."""
        try:
            resources = load_directory(self._directory)
        except ConfigError as exc:
            self._last_error, self._last_error_at = exc.message, time.time()
            raise
        self._last_error = self._last_error_at = None
        current = self._current
        if current is not None and current.content_hash == resources.content_hash:
            return current
        config = validate(resources, self._options, current.config.certificates() if current else None)
        version = current.version + 1 if current else 1
        snapshot = ConfigSnapshot(version, resources.content_hash, resources, config, time.time())
        self._current = snapshot
        return snapshot

    async def _reload(self) -> ConfigSnapshot | None:
        """Load in a worker thread; None when it failed or nothing changed."""
        before = self._current
        failing = self._last_error is not None
        try:
            snapshot = await asyncio.to_thread(self.load)
        except ConfigError as exc:
            log.warning("keeping configuration version %s: %s", before.version if before else 0, exc.message)
            return None
        if failing:  # said at the level the failure was (an operator who saw it sees it end)
            log.warning("manifests valid again: configuration version %s", snapshot.version)
        return None if snapshot is before else snapshot

    async def run(self, publish: Publish, stop: asyncio.Event | None = None) -> None:
        """Watch until ``stop`` is set, calling ``publish`` with each new snapshot.

        The watcher starts before the first load, so no change is missed between them; the
        current snapshot (when there is one) is published first.
        """
        first = True
        async for changes in awatch(
            self._directory,
            watch_filter=_is_manifest,
            debounce=self._max_batch_ms,
            step=self._quiet_ms,
            stop_event=stop,
            force_polling=self._force_polling,
            recursive=True,
            yield_on_timeout=True,
            rust_timeout=_IDLE_TIMEOUT_MS,
        ):
            if first:
                first = False
                await self._reload()
                if self._current is not None:
                    await publish(self._current)
            elif changes:
                snapshot = await self._reload()
                if snapshot is not None:
                    await publish(snapshot)

    async def updates(self, stop: asyncio.Event | None = None) -> AsyncGenerator[ConfigSnapshot, None]:
        """The current snapshot, then each new one, until ``stop`` is set (wraps ``run``)."""
        queue: asyncio.Queue[ConfigSnapshot | None] = asyncio.Queue()
        stop = stop or asyncio.Event()

        async def publish(snapshot: ConfigSnapshot) -> None:
            queue.put_nowait(snapshot)

        async def watch() -> None:
            try:
                await self.run(publish, stop)
            finally:
                queue.put_nowait(None)

        task = asyncio.create_task(watch())
        try:
            while (snapshot := await queue.get()) is not None:
                yield snapshot
        finally:
            stop.set()
            await task
