"""The simulated replica's KV-event publisher: vLLM's ``ZmqEventPublisher`` protocol
(``vllm/distributed/kv_events.py``), so a subscriber built for vLLM follows the simulator.

- A PUB socket bound on ``tcp://<host>:<port>`` sends one message per engine step that changed the
  prefix cache: ``(topic, seq, payload)`` with ``seq`` an 8-byte big-endian counter from 0 and the
  payload msgpack of ``EventBatch{ts, events, data_parallel_rank}``; events are maps tagged by
  ``type`` (vLLM's current encoding): ``BlockStored`` (one per newly cached full prompt block, with
  its parent's hash, its tokens, block size, LoRA name, medium ``GPU``, the extra keys vLLM hashes
  with (the adapter's name, a first block's cache salt), group 0 of kind ``full_attention``) and
  ``BlockRemoved`` (an evicted block). Block hashes are the simulator's own 64-bit integers.
- A ROUTER replay socket on ``port + 1``: a request ``(b"", start_seq)`` from a DEALER is answered
  with each buffered ``(b"", seq, payload)`` from ``start_seq`` on, then ``(b"", -1, b"")``. The
  last ``buffer_steps`` batches are kept.
- The topic is llm-d's ``kv@<host>@<model>``.

``stop`` closes both sockets (an admin call can stop a replica's publisher alone: a subscriber
must notice and fall back for that replica).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import Any

import msgspec
import zmq
import zmq.asyncio

from kvgate.simulator.engine_types import CacheEvent, Stored

END_SEQ = (-1).to_bytes(8, "big", signed=True)


class _Batch(msgspec.Struct, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class _Event(msgspec.Struct, omit_defaults=True, gc=False, tag_field="type", tag=True):
    pass


class BlockStored(_Event):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[list[Any] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None


class BlockRemoved(_Event):
    block_hashes: list[int]
    medium: str | None
    group_idx: int | None = None


def _extras(event: Stored) -> list[Any] | None:
    """A block's extra keys as vLLM's ``generate_block_hash_extra_keys`` makes them: the adapter's
    name, the ``(identifier, offset)`` of each image the block holds part of, then the cache salt on
    a prompt's first block; None when none of them."""
    keys = ([event.lora] if event.lora else []) + [list(item) for item in event.media] + (
        [event.salt] if event.salt else [])
    return keys or None


def vllm_events(events: list[CacheEvent], block_size: int) -> list[_Event]:
    """The engine's events as vLLM's (consecutive stored blocks of one chain merged into one event,
    as vLLM reports a request's new blocks together)."""
    out: list[_Event] = []
    for event in events:
        if isinstance(event, Stored):
            last = out[-1] if out else None
            extras = _extras(event)
            if (isinstance(last, BlockStored) and last.block_hashes[-1] == event.parent_hash
                    and last.lora_name == event.lora):
                last.block_hashes.append(event.block_hash)
                last.token_ids.extend(event.tokens)
                if last.extra_keys is not None or extras is not None:
                    last.extra_keys = [*(last.extra_keys or [None] * (len(last.block_hashes) - 1)), extras]
                continue
            out.append(BlockStored(block_hashes=[event.block_hash], parent_block_hash=event.parent_hash,
                                   token_ids=list(event.tokens), block_size=block_size, lora_id=None,
                                   medium="GPU", lora_name=event.lora,
                                   extra_keys=None if extras is None else [extras], group_idx=0,
                                   kv_cache_spec_kind="full_attention"))
        else:
            last = out[-1] if out else None
            if isinstance(last, BlockRemoved):
                last.block_hashes.append(event.block_hash)
                continue
            out.append(BlockRemoved(block_hashes=[event.block_hash], medium="GPU", group_idx=0))
    return out


class KvEventPublisher:
    def __init__(self, host: str, port: int, topic: str, *, buffer_steps: int = 10_000,
                 connect: str | None = None) -> None:
        """PUB bound on ``host:port`` (or connected to ``connect``: vLLM's convention for an
        endpoint without a wildcard, llm-d's picker binding), replay ROUTER on ``host:port + 1``."""
        self._context = zmq.asyncio.Context()
        self._pub = self._context.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.setsockopt(zmq.SNDHWM, 100_000)
        self._router = self._context.socket(zmq.ROUTER)
        self._router.setsockopt(zmq.LINGER, 0)
        try:
            if connect is not None:
                self._pub.connect(connect)
            else:
                self._pub.bind(f"tcp://{host}:{port}")
            self._router.bind(f"tcp://{host}:{port + 1}")
        except zmq.ZMQError:
            self._pub.close(linger=0)
            self._router.close(linger=0)
            self._context.term()
            raise
        self.address = connect if connect is not None else f"tcp://{host}:{port}"
        self.replay_address = f"tcp://{host}:{port + 1}"
        self._topic = topic.encode()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._seq = 0
        self._encoder = msgspec.msgpack.Encoder()
        self._replays: asyncio.Task[None] | None = asyncio.create_task(self._serve_replays())
        self.published = 0
        self.running = True

    def publish(self, ts: float, events: list[_Event]) -> None:
        if not events or not self.running:
            return
        payload = self._encoder.encode(_Batch(ts=ts, events=events))
        seq = self._seq
        self._seq += 1
        self._buffer.append((seq, payload))
        with contextlib.suppress(zmq.Again):  # PUB never blocks; a full queue drops, as vLLM's may
            self._pub.send_multipart([self._topic, seq.to_bytes(8, "big"), payload], flags=zmq.NOBLOCK)
        self.published += 1

    async def _serve_replays(self) -> None:
        while True:
            frames = await self._router.recv_multipart()
            if len(frames) != 3:
                continue
            client, _, start = frames
            first = int.from_bytes(start, "big")
            for seq, payload in list(self._buffer):
                if seq >= first:
                    await self._router.send_multipart([client, b"", seq.to_bytes(8, "big"), payload])
            await self._router.send_multipart([client, b"", END_SEQ, b""])

    async def stop(self) -> None:
        self.running = False
        task, self._replays = self._replays, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._pub.close(linger=0)
        self._router.close(linger=0)
        self._context.term()
