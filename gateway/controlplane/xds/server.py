"""The ADS gRPC server (grpc.aio, State of the World): a thin shell around :class:`AdsStream`.

Per stream, one queue receives requests (from a reader task) and snapshot changes (from a cache watch
callback); the loop feeds each to the stream's state machine and writes out its responses. The node id
comes from the stream's first request; a node without a snapshot of its own gets the default one.
Delta xDS is answered with UNIMPLEMENTED.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterable
from typing import TypeAlias

import grpc
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2

from kvgate.gateway.controlplane.xds.cache import SnapshotCache, Unwatch
from kvgate.gateway.controlplane.xds.observer import NullObserver, XdsObserver
from kvgate.gateway.controlplane.xds.resource_types import DEFAULT_KINDS, ResourceKind
from kvgate.gateway.controlplane.xds.snapshot import Snapshot
from kvgate.gateway.controlplane.xds.stream import Acked, Action, AdsStream, Ignored, Nacked, Send

log = logging.getLogger(__name__)

_StreamEvent: TypeAlias = discovery_pb2.DiscoveryRequest | Snapshot | None  # None: the client closed its side


class AggregatedDiscoveryServicer:
    """``envoy.service.discovery.v3.AggregatedDiscoveryService`` over a :class:`SnapshotCache`.

    Register it on any ``grpc.aio`` server with :meth:`add_to`.
    """

    def __init__(
        self,
        cache: SnapshotCache,
        observer: XdsObserver | None = None,
        kinds: Iterable[ResourceKind] = DEFAULT_KINDS,
    ) -> None:
        self._cache = cache
        self._observer: XdsObserver = observer or NullObserver()
        self._kinds = tuple(kinds)

    def add_to(self, server: grpc.aio.Server) -> None:
        ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server(self, server)

    async def StreamAggregatedResources(
        self,
        request_iterator: AsyncIterator[discovery_pb2.DiscoveryRequest],
        context: grpc.aio.ServicerContext[discovery_pb2.DiscoveryRequest, discovery_pb2.DiscoveryResponse],
    ) -> AsyncIterator[discovery_pb2.DiscoveryResponse]:
        events: asyncio.Queue[_StreamEvent] = asyncio.Queue()
        reader = asyncio.create_task(self._read(request_iterator, events))
        machine = AdsStream(self._kinds)
        node_id = ""
        unwatch: Unwatch | None = None
        try:
            while (event := await events.get()) is not None:
                if isinstance(event, Snapshot):
                    latest = self._cache.snapshot_for(node_id)  # coalesce a burst of changes
                    actions = machine.on_snapshot(latest or event)
                else:
                    if unwatch is None:
                        node_id = event.node.id
                        unwatch = self._cache.watch(node_id, events.put_nowait)
                        snapshot = self._cache.snapshot_for(node_id)
                        if snapshot is not None:
                            machine.on_snapshot(snapshot)
                        log.info("ADS stream opened by node %r", node_id)
                    actions = machine.on_request(event)
                for action in actions:
                    response = self._report(node_id, action)
                    if response is not None:
                        yield response
        finally:
            if unwatch is not None:
                unwatch()
                log.info("ADS stream closed by node %r", node_id)
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader

    async def DeltaAggregatedResources(
        self,
        request_iterator: AsyncIterator[discovery_pb2.DiscoveryRequest],
        context: grpc.aio.ServicerContext[discovery_pb2.DiscoveryRequest, discovery_pb2.DiscoveryResponse],
    ) -> None:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "kvgate serves State of the World ADS only")

    @staticmethod
    async def _read(
        requests: AsyncIterator[discovery_pb2.DiscoveryRequest], events: asyncio.Queue[_StreamEvent]
    ) -> None:
        try:
            async for request in requests:
                events.put_nowait(request)
        except (grpc.aio.AioRpcError, grpc.RpcError) as exc:
            log.debug("ADS stream read ended: %s", exc)
        finally:
            events.put_nowait(None)

    def _report(self, node_id: str, action: Action) -> discovery_pb2.DiscoveryResponse | None:
        observer = self._observer
        if isinstance(action, Send):
            observer.on_push(node_id, action.type_url, action.version, action.resource_count)
            return action.response
        if isinstance(action, Acked):
            observer.on_ack(node_id, action.type_url, action.version)
        elif isinstance(action, Nacked):
            log.warning(
                "Envoy node %r rejected %s version %s: %s",
                node_id, action.type_url, action.version, action.message,
            )
            observer.on_nack(node_id, action.type_url, action.version, action.message)
        elif isinstance(action, Ignored):
            log.debug("ignoring stale %s request (nonce %s) from %r", action.type_url, action.nonce, node_id)
        return None


class AdsServer:
    """A ``grpc.aio`` server serving only ADS, on ``host:port`` (port 0 picks a free one)."""

    def __init__(
        self,
        cache: SnapshotCache,
        *,
        observer: XdsObserver | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        kinds: Iterable[ResourceKind] = DEFAULT_KINDS,
    ) -> None:
        self._servicer = AggregatedDiscoveryServicer(cache, observer, kinds)
        self._host = host
        self._requested_port = port
        self._server: grpc.aio.Server | None = None
        self.port = 0

    @property
    def address(self) -> tuple[str, int]:
        return self._host, self.port

    async def start(self) -> int:
        """Bind and start serving; returns the bound port."""
        if self._server is not None:
            return self.port
        server = grpc.aio.server()
        self._servicer.add_to(server)
        self.port = server.add_insecure_port(f"{self._host}:{self._requested_port}")
        await server.start()
        self._server = server
        return self.port

    async def stop(self, grace: float | None = 1.0) -> None:
        """Stop serving; open streams are cancelled after ``grace`` seconds."""
        if self._server is not None:
            server, self._server = self._server, None
            await server.stop(grace)

    async def __aenter__(self) -> AdsServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()
