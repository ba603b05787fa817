"""vLLM's KV-cache events as they arrive on the wire, decoded into plain values (sans-IO).

vLLM's ``ZmqEventPublisher`` (``vllm/distributed/kv_events.py``) sends each batch as a three-frame
multipart message: the topic (bytes; llm-d's convention ``kv@<pod-ip>@<model>``, vLLM's default
empty), the sequence number (8 bytes, big-endian, from 0) and the payload: msgpack of an
``EventBatch`` ``{ts, events, data_parallel_rank}`` whose events are ``BlockStored``,
``BlockRemoved`` and ``AllBlocksCleared``, tagged by their class name. Recent releases encode the
batch and each event as a map (the event's tag under ``"type"``); older ones as positional arrays
(the tag first, then the fields in declaration order). Both are read. A block hash is an integer
(older releases) or bytes (a digest); either is kept as it is, as an opaque key.

An event of a type this module does not know is skipped and counted (a newer engine's events must
not stop the index); a message that is not a batch raises :class:`MalformedBatch`.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgspec

BlockHash = int | bytes
GPU: Final = "GPU"


class MalformedBatch(ValueError):
    """A message that is not a KV-event batch (counted and dropped by the subscriber)."""


@dataclass(frozen=True, slots=True)
class BlockStored:
    block_hashes: tuple[BlockHash, ...]
    parent_block_hash: BlockHash | None
    token_ids: Sequence[int]
    """Packed (``array("I")``: token ids are below 2**32)."""
    block_size: int
    lora_name: str | None = None
    medium: str = GPU
    group_idx: int | None = None
    extra_keys: tuple[object, ...] | None = None
    """Per block: the extra keys vLLM hashed it with (None where it has none), as decoded."""
    kv_cache_spec_kind: str | None = None
    """The group's spec kind (``full_attention``, ``sliding_window``, ``mamba``, ...)."""


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: tuple[BlockHash, ...]
    medium: str = GPU
    group_idx: int | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    topic: str
    seq: int
    ts: float
    events: tuple[KvEvent, ...]
    data_parallel_rank: int | None = None
    skipped: int = 0
    """Events of types not known here (skipped)."""


_STORED_FIELDS: Final = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
                         "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind",
                         "kv_cache_spec_sliding_window")
_REMOVED_FIELDS: Final = ("block_hashes", "medium", "group_idx")
_BATCH_FIELDS: Final = ("ts", "events", "data_parallel_rank")
END_OF_REPLAY: Final = -1
"""The sequence number of the replay socket's last frame (vLLM's ``END_SEQ``)."""


def decode_seq(frame: bytes) -> int:
    if len(frame) != 8:
        raise MalformedBatch(f"a sequence number is 8 bytes, not {len(frame)}")
    return int.from_bytes(frame, "big", signed=True)


def decode_message(frames: Sequence[bytes]) -> EventBatch:
    """One publisher message: ``(topic, seq, payload)``."""
    if len(frames) != 3:
        raise MalformedBatch(f"a KV-event message has 3 frames, not {len(frames)}")
    topic, seq, payload = frames
    return decode_batch(topic.decode("utf-8", "replace"), decode_seq(seq), payload)


def decode_batch(topic: str, seq: int, payload: bytes) -> EventBatch:
    try:
        raw = msgspec.msgpack.decode(payload)
    except msgspec.DecodeError as exc:
        raise MalformedBatch(f"not msgpack: {exc}") from exc
    batch = _fields(raw, _BATCH_FIELDS, "batch")
    events_raw = batch.get("events")
    if not isinstance(events_raw, list):
        raise MalformedBatch("a batch's events are a list")
    ts = batch.get("ts")
    rank = batch.get("data_parallel_rank")
    events: list[KvEvent] = []
    skipped = 0
    for item in events_raw:
        event = _event(item)
        if event is None:
            skipped += 1
        else:
            events.append(event)
    return EventBatch(topic, seq, float(ts) if isinstance(ts, int | float) else 0.0, tuple(events),
                      rank if isinstance(rank, int) else None, skipped)


def _fields(raw: Any, names: Sequence[str], what: str) -> Mapping[str, Any]:
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, list):
        return dict(zip(names, raw, strict=False))
    raise MalformedBatch(f"a {what} is a map or an array, not {type(raw).__name__}")


def _event(raw: Any) -> KvEvent | None:
    """One event, or None for a type not known here; raises MalformedBatch for a known type whose
    fields are wrong."""
    if isinstance(raw, dict):
        tag = raw.get("type")
        fields: Mapping[str, Any] = raw
    elif isinstance(raw, list) and raw:
        tag = raw[0]
        names = _STORED_FIELDS if tag == "BlockStored" else _REMOVED_FIELDS
        fields = dict(zip(names, raw[1:], strict=False))
    else:
        raise MalformedBatch(f"an event is a map or an array, not {type(raw).__name__}")
    if tag == "BlockStored":
        return BlockStored(
            block_hashes=_hashes(fields.get("block_hashes")),
            parent_block_hash=_hash_or_none(fields.get("parent_block_hash")),
            token_ids=_ints(fields.get("token_ids"), "token_ids"),
            block_size=_positive(fields.get("block_size")),
            lora_name=_str_or_none(fields.get("lora_name")),
            medium=_str_or_none(fields.get("medium")) or GPU,
            group_idx=_int_or_none(fields.get("group_idx")),
            extra_keys=_extra_keys(fields.get("extra_keys")),
            kv_cache_spec_kind=_str_or_none(fields.get("kv_cache_spec_kind")),
        )
    if tag == "BlockRemoved":
        return BlockRemoved(_hashes(fields.get("block_hashes")), _str_or_none(fields.get("medium")) or GPU,
                            _int_or_none(fields.get("group_idx")))
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    return None


def _hash(value: Any) -> BlockHash:
    if isinstance(value, bool) or not isinstance(value, int | bytes):
        raise MalformedBatch(f"a block hash is an integer or bytes, not {type(value).__name__}")
    return value


def _hash_or_none(value: Any) -> BlockHash | None:
    return None if value is None else _hash(value)


def _hashes(value: Any) -> tuple[BlockHash, ...]:
    if not isinstance(value, list):
        raise MalformedBatch("block_hashes is a list")
    return tuple(_hash(v) for v in value)


def _ints(value: Any, name: str) -> array[int]:
    """A list of token ids, packed (checked in C: ~20 times faster than a check per id in Python)."""
    if not isinstance(value, list):
        raise MalformedBatch(f"{name} is a list of integers")
    try:
        return array("I", value)
    except (TypeError, OverflowError):
        raise MalformedBatch(f"{name} is a list of integers from 0 to 2**32 - 1") from None


def _extra_keys(value: Any) -> tuple[object, ...] | None:
    """One entry per block (a list, or None): kept as decoded; anything else is no extra keys."""
    if not isinstance(value, list):
        return None
    return tuple(v if isinstance(v, list) else None for v in value)


def _positive(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise MalformedBatch("block_size is a positive integer")
    return value


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None
