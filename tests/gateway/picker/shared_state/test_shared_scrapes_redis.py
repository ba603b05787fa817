"""Shared scrapes through a real redis-server: the endpoint's owner scrapes, the other picker adopts;
an owner that stops or dies is replaced; Redis going away sends every picker back to its own scrapes.
(``leads``: the picker published a batch of its own scrapes in its last round.)"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import pytest

from kvgate.gateway.picker.redis_link import RedisLink, RedisSettings
from kvgate.gateway.picker.scraper import MetricsScraper
from kvgate.gateway.picker.shared_state import SharedStateSync
from kvgate.gateway.picker.shared_state.runtime import SharingRuntime
from kvgate.gateway.picker.shared_state.scrapes import owner_of
from kvgate.policies.types import Endpoint
from tests.gateway.picker.metrics_server import (
    MetricsServer,
    ServerFactory,
    eventually,
    vllm_text,
    waiting_of,
)
from tests.redis_server import RedisServer

STALE_AFTER = 0.3
"""Well above a sync round (20 ms): a follower counted as scraping nothing must not fall back
because a loaded machine delayed one batch."""


@dataclass
class Picker:
    scraper: MetricsScraper
    sync: SharedStateSync

    def leads(self) -> bool:
        return self.sync.scrapes is not None and self.sync.scrapes.leads("p")

    def successes(self) -> int:
        return sum(c.successes for c in self.scraper.counters().values())

    async def stop(self) -> None:
        await self.sync.stop()
        await self.sync.link.close()
        await self.scraper.stop()


MakePicker = Callable[..., Awaitable[Picker]]


@pytest.fixture
async def make_picker(redis_server: RedisServer) -> AsyncIterator[MakePicker]:
    made: list[Picker] = []

    async def make(server: MetricsServer, picker_id: str | None = None, share: bool = True) -> Picker:
        settings = RedisSettings(
            url=redis_server.url, key_prefix="t", sync_interval_s=0.02, read_block_s=0.05,
            backoff_initial_s=0.05, backoff_max_s=0.2,
        )
        scraper = MetricsScraper(interval=0.02, timeout=0.3, stale_after=STALE_AFTER, rng=random.Random(1))
        sync = SharedStateSync(RedisLink(settings), picker_id=picker_id)
        sync.state_for("p")
        if share:
            scraper.delegate_to(sync.share_scrapes(scraper, STALE_AFTER))
        scraper.set_endpoints("p", "vllm", [server.address])
        await scraper.start()
        await sync.start()
        picker = Picker(scraper, sync)
        made.append(picker)
        return picker

    yield make
    for picker in made:
        await picker.stop()


def owner_ids(server: MetricsServer) -> tuple[str, str]:
    """Two picker ids, the first the one that owns ``server``'s endpoint when both are live."""
    ids = ["picker-a", "picker-b"]
    owner = owner_of(ids, server.address)
    return owner, next(i for i in ids if i != owner)


def received(picker: Picker) -> int:
    """Scrape batches ``picker`` has adopted from another picker."""
    return picker.sync.scrapes.batches_received if picker.sync.scrapes is not None else 0


async def steady(picker: Picker, seconds: float = 0.4) -> int:
    """How many scrapes ``picker`` made itself over ``seconds``."""
    before = picker.successes()
    await asyncio.sleep(seconds)
    return picker.successes() - before


async def test_one_picker_scrapes_and_the_other_adopts_its_views(
    servers: ServerFactory, make_picker: MakePicker
) -> None:
    server = await servers(vllm_text(3))
    owner, other = owner_ids(server)
    leader = await make_picker(server, owner)
    follower = await make_picker(server, other)
    await eventually(lambda: received(follower) > 0, "the follower has the owner's batches")
    await eventually(lambda: waiting_of(follower.scraper, "p", server.address) == 3, "the follower adopts")
    await eventually(lambda: not follower.leads(), "the follower's own scrapes have aged out of its batches")
    # The page changes: the follower sees it through the leader without scraping itself.
    server.text = vllm_text(9)
    await eventually(lambda: waiting_of(follower.scraper, "p", server.address) == 9, "the change arrives")
    assert await steady(follower) == 0
    assert await steady(leader) > 5
    assert leader.sync.scrapes is not None
    assert follower.sync.scrapes is not None
    assert leader.sync.scrapes.batches_sent > 0
    assert follower.sync.scrapes.batches_received > 0
    counters = follower.scraper.counters()[Endpoint(server.address, "p")]
    assert counters.delegated > 0
    # A replica the leader cannot reach is unhealthy on the follower too, without its own scrapes.
    server.status = 500
    await eventually(lambda: not follower.scraper.views("p")[0].healthy, "the leader's verdict arrives")
    assert waiting_of(follower.scraper, "p", server.address) == 9  # the last metrics stay


async def test_a_picker_that_does_not_share_scrapes_owns_no_share(
    servers: ServerFactory, make_picker: MakePicker
) -> None:
    server = await servers(vllm_text(2))
    # a picker id that would own the endpoint among all three, and two sharing ones
    loner_id = next(f"loner-{i}" for i in range(1000)
                    if owner_of([f"loner-{i}", "picker-a", "picker-b"], server.address) == f"loner-{i}")
    owner, other = owner_ids(server)
    loner = await make_picker(server, loner_id, share=False)  # an in-flight peer publishing no scrapes
    sharing_owner = await make_picker(server, owner)
    sharing_other = await make_picker(server, other)
    await eventually(lambda: received(sharing_other) > 0, "the sharers divide the endpoint between them")
    await eventually(lambda: not sharing_other.leads(), "its own scrapes aged out of its batches")
    assert await steady(sharing_other) == 0  # the loner's would-be share is not scraped twice
    assert await steady(sharing_owner) > 5
    assert await steady(loner) > 5  # it scrapes for itself, as without sharing


async def test_a_stopping_leader_hands_over_at_once(servers: ServerFactory, make_picker: MakePicker) -> None:
    server = await servers(vllm_text(1))
    first, second = owner_ids(server)
    a = await make_picker(server, first)
    await eventually(a.leads, "the first picker leads")
    b = await make_picker(server, second)
    await eventually(lambda: waiting_of(b.scraper, "p", server.address) == 1, "b adopts a's scrapes")
    assert await steady(b) == 0
    await a.stop()  # leaves the pool's pickers at once: b owns everything from its next round
    await eventually(b.leads, "b leads", within=0.6)
    server.text = vllm_text(5)
    await eventually(lambda: waiting_of(b.scraper, "p", server.address) == 5, "b scrapes itself")


async def test_a_dead_leaders_followers_scrape_for_themselves_until_one_leads(
    servers: ServerFactory, make_picker: MakePicker
) -> None:
    server = await servers(vllm_text(1))
    first, second = owner_ids(server)
    a = await make_picker(server, first)
    await eventually(a.leads, "the first picker leads")
    b = await make_picker(server, second)
    await eventually(lambda: waiting_of(b.scraper, "p", server.address) == 1, "b adopts a's scrapes")
    # a dies without a word: its loops stop, it stays among the pool's pickers until its entry ages out.
    tasks, a.sync._tasks = a.sync._tasks, []
    for task in tasks:
        task.cancel()
    _, pending = await asyncio.wait(tasks, timeout=3.0)  # (a loaded 2-core machine took over 1 s once)
    assert not pending, "a cancelled loop must end"
    await a.scraper.stop()
    server.text = vllm_text(6)
    await eventually(lambda: waiting_of(b.scraper, "p", server.address) == 6, "b scrapes itself", within=1.0)
    await eventually(b.leads, "b publishes its own scrapes")


async def test_without_redis_each_picker_scrapes_again(
    servers: ServerFactory, make_picker: MakePicker, redis_server: RedisServer
) -> None:
    server = await servers(vllm_text(2))
    owner, other = owner_ids(server)
    a = await make_picker(server, owner)
    b = follower = await make_picker(server, other)
    await eventually(lambda: received(follower) > 0, "the follower has the owner's batches")
    await eventually(lambda: not follower.leads(), "the follower's own scrapes have aged out of its batches")
    await asyncio.sleep(0.1)  # a scrape it started before the first batch came has ended
    assert await steady(follower) == 0
    await redis_server.kill()
    server.text = vllm_text(8)
    await eventually(
        lambda: waiting_of(follower.scraper, "p", server.address) == 8, "it scrapes itself", within=2.0
    )
    assert await steady(follower) > 5
    await redis_server.start()
    await eventually(lambda: a.leads() and not b.leads(), "sharing resumes", within=5.0)


def test_sharing_scrapes_can_be_turned_off() -> None:
    scraper = MetricsScraper()
    on = SharingRuntime(RedisSettings(url="redis://127.0.0.1:1/0"))
    assert on.share_scrapes(scraper, STALE_AFTER) is not None
    off = SharingRuntime(RedisSettings(url="redis://127.0.0.1:1/0", share_scrapes=False))
    assert off.share_scrapes(scraper, STALE_AFTER) is None
    assert SharingRuntime(None).share_scrapes(scraper, STALE_AFTER) is None
