"""Shared scrapes without Redis: the batch codec, who covers what, and the scraper's side."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence

import msgspec
import pytest

from kvgate.gateway.picker.scraper import MetricsScraper
from kvgate.gateway.picker.shared_state.scrapes import (
    ScrapeRecord,
    SharedScrapes,
    decode_scrapes,
    encode_scrapes,
    owner_of,
)
from kvgate.policies.types import Endpoint, EndpointMetrics, EndpointView
from kvgate.proto import shared_state_pb2 as pb
from tests.gateway.picker.metrics_server import ServerFactory, eventually, view, vllm_text

FULL = EndpointMetrics(
    waiting=3, running=7, kv_cache_usage=0.625, active_loras=frozenset({"b", "a"}),
    waiting_loras=frozenset({"c"}), max_loras=4, block_size=16, num_gpu_blocks=9000,
    updated_at=99.75, served_models=frozenset({"m"}),
)


def views() -> tuple[EndpointView, ...]:
    return (
        EndpointView(Endpoint("10.0.0.1:8000", "p"), FULL, healthy=True),
        EndpointView(Endpoint("10.0.0.2:8000", "p"), EndpointMetrics(updated_at=99.0), healthy=False),
        EndpointView(Endpoint("10.0.0.3:8000", "p"), None, healthy=False),
    )


def test_a_batch_carries_every_field_and_ages_not_clock_readings() -> None:
    data = encode_scrapes(views(), now=100.0)
    # The receiving picker's clock reads 5000.0: each metrics' age is kept, not its time.
    records = decode_scrapes(data, now=5000.0)
    assert [r.address for r in records] == ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"]
    first = records[0]
    assert first.healthy
    assert first.metrics is not None
    assert first.metrics.updated_at == pytest.approx(5000.0 - 0.25)
    assert first.metrics == EndpointMetrics(
        waiting=3, running=7, kv_cache_usage=0.625, active_loras=frozenset({"a", "b"}),
        waiting_loras=frozenset({"c"}), max_loras=4, block_size=16, num_gpu_blocks=9000,
        updated_at=first.metrics.updated_at, served_models=frozenset({"m"}),
    )
    assert first.metrics.running_reported
    jetstream = EndpointView(Endpoint("10.0.0.4:8000", "p"), EndpointMetrics(running_reported=False))
    [record] = decode_scrapes(encode_scrapes([jetstream], now=0.0), now=0.0)
    assert record.metrics is not None
    assert not record.metrics.running_reported
    second = records[1]
    assert not second.healthy
    assert second.metrics is not None
    assert second.metrics.block_size is None
    assert second.metrics.num_gpu_blocks is None
    assert second.metrics.updated_at == pytest.approx(4999.0)
    assert records[2] == ScrapeRecord("10.0.0.3:8000", None, False)


def test_unreadable_batches_and_other_formats_are_refused() -> None:
    with pytest.raises(ValueError, match="not a scrape batch"):
        decode_scrapes(b"\xff\xff\xff", now=0.0)
    with pytest.raises(ValueError, match="format 2"):  # a protobuf batch is format 1 or nothing
        decode_scrapes(pb.ScrapeBatch(format=2).SerializeToString(), now=0.0)
    with pytest.raises(ValueError, match="format 3"):
        decode_scrapes(msgspec.msgpack.encode((3, [])), now=0.0)
    with pytest.raises(ValueError, match="not a scrape batch"):  # a field of the wrong type
        decode_scrapes(msgspec.msgpack.encode((2, [["10.0.0.1:8000", True, 5, "many"]])), now=0.0)


def test_a_format_1_batch_of_the_previous_kvgate_reads_the_same() -> None:
    from kvgate.bench.scrape_batch_codec import encode_scrapes_format1

    assert decode_scrapes(encode_scrapes_format1(views(), now=100.0), now=5000.0) == \
        decode_scrapes(encode_scrapes(views(), now=100.0), now=5000.0)


class Source:
    def __init__(self) -> None:
        self.adopted: list[tuple[str, list[ScrapeRecord]]] = []
        self.own: tuple[EndpointView, ...] = ()
        self.since: list[float] = []

    def own_views(self, pool: str, since: float) -> tuple[EndpointView, ...]:
        self.since.append(since)
        return self.own

    def adopt(self, pool: str, records: Sequence[ScrapeRecord]) -> None:
        self.adopted.append((pool, list(records)))


def owned_by(shared: SharedScrapes, pool: str, addresses: list[str]) -> list[str]:
    return [a for a in addresses if shared.owns(pool, a)]


def test_endpoints_are_divided_among_the_live_pickers_and_a_leaving_one_moves_only_its_share() -> None:
    addresses = [f"10.0.{i // 250}.{i % 250}:8000" for i in range(1000)]
    pickers = [SharedScrapes(Source(), 0.2, lambda: 0.0, f"host:{n}") for n in range(4)]
    for shared in pickers:
        shared.set_members("p", [f"host:{n}" for n in range(4)])
    shares = [set(owned_by(shared, "p", addresses)) for shared in pickers]
    assert sum(len(share) for share in shares) == 1000  # each endpoint owned by exactly one
    assert set().union(*shares) == set(addresses)
    assert all(200 <= len(share) <= 300 for share in shares), [len(share) for share in shares]
    assert owner_of([f"host:{n}" for n in range(4)], addresses[0]) in {f"host:{n}" for n in range(4)}
    # host:3 leaves: the others keep what they had and divide its share.
    for shared in pickers[:3]:
        shared.set_members("p", [f"host:{n}" for n in range(3)])
    after = [set(owned_by(shared, "p", addresses)) for shared in pickers[:3]]
    for before, now in zip(shares, after, strict=False):
        assert before <= now
    assert set().union(*after) == set(addresses)
    # Alone (or before any round named the members), a picker owns every endpoint.
    alone = SharedScrapes(Source(), 0.2, lambda: 0.0, "solo")
    assert owned_by(alone, "p", addresses) == addresses
    alone.set_members("p", [])
    assert owned_by(alone, "p", addresses) == addresses


def test_an_endpoint_owned_elsewhere_is_skipped_while_batches_name_it() -> None:
    now = [10.0]
    source = Source()
    shared = SharedScrapes(source, stale_after=0.2, clock=lambda: now[0], me="me")
    one, other = Endpoint("10.0.0.1:8000", "p"), Endpoint("10.0.0.9:8000", "p")
    members = ["me", "peer"]
    shared.set_members("p", members)
    theirs = next(e for e in (Endpoint(f"10.0.0.{i}:8000", "p") for i in range(1, 50))
                  if owner_of(members, e.address) == "peer")
    mine = next(e for e in (Endpoint(f"10.0.0.{i}:8000", "p") for i in range(1, 50))
                if owner_of(members, e.address) == "me")
    assert shared.covered_until(theirs, now[0]) is None  # nothing received yet: scrape
    batch = encode_scrapes([EndpointView(theirs, FULL), EndpointView(mine, FULL)], now=0.0)
    shared.received("p", batch, "peer")
    assert source.adopted[0][0] == "p"
    assert shared.covered_until(theirs, now[0]) == pytest.approx(10.2)
    assert shared.covered_until(mine, now[0]) is None  # its own share: always scraped here
    assert shared.covered_until(Endpoint(theirs.address, "q"), now[0]) is None  # not another pool's
    now[0] += 0.19
    assert shared.covered_until(theirs, now[0]) is not None
    now[0] += 0.02  # the peer went quiet for stale_after: scrape it here
    assert shared.covered_until(theirs, now[0]) is None
    # A batch from another picker covers it too; this picker's own batches are skipped.
    shared.received("p", batch, "third")
    assert shared.covered_until(theirs, now[0]) is not None
    shared.received("p", batch, "me")
    assert len(source.adopted) == 2
    # This picker publishes what it scraped itself since its last batch, and nothing when none.
    woken: list[int] = []
    shared.wake = lambda: woken.append(1)
    shared.scraped("p")
    assert woken == [1]
    assert shared.take_due() == ["p"]
    assert shared.take_due() == []
    assert shared.batch("p") is None
    assert source.since[-1] == pytest.approx(now[0] - 0.2)  # at most stale_after back
    assert not shared.leads("p")
    source.own = (EndpointView(mine, FULL),)
    now[0] += 0.05
    data = shared.batch("p")
    assert data is not None
    assert source.since[-1] == pytest.approx(now[0] - 0.05)  # since the last batch
    assert [r.address for r in decode_scrapes(data, now[0])] == [mine.address]
    assert shared.leads("p")
    now[0] += 0.21
    assert not shared.leads("p")  # nothing published for stale_after
    assert shared.batch("p") is not None
    assert shared.leading == frozenset({"p"})
    assert (shared.batches_sent, shared.batches_received) == (2, 2)
    shared.received("q", b"garbage", "peer")
    assert shared.bad_batches == 1
    shared.forget_pool("p")
    assert not shared.leads("p")
    assert shared.covered_until(one, now[0]) is None
    assert shared.covered_until(other, now[0]) is None


def test_a_lagging_reader_judges_its_peers_silence_as_of_its_last_read_within_a_bound() -> None:
    now = [10.0]
    shared = SharedScrapes(Source(), stale_after=0.2, clock=lambda: now[0], me="me")
    members = ["me", "peer"]
    shared.set_members("p", members)
    theirs = next(e for e in (Endpoint(f"10.0.0.{i}:8000", "p") for i in range(1, 50))
                  if owner_of(members, e.address) == "peer")
    shared.received("p", encode_scrapes([EndpointView(theirs, FULL)], now=0.0), "peer")
    shared.read_done(now[0])
    now[0] += 0.5  # this picker's loop lagged: no read came back since, the peer's batches may wait unread
    assert shared.covered_until(theirs, now[0]) == pytest.approx(10.7)
    now[0] += 0.69  # judged as of NAMED_WITHIN x stale_after back at most: then quiet for stale_after
    assert shared.covered_until(theirs, now[0]) is not None
    now[0] += 0.02
    assert shared.covered_until(theirs, now[0]) is None
    shared.read_done(now[0])  # reads come back again, and without the peer's batches: it went quiet
    assert shared.covered_until(theirs, now[0]) is None
    now[0] = 20.0
    shared.received("p", encode_scrapes([EndpointView(theirs, FULL)], now=0.0), "peer")
    shared.read_done(now[0])
    shared.read_failed()  # Redis gone: silence is judged as of now
    now[0] += 0.21
    assert shared.covered_until(theirs, now[0]) is None


class Covers:
    def __init__(self) -> None:
        self.covered: set[str] = set()

    def covered_until(self, endpoint: Endpoint, now: float) -> float | None:
        return now + 0.01 if endpoint.address in self.covered else None

    def scraped(self, pool: str) -> None:
        pass


def fast(stale_after: float = 0.1) -> MetricsScraper:
    return MetricsScraper(interval=0.02, timeout=0.3, stale_after=stale_after, rng=random.Random(1))


async def test_the_scraper_skips_covered_endpoints_and_adopts_others_views(servers: ServerFactory) -> None:
    covered, own = await servers(vllm_text(3)), await servers(vllm_text(4))
    delegate = Covers()
    delegate.covered.add(covered.address)
    scraper = fast()
    scraper.delegate_to(delegate)
    scraper.set_endpoints("p", "vllm", [covered.address, own.address])
    async with scraper:
        await eventually(lambda: own.hits >= 3, "the uncovered endpoint is scraped")
        assert covered.hits == 0
        counters = {e.address: c for e, c in scraper.counters().items()}
        assert counters[covered.address].delegated > 0
        assert counters[own.address].delegated == 0
        # Another picker's view of the covered endpoint is taken as it is...
        now = asyncio.get_running_loop().time()
        theirs = EndpointMetrics(waiting=42, updated_at=now)
        version = scraper.version
        scraper.adopt("p", [(covered.address, theirs, True), ("10.9.9.9:1", theirs, True)])
        assert scraper.version == version + 1  # one snapshot for the batch; unknown addresses ignored
        adopted = view(scraper, "p", covered.address)
        assert adopted is not None
        assert adopted.metrics == theirs
        assert adopted.healthy
        assert [v.address for v in scraper.views("p")] == [covered.address, own.address]
        # ...the same view again publishes nothing...
        scraper.adopt("p", [(covered.address, theirs, True)])
        assert scraper.version == version + 1
        # ...a verdict without metrics keeps the last metrics...
        scraper.adopt("p", [(covered.address, None, False)])
        down = view(scraper, "p", covered.address)
        assert down is not None
        assert down.metrics == theirs
        assert not down.healthy
        # ...and one older than this scraper's own healthy scrape is not taken.
        mine = view(scraper, "p", own.address)
        assert mine is not None
        assert mine.metrics is not None
        assert mine.healthy
        older = EndpointMetrics(waiting=99, updated_at=mine.metrics.updated_at - 1.0)
        scraper.adopt("p", [(own.address, older, True)])
        kept = view(scraper, "p", own.address)
        assert kept is not None
        assert kept.metrics is not None
        assert kept.metrics.waiting != 99
        # A leader's later verdict over the same metrics is taken, though re-timed from their age
        # they may read a few ms older than the view adopted before (each batch's transit differs).
        scraper.adopt("p", [(covered.address, EndpointMetrics(waiting=42, updated_at=now + 0.010), True)])
        scraper.adopt("p", [(covered.address, EndpointMetrics(waiting=42, updated_at=now + 0.002), False)])
        verdict = view(scraper, "p", covered.address)
        assert verdict is not None
        assert not verdict.healthy
        # No longer covered: scraped again.
        delegate.covered.clear()
        await eventually(lambda: covered.hits >= 2, "scraped once no longer covered")
