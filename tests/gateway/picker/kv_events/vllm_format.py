"""vLLM's KV-event classes as its publisher declares them (``vllm/distributed/kv_events.py``), to
encode messages exactly as an engine sends them: the current release's (maps tagged by ``type``) and
an older one's (``array_like``: positional arrays, the tag first; integer block hashes)."""

from __future__ import annotations

from typing import Any

import msgspec


class EventBatch(msgspec.Struct, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int | bytes]
    medium: str | None
    group_idx: int | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class OldEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class OldKVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class OldBlockStored(OldKVCacheEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class OldBlockRemoved(OldKVCacheEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None


class FutureEvent(KVCacheEvent):
    """A type a newer engine might send (kvgate skips it)."""

    whatever: int


def message(seq: int, events: list[Any], *, topic: str = "kv@10.0.0.1@llama", old: bool = False,
            rank: int | None = None) -> list[bytes]:
    """The three frames the publisher sends for one batch."""
    batch = (OldEventBatch if old else EventBatch)(ts=1700000000.5, events=events, data_parallel_rank=rank)
    return [topic.encode(), seq.to_bytes(8, "big"), msgspec.msgpack.encode(batch)]
