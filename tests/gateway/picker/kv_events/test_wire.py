"""Decoding vLLM's KV-event messages (``gateway.picker.kv_events.wire``), both encodings."""

from __future__ import annotations

from array import array

import msgspec
import pytest

from kvgate.gateway.picker.kv_events.wire import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    MalformedBatch,
    decode_message,
    decode_seq,
)
from tests.gateway.picker.kv_events import vllm_format as v

TOKENS = list(range(32))


def test_the_current_encoding_maps_tagged_by_type() -> None:
    h1, h2 = b"\x01" * 32, b"\x02" * 32
    frames = v.message(7, [
        v.BlockStored(block_hashes=[h1, h2], parent_block_hash=None, token_ids=TOKENS, block_size=16,
                      lora_id=None, medium="GPU", lora_name="sql-lora",
                      extra_keys=[("sql-lora", ("img-1", 3)), ("sql-lora",)], group_idx=0,
                      kv_cache_spec_kind="full_attention"),
        v.BlockRemoved(block_hashes=[h1], medium="CPU"),
        v.AllBlocksCleared(),
    ], rank=1)
    batch = decode_message(frames)
    assert (batch.topic, batch.seq, batch.ts) == ("kv@10.0.0.1@llama", 7, 1700000000.5)
    assert batch.data_parallel_rank == 1
    stored, removed, cleared = batch.events
    assert stored == BlockStored((h1, h2), None, array("I", TOKENS), 16, "sql-lora", "GPU", 0,
                                 (["sql-lora", ["img-1", 3]], ["sql-lora"]), "full_attention")
    assert removed == BlockRemoved((h1,), "CPU", None)
    assert cleared == AllBlocksCleared()
    assert batch.skipped == 0


def test_an_older_release_positional_arrays_and_integer_hashes() -> None:
    frames = v.message(0, [
        v.OldBlockStored(block_hashes=[11, 12], parent_block_hash=10, token_ids=TOKENS, block_size=16,
                         lora_id=None, medium=None),
        v.OldBlockRemoved(block_hashes=[12], medium=None),
    ], old=True)
    assert frames[2][:1] == b"\x93"  # an array (ts, events, rank): positional, as such releases sent it
    batch = decode_message(frames)
    stored = BlockStored((11, 12), 10, array("I", TOKENS), 16, None, "GPU")
    assert batch.events == (stored, BlockRemoved((12,), "GPU"))


def test_an_unknown_event_type_is_skipped_and_counted() -> None:
    frames = v.message(3, [v.FutureEvent(whatever=1), v.AllBlocksCleared()])
    batch = decode_message(frames)
    assert batch.events == (AllBlocksCleared(),)
    assert batch.skipped == 1


@pytest.mark.parametrize("frames", [
    [b"topic", (1).to_bytes(8, "big")],  # two frames
    [b"topic", b"\x00\x01", msgspec.msgpack.encode({"ts": 1.0, "events": []})],  # a short sequence number
    [b"topic", (1).to_bytes(8, "big"), b"\xc1"],  # not msgpack
    [b"topic", (1).to_bytes(8, "big"), msgspec.msgpack.encode("hello")],  # not a batch
    [b"topic", (1).to_bytes(8, "big"), msgspec.msgpack.encode({"ts": 1.0, "events": 3})],
    [b"topic", (1).to_bytes(8, "big"),
     msgspec.msgpack.encode({"ts": 1.0, "events": [{"type": "BlockStored", "block_hashes": "x"}]})],
    [b"topic", (1).to_bytes(8, "big"), msgspec.msgpack.encode(
        {"ts": 1.0, "events": [{"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None,
                                "token_ids": [1], "block_size": 0}]})],
    *([b"topic", (1).to_bytes(8, "big"), msgspec.msgpack.encode(
        {"ts": 1.0, "events": [{"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None,
                                "token_ids": tokens, "block_size": 16}]})]
      for tokens in ([1, "x"], [1, -1], [1, 2**40], [1.5], "abc")),
])
def test_a_malformed_message_raises_malformed_batch(frames: list[bytes]) -> None:
    with pytest.raises(MalformedBatch):
        decode_message(frames)


def test_the_replay_sockets_end_marker() -> None:
    assert decode_seq((-1).to_bytes(8, "big", signed=True)) == -1
