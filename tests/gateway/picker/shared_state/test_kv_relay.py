"""KV events relayed through Redis (``shared_state.kv_relay``): in llm-d's topology one picker
binds the socket the engines connect to, another picker of the pool (a ``--workers`` sibling) cannot,
and follows the engines' caches through a real redis-server; real ZMQ sockets, vLLM's wire format."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import msgspec
import pytest
import zmq.asyncio

from kvgate.gateway.picker.kv_events.subscriber import KvEventSubscribers
from kvgate.gateway.picker.redis_link import RedisLink, RedisSettings
from kvgate.gateway.picker.shared_state import SharedStateSync
from kvgate.gateway.picker.shared_state.kv_relay import KvEventsRelay
from kvgate.gateway.processes.envoy_process import free_port
from kvgate.policies.engine_blocks import EngineBlockIndex, block_keys
from tests.gateway.picker.kv_events.vllm_publisher import VllmPublisher, stored
from tests.redis_server import RedisServer

DOC = list(range(1000, 1064))  # 4 blocks of 16
KEYS = block_keys(DOC, 16)
ENDPOINT = "127.0.8.1:8000"


def test_an_entry_carries_the_messages_as_sent_and_an_unreadable_one_is_counted() -> None:
    got: list[tuple[str, list[bytes]]] = []
    relay = KvEventsRelay(lambda pool, frames: got.append((pool, frames)))
    woken: list[int] = []
    relay.wake = lambda: woken.append(1)
    relay.relay("p", [b"kv@1.2.3.4@m", b"\x00" * 8, b"payload"])
    relay.relay("p", [b"kv@1.2.3.4@m", b"\x01".rjust(8, b"\x00"), b"more"])
    assert woken == [1, 1]
    [(pool, payload)] = relay.take()
    assert relay.take() == []
    relay.received_entry(pool, payload)
    assert got == [("p", [b"kv@1.2.3.4@m", b"\x00" * 8, b"payload"]),
                   ("p", [b"kv@1.2.3.4@m", b"\x01".rjust(8, b"\x00"), b"more"])]
    relay.received_entry("p", b"not msgpack \xff")
    relay.received_entry("p", msgspec.msgpack.encode([["not bytes"]]))
    assert relay.bad_entries == 2
    assert (relay.sent, relay.received) == (2, 2)


class Picker:
    def __init__(self, redis: RedisServer, bind: str, replay: str) -> None:
        settings = RedisSettings(url=redis.url, key_prefix="t", sync_interval_s=0.02, read_block_s=0.05,
                                 backoff_initial_s=0.05, backoff_max_s=0.2)
        self.sync = SharedStateSync(RedisLink(settings))
        self.sync.state_for("p")
        self.index = EngineBlockIndex()
        self.subscribers: KvEventSubscribers | None = None
        self.bind, self.replay = bind, replay

    async def start(self) -> None:
        holder: list[KvEventSubscribers] = []
        relay = self.sync.share_kv_events(lambda pool, frames: holder[0].deliver(pool, frames))
        self.subscribers = KvEventSubscribers(lambda pool: self.index, relay.relay)
        holder.append(self.subscribers)
        self.subscribers.set_endpoints("p", {ENDPOINT: (None, self.replay)}, self.bind)
        self.sync.follow_kv_events(["p"])
        await self.sync.start()

    async def stop(self) -> None:
        if self.subscribers is not None:
            await self.subscribers.stop()
        await self.sync.stop()
        await self.sync.link.close()


@pytest.fixture
async def context() -> AsyncIterator[zmq.asyncio.Context]:
    ctx = zmq.asyncio.Context()
    yield ctx
    ctx.term()


async def eventually(check: Callable[[], bool], what: str, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for: {what}"
        await asyncio.sleep(0.02)


async def test_a_picker_that_cannot_bind_follows_the_engines_through_the_one_that_did(
    redis_server: RedisServer, context: zmq.asyncio.Context
) -> None:
    bind = f"tcp://127.0.0.1:{free_port()}"
    engine = VllmPublisher(context, connect=bind, host="127.0.8.1", topic="kv@127.0.8.1@m")
    binder, follower = Picker(redis_server, bind, engine.replay_address), \
        Picker(redis_server, bind, engine.replay_address)
    try:
        await binder.start()
        await follower.start()  # its bind fails: the binder holds the address
        await asyncio.sleep(0.3)  # the engine's connection and subscription settle
        await engine.publish([stored([1, 2], None, DOC[:32])])
        engine.frames([stored([3], 2, DOC[32:48])])  # never sent: each picker replays it itself
        await engine.publish([stored([4], 3, DOC[48:])])
        await eventually(lambda: binder.index.blocks(ENDPOINT) == 4, "the binder follows the engine")
        await eventually(lambda: follower.index.blocks(ENDPOINT) == 4, "the follower, through Redis")
        assert follower.index.matches(KEYS) == {ENDPOINT: 4}
        assert binder.subscribers is not None
        assert follower.subscribers is not None
        followed = follower.subscribers.subscriptions()[("p", ENDPOINT)]
        assert followed.counts.replayed == 1
        assert followed.in_step
        assert follower.subscribers.delivered == 2
        assert binder.sync.kv_relay is not None
        assert binder.sync.kv_relay.sent == 2
        assert binder.subscribers.delivered == 0  # its own entries are skipped
    finally:
        await engine.close()
        await binder.stop()
        await follower.stop()
