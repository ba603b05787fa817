"""The informer against the FAKE API server (tests/kube_api_fake.py; no real one can run here):
list then watch, resume a dropped watch without listing, list again on 410 Gone (noticing deletes
made meanwhile), back off on errors, treat a kind the server does not serve as empty."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from kvgate.gateway.controlplane.kubernetes.client import KindSpec, KubeClient
from kvgate.gateway.controlplane.kubernetes.informer import ObjectCache, follow
from tests.kube_api_fake import FakeApiServer

POD = KindSpec("v1", "Pod", "pods")


def pod(name: str, ip: str = "10.0.0.1", ready: bool = True) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": "llm"}},
        "status": {"phase": "Running", "podIP": ip,
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def test_the_cache_follows_events_and_ignores_what_only_moves_the_version() -> None:
    cache = ObjectCache(POD)
    assert cache.replace([{**pod("a"), "metadata": {"name": "a", "resourceVersion": "5"}}], "5")
    assert cache.synced
    assert cache.resource_version == "5"
    assert not cache.apply({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "7"}}})
    assert cache.resource_version == "7"
    assert cache.apply({"type": "ADDED", "object": pod("b")})
    assert cache.apply({"type": "DELETED", "object": pod("b")})
    assert not cache.apply({"type": "DELETED", "object": pod("b")})
    assert [o["metadata"]["name"] for o in cache.objects()] == ["a"]


@pytest.fixture
async def fake() -> AsyncIterator[FakeApiServer]:
    server = FakeApiServer(bookmark_interval_s=0.05)
    await server.start()
    yield server
    await server.stop()


Following = tuple[ObjectCache, asyncio.Event, asyncio.Task[None], KubeClient, list[int]]


async def _following(fake: FakeApiServer, **kwargs: Any) -> Following:
    client = await KubeClient.connect(host=fake.url)
    cache = ObjectCache(POD)
    stop = asyncio.Event()
    changes: list[int] = []
    task = asyncio.create_task(follow(client, cache, "default", lambda: changes.append(1), stop,
                                      watch_timeout_s=30, **kwargs))
    return cache, stop, task, client, changes


async def _until(check: Callable[[], bool], what: str, timeout_s: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not check():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def _names(cache: ObjectCache) -> set[str]:
    return {o["metadata"]["name"] for o in cache.objects()}


def _lists(fake: FakeApiServer) -> int:
    return sum(1 for r in fake.requests if "watch=true" not in r)


async def test_a_dropped_watch_resumes_from_its_version_without_listing(fake: FakeApiServer) -> None:
    await fake.apply(pod("a"))
    cache, stop, task, client, _ = await _following(fake)
    try:
        await _until(lambda: _names(cache) == {"a"}, "the list")
        await _until(lambda: fake.watches_opened == 1, "the watch")  # else there is none to drop
        await fake.drop_watches()
        await fake.apply(pod("b"))  # while the watch is being re-opened
        await _until(lambda: _names(cache) == {"a", "b"}, "the event after the resumed watch")
        assert _lists(fake) == 1
        watches = [r for r in fake.requests if "watch=true" in r]
        assert len(watches) >= 2
        assert "allowWatchBookmarks=true" in watches[-1]
    finally:
        stop.set()
        task.cancel()
        await client.close()


async def test_410_gone_lists_again_and_notices_deletes_made_meanwhile(fake: FakeApiServer) -> None:
    await fake.apply(pod("a"))
    await fake.apply(pod("b"))
    cache, stop, task, client, _ = await _following(fake)
    try:
        await _until(lambda: _names(cache) == {"a", "b"}, "the list")
        version = cache.resource_version
        fake.compact()  # the server forgot everything up to now...
        await fake.delete("v1", "Pod", "b")
        fake.compact()  # ...and the delete event too: only a new list can show it
        await fake.drop_watches()
        await _until(lambda: _names(cache) == {"a"}, "the relist without b")
        assert _lists(fake) == 2
        assert int(cache.resource_version) > int(version)
    finally:
        stop.set()
        task.cancel()
        await client.close()


async def test_errors_back_off_and_recover(fake: FakeApiServer) -> None:
    await fake.apply(pod("a"))
    fake.fail_next(3, 500)
    delays: list[float] = []

    async def no_wait(delay: float) -> None:
        delays.append(delay)

    cache, stop, task, client, _ = await _following(fake, sleep=no_wait)
    try:
        await _until(lambda: _names(cache) == {"a"}, "the list after three failures")
        assert delays[:3] == [0.2, 0.4, 0.8]
    finally:
        stop.set()
        task.cancel()
        await client.close()


async def test_a_kind_the_server_does_not_serve_counts_as_empty() -> None:
    server = FakeApiServer()
    await server.start()
    client = await KubeClient.connect(host=server.url)
    cache = ObjectCache(KindSpec("example.com/v1", "Widget", "widgets"))
    stop = asyncio.Event()

    async def no_wait(delay: float) -> None:
        await asyncio.sleep(0.01)

    task = asyncio.create_task(follow(client, cache, "default", lambda: None, stop, sleep=no_wait))
    try:
        await _until(lambda: cache.synced, "the missing kind known as empty")
        assert cache.objects() == []
    finally:
        stop.set()
        task.cancel()
        await client.close()
        await server.stop()


def test_of_a_config_map_only_its_name_and_ca_bundle_are_held_and_nothing_else_is_a_change() -> None:
    cache = ObjectCache(KindSpec("v1", "ConfigMap", "configmaps"))
    election: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "leader", "namespace": "default",
                             "annotations": {"control-plane.alpha.kubernetes.io/leader": "pod-1"}},
                "data": {"config.yaml": "x" * 100_000}}
    assert cache.replace([election], "1")
    [held] = cache.objects()
    assert held == {"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": "leader", "namespace": "default"}, "data": {}}
    renewed = {**election, "metadata": {**election["metadata"],
                                        "annotations": {"control-plane.alpha.kubernetes.io/leader": "pod-2"}}}
    assert not cache.apply({"type": "MODIFIED", "object": renewed})
    assert cache.apply({"type": "MODIFIED", "object": {**election, "data": {"ca.crt": "PEM"}}})
    assert cache.objects()[0]["data"] == {"ca.crt": "PEM"}
