"""The scraper against real aiohttp servers on 127.0.0.1 (and against the simulator)."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from kvgate.gateway.picker.scrape.dialects import MetricsDialect
from kvgate.gateway.picker.scrape.target import metrics_url
from kvgate.gateway.picker.scraper import MetricsScraper, grid_tick
from kvgate.policies.pool_views import PoolViews
from kvgate.policies.types import Endpoint, EndpointMetrics, EndpointSnapshot
from tests.gateway.picker.metrics_server import (
    ServerFactory,
    eventually,
    healthy,
    view,
    vllm_text,
    waiting_of,
)

FIXTURES = Path(__file__).parent / "fixtures"


def scraping(scraper: MetricsScraper) -> list[str]:
    """The endpoints the scraper still GETs (none once stopped)."""
    if not scraper.running:
        return []
    return [e.address for e in scraper.counters()]


def fast_scraper(
    *,
    timeout: float = 0.3,
    stale_after: float = 0.1,
    clock: Callable[[], float] | None = None,
    on_snapshot: Callable[[EndpointSnapshot], None] | None = None,
) -> MetricsScraper:
    """Scrapes every 20 ms; ``clock`` defaults to the scraper's own (time.monotonic)."""
    extra = {} if clock is None else {"clock": clock}
    return MetricsScraper(
        interval=0.02,
        timeout=timeout,
        stale_after=stale_after,
        on_snapshot=on_snapshot,
        rng=random.Random(1),
        **extra,
    )


async def test_picks_up_values_and_publishes_new_immutable_snapshots(servers: ServerFactory) -> None:
    server = await servers(vllm_text(3))
    seen: list[EndpointSnapshot] = []
    clock_values = iter(range(1000, 10**6))
    async with fast_scraper(clock=lambda: float(next(clock_values)), on_snapshot=seen.append) as scraper:
        scraper.set_endpoints("pool-a", MetricsDialect.VLLM, [server.address])
        await eventually(lambda: waiting_of(scraper, "pool-a", server.address) == 3, "first scrape")
        first = scraper.snapshot()
        first_view = first.endpoints("pool-a")[0]
        assert first_view.healthy
        assert first_view.metrics is not None
        assert first_view.metrics.updated_at >= 1000.0  # from the injected clock
        server.text = vllm_text(9, running=4, kv=0.75)
        await eventually(lambda: waiting_of(scraper, "pool-a", server.address) == 9, "new value")
        latest = scraper.snapshot()
        assert latest.version > first.version
        assert first.endpoints("pool-a")[0] is first_view  # the old snapshot never changed
        assert first_view.metrics.waiting == 3
        metrics = latest.endpoints("pool-a")[0].metrics
        assert metrics is not None
        assert (metrics.running, metrics.kv_cache_usage) == (4, 0.75)
        assert scraper.version == latest.version
        assert scraper.counters()[Endpoint(server.address, "pool-a")].successes >= 2
    assert seen
    assert seen[-1] is scraper.snapshot()
    assert [s.version for s in seen] == sorted({s.version for s in seen})
    assert scraping(scraper) == []
    assert not scraper.running


async def test_a_stopped_server_is_marked_unhealthy_and_keeps_its_last_metrics(
    servers: ServerFactory,
) -> None:
    server = await servers(vllm_text(5))
    async with fast_scraper() as scraper:
        scraper.set_endpoints("p", "vllm", [server.address])
        await eventually(lambda: waiting_of(scraper, "p", server.address) == 5, "first scrape")
        await server.stop()
        await eventually(lambda: not healthy(scraper, "p", server.address), "marked unhealthy")
        stale = view(scraper, "p", server.address)
        assert stale is not None
        assert stale.metrics is not None
        assert stale.metrics.waiting == 5
        counters = scraper.counters()[Endpoint(server.address, "p")]
        assert counters.failures >= 1
        assert counters.errors.get("connection", 0) >= 1
        assert counters.consecutive_failures >= 1


async def test_an_error_status_makes_it_unhealthy_and_a_good_scrape_heals_it(servers: ServerFactory) -> None:
    server = await servers(vllm_text(1))
    async with fast_scraper() as scraper:
        scraper.set_endpoints("p", "vllm", [server.address])
        await eventually(lambda: waiting_of(scraper, "p", server.address) == 1, "first scrape")
        server.status = 503
        await eventually(lambda: not healthy(scraper, "p", server.address), "unhealthy on 503")
        assert scraper.counters()[Endpoint(server.address, "p")].errors["status"] >= 1
        server.status = 200
        server.text = vllm_text(2)
        await eventually(lambda: healthy(scraper, "p", server.address), "healthy again")
        assert waiting_of(scraper, "p", server.address) == 2
        assert scraper.counters()[Endpoint(server.address, "p")].consecutive_failures == 0


async def test_staleness_follows_the_injected_clock(servers: ServerFactory) -> None:
    server = await servers(vllm_text(4))
    now = [100.0]
    async with fast_scraper(clock=lambda: now[0], stale_after=10.0) as scraper:
        scraper.set_endpoints("p", "vllm", [server.address])
        await eventually(lambda: waiting_of(scraper, "p", server.address) == 4, "first scrape")
        server.status = 500
        errors_then = scraper.counters()[Endpoint(server.address, "p")].failures
        await eventually(
            lambda: scraper.counters()[Endpoint(server.address, "p")].failures >= errors_then + 3, "failures"
        )
        assert healthy(scraper, "p", server.address)  # 0 s old < 10 s
        now[0] += 11.0
        await eventually(lambda: not healthy(scraper, "p", server.address), "stale after 10 s")


async def test_a_page_in_another_dialect_counts_as_a_failed_scrape(servers: ServerFactory) -> None:
    server = await servers((FIXTURES / "sglang.prom").read_text())
    async with fast_scraper() as scraper:
        scraper.set_endpoints("p", "vllm", [server.address])
        await eventually(
            lambda: scraper.counters()[Endpoint(server.address, "p")].errors.get("page", 0) >= 1, "page error"
        )
        # (the unhealthy view is published with the tick's other scrapes, PUBLISH_DELAY_S later)
        await eventually(lambda: not healthy(scraper, "p", server.address), "published unhealthy")
        found = view(scraper, "p", server.address)
        assert found is not None
        assert found.metrics is None
        assert not found.healthy


async def test_endpoints_added_and_removed_at_run_time(servers: ServerFactory) -> None:
    one = await servers(vllm_text(1))
    two = await servers(vllm_text(2))
    three = await servers((FIXTURES / "trtllm_serve.prom").read_text(), path="/prometheus/metrics")
    async with fast_scraper() as scraper:
        scraper.set_endpoints("p", "vllm", [one.address])
        await eventually(lambda: waiting_of(scraper, "p", one.address) == 1, "one scraped")
        scraper.set_endpoints("p", "vllm", [one.address, two.address])
        scraper.set_endpoints("q", "trtllm", [three.address])
        assert [v.address for v in scraper.snapshot().endpoints("p")] == [one.address, two.address]
        await eventually(lambda: waiting_of(scraper, "p", two.address) == 2, "two scraped")
        await eventually(lambda: waiting_of(scraper, "q", three.address) == 4, "trtllm pool scraped")
        assert waiting_of(scraper, "p", one.address) == 1  # kept its metrics across the change

        scraper.set_endpoints("p", "vllm", [two.address])
        assert [v.address for v in scraper.snapshot().endpoints("p")] == [two.address]
        assert Endpoint(one.address, "p") not in scraper.counters()
        assert sorted(scraping(scraper)) == sorted([two.address, three.address])
        hits = one.hits
        await asyncio.sleep(0.15)
        assert one.hits <= hits + 1  # at most one request that was already in flight

        scraper.remove_pool("q")
        assert "q" not in scraper.snapshot().pools
        assert scraping(scraper) == [two.address]
    assert scraping(scraper) == []


async def test_endpoints_set_before_start_are_scraped_once_started(servers: ServerFactory) -> None:
    server = await servers(vllm_text(6))
    scraper = fast_scraper()
    scraper.set_endpoints("p", "vllm", [Endpoint(server.address, "p", name="replica-0")])
    assert scraper.snapshot().endpoints("p")[0].metrics is None
    assert scraping(scraper) == []
    await scraper.start()
    try:
        await eventually(lambda: waiting_of(scraper, "p", server.address) == 6, "scraped after start")
        assert scraper.snapshot().endpoints("p")[0].endpoint.name == "replica-0"
    finally:
        await scraper.stop()
    assert scraping(scraper) == []


async def test_a_hung_server_does_not_stall_the_others(servers: ServerFactory) -> None:
    hung = await servers(vllm_text(7))
    hung.hold = True
    fast = await servers(vllm_text(8))
    async with fast_scraper(timeout=2.0) as scraper:
        scraper.set_endpoints("p", "vllm", [hung.address])
        await eventually(lambda: hung.hits >= 1, "the hung replica holds a scrape")
        scraper.set_endpoints("p", "vllm", [hung.address, fast.address])
        key = Endpoint(fast.address, "p")
        # The hung replica holds its scrape for the 2 s timeout; meanwhile the fast one goes on every
        # 20 ms (10 scrapes take 0.2 s; 1.5 s is slack for a loaded machine, and still shorter than
        # the timeout, so a shared connection or a shared loop would fail this).
        await eventually(lambda: scraper.counters()[key].successes >= 10, "fast keeps going", 1.5)
        assert scraper.counters()[Endpoint(hung.address, "p")].failures == 0  # still waiting
        await eventually(
            lambda: scraper.counters()[Endpoint(hung.address, "p")].errors.get("timeout", 0) >= 1, "timeout"
        )
        # counted at once, the unhealthy view published with the others of the next millisecond
        await eventually(lambda: not healthy(scraper, "p", hung.address), "unhealthy", 0.5)
        assert healthy(scraper, "p", fast.address)


def test_grid_tick_is_the_first_tick_at_or_after_now() -> None:
    assert grid_tick(10.0, phase=0.25, interval=1.0) == pytest.approx(10.25)
    assert grid_tick(10.25, phase=0.25, interval=1.0) == pytest.approx(10.25)
    assert grid_tick(10.3, phase=0.25, interval=1.0) == pytest.approx(11.25)
    assert grid_tick(10.3, phase=3.25, interval=1.0) == pytest.approx(11.25)  # phase beyond one interval


async def test_every_endpoint_is_scraped_on_the_scrapers_one_grid(servers: ServerFactory) -> None:
    """One timer wake-up starts every endpoint's scrape (an idle picker costs half as much CPU as
    with a jittered start per endpoint: bench/results/scrape_ticks.md); each scraper has its own phase."""
    fleet = [await servers(vllm_text(i)) for i in range(4)]
    interval = 0.2
    async with MetricsScraper(interval=interval, timeout=0.5, rng=random.Random(7)) as scraper:
        scraper.set_endpoints("p", "vllm", [server.address for server in fleet])
        await eventually(lambda: all(len(server.arrivals) >= 3 for server in fleet), "three rounds")
    offsets = sorted(
        min(offset, interval - offset)
        for server in fleet
        for offset in ((t - scraper.phase) % interval for t in server.arrivals)
    )
    # Each GET arrives just after a grid tick (the server answers in the test's own loop); a start
    # jittered per endpoint would put the median a quarter interval (50 ms) away.
    assert offsets[len(offsets) // 2] < 0.02, offsets
    assert MetricsScraper(interval=interval, rng=random.Random(8)).phase != scraper.phase


async def test_rejects_endpoints_of_another_pool_and_bad_addresses() -> None:
    scraper = MetricsScraper()
    with pytest.raises(ValueError, match="pool"):
        scraper.set_endpoints("p", "vllm", [Endpoint("127.0.0.1:1", "other")])
    with pytest.raises(ValueError, match="host:port"):
        scraper.set_endpoints("p", "vllm", ["localhost"])
    with pytest.raises(ValueError, match="tgi"):
        scraper.set_endpoints("p", "tgi", ["127.0.0.1:1"])
    assert scraper.snapshot().pools == {}


def test_metrics_url() -> None:
    assert metrics_url(Endpoint("10.0.0.1:8000", "p"), "/metrics") == "http://10.0.0.1:8000/metrics"
    assert metrics_url(Endpoint("10.0.0.1:8000", "p"), "/metrics", 8002) == "http://10.0.0.1:8002/metrics"
    assert metrics_url(Endpoint("::1:8000", "p"), "/m") == "http://[::1]:8000/m"


async def test_against_the_simulator() -> None:
    from kvgate.simulator.engine_types import EngineConfig
    from kvgate.simulator.fleet import Fleet, FleetConfig
    from kvgate.simulator.server import ReplicaConfig

    fleet = Fleet(FleetConfig(replicas=(ReplicaConfig(0, EngineConfig(num_gpu_blocks=1234)),), port=0))
    await fleet.start()
    try:
        address = fleet.urls[0].removeprefix("http://")
        async with fast_scraper() as scraper:
            scraper.set_endpoints("sim", "vllm", [address])
            await eventually(lambda: waiting_of(scraper, "sim", address) == 0, "simulator scraped")
            metrics = scraper.snapshot().endpoints("sim")[0].metrics
            assert metrics is not None
            assert (metrics.block_size, metrics.num_gpu_blocks, metrics.kv_cache_usage) == (16, 1234, 0.0)
            await fleet.listener(0).stop()
            await eventually(lambda: not healthy(scraper, "sim", address), "stopped replica unhealthy")
            await fleet.listener(0).start()
            await eventually(lambda: healthy(scraper, "sim", address), "restarted replica healthy")
    finally:
        await fleet.stop()


async def test_a_replica_whose_metrics_page_hangs_is_stale_within_the_window() -> None:
    """The simulator's ``metrics_delay_s`` fault (its /metrics answers after a delay longer than the
    scrape timeout): the endpoint's last metrics age past ``stale_after`` (so admission counts it
    saturated) and the timed-out scrapes make it unhealthy; without the fault it heals."""
    import dataclasses
    import time

    from kvgate.simulator.fleet import Fleet, FleetConfig
    from kvgate.simulator.server import ReplicaConfig

    fleet = Fleet(FleetConfig(replicas=(ReplicaConfig(0),), port=0))
    await fleet.start()
    try:
        address = fleet.urls[0].removeprefix("http://")
        async with fast_scraper(timeout=0.3, stale_after=0.1) as scraper:
            scraper.set_endpoints("sim", "vllm", [address])
            await eventually(lambda: healthy(scraper, "sim", address), "scraped")
            replica = fleet.replicas[0]
            replica.faults = dataclasses.replace(replica.faults, metrics_delay_s=5.0)

            def stale() -> bool:
                found = view(scraper, "sim", address)
                return found is not None and found.age(time.monotonic()) >= 0.1

            await eventually(stale, "metrics older than stale_after")
            await eventually(lambda: not healthy(scraper, "sim", address), "unhealthy after a timeout")
            replica.faults = dataclasses.replace(replica.faults, metrics_delay_s=0.0)
            await eventually(lambda: healthy(scraper, "sim", address), "healthy again", 8.0)
    finally:
        await fleet.stop()


async def test_each_published_tuple_names_the_endpoints_whose_views_it_replaced(
    servers: ServerFactory,
) -> None:
    one, two, three = [await servers(vllm_text(i)) for i in (1, 2, 3)]
    seen: list[EndpointSnapshot] = []
    async with fast_scraper(on_snapshot=seen.append) as scraper:
        scraper.set_endpoints("p", "vllm", [one.address, two.address])
        await eventually(lambda: waiting_of(scraper, "p", two.address) == 2, "both scraped")
        scraper.set_endpoints("p", "vllm", [one.address, two.address, three.address])
        await eventually(lambda: waiting_of(scraper, "p", three.address) == 3, "three scraped")
        stopped = one.address
        await one.stop()
        await eventually(lambda: not healthy(scraper, "p", stopped), "one unhealthy")
        scraper.adopt("p", [(two.address, EndpointMetrics(waiting=42, updated_at=scraper.now() + 5), True)])
        assert waiting_of(scraper, "p", two.address) == 42
    tuples = [s.endpoints("p") for s in seen if s.endpoints("p")]
    said = unknown = 0
    for before, after in itertools.pairwise(tuples):
        assert isinstance(after, PoolViews)
        changed = after.changed_since(before)
        if len(before) != len(after):
            assert changed is None  # the membership changed: not known
            unknown += 1
            continue
        assert changed is not None
        replaced = {b.address for a, b in zip(before, after, strict=True) if a is not b}
        assert replaced <= changed  # never fewer than replaced (more when a view was set twice)
        said += 1
    assert unknown == 1
    assert said >= 3
    last, adopted = tuples[-2], tuples[-1]
    assert isinstance(adopted, PoolViews)
    assert adopted.changed_since(last) == {two.address}
    assert adopted.changed_since(tuples[0]) is None  # across the membership change


def test_adopted_views_replace_theirs_in_place_and_leave_the_others_as_they_were() -> None:
    scraper = fast_scraper()
    addresses = [f"127.0.0.{i}:8000" for i in range(1, 6)]
    scraper.set_endpoints("p", "vllm", addresses)
    before = scraper.snapshot().endpoints("p")
    now = scraper.now()
    scraper.adopt("p", [(addresses[3], EndpointMetrics(waiting=4, updated_at=now), True),
                        (addresses[1], EndpointMetrics(waiting=2, updated_at=now), True)])
    after = scraper.snapshot().endpoints("p")
    assert [v.address for v in after] == addresses
    assert [v.metrics.waiting if v.metrics else None for v in after] == [None, 2, None, 4, None]
    assert after[0] is before[0]
    assert isinstance(after, PoolViews)
    assert after.changed_since(before) == {addresses[1], addresses[3]}
    scraper.set_endpoints("p", "vllm", [addresses[4], *addresses[:4]])  # the order changed
    scraper.adopt("p", [(addresses[4], EndpointMetrics(waiting=7, updated_at=now), True)])
    moved = scraper.snapshot().endpoints("p")
    assert [v.address for v in moved] == [addresses[4], *addresses[:4]]
    assert moved[0].metrics is not None
    assert moved[0].metrics.waiting == 7
