"""A publisher speaking vLLM's ``ZmqEventPublisher`` protocol, for the subscriber's tests: a PUB
socket sending ``(topic, seq, payload)`` and a ROUTER replay socket answering ``(b"", start_seq)``
with each buffered ``(b"", seq, payload)`` from ``start_seq`` on, then ``(b"", -1, b"")``."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import Any

import msgspec
import zmq
import zmq.asyncio

from tests.gateway.picker.kv_events import vllm_format as v

END_SEQ = (-1).to_bytes(8, "big", signed=True)


class VllmPublisher:
    def __init__(self, context: zmq.asyncio.Context, *, topic: str = "", buffer_steps: int = 10_000,
                 connect: str | None = None, host: str = "127.0.0.1") -> None:
        """PUB bound on a random port of ``host``, or connected to ``connect`` (vLLM connects when
        its endpoint has no wildcard); replay ROUTER bound on ``host``."""
        self.pub = context.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        if connect is None:
            port = self.pub.bind_to_random_port(f"tcp://{host}")
            self.address = f"tcp://{host}:{port}"
        else:
            self.pub.connect(connect)
            self.address = connect
        self.router = context.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        replay_port = self.router.bind_to_random_port(f"tcp://{host}")
        self.replay_address = f"tcp://{host}:{replay_port}"
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self.topic = topic.encode()
        self.next_seq = 0
        self._replays = asyncio.create_task(self._serve_replays())

    def frames(self, events: list[Any], seq: int | None = None) -> list[bytes]:
        """The next batch's frames, buffered for replay (not sent)."""
        number = self.next_seq if seq is None else seq
        self.next_seq = number + 1
        payload = msgspec.msgpack.encode(v.EventBatch(ts=1.0, events=events))
        self.buffer.append((number, payload))
        return [self.topic, number.to_bytes(8, "big"), payload]

    async def publish(self, events: list[Any]) -> list[bytes]:
        frames = self.frames(events)
        await self.pub.send_multipart(frames)
        return frames

    async def _serve_replays(self) -> None:
        while True:
            client, _, start = await self.router.recv_multipart()
            first = int.from_bytes(start, "big")
            for seq, payload in list(self.buffer):
                if seq >= first:
                    await self.router.send_multipart([client, b"", seq.to_bytes(8, "big"), payload])
            await self.router.send_multipart([client, b"", END_SEQ, b""])

    async def close(self) -> None:
        self._replays.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._replays
        self.pub.close(linger=0)
        self.router.close(linger=0)


def stored(hashes: list[int | bytes], parent: int | None, tokens: list[int]) -> v.BlockStored:
    return v.BlockStored(block_hashes=hashes, parent_block_hash=parent, token_ids=tokens, block_size=16,
                         lora_id=None, medium="GPU", lora_name=None)
