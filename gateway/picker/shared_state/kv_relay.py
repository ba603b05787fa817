"""KV events through Redis: what a picker's bound socket receives, for the pool's other pickers.

In llm-d's topology the engines connect their publishers to one address the picker binds; only one
process can bind it, so with ``kvgate up --workers N`` (or several kvgate replicas whose engines
connect to one of them) the others would see none of the engines' events. The picker that binds
hands each message it routed to :class:`KvEventsRelay` (``relay``); the sync's publisher appends
them, a few milliseconds' worth per entry, to ``P:{pool}:kv-events`` (trimmed to the last
``STREAM_LENGTH`` entries), and every other picker's read loop hands them to its subscribers, which
apply them as their own socket's (``kv_events.subscriber``: sequences, gaps and replays per
endpoint; a message seen twice is a duplicate). The messages travel as the engines sent them (the
three ZMQ frames, msgpack-framed), so what arrives is checked exactly as what is received.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

STREAM_LENGTH = 1024
"""Entries kept per pool's stream (each a few milliseconds of one picker's messages)."""
OUTBOX_LIMIT = 10_000
"""Messages waiting to be written per pool; beyond it the oldest are dropped (counted): the other
pickers see a gap in those endpoints' sequences and replay it from the engines."""
FIELD = b"k"

_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(list[list[bytes]])


class KvEventsRelay:
    """Per pool, the messages to write; counters; the entry format."""

    def __init__(self, deliver: Callable[[str, list[bytes]], None]) -> None:
        """``deliver(pool, frames)``: a message another picker relayed (the subscribers')."""
        self.deliver = deliver
        self._outbox: dict[str, list[list[bytes]]] = {}
        self.followed: set[str] = set()
        """Pools whose streams this picker reads (those with a bound socket in its configuration)."""
        self.wake: Callable[[], None] = lambda: None
        """Called when messages wait to be written (the sync's publisher waits for it)."""
        self.sent = 0
        self.received = 0
        self.dropped = 0
        self.bad_entries = 0

    def relay(self, pool: str, frames: list[bytes]) -> None:
        """A message this picker's bound socket received for one of ``pool``'s endpoints."""
        box = self._outbox.setdefault(pool, [])
        box.append(frames)
        if len(box) > OUTBOX_LIMIT:
            del box[0]
            self.dropped += 1
        self.wake()

    def take(self) -> list[tuple[str, bytes]]:
        """Each pool's waiting messages as one entry's payload; the outbox emptied."""
        out = [(pool, _ENCODER.encode(box)) for pool, box in self._outbox.items() if box]
        self.sent += sum(len(box) for box in self._outbox.values())
        self._outbox = {}
        return out

    def received_entry(self, pool: str, payload: bytes) -> None:
        """Another picker's entry for ``pool``: its messages, in order, to the subscribers."""
        try:
            messages = _DECODER.decode(payload)
        except (msgspec.DecodeError, msgspec.ValidationError):
            self.bad_entries += 1
            return
        for frames in messages:
            self.received += 1
            self.deliver(pool, frames)
