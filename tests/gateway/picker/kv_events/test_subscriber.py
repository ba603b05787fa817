"""The KV-event subscriber against a publisher speaking vLLM's protocol over real ZMQ sockets."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import msgspec
import pytest
import zmq.asyncio

from kvgate.gateway.picker.kv_events.subscriber import (
    EndpointSubscription,
    KvEventSubscribers,
    endpoint_of_topic,
)
from kvgate.policies.engine_blocks import EngineBlockIndex, block_keys
from tests.gateway.picker.kv_events import vllm_format as v
from tests.gateway.picker.kv_events.vllm_publisher import VllmPublisher, stored

ENDPOINT = "127.0.0.1:8000"
DOC = list(range(1000, 1064))  # 4 blocks
KEYS = block_keys(DOC, 16)


@pytest.fixture
async def context() -> AsyncIterator[zmq.asyncio.Context]:
    ctx = zmq.asyncio.Context()
    yield ctx
    ctx.term()


async def publisher_and_subscription(
    context: zmq.asyncio.Context, buffer_steps: int = 10_000, replay: bool = True
) -> tuple[VllmPublisher, EndpointSubscription, EngineBlockIndex]:
    publisher = VllmPublisher(context, buffer_steps=buffer_steps)
    index = EngineBlockIndex()
    sub = EndpointSubscription(context, ENDPOINT, publisher.address,
                               publisher.replay_address if replay else None, index, replay_timeout_s=2.0)
    return publisher, sub, index


async def test_events_over_the_socket_follow_the_engines_cache(context: zmq.asyncio.Context) -> None:
    publisher, sub, index = await publisher_and_subscription(context)
    sub.start()
    try:
        for _ in range(100):  # PUB/SUB: the subscription takes a moment to reach the publisher
            await publisher.pub.send_multipart([b"probe"])  # a malformed message: counted, dropped
            await asyncio.sleep(0.02)
            if sub.counts.malformed:
                break
        await publisher.publish([stored([1, 2], None, DOC[:32])])
        await publisher.publish([stored([3, 4], 2, DOC[32:])])
        for _ in range(100):
            if index.matches(KEYS).get(ENDPOINT) == 4:
                break
            await asyncio.sleep(0.02)
        assert index.matches(KEYS) == {ENDPOINT: 4}
        await publisher.publish([v.BlockRemoved(block_hashes=[4, 3], medium="GPU")])  # tail first
        for _ in range(100):
            if index.matches(KEYS).get(ENDPOINT) == 2:
                break
            await asyncio.sleep(0.02)
        assert index.matches(KEYS) == {ENDPOINT: 2}
        assert sub.in_step
    finally:
        await sub.stop()
        await publisher.close()


async def test_a_gap_is_filled_from_the_replay_socket(context: zmq.asyncio.Context) -> None:
    publisher, sub, index = await publisher_and_subscription(context)
    try:
        first = publisher.frames([stored([1], None, DOC[:16])])
        publisher.frames([stored([2], 1, DOC[16:32])])  # missed
        publisher.frames([stored([3], 2, DOC[32:48])])  # missed
        last = publisher.frames([stored([4], 3, DOC[48:])])
        await sub.receive(first)
        await sub.receive(last)
        assert (sub.counts.gaps, sub.counts.replayed, sub.counts.unrecoverable) == (1, 2, 0)
        assert index.matches(KEYS) == {ENDPOINT: 4}
        assert sub.in_step
        await sub.receive(last)  # a duplicate: nothing changes
        assert sub.counts.batches == 4
    finally:
        await publisher.close()


async def test_an_unrecoverable_gap_drops_the_endpoints_entries_and_puts_it_out_of_step(
    context: zmq.asyncio.Context,
) -> None:
    publisher, sub, index = await publisher_and_subscription(context, buffer_steps=1)
    try:
        await sub.receive(publisher.frames([stored([1], None, DOC[:16])]))
        publisher.frames([stored([2], 1, DOC[16:32])])  # missed, and gone from the buffer
        later = publisher.frames([stored([9], None, DOC[:16])])
        await sub.receive(later)
        assert sub.counts.unrecoverable == 1
        assert not sub.in_step
        assert index.matches(KEYS) == {ENDPOINT: 1}  # only what came after the loss
        await sub.receive(publisher.frames([v.AllBlocksCleared()]))
        assert sub.in_step  # the engine's cache is empty and so is the index: exact again
        assert index.matches(KEYS) == {}
    finally:
        await publisher.close()


async def test_without_a_replay_socket_a_gap_is_unrecoverable_and_a_restart_clears(
    context: zmq.asyncio.Context,
) -> None:
    publisher, sub, index = await publisher_and_subscription(context, replay=False)
    try:
        await sub.receive(publisher.frames([stored([1, 2], None, DOC[:32])]))
        await sub.receive(publisher.frames([stored([3], 2, DOC[32:48])], seq=5))
        assert sub.counts.unrecoverable == 1
        restarted = [b"", (0).to_bytes(8, "big"), msgspec.msgpack.encode(v.EventBatch(ts=2.0, events=[]))]
        await sub.receive(restarted)
        assert index.blocks(ENDPOINT) == 0  # a new publisher: the engine's cache starts empty
        assert sub.in_step
    finally:
        await publisher.close()


def test_llm_d_topics_name_the_endpoint() -> None:
    assert endpoint_of_topic("kv@10.1.2.3@meta-llama/Llama-3.1-8B", 8000) == "10.1.2.3:8000"
    assert endpoint_of_topic("", 8000) is None


async def test_subscriptions_follow_the_pools_endpoints(context: zmq.asyncio.Context) -> None:
    indexes: dict[str, EngineBlockIndex] = {}
    subscribers = KvEventSubscribers(lambda pool: indexes.setdefault(pool, EngineBlockIndex()))
    try:
        subscribers.set_endpoints("p", {"10.0.0.1:8000": ("tcp://127.0.0.1:1", None),
                                        "10.0.0.2:8000": ("tcp://127.0.0.1:2", "tcp://127.0.0.1:3")})
        assert sorted(k[1] for k in subscribers.subscriptions()) == ["10.0.0.1:8000", "10.0.0.2:8000"]
        assert not subscribers.in_step("p", "10.0.0.1:8000")  # nothing received yet
        subscribers.set_endpoints("p", {"10.0.0.2:8000": ("tcp://127.0.0.1:2", "tcp://127.0.0.1:3")})
        assert [k[1] for k in subscribers.subscriptions()] == ["10.0.0.2:8000"]
    finally:
        await subscribers.stop()


async def test_engines_connecting_to_a_bound_socket_are_told_apart_by_their_topics(
    context: zmq.asyncio.Context,
) -> None:
    """llm-d's topology: the picker binds, two engines (127.0.8.1, 127.0.8.2) connect with topics
    ``kv@<ip>@<model>``; each batch lands on its endpoint, a gap is filled from that engine's own
    replay socket, a topic naming no endpoint is counted and dropped."""
    from kvgate.gateway.processes.envoy_process import free_port

    indexes: dict[str, EngineBlockIndex] = {}
    subscribers = KvEventSubscribers(lambda pool: indexes.setdefault(pool, EngineBlockIndex()))
    bind = f"tcp://127.0.0.1:{free_port()}"
    engines = [VllmPublisher(context, connect=bind, host=f"127.0.8.{i}", topic=f"kv@127.0.8.{i}@m")
               for i in (1, 2)]
    stranger = VllmPublisher(context, connect=bind, topic="kv@10.9.9.9@m")
    try:
        publishers: dict[str, tuple[str | None, str | None]] = {
            f"127.0.8.{i + 1}:8000": (None, engine.replay_address) for i, engine in enumerate(engines)}
        subscribers.set_endpoints("p", publishers, bind)
        await asyncio.sleep(0.3)  # the publishers' connections and subscriptions settle
        other = list(range(2000, 2032))
        await engines[0].publish([stored([1, 2, 3, 4], None, DOC)])
        engines[1].frames([stored([9], None, other[:16])])  # seq 0 never sent: the gap is replayed
        await engines[1].publish([stored([10], 9, other[16:])])
        await stranger.publish([stored([5], None, DOC[:16])])
        index = indexes["p"]
        for _ in range(100):
            if index.blocks("127.0.8.1:8000") == 4 and index.blocks("127.0.8.2:8000") == 2:
                break
            await asyncio.sleep(0.02)
        assert index.matches(KEYS) == {"127.0.8.1:8000": 4}
        assert index.matches(block_keys(other, 16)) == {"127.0.8.2:8000": 2}
        subs = subscribers.subscriptions()
        assert subs[("p", "127.0.8.2:8000")].counts.replayed == 1
        assert subscribers.in_step("p", "127.0.8.1:8000")
        assert subscribers.in_step("p", "127.0.8.2:8000")
        for _ in range(50):
            if subscribers.unrouted() == 1:
                break
            await asyncio.sleep(0.02)
        assert subscribers.unrouted() == 1
    finally:
        for publisher in (*engines, stranger):
            await publisher.close()
        await subscribers.stop()
