"""Wire format of what pickers share through Redis (pure; no IO).

* Prefix insertions and session pins travel as *event batches*: one stream entry per flush holds
  a compact binary blob of many events (``encode_batch`` / ``decode_batch``)::

      P  u16 len, address | u32 capacity | u16 n | n × u64 block hash
      S  u16 len, session id | u16 len, address

* A picker's in-flight contribution per endpoint is one hash field, ``"requests tokens"``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass

from policies.state import InFlight

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_MAX_STR = 0xFFFF
_MAX_HASHES = 0xFFFF
_U64_MAX = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class PrefixInsert:
    """``address`` now holds the prompt blocks ``hashes`` (chained, leading block first)."""

    address: str
    hashes: tuple[int, ...]
    capacity: int


@dataclass(frozen=True, slots=True)
class SessionPin:
    """Session ``session_id`` is pinned to ``address``."""

    session_id: str
    address: str


SharedEvent = PrefixInsert | SessionPin


def _put_str(out: bytearray, value: str) -> bool:
    data = value.encode()
    if len(data) > _MAX_STR:
        return False
    out += _U16.pack(len(data))
    out += data
    return True


def encode_batch(events: Iterable[SharedEvent]) -> bytes:
    """Events in order; ones that cannot be encoded (a 64 KiB id, a hash out of u64) are skipped."""
    out = bytearray()
    for event in events:
        mark = len(out)
        if isinstance(event, PrefixInsert):
            hashes = event.hashes[:_MAX_HASHES]
            if any(h < 0 or h > _U64_MAX for h in hashes):
                continue
            out += b"P"
            if not _put_str(out, event.address):
                del out[mark:]
                continue
            out += _U32.pack(max(0, min(event.capacity, 0xFFFFFFFF)))
            out += _U16.pack(len(hashes))
            out += struct.pack(f"<{len(hashes)}Q", *hashes)
        else:
            out += b"S"
            if not (_put_str(out, event.session_id) and _put_str(out, event.address)):
                del out[mark:]
    return bytes(out)


def decode_batch(data: bytes) -> list[SharedEvent]:
    """The events of one blob; raises ValueError when it is truncated or unknown."""
    events: list[SharedEvent] = []
    view = memoryview(data)
    pos = 0

    def take_str() -> str:
        nonlocal pos
        (length,) = _U16.unpack_from(view, pos)
        pos += 2
        if pos + length > len(view):
            raise ValueError("truncated string")
        value = bytes(view[pos : pos + length]).decode()
        pos += length
        return value

    try:
        while pos < len(view):
            kind = view[pos]
            pos += 1
            if kind == ord("P"):
                address = take_str()
                (capacity,) = _U32.unpack_from(view, pos)
                (count,) = _U16.unpack_from(view, pos + 4)
                pos += 6
                hashes = struct.unpack_from(f"<{count}Q", view, pos)
                pos += 8 * count
                events.append(PrefixInsert(address, hashes, capacity))
            elif kind == ord("S"):
                session_id = take_str()
                events.append(SessionPin(session_id, take_str()))
            else:
                raise ValueError(f"unknown event kind {kind!r}")
    except struct.error as exc:
        raise ValueError(f"truncated event batch: {exc}") from exc
    return events


def encode_inflight(value: InFlight) -> str:
    return f"{value.requests} {value.tokens}"


def decode_inflight(value: bytes | str) -> InFlight:
    """``"requests tokens"``; raises ValueError on anything else."""
    text = value.decode() if isinstance(value, bytes) else value
    requests, tokens = text.split()
    return InFlight(int(requests), int(tokens))
