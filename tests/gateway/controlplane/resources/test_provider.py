from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kvgate.gateway.controlplane.resources import ConfigSnapshot, FileProvider, ObjectKey
from kvgate.policies.errors import ConfigError
from tests.gateway.controlplane.resources.manifests import base, pool_ref, route

ROUTE_FILE = "route.yaml"


def _route(weight_a: int, weight_b: int) -> str:
    return route("r", f"    - backendRefs: [{pool_ref('pool-a', weight_a)}, {pool_ref('pool-b', weight_b)}]")


def _weights(snapshot: ConfigSnapshot) -> list[int]:
    return [backend.weight for backend in snapshot.config.routes[0].rules[0].backends]


@pytest.fixture
def manifests(tmp_path: Path) -> Path:
    (tmp_path / "base.yaml").write_text("\n---\n".join(base()))
    (tmp_path / ROUTE_FILE).write_text(_route(70, 30))
    return tmp_path


async def _next(updates: AsyncIterator[ConfigSnapshot], within_s: float = 10.0) -> ConfigSnapshot:
    return await asyncio.wait_for(anext(updates), within_s)


def test_load_once_and_unchanged_content_keeps_the_version(manifests: Path) -> None:
    provider = FileProvider(manifests)
    first = provider.load()
    assert first.version == 1
    assert _weights(first) == [70, 30]
    assert provider.load() is first
    assert provider.status().last_error is None


def test_first_load_failure_raises_and_is_reported(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("kind: [")
    provider = FileProvider(tmp_path)
    with pytest.raises(ConfigError, match=r"bad\.yaml"):
        provider.load()
    assert provider.current is None
    status = provider.status()
    assert status.last_error is not None
    assert "bad.yaml" in status.last_error
    assert status.version == 0


async def test_hot_reload_publishes_changes_and_keeps_last_good(
    manifests: Path, caplog: pytest.LogCaptureFixture
) -> None:
    stop = asyncio.Event()
    provider = FileProvider(manifests, quiet_ms=50, max_batch_ms=300)
    published: asyncio.Queue[ConfigSnapshot] = asyncio.Queue()

    async def publish(snapshot: ConfigSnapshot) -> None:
        published.put_nowait(snapshot)

    watcher = asyncio.create_task(provider.run(publish, stop))

    async def next_snapshot() -> ConfigSnapshot:
        return await asyncio.wait_for(published.get(), 10.0)

    try:
        first = await next_snapshot()
        assert (first.version, _weights(first)) == (1, [70, 30])

        # An edit produces a new snapshot.
        (manifests / ROUTE_FILE).write_text(_route(50, 50))
        second = await next_snapshot()
        assert (second.version, _weights(second)) == (2, [50, 50])

        # A broken file: nothing is published, the last good snapshot stays, the error is reported.
        (manifests / ROUTE_FILE).write_text("apiVersion: v1\nkind: [broken\n")
        for _ in range(100):
            if provider.status().last_error is not None:
                break
            await asyncio.sleep(0.05)
        error = provider.status().last_error
        assert error is not None
        assert ROUTE_FILE in error
        assert provider.current is second
        assert published.empty()

        # A fix loads again and clears the error (said at the failure's level); a new file in a new
        # folder is seen too.
        caplog.clear()
        (manifests / ROUTE_FILE).write_text(_route(90, 10))
        third = await next_snapshot()
        assert (third.version, _weights(third)) == (3, [90, 10])
        assert provider.status().last_error is None
        said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        # (the broken file may have been read once more before the fix: its warning again, first)
        assert said[-1] == "manifests valid again: configuration version 3", said
        assert all(line.startswith("keeping configuration version 2") for line in said[:-1]), said
        (manifests / "more").mkdir()
        (manifests / "more" / "r2.yml").write_text(_route(1, 1).replace("{name: r,", "{name: r2,"))
        fourth = await next_snapshot()
        assert [r.key for r in fourth.config.routes] == [
            ObjectKey("default", "r"),
            ObjectKey("default", "r2"),
        ]

        # Deleting a file is a change too.
        (manifests / "more" / "r2.yml").unlink()
        fifth = await next_snapshot()
        assert [r.key for r in fifth.config.routes] == [ObjectKey("default", "r")]
    finally:
        stop.set()
        await asyncio.wait_for(watcher, 10)


async def test_a_burst_of_writes_is_debounced(manifests: Path) -> None:
    stop = asyncio.Event()
    provider = FileProvider(manifests, quiet_ms=500, max_batch_ms=3000)
    updates = provider.updates(stop)
    try:
        first = await _next(updates)
        for weight in range(1, 6):
            (manifests / ROUTE_FILE).write_text(_route(weight, 1))
        latest = await _next(updates)
        while _weights(latest) != [5, 1]:
            latest = await _next(updates)
        assert latest.version - first.version < 5  # fewer reloads than writes
    finally:
        stop.set()
        await updates.aclose()
