"""The sans-IO state of one ADS (State of the World) stream: requests and snapshots in, actions out.

Per type URL the stream remembers what it last sent (version, nonce, resource names), what Envoy last
acknowledged, and which versions Envoy rejected. The rules (docs/architecture.md, principle 5):

- every response carries a fresh nonce, unique on the stream;
- a request whose ``response_nonce`` is not the last one sent for its type is stale and ignored
  (unless nothing was sent for that type on this stream yet: then it is a first request);
- a request answering the last nonce is a NACK when it carries ``error_detail`` (the version sent with
  that nonce is recorded as rejected and never sent again on this stream), else an ACK when its
  ``version_info`` is the version sent;
- a response is sent when the served snapshot's version of a subscribed type (of the subscribed names,
  for RDS and EDS) differs from the version last sent (or the subscribed names changed) and that version
  was not rejected; a first request is always answered when there is something to serve;
- LDS and CDS are wildcard subscriptions (all resources); RDS and EDS send only the names requested;
- on a new snapshot, types are pushed in the order of ``kinds``: clusters, endpoints, listeners, routes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from envoy.service.discovery.v3 import discovery_pb2

from kvgate.gateway.controlplane.xds.resource_types import DEFAULT_KINDS, ResourceKind
from kvgate.gateway.controlplane.xds.snapshot import Snapshot

CONTROL_PLANE_ID = "kvgate"


@dataclass(frozen=True, slots=True)
class Send:
    """Write ``response`` on the stream."""

    type_url: str
    version: str
    resource_count: int
    response: discovery_pb2.DiscoveryResponse


@dataclass(frozen=True, slots=True)
class Acked:
    type_url: str
    version: str


@dataclass(frozen=True, slots=True)
class Nacked:
    type_url: str
    version: str
    message: str


@dataclass(frozen=True, slots=True)
class Ignored:
    """A request with a stale nonce."""

    type_url: str
    nonce: str


Action = Send | Acked | Nacked | Ignored


@dataclass(slots=True)
class _TypeState:
    """One type URL on one stream. ``names`` is ``None`` for a wildcard subscription."""

    names: frozenset[str] | None = None
    subscribed: bool = False
    sent_version: str | None = None
    sent_names: frozenset[str] | None = None
    sent_nonce: str = ""
    answered_nonce: str = ""
    acked_version: str | None = None
    rejected: set[str] = field(default_factory=set)


class AdsStream:
    """The per-stream state machine. Feed it requests (:meth:`on_request`) and the snapshot served to
    its node (:meth:`on_snapshot`); write out the responses in the :class:`Send` actions it returns."""

    def __init__(self, kinds: Iterable[ResourceKind] = DEFAULT_KINDS) -> None:
        self._kinds = {kind.type_url: kind for kind in kinds}
        self._order = list(self._kinds)
        self._types: dict[str, _TypeState] = {}
        self._snapshot: Snapshot | None = None
        self._nonces = 0
        self.node_id: str | None = None

    @property
    def snapshot(self) -> Snapshot | None:
        return self._snapshot

    def rejected_versions(self, type_url: str) -> frozenset[str]:
        state = self._types.get(type_url)
        return frozenset() if state is None else frozenset(state.rejected)

    def acked_version(self, type_url: str) -> str | None:
        state = self._types.get(type_url)
        return None if state is None else state.acked_version

    def on_snapshot(self, snapshot: Snapshot) -> list[Action]:
        """The snapshot served to this stream's node changed: push every subscribed type that differs."""
        self._snapshot = snapshot
        actions: list[Action] = []
        for type_url in self._order + sorted(set(self._types) - set(self._order)):
            state = self._types.get(type_url)
            if state is not None:
                actions.extend(self._maybe_send(type_url, state))
        return actions

    def on_request(self, request: discovery_pb2.DiscoveryRequest) -> list[Action]:
        """Handle one DiscoveryRequest (first request, ACK, NACK, resource-name change or stale)."""
        if self.node_id is None and request.HasField("node"):
            self.node_id = request.node.id
        type_url = request.type_url
        state = self._types.setdefault(type_url, _TypeState())
        nonce = request.response_nonce
        actions: list[Action] = []
        if nonce and state.sent_nonce and nonce != state.sent_nonce:
            return [Ignored(type_url, nonce)]
        first = not state.subscribed or not nonce or not state.sent_nonce
        state.subscribed = True
        state.names = self._subscribed_names(type_url, request.resource_names)
        if first:
            state.sent_version = None
        elif nonce != state.answered_nonce:
            state.answered_nonce = nonce
            sent = state.sent_version or ""
            if request.HasField("error_detail"):
                state.rejected.add(sent)
                actions.append(Nacked(type_url, sent, request.error_detail.message))
            elif request.version_info == sent:
                state.acked_version = sent
                actions.append(Acked(type_url, sent))
        actions.extend(self._maybe_send(type_url, state))
        return actions

    def _subscribed_names(self, type_url: str, names: Iterable[str]) -> frozenset[str] | None:
        requested = frozenset(names)
        kind = self._kinds.get(type_url)
        wildcard = kind is not None and kind.wildcard
        if wildcard and (not requested or "*" in requested):
            return None
        return requested - {"*"}

    def _maybe_send(self, type_url: str, state: _TypeState) -> list[Action]:
        snapshot = self._snapshot
        if not state.subscribed or snapshot is None:
            return []
        if state.names is not None and not state.names:
            return []  # a named subscription to nothing (Envoy dropped every RDS/EDS resource)
        version = snapshot.version_of(type_url, state.names)
        if version is None or version in state.rejected:
            return []
        if version == state.sent_version and state.names == state.sent_names:
            return []
        resources = snapshot.packed(type_url, state.names)
        self._nonces += 1
        nonce = str(self._nonces)
        response = discovery_pb2.DiscoveryResponse(
            version_info=version, type_url=type_url, nonce=nonce, resources=resources
        )
        response.control_plane.identifier = CONTROL_PLANE_ID
        state.sent_version = version
        state.sent_names = state.names
        state.sent_nonce = nonce
        return [Send(type_url, version, len(resources), response)]
