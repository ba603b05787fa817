"""Subscribing to the engines' KV-event publishers and keeping ``policies.engine_blocks`` in step
(the IO shell around ``kv_events.wire`` and ``kv_events.sequence``).

Two topologies, as deployments run them:

- **connect** (one subscription per endpoint): the picker connects a SUB socket to each endpoint's
  publisher (``tcp://<endpoint ip>:<port>``, vLLM's ``--kv-events-config`` ``endpoint`` bound on
  ``tcp://*:5557``) and, for missed batches, a DEALER to its replay socket (``replay_endpoint``);
  the endpoint is the address it connected to.
- **bind** (llm-d's): the picker binds one SUB socket that the engines connect their publishers to;
  the topic ``kv@<pod-ip>@<model>`` names the endpoint (its ``<pod-ip>`` with the pool's port).

Several pickers of one pool (``kvgate up --workers N``, replicas on Redis) and the bound topology:
one of them binds; each message its socket receives is also handed to the relay (``relay``: the
shared state shell puts it on Redis), and the others, whose bind fails or whose engines connect
elsewhere, get it from there (:meth:`KvEventSubscribers.deliver`) exactly as if their own socket had
received it (sequence, gaps and replays per endpoint as below; a message seen twice is a duplicate).

A gap in the sequence is filled from the replay socket; when it cannot be (no replay socket, or the
publisher's buffer no longer reaches back), the endpoint's entries are dropped and it is marked not
in step (``in_step``), so scoring falls back to the approximate index for that endpoint alone until
the publisher restarts its sequence or clears its cache. A publisher whose connection drops (the
socket monitor's disconnect) is out of step in the same way: what its engine does meanwhile goes
unseen. A malformed message is counted and dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from kvgate.gateway.picker.kv_events.sequence import SequenceTracker, Verdict
from kvgate.gateway.picker.kv_events.wire import (
    END_OF_REPLAY,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    MalformedBatch,
    decode_message,
    decode_seq,
)
from kvgate.policies.engine_blocks import EngineBlockIndex

_log = logging.getLogger(__name__)

INBOX_LIMIT = 10_000
"""Messages relayed by other pickers waiting to be applied (``KvEventSubscribers.deliver``)."""


@dataclass(slots=True)
class SubscriberCounts:
    batches: int = 0
    events: int = 0
    skipped: int = 0
    malformed: int = 0
    gaps: int = 0
    replayed: int = 0
    unrecoverable: int = 0


def apply_batch(index: EngineBlockIndex, endpoint: str, batch: EventBatch) -> None:
    """A decoded batch's events, in order, into ``index`` for ``endpoint``."""
    for event in batch.events:
        if isinstance(event, BlockStored):
            index.stored(endpoint, event.block_hashes, event.parent_block_hash, event.token_ids,
                         event.block_size, lora=event.lora_name, medium=event.medium,
                         extra_keys=event.extra_keys, group=event.group_idx, kind=event.kv_cache_spec_kind)
        elif isinstance(event, BlockRemoved):
            index.removed(endpoint, event.block_hashes, medium=event.medium, group=event.group_idx)
        elif isinstance(event, AllBlocksCleared):
            index.forget(endpoint)


def endpoint_of_topic(topic: str, port: int) -> str | None:
    """llm-d's topic ``kv@<pod-ip>@<model>`` → ``<pod-ip>:<port>``; None for another topic."""
    parts = topic.split("@")
    if len(parts) >= 2 and parts[0] == "kv" and parts[1]:
        return f"{parts[1]}:{port}"
    return None


class EndpointSubscription:
    """One endpoint's publisher: its SUB socket (connect topology; None where the engine connects to
    the picker's bound socket, which hands its messages to ``receive``), its replay DEALER, its
    sequence."""

    def __init__(self, context: zmq.asyncio.Context, endpoint: str, publisher: str | None, replay: str | None,
                 index: EngineBlockIndex, *, replay_timeout_s: float = 1.0) -> None:
        self.endpoint = endpoint
        self.publisher = publisher
        self.replay_address = replay
        self.index = index
        self.counts = SubscriberCounts()
        self.sequence = SequenceTracker()
        self._context = context
        self._replay_timeout_s = replay_timeout_s
        self._task: asyncio.Task[None] | None = None
        self._monitor: asyncio.Task[None] | None = None
        self._sub: zmq.asyncio.Socket | None = None
        self.disconnects = 0
        self.connected: bool | None = None
        """The publisher's connection as the socket monitor last said (None: not watched)."""

    @property
    def in_step(self) -> bool:
        return self.connected is not False and self.sequence.in_step

    def start(self) -> None:
        if self.publisher is None:
            return  # bound topology: messages come through ``BoundSubscriber``
        sub = self._context.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        monitor = sub.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        sub.connect(self.publisher)
        self._sub = sub
        self._task = asyncio.create_task(self._run(sub), name=f"kv-events {self.endpoint}")
        self._monitor = asyncio.create_task(self._watch(monitor), name=f"kv-events monitor {self.endpoint}")

    async def stop(self) -> None:
        for task in (self._task, self._monitor):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self._sub is not None:
            with contextlib.suppress(zmq.ZMQError):
                self._sub.disable_monitor()
            self._sub.close(linger=0)

    async def _watch(self, monitor: zmq.asyncio.Socket) -> None:
        """The publisher's connection: while it is down, the engine's events go unseen, so the
        endpoint is out of step (the next batch, a restarted sequence or a gap, says what to do)."""
        try:
            while True:
                event = parse_monitor_message(await monitor.recv_multipart())
                if event["event"] == zmq.EVENT_CONNECTED:
                    self.connected = True
                elif event["event"] == zmq.EVENT_DISCONNECTED:
                    self.connected = False
                    self.disconnects += 1
                    self.sequence.lost()
                    _log.info("kv events from %s: publisher %s disconnected", self.endpoint, self.publisher)
        finally:
            monitor.close(linger=0)

    async def _run(self, sub: zmq.asyncio.Socket) -> None:
        while True:
            frames = await sub.recv_multipart()
            await self.receive(frames)

    async def receive(self, frames: list[bytes]) -> None:
        try:
            batch = decode_message(frames)
        except MalformedBatch as exc:
            self.counts.malformed += 1
            _log.debug("kv events from %s: dropped a malformed message: %s", self.endpoint, exc)
            return
        verdict = self.sequence.observe(batch.seq)
        if verdict is Verdict.DUPLICATE:
            return
        if verdict is Verdict.GAP:
            self.counts.gaps += 1
            if not await self._fill(self.sequence.expected_before_gap, batch.seq):
                self.counts.unrecoverable += 1
                self.index.forget(self.endpoint)
                self.sequence.lost()
                _log.info("kv events from %s: batches before %d lost; its cache is estimated until it "
                          "is seen whole again", self.endpoint, batch.seq)
        elif verdict is Verdict.RESTART:
            self.index.forget(self.endpoint)  # a new publisher: the engine restarted, its cache is empty
        self._apply(batch)

    def _apply(self, batch: EventBatch) -> None:
        self.counts.batches += 1
        self.counts.events += len(batch.events)
        self.counts.skipped += batch.skipped
        apply_batch(self.index, self.endpoint, batch)
        if any(isinstance(e, AllBlocksCleared) for e in batch.events):
            self.sequence.cleared()

    async def _fill(self, first: int, upto: int) -> bool:
        """Batches ``first`` .. ``upto - 1`` from the replay socket, applied; whether all came."""
        if self.replay_address is None:
            return False
        dealer = self._context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        try:
            dealer.connect(self.replay_address)
            await dealer.send_multipart([b"", first.to_bytes(8, "big")])
            want = first
            while True:
                if not await dealer.poll(int(self._replay_timeout_s * 1000)):
                    return False
                frames = await dealer.recv_multipart()
                if len(frames) != 3:
                    return False
                seq = decode_seq(frames[1])
                if seq == END_OF_REPLAY or seq >= upto:
                    return want >= upto
                if seq < want:
                    continue
                if seq > want:
                    return False  # the publisher's buffer no longer reaches back
                try:
                    batch = decode_message([b"", frames[1], frames[2]])
                except MalformedBatch:
                    self.counts.malformed += 1
                    return False
                self._apply(batch)
                self.counts.replayed += 1
                want = seq + 1
        except (zmq.ZMQError, MalformedBatch):
            return False
        finally:
            dealer.close(linger=0)


class BoundSubscriber:
    """The bound topology: one SUB socket at ``address`` that engines connect their publishers to;
    each message goes to the subscription its topic's pod IP names (``route``), others are counted
    in ``unrouted`` and dropped."""

    def __init__(self, context: zmq.asyncio.Context, address: str,
                 route: Callable[[str], EndpointSubscription | None],
                 routed: Callable[[str, list[bytes]], None] | None = None) -> None:
        """``routed(host, frames)``: told of each message that named an endpoint (the relay)."""
        self.address = address
        self.unrouted = 0
        self._route = route
        self._routed = routed
        self._sub = context.socket(zmq.SUB)
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.setsockopt(zmq.SUBSCRIBE, b"")
        self._sub.bind(address)
        self._task = asyncio.create_task(self._run(), name=f"kv-events bound {address}")

    async def _run(self) -> None:
        while True:
            frames = await self._sub.recv_multipart()
            host = host_of_topic(frames[0]) if len(frames) == 3 else None
            sub = self._route(host) if host is not None else None
            if sub is None or host is None:
                self.unrouted += 1
                continue
            if self._routed is not None:
                self._routed(host, frames)
            await sub.receive(frames)

    async def stop(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._sub.close(linger=0)


def host_of_topic(topic: bytes) -> str | None:
    """llm-d's topic ``kv@<pod-ip>@<model>`` → ``<pod-ip>``; None for another topic."""
    try:
        endpoint = endpoint_of_topic(topic.decode(), 0)
    except UnicodeDecodeError:
        return None
    return endpoint.rpartition(":")[0] if endpoint is not None else None


class KvEventSubscribers:
    """The subscriptions of every endpoint whose pool has KV events configured, and the bound
    sockets of the pools whose engines connect to the picker."""

    def __init__(self, index_of: Callable[[str], EngineBlockIndex],
                 relay: Callable[[str, list[bytes]], None] | None = None) -> None:
        """``index_of(pool)``: that pool's index; ``relay(pool, frames)``: each message a bound
        socket received for one of the pool's endpoints, to share with the pool's other pickers."""
        self._context = zmq.asyncio.Context()
        self._index_of = index_of
        self._relay = relay
        self._inbox: asyncio.Queue[tuple[str, list[bytes]]] = asyncio.Queue(maxsize=INBOX_LIMIT)
        self._delivering: asyncio.Task[None] | None = None
        self.delivered = 0
        self.inbox_dropped = 0
        self._subs: dict[tuple[str, str], EndpointSubscription] = {}
        self._bound: dict[str, BoundSubscriber] = {}
        self._bind_of: dict[str, str] = {}
        """Pool → the address its engines connect to (bound topology)."""
        self._by_host: dict[tuple[str, str], EndpointSubscription] = {}
        """(bound address, endpoint host) → its subscription."""
        self._pool_hosts: set[tuple[str, str]] = set()
        """(pool, endpoint host) of the bound topology's endpoints."""

    def set_endpoints(self, pool: str, publishers: Mapping[str, tuple[str | None, str | None]],
                      bind: str | None = None) -> None:
        """``publishers``: endpoint → (publisher address, or None where its engine connects to
        ``bind``; replay address or None). A bind address that cannot be bound is logged as an error
        (the pool's endpoints stay out of step: routing keeps the approximate index)."""
        if bind is not None and bind not in self._bound:
            try:
                self._bound[bind] = BoundSubscriber(self._context, bind, self._router(bind),
                                                    self._relayer(bind) if self._relay is not None else None)
            except zmq.ZMQError as exc:
                if self._relay is None:
                    _log.error("pool %s: cannot bind the KV-events socket %s (%s): its engines' events "
                               "go unseen", pool, bind, exc)
                else:  # another picker of the pool (a --workers sibling) holds it and shares them
                    _log.info("pool %s: the KV-events socket %s is bound elsewhere (%s): its engines' "
                              "events come through Redis from the picker that binds it", pool, bind, exc)
        if bind is None:
            self._bind_of.pop(pool, None)
        else:
            self._bind_of[pool] = bind
        for key in [k for k in self._subs if k[0] == pool and k[1] not in publishers]:
            sub = self._subs.pop(key)
            sub.index.forget(sub.endpoint)
            asyncio.get_running_loop().create_task(sub.stop())
        for endpoint, (publisher, replay) in publishers.items():
            key = (pool, endpoint)
            current = self._subs.get(key)
            if current is not None and (current.publisher, current.replay_address) == (publisher, replay):
                continue
            if current is not None:
                asyncio.get_running_loop().create_task(current.stop())
            sub = EndpointSubscription(self._context, endpoint, publisher, replay, self._index_of(pool))
            self._subs[key] = sub
            sub.start()
        self._route_hosts()

    def _router(self, bind: str) -> Callable[[str], EndpointSubscription | None]:
        def route(host: str) -> EndpointSubscription | None:
            return self._by_host.get((bind, host))

        return route

    def _relayer(self, bind: str) -> Callable[[str, list[bytes]], None]:
        def routed(host: str, frames: list[bytes]) -> None:
            relay = self._relay
            for pool in [p for p, b in self._bind_of.items() if b == bind]:
                if relay is not None and (pool, host) in self._pool_hosts:
                    relay(pool, frames)

        return routed

    def deliver(self, pool: str, frames: list[bytes]) -> None:
        """A message another picker's bound socket received for ``pool``: applied in arrival order
        (one task), as if this picker's own socket had received it. Beyond ``INBOX_LIMIT`` waiting
        messages the newest are dropped (counted): the endpoints' sequences see a gap and replay."""
        if self._delivering is None or self._delivering.done():
            loop = asyncio.get_running_loop()
            self._delivering = loop.create_task(self._deliver(), name="kv-events relayed")
        try:
            self._inbox.put_nowait((pool, frames))
        except asyncio.QueueFull:
            self.inbox_dropped += 1

    async def _deliver(self) -> None:
        while True:
            pool, frames = await self._inbox.get()
            bind = self._bind_of.get(pool)
            host = host_of_topic(frames[0]) if len(frames) == 3 else None
            sub = self._by_host.get((bind, host)) if bind is not None and host is not None else None
            if sub is None:
                continue
            self.delivered += 1
            try:
                await sub.receive(frames)
            except Exception:  # one bad message must not end the relay
                _log.exception("kv events relayed for %s: applying a message failed", sub.endpoint)

    def _route_hosts(self) -> None:
        """The bound sockets' topic routes; a bound socket no pool names any more is closed."""
        routes: dict[tuple[str, str], EndpointSubscription] = {}
        pool_hosts: set[tuple[str, str]] = set()
        for (pool, endpoint), sub in self._subs.items():
            bind = self._bind_of.get(pool)
            if bind is not None and sub.publisher is None:
                host = endpoint.rpartition(":")[0].strip("[]")
                routes.setdefault((bind, host), sub)
                pool_hosts.add((pool, host))
        self._by_host = routes
        self._pool_hosts = pool_hosts
        for address in [a for a in self._bound if a not in self._bind_of.values()]:
            asyncio.get_running_loop().create_task(self._bound.pop(address).stop())

    def in_step(self, pool: str, endpoint: str) -> bool:
        sub = self._subs.get((pool, endpoint))
        return sub is not None and sub.in_step

    def subscriptions(self) -> Mapping[tuple[str, str], EndpointSubscription]:
        return self._subs

    def unrouted(self) -> int:
        """Messages on the bound sockets whose topic named no endpoint (dropped)."""
        return sum(bound.unrouted for bound in self._bound.values())

    async def stop(self) -> None:
        if self._delivering is not None:
            self._delivering.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._delivering
        await asyncio.gather(*(sub.stop() for sub in self._subs.values()),
                             *(bound.stop() for bound in self._bound.values()), return_exceptions=True)
        self._subs.clear()
        self._bound.clear()
        self._context.term()
