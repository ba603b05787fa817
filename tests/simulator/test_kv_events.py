"""The simulator's KV events (``simulator.kv_events``): what the engine records, and the
publisher followed by kvgate's own subscriber over real ZMQ (vLLM's protocol both ways)."""

from __future__ import annotations

import asyncio
from array import array
from collections.abc import Callable

import aiohttp
import msgspec
import zmq.asyncio

from kvgate.gateway.picker.kv_events.subscriber import EndpointSubscription, apply_batch
from kvgate.gateway.picker.kv_events.wire import BlockStored, decode_batch
from kvgate.policies.engine_blocks import EngineBlockIndex, block_keys, chain_root
from kvgate.simulator.engine_types import CacheEvent, Removed, SimRequest, Stored
from kvgate.simulator.kv_events import vllm_events
from kvgate.simulator.tokenizer import encode
from tests.ports import free_port_pair
from tests.simulator.conftest import MODEL, FleetFactory
from tests.simulator.test_engine import _drain
from tests.simulator.test_engine_support import make_engine, prompt, request


def test_the_engine_records_each_newly_cached_block_and_each_eviction() -> None:
    engine = make_engine(kv_events=True, num_gpu_blocks=8, block_size=16)
    engine.submit(request("a", 64, 1), 0.0)
    now, _ = _drain(engine, 0.0)
    events = engine.take_kv_events()
    stored = [e for e in events if isinstance(e, Stored)]
    assert len(stored) == 4
    assert stored[0].parent_hash is None
    assert [s.parent_hash for s in stored[1:]] == [s.block_hash for s in stored[:-1]]
    assert stored[0].tokens == prompt(64)[:16]
    assert engine.take_kv_events() == []  # taken
    engine.submit(request("b", 96, 1, salt=1), now)  # needs the blocks "a" left cached
    _drain(engine, now)
    removed = [e for e in engine.take_kv_events() if isinstance(e, Removed)]
    assert {r.block_hash for r in removed} <= {s.block_hash for s in stored}
    assert removed
    assert make_engine().take_kv_events() == []  # off by default


def test_a_chain_of_stored_blocks_is_one_vllm_event() -> None:
    events: list[CacheEvent] = [Stored(1, None, (1,) * 16, None), Stored(2, 1, (2,) * 16, None), Removed(9),
                                Removed(8)]
    encoded = vllm_events(events, 16)
    payload = msgspec.msgpack.encode({"ts": 1.0, "events": encoded})
    batch = decode_batch("", 0, payload)
    assert batch.events[0] == BlockStored((1, 2), None, array("I", [1] * 16 + [2] * 16), 16, None, "GPU", 0,
                                          None, "full_attention")
    assert len(batch.events) == 2


def test_extra_keys_are_vllms_the_adapter_on_every_block_the_salt_on_the_first() -> None:
    events: list[CacheEvent] = [Stored(1, None, (1,) * 16, "sql", "tenant-a"), Stored(2, 1, (2,) * 16, "sql"),
                                Stored(3, None, (3,) * 16, None), Stored(4, 3, (4,) * 16, None),
                                Stored(5, None, (5,) * 16, None, "tenant-b")]
    batch = decode_batch("", 0, msgspec.msgpack.encode({"ts": 1.0, "events": vllm_events(events, 16)}))
    adapter, base = batch.events[0], batch.events[1]
    assert isinstance(adapter, BlockStored)
    assert isinstance(base, BlockStored)
    assert adapter.extra_keys == (["sql", "tenant-a"], ["sql"])
    assert base.block_hashes == (3, 4)
    assert base.extra_keys is None
    assert batch.events[2] == BlockStored((5,), None, array("I", [5] * 16), 16, None, "GPU", 0,
                                          (["tenant-b"],), "full_attention")


def test_a_salted_prompt_shares_its_blocks_only_with_the_same_salt() -> None:
    engine = make_engine(kv_events=True, num_gpu_blocks=64, block_size=16)
    tokens = prompt(64)
    engine.submit(SimRequest("a", tokens, 1, cache_salt="tenant-a"), 0.0)
    now, _ = _drain(engine, 0.0)
    first = [e for e in engine.take_kv_events() if isinstance(e, Stored)]
    assert first[0].salt == "tenant-a"
    assert all(e.salt is None for e in first[1:])
    assert engine.peek(tokens, None, now, "tenant-a").cached_tokens == 48  # the last block is recomputed
    assert engine.peek(tokens, None, now).cached_tokens == 0
    assert engine.peek(tokens, None, now, "tenant-b").cached_tokens == 0


async def test_kvgates_subscriber_follows_a_simulated_replica(
    make_fleet: FleetFactory, http: aiohttp.ClientSession
) -> None:
    port = free_port_pair()
    fleet = await make_fleet(1, kv_events_port=port, block_size=16)
    replica = fleet.replicas[0]
    assert replica.kv_events is not None
    index = EngineBlockIndex()
    context = zmq.asyncio.Context()
    publisher = replica.kv_events
    sub = EndpointSubscription(context, "r0", publisher.address, publisher.replay_address, index)
    sub.start()
    try:
        await asyncio.sleep(0.2)  # the subscription reaches the publisher (earlier batches: replayed)
        text = "the quick brown fox jumps over the lazy dog " * 20
        async with http.post(fleet.urls[0] + "/v1/completions",
                             json={"model": MODEL, "prompt": text, "max_tokens": 1}) as response:
            assert response.status == 200
        cached = replica.engine.kv_cache.num_cached_blocks
        for _ in range(100):
            if index.blocks("r0") == cached:
                break
            await asyncio.sleep(0.02)
        assert index.blocks("r0") == cached > 0
        keys = block_keys(list(encode(text)), 16)
        assert index.matches(keys)["r0"] == cached  # the prompt's whole blocks, from the first on
        assert sub.in_step
        assert sub.connected
        async with http.post(fleet.urls[0] + "/sim/kv-events/stop") as response:
            assert response.status == 200  # the publisher alone goes away; the replica serves on
        for _ in range(100):
            if not sub.in_step:
                break
            await asyncio.sleep(0.02)
        assert not sub.in_step  # noticed: its cache is estimated from here on
        assert sub.disconnects == 1
    finally:
        await sub.stop()
        context.term()


async def test_the_index_follows_evictions_in_a_small_cache(make_fleet: FleetFactory,
                                                            http: aiohttp.ClientSession) -> None:
    """64 blocks of 16 tokens: each new 480-token document evicts older ones; the subscriber's
    index holds exactly the replica's cached blocks after every request."""
    fleet = await make_fleet(1, kv_events_port=free_port_pair(), block_size=16, num_gpu_blocks=64)
    replica = fleet.replicas[0]
    assert replica.kv_events is not None
    index = EngineBlockIndex()
    context = zmq.asyncio.Context()
    publisher = replica.kv_events
    sub = EndpointSubscription(context, "r0", publisher.address, publisher.replay_address, index)
    sub.start()
    try:
        for _ in range(100):  # connected and subscribed before the first batch (PUB drops until then;
            if sub.connected:  # a batch lost before any other came cannot be told from none)
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)
        for i in range(8):
            text = f"{i:04d}" + "abcd" * 479  # 480 tokens: 30 blocks
            async with http.post(fleet.urls[0] + "/v1/completions",
                                 json={"model": MODEL, "prompt": text, "max_tokens": 1}) as response:
                assert response.status == 200
            cached = replica.engine.kv_cache.num_cached_blocks
            keys = block_keys(list(encode(text)), 16)
            # the response can come before the step's events are published: wait for this document's
            # blocks (the count alone can match the state before them: 2 documents of 30 blocks)
            for _ in range(100):
                if index.blocks("r0") == cached and index.matches(keys).get("r0", 0) == 30:
                    break
                await asyncio.sleep(0.02)
            assert index.blocks("r0") == cached
            assert index.matches(keys)["r0"] == 30  # 480 tokens: 30 whole blocks, all cached
        latest = block_keys(list(encode(f"{7:04d}" + "abcd" * 479)), 16)
        first = block_keys(list(encode(f"{0:04d}" + "abcd" * 479)), 16)
        assert index.matches(latest).get("r0", 0) > 0
        assert index.matches(first) == {}  # evicted, and the index knows
    finally:
        await sub.stop()
        context.term()


async def test_a_restarted_replica_starts_empty_and_kvgates_index_drops_it_at_once(
    make_fleet: FleetFactory, http: aiohttp.ClientSession
) -> None:
    """``POST /replicas/{i}/restart`` on the fleet admin: a new engine (empty cache, counters from
    zero, the fleet's totals kept) and a new publisher (sequence from 0) on the same addresses. The
    subscriber sees the old publisher go (out of step: its report no longer used) and at the new
    one's first batch (sequence 0) drops what the old engine held and follows the new one."""
    fleet = await make_fleet(1, kv_events_port=free_port_pair(), block_size=16, admin=True)
    publisher = fleet.replicas[0].kv_events
    assert publisher is not None
    index = EngineBlockIndex()
    context = zmq.asyncio.Context()
    sub = EndpointSubscription(context, "r0", publisher.address, publisher.replay_address, index)
    sub.start()
    text = "the quick brown fox jumps over the lazy dog " * 20
    keys = block_keys(list(encode(text)), 16)

    async def complete() -> None:
        async with http.post(fleet.urls[0] + "/v1/completions",
                             json={"model": MODEL, "prompt": text, "max_tokens": 1}) as response:
            assert response.status == 200

    async def until(condition: Callable[[], bool]) -> None:
        for _ in range(150):
            if condition():
                return
            await asyncio.sleep(0.02)
        raise AssertionError("not reached")

    try:
        await asyncio.sleep(0.2)
        await complete()
        await until(lambda: index.matches(keys).get("r0", 0) == len(keys))
        async with http.post(f"{fleet.admin_url}/replicas/0/restart") as response:
            assert response.status == 200
            assert (await response.json())["listening"] is True
        replica = fleet.replicas[0]
        assert replica.engine.kv_cache.num_cached_blocks == 0
        assert replica.counters.requests_received == 0
        await until(lambda: not sub.in_step)  # the old publisher's loss noticed
        await until(lambda: sub.connected is True)  # reconnected (a real engine loads for minutes)
        await asyncio.sleep(0.2)
        assert fleet.stats()["totals"]["requests_received"] == 1  # the old process's count kept
        other = "a different document entirely, with other words in it " * 20
        async with http.post(fleet.urls[0] + "/v1/completions",
                             json={"model": MODEL, "prompt": other, "max_tokens": 1}) as response:
            assert response.status == 200
        # the new publisher's first batch (sequence 0): the old engine's blocks are gone from the
        # index at once, the new engine's followed
        await until(lambda: sub.in_step and index.blocks("r0") == replica.engine.kv_cache.num_cached_blocks)
        assert index.matches(keys) == {}
        assert index.matches(block_keys(list(encode(other)), 16))["r0"] > 0
    finally:
        await sub.stop()
        context.term()


def test_kvgates_index_keys_a_continued_adapter_chain_as_its_requests_do() -> None:
    """The simulated engine's events, on vLLM's wire, into the picker's index: an adapter's salted
    prompt, then a longer one that hits its blocks and stores only the new ones (an event whose
    parent is the last cached block): the longer prompt's keys, as the picker computes them from
    its tokens, match every block."""
    engine = make_engine(kv_events=True, num_gpu_blocks=64, block_size=16, max_loras=2)
    engine.load_lora("sql")
    tokens = prompt(96)
    index = EngineBlockIndex()
    stored: list[BlockStored] = []
    now = 0.0
    for seq, (rid, upto) in enumerate([("a", 48), ("b", 96)]):
        engine.submit(SimRequest(rid, tokens[:upto], 1, "sql", cache_salt="t"), now)
        now, _ = _drain(engine, now)
        payload = msgspec.msgpack.encode({"ts": now, "events": vllm_events(engine.take_kv_events(), 16)})
        batch = decode_batch("", seq, payload)
        stored += [e for e in batch.events if isinstance(e, BlockStored)]
        apply_batch(index, "r0", batch)
    assert [(len(e.block_hashes), e.parent_block_hash is None) for e in stored] == [(3, True), (3, False)]
    assert index.matches(block_keys(tokens, 16, parent=chain_root("sql", "t"))) == {"r0": 6}
    assert index.matches(block_keys(tokens, 16, parent=chain_root("sql"))) == {}


def test_generated_blocks_are_cached_and_reported_as_vllm_caches_them() -> None:
    """With the ids its output has where a next turn resends it, a request's full blocks of prompt
    and output enter the prefix cache as they are computed (vLLM caches generated tokens' blocks
    too): a next turn that resends the reply hits them, and their events chain on the prompt's."""
    engine = make_engine(kv_events=True, num_gpu_blocks=64, block_size=16)
    tokens = prompt(40)
    reply = tuple(range(500, 540))  # 40 output tokens: the last one's KV is never computed
    engine.submit(SimRequest("turn1", tokens, 40, output_tokens=reply), 0.0)
    now, _ = _drain(engine, 0.0)
    stored = [e for e in engine.take_kv_events() if isinstance(e, Stored)]
    assert len(stored) == (40 + 39) // 16  # 4: two of prompt, one across both, one of output
    assert stored[3].tokens == reply[8:24]
    assert [s.parent_hash for s in stored[1:]] == [s.block_hash for s in stored[:-1]]
    turn2 = tokens + reply + prompt(30, salt=3)
    assert engine.peek(turn2, None, now).cached_tokens == 64
    engine.submit(SimRequest("plain", prompt(40, salt=7), 40), now)
    _drain(engine, now)
    assert len([e for e in engine.take_kv_events() if isinstance(e, Stored)]) == 2  # its prompt's only
