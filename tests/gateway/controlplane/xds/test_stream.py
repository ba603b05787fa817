"""The per-stream ADS state machine, fed DiscoveryRequests and snapshots, without any network."""

from __future__ import annotations

from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.rpc import status_pb2

from kvgate.gateway.controlplane.xds import (
    CLUSTER,
    ENDPOINT,
    LISTENER,
    ROUTE,
    Acked,
    AdsStream,
    Ignored,
    Nacked,
    Send,
    Snapshot,
)
from kvgate.gateway.controlplane.xds.stream import Action
from tests.gateway.controlplane.xds.envoy_dicts import (
    assignment,
    eds_cluster,
    listener,
    route_config,
    static_cluster,
)


def snapshot(body: str = "v1", *, port: int = 8080, extra_route: bool = False) -> Snapshot:
    routes = [route_config("main", body=body, cluster="pool")]
    listeners = [listener("http", port, "main")]
    if extra_route:
        routes.append(route_config("other", body="other"))
        listeners.append(listener("admin", port + 1, "other"))
    return Snapshot.from_dicts(
        listeners=listeners,
        routes=routes,
        clusters=[static_cluster("pool"), eds_cluster("eds")],
        endpoints=[assignment("eds", "127.0.0.1", 8000), assignment("unused", "127.0.0.1", 8001)],
    )


def request(
    type_url: str,
    *,
    nonce: str = "",
    version: str = "",
    names: tuple[str, ...] = (),
    error: str | None = None,
    node: str | None = None,
) -> discovery_pb2.DiscoveryRequest:
    req = discovery_pb2.DiscoveryRequest(
        type_url=type_url, response_nonce=nonce, version_info=version, resource_names=list(names)
    )
    if error is not None:
        req.error_detail.CopyFrom(status_pb2.Status(code=3, message=error))
    if node is not None:
        req.node.id = node
    return req


def sends(actions: list[Action]) -> list[Send]:
    assert all(isinstance(a, Send) for a in actions), actions
    return [a for a in actions if isinstance(a, Send)]


def only_send(actions: list[Action]) -> discovery_pb2.DiscoveryResponse:
    [send] = sends(actions)
    return send.response


def subscribed_stream(snap: Snapshot) -> tuple[AdsStream, dict[str, discovery_pb2.DiscoveryResponse]]:
    """A stream that has sent and had ACKed CDS, EDS, LDS and RDS the way Envoy asks for them."""
    stream = AdsStream()
    stream.on_snapshot(snap)
    sent: dict[str, discovery_pb2.DiscoveryResponse] = {}
    for type_url, names in ((CLUSTER, ()), (ENDPOINT, ("eds",)), (LISTENER, ()), (ROUTE, ("main",))):
        response = only_send(stream.on_request(request(type_url, names=names, node="envoy-1")))
        ack = stream.on_request(
            request(type_url, nonce=response.nonce, version=response.version_info, names=names)
        )
        assert ack == [Acked(type_url, response.version_info)]
        sent[type_url] = response
    return stream, sent


def test_first_request_gets_every_listener_with_version_and_nonce() -> None:
    snap = snapshot()
    stream = AdsStream()
    stream.on_snapshot(snap)
    response = only_send(stream.on_request(request(LISTENER, node="envoy-1")))
    assert stream.node_id == "envoy-1"
    assert response.type_url == LISTENER
    assert response.version_info == snap.version_of(LISTENER)
    assert response.nonce
    assert response.control_plane.identifier == "kvgate"
    [packed] = response.resources
    decoded = listener_pb2.Listener()
    assert packed.Unpack(decoded)
    assert decoded.name == "http"


def test_requests_before_any_snapshot_are_answered_when_one_arrives() -> None:
    stream = AdsStream()
    assert stream.on_request(request(CLUSTER)) == []
    snap = snapshot()
    [send] = sends(stream.on_snapshot(snap))
    assert send.type_url == CLUSTER
    assert send.version == snap.version_of(CLUSTER)
    assert send.resource_count == 2


def test_ack_is_recorded_and_answered_with_nothing() -> None:
    stream, sent = subscribed_stream(snapshot())
    assert stream.acked_version(LISTENER) == sent[LISTENER].version_info
    # The same ACK again (Envoy re-sends it when it re-requests) is not counted twice.
    again = request(LISTENER, nonce=sent[LISTENER].nonce, version=sent[LISTENER].version_info)
    assert stream.on_request(again) == []


def test_nonces_are_unique_on_a_stream() -> None:
    _, sent = subscribed_stream(snapshot())
    nonces = [r.nonce for r in sent.values()]
    assert len(set(nonces)) == len(nonces)


def test_named_subscriptions_get_only_the_names_asked_for() -> None:
    stream, sent = subscribed_stream(snapshot())
    [eds] = sent[ENDPOINT].resources
    assert len(sent[ENDPOINT].resources) == 1
    assert "eds" in eds.value.decode(errors="replace")
    # Envoy asks for one more route name (a new listener): the new subset is sent at the same version.
    rds = sent[ROUTE]
    snap = snapshot(extra_route=True)
    stream.on_snapshot(snap)
    more_names = request(ROUTE, nonce=rds.nonce, version="x", names=("main", "other"))
    update = only_send(stream.on_request(more_names))
    names = set()
    for packed in update.resources:
        config = route_pb2.RouteConfiguration()
        packed.Unpack(config)
        names.add(config.name)
    assert names == {"main", "other"}
    # Dropping every name is a subscription to nothing: no response.
    assert stream.on_request(request(ROUTE, nonce=update.nonce, version=update.version_info)) == [
        Acked(ROUTE, update.version_info)
    ]


def test_a_new_snapshot_pushes_changed_types_clusters_before_listeners() -> None:
    stream, _ = subscribed_stream(snapshot(body="v1", port=8080))
    newer = Snapshot.from_dicts(
        listeners=[listener("http", 9090, "main")],
        routes=[route_config("main", body="v2", cluster="pool2")],
        clusters=[static_cluster("pool2"), eds_cluster("eds")],
        endpoints=[assignment("eds", "127.0.0.1", 8000)],
    )
    pushed = sends(stream.on_snapshot(newer))
    assert [s.type_url for s in pushed] == [CLUSTER, LISTENER, ROUTE]  # EDS content unchanged
    assert [s.version for s in pushed] == [newer.version_of(t) for t in (CLUSTER, LISTENER, ROUTE)]
    assert stream.on_snapshot(newer) == []


def test_unsubscribed_types_are_not_pushed() -> None:
    stream = AdsStream()
    stream.on_snapshot(snapshot())
    only_send(stream.on_request(request(CLUSTER)))
    assert [s.type_url for s in sends(stream.on_snapshot(snapshot(body="v2")))] == []


def test_stale_nonces_are_ignored() -> None:
    stream, sent = subscribed_stream(snapshot(body="v1"))
    first_rds = sent[ROUTE]
    second_rds = only_send(stream.on_snapshot(snapshot(body="v2")))
    # A late NACK of the superseded response: ignored, nothing recorded, nothing sent.
    late = request(ROUTE, nonce=first_rds.nonce, version=first_rds.version_info, names=("main",), error="x")
    assert stream.on_request(late) == [Ignored(ROUTE, first_rds.nonce)]
    assert stream.rejected_versions(ROUTE) == frozenset()
    # A nonce this stream never sent.
    assert stream.on_request(request(ROUTE, nonce="bogus", names=("main",))) == [Ignored(ROUTE, "bogus")]
    ack = request(ROUTE, nonce=second_rds.nonce, version=second_rds.version_info, names=("main",))
    assert stream.on_request(ack) == [Acked(ROUTE, second_rds.version_info)]


def test_nack_records_the_rejected_version_and_it_is_never_resent() -> None:
    stream, sent = subscribed_stream(snapshot(body="good"))
    good_version = sent[ROUTE].version_info
    bad = snapshot(body="bad")
    bad_rds = only_send(stream.on_snapshot(bad))
    nack = request(ROUTE, nonce=bad_rds.nonce, version=good_version, names=("main",), error="invalid regex")
    assert stream.on_request(nack) == [Nacked(ROUTE, bad.version_of(ROUTE) or "", "invalid regex")]
    assert stream.rejected_versions(ROUTE) == {bad.version_of(ROUTE)}
    assert stream.acked_version(ROUTE) == good_version

    # The same snapshot again, a change in another type, or a re-request: the rejected RDS is not re-sent.
    assert stream.on_snapshot(bad) == []
    assert stream.on_request(request(ROUTE, nonce=bad_rds.nonce, version=good_version, names=("main",))) == []
    other_type_changed = Snapshot.from_dicts(
        listeners=[listener("http", 8080, "main")],
        routes=[route_config("main", body="bad", cluster="pool")],
        clusters=[static_cluster("pool"), static_cluster("extra"), eds_cluster("eds")],
        endpoints=[assignment("eds", "127.0.0.1", 8000)],
    )
    assert [s.type_url for s in sends(stream.on_snapshot(other_type_changed))] == [CLUSTER]

    # A newer snapshot is pushed, and acknowledged.
    fixed = snapshot(body="fixed")
    pushed = stream.on_snapshot(fixed)
    fixed_rds = only_send([a for a in pushed if isinstance(a, Send) and a.type_url == ROUTE])
    assert fixed_rds.version_info == fixed.version_of(ROUTE, ["main"])
    ack = request(ROUTE, nonce=fixed_rds.nonce, version=fixed_rds.version_info, names=("main",))
    assert stream.on_request(ack) == [Acked(ROUTE, fixed_rds.version_info)]


def test_a_first_request_is_answered_even_when_envoy_already_has_the_version() -> None:
    snap = snapshot()
    stream = AdsStream()
    stream.on_snapshot(snap)
    reconnect = request(LISTENER, version=snap.version_of(LISTENER) or "", node="envoy-1")
    assert only_send(stream.on_request(reconnect)).version_info == snap.version_of(LISTENER)


def test_types_a_snapshot_does_not_serve_get_nothing() -> None:
    stream = AdsStream()
    stream.on_snapshot(snapshot())
    secrets = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"
    assert stream.on_request(request(secrets, names=("cert",))) == []


def test_a_nonce_from_an_earlier_stream_counts_as_a_first_request() -> None:
    snap = snapshot()
    stream = AdsStream()
    stream.on_snapshot(snap)
    carried_over = request(CLUSTER, nonce="41", version="old", node="envoy-1")
    assert only_send(stream.on_request(carried_over)).version_info == snap.version_of(CLUSTER)
