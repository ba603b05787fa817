"""Translated dicts → protobuf messages, fast: each Envoy route dict shared by several virtual hosts
and each per-filter config shared by many routes is parsed once (``json_format.ParseDict`` is pure
Python and dominates the cost of a large configuration)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from envoy.config.route.v3 import route_components_pb2, route_pb2
from google.protobuf import any_pb2, json_format

from kvgate.gateway.controlplane.xds import CLUSTER, LISTENER, Snapshot
from kvgate.policies.errors import ConfigError

JsonDict = dict[str, Any]
_PER_FILTER = "typed_per_filter_config"


class _Parser:
    def __init__(self) -> None:
        self._routes: dict[int, route_components_pb2.Route] = {}
        self._anys: dict[int, any_pb2.Any] = {}

    def _any(self, config: JsonDict) -> any_pb2.Any:
        found = self._anys.get(id(config))
        if found is None:
            found = any_pb2.Any()
            json_format.ParseDict(config, found)
            self._anys[id(config)] = found
        return found

    def route(self, route: JsonDict) -> route_components_pb2.Route:
        found = self._routes.get(id(route))
        if found is not None:
            return found
        stripped = {key: value for key, value in route.items() if key != _PER_FILTER}
        entries: list[JsonDict] = []
        action = route.get("route")
        if action is not None and "weighted_clusters" in action:
            entries = action["weighted_clusters"]["clusters"]
            plain = [{k: v for k, v in entry.items() if k != _PER_FILTER} for entry in entries]
            stripped["route"] = {
                **action,
                "weighted_clusters": {**action["weighted_clusters"], "clusters": plain},
            }
        message = route_components_pb2.Route()
        try:
            json_format.ParseDict(stripped, message)
        except (json_format.ParseError, TypeError, ValueError) as exc:
            raise ConfigError(f"invalid route {route.get('name')!r}: {exc}") from exc
        for name, config in route.get(_PER_FILTER, {}).items():
            message.typed_per_filter_config[name].CopyFrom(self._any(config))
        for entry, weighted in zip(entries, message.route.weighted_clusters.clusters, strict=True):
            for name, config in entry.get(_PER_FILTER, {}).items():
                weighted.typed_per_filter_config[name].CopyFrom(self._any(config))
        self._routes[id(route)] = message
        return message


def route_configurations(configs: Iterable[JsonDict]) -> list[route_pb2.RouteConfiguration]:
    """The same messages ``json_format.ParseDict`` would give, each shared part parsed once."""
    parser = _Parser()
    messages = []
    for config in configs:
        message = route_pb2.RouteConfiguration(name=config["name"])
        for vhost in config["virtual_hosts"]:
            virtual_host = message.virtual_hosts.add(name=vhost["name"], domains=vhost["domains"])
            virtual_host.routes.extend(parser.route(route) for route in vhost["routes"])
        messages.append(message)
    return messages


def snapshot_of(
    listeners: Iterable[JsonDict], routes: Iterable[JsonDict], clusters: Iterable[JsonDict]
) -> Snapshot:
    """The xDS snapshot of translated resources (routes through :func:`route_configurations`)."""
    parsed = Snapshot.from_dicts(listeners=listeners, clusters=clusters)
    return Snapshot.from_messages(
        listeners=parsed.messages(LISTENER).values(),
        clusters=parsed.messages(CLUSTER).values(),
        routes=route_configurations(routes),
    )
