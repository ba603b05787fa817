"""Wire format of what pickers share through Redis (pure; no IO). The schema is
proto/kvgate_proto/shared_state.proto (package ``kvgate.shared_state.v1``).

* Prefix insertions and session pins travel as *event batches*: one stream entry per flush, whose
  field ``p`` is an ``EventBatch`` (``encode_batch`` / :func:`decode_entry`). A batch names its
  format; a reader refuses one it does not know (:class:`UnknownFormat`, counted by the sync and
  skipped), so two kvgate versions side by side never misread each other.
* A picker's in-flight contribution per endpoint is one hash field holding an ``InFlight``.
* A picker's held and dispatched work per (band, tenant) of a flow-controlled pool is one hash field
  holding a ``TenantUsage`` (fairness across pickers).

Format 0, what kvgate wrote before the schema (a hand-packed ``struct`` layout in stream field
``b``; in-flight values as the text ``"requests tokens"``), is still read, so pickers of the
previous version keep sharing with upgraded ones during a rolling upgrade. (Pickers of that version
ignore format-1 entries: until they are replaced they route on their own view, as when Redis is
away.) bench/shared_state_codec.py compares the two encodings' costs.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kvgate.policies.state import InFlight
from kvgate.policies.tenant_ledger import TenantKey, TenantUsage
from kvgate.proto import shared_state_pb2 as pb

FORMAT = 1
"""The event-batch format this version writes (``EventBatch.format``)."""
BATCH_FIELD = b"p"
LEGACY_BATCH_FIELD = b"b"
_U32_MAX = 0xFFFFFFFF


class UnknownFormat(ValueError):
    """A batch written in a format this version cannot read (a newer kvgate's)."""


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


def encode_batch(events: Iterable[SharedEvent]) -> bytes:
    """Events in order, as an ``EventBatch``; a prefix insert with a hash outside u64 is skipped."""
    batch = pb.EventBatch(format=FORMAT)
    for event in events:
        if isinstance(event, PrefixInsert):
            prefix = batch.events.add().prefix
            try:
                prefix.hashes.extend(event.hashes)  # protobuf refuses a value outside u64
            except (ValueError, TypeError):
                del batch.events[-1]
                continue
            prefix.address = event.address
            prefix.capacity = max(0, min(event.capacity, _U32_MAX))
        else:
            session = batch.events.add().session
            session.session_id = event.session_id
            session.address = event.address
    return batch.SerializeToString()


def decode_batch(data: bytes) -> list[SharedEvent]:
    """The events of one ``EventBatch``; raises :class:`UnknownFormat` for a format other than
    :data:`FORMAT`, ValueError when the bytes are not a batch."""
    try:
        batch = pb.EventBatch.FromString(data)
    except Exception as exc:  # protobuf's DecodeError
        raise ValueError(f"not an event batch: {exc}") from exc
    if batch.format != FORMAT:
        raise UnknownFormat(f"event batch format {batch.format} (this kvgate reads {FORMAT} and 0)")
    events: list[SharedEvent] = []
    for event in batch.events:
        kind = event.WhichOneof("kind")
        if kind == "prefix":
            prefix = event.prefix
            events.append(PrefixInsert(prefix.address, tuple(prefix.hashes), prefix.capacity))
        elif kind == "session":
            events.append(SessionPin(event.session.session_id, event.session.address))
        # an event kind added later (a field this version does not know) is skipped
    return events


def decode_entry(fields: Mapping[bytes, bytes]) -> list[SharedEvent]:
    """The events of one stream entry, of either format; raises ValueError (UnknownFormat included)."""
    data = fields.get(BATCH_FIELD)
    if data is not None:
        return decode_batch(data)
    legacy = fields.get(LEGACY_BATCH_FIELD)
    if legacy is not None:
        return decode_legacy_batch(legacy)
    raise UnknownFormat("a stream entry with no event batch field this kvgate knows")


def encode_inflight(value: InFlight) -> bytes:
    return pb.InFlight(requests=max(0, value.requests), tokens=max(0, value.tokens)).SerializeToString()


def encode_tenant_usage(usage: Mapping[TenantKey, TenantUsage]) -> dict[str, bytes]:
    """A picker's fairness hash: field ``"<band> <tenant>"`` → a ``TenantUsage``."""
    return {f"{band} {tenant}": pb.TenantUsage(served_s=u.served_s, waiting_s=u.waiting_s).SerializeToString()
            for (band, tenant), u in usage.items()}


def decode_tenant_usage(fields: Mapping[bytes, bytes]) -> tuple[dict[TenantKey, TenantUsage], int]:
    """A peer's fairness hash; the fields it could not read are counted, not returned."""
    out: dict[TenantKey, TenantUsage] = {}
    bad = 0
    for name, value in fields.items():
        try:
            band, _, tenant = name.decode().partition(" ")
            message = pb.TenantUsage.FromString(value)
            out[(int(band), tenant)] = TenantUsage(max(0.0, message.served_s), max(0.0, message.waiting_s))
        except Exception:  # a field another writer mangled: UnicodeError, ValueError, DecodeError
            bad += 1
    return out, bad


def decode_inflight(value: bytes | str) -> InFlight:
    """An ``InFlight`` message, or format 0's text ``"requests tokens"``; raises ValueError."""
    data = value.encode() if isinstance(value, str) else value
    if data[:1].isdigit():
        requests, tokens = data.decode().split()
        return InFlight(int(requests), int(tokens))
    try:
        message = pb.InFlight.FromString(data)
    except Exception as exc:  # protobuf's DecodeError
        raise ValueError(f"not an in-flight record: {exc}") from exc
    return InFlight(message.requests, message.tokens)


_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")


def decode_legacy_batch(data: bytes) -> list[SharedEvent]:
    """Format 0: ``P u16 len, address | u32 capacity | u16 n | n × u64 hash`` and
    ``S u16 len, session id | u16 len, address``, little-endian; raises ValueError."""
    events: list[SharedEvent] = []
    view = memoryview(data)
    pos = 0

    def take_str() -> str:
        nonlocal pos
        (length,) = _U16.unpack_from(view, pos)
        pos += 2
        if pos + length > len(view):
            raise ValueError("truncated string")
        text = bytes(view[pos : pos + length]).decode()
        pos += length
        return text

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
