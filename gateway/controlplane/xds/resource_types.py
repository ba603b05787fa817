"""The xDS resource types kvgate serves, and the Envoy extension protos its resources embed.

A :class:`ResourceKind` ties a type URL to its message class and to how a resource of that type is named
(``Listener.name`` but ``ClusterLoadAssignment.cluster_name``). :data:`DEFAULT_KINDS` holds the four
kinds kvgate serves; pass your own tuple to :class:`gateway.controlplane.xds.snapshot.Snapshot`
builders to serve more.

Importing this module also registers, in protobuf's default descriptor pool, every extension message
kvgate packs into an ``Any`` (``typed_config``, ``typed_per_filter_config``,
``typed_extension_protocol_options``), so ``json_format.ParseDict`` can resolve their ``@type``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

# Extension modules: imported for their side effect on the descriptor pool (see the module docstring).
import envoy.config.trace.v3.opentelemetry_pb2
import envoy.extensions.access_loggers.file.v3.file_pb2
import envoy.extensions.access_loggers.filters.cel.v3.cel_pb2
import envoy.extensions.access_loggers.grpc.v3.als_pb2
import envoy.extensions.access_loggers.stream.v3.stream_pb2
import envoy.extensions.filters.http.cors.v3.cors_pb2
import envoy.extensions.filters.http.ext_authz.v3.ext_authz_pb2
import envoy.extensions.filters.http.ext_proc.v3.ext_proc_pb2
import envoy.extensions.filters.http.header_mutation.v3.header_mutation_pb2
import envoy.extensions.filters.http.health_check.v3.health_check_pb2
import envoy.extensions.filters.http.router.v3.router_pb2
import envoy.extensions.filters.listener.original_dst.v3.original_dst_pb2
import envoy.extensions.filters.listener.tls_inspector.v3.tls_inspector_pb2
import envoy.extensions.filters.network.http_connection_manager.v3.http_connection_manager_pb2
import envoy.extensions.load_balancing_policies.override_host.v3.override_host_pb2
import envoy.extensions.load_balancing_policies.round_robin.v3.round_robin_pb2
import envoy.extensions.request_id.uuid.v3.uuid_pb2
import envoy.extensions.transport_sockets.tls.v3.tls_pb2
import envoy.extensions.upstreams.http.v3.http_protocol_options_pb2  # noqa: F401
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from google.protobuf.message import Message

TYPE_URL_PREFIX: Final = "type.googleapis.com/"
CLUSTER: Final = TYPE_URL_PREFIX + "envoy.config.cluster.v3.Cluster"
ENDPOINT: Final = TYPE_URL_PREFIX + "envoy.config.endpoint.v3.ClusterLoadAssignment"
LISTENER: Final = TYPE_URL_PREFIX + "envoy.config.listener.v3.Listener"
ROUTE: Final = TYPE_URL_PREFIX + "envoy.config.route.v3.RouteConfiguration"
HCM: Final = (
    TYPE_URL_PREFIX
    + "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
)
EXT_PROC: Final = TYPE_URL_PREFIX + "envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor"
EXT_PROC_PER_ROUTE: Final = TYPE_URL_PREFIX + "envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute"
FILTER_CONFIG: Final = TYPE_URL_PREFIX + "envoy.config.route.v3.FilterConfig"


@dataclass(frozen=True, slots=True)
class ResourceKind:
    """One xDS resource type: its type URL, message class, how a resource is named, and whether Envoy
    subscribes to it as a wildcard (LDS, CDS: the whole set) or by resource names (RDS, EDS)."""

    type_url: str
    message_type: type[Message]
    name_of: Callable[[Message], str]
    wildcard: bool

    @property
    def short_name(self) -> str:
        """``Cluster``, ``Listener``… for logs and metrics labels."""
        return self.type_url.rsplit(".", 1)[-1]


def _name_field(message: Message) -> str:
    return str(getattr(message, "name"))  # noqa: B009 - every kind here but EDS has a string ``name``


def _cluster_name_field(message: Message) -> str:
    return str(getattr(message, "cluster_name"))  # noqa: B009


DEFAULT_KINDS: Final = (
    ResourceKind(CLUSTER, cluster_pb2.Cluster, _name_field, wildcard=True),
    ResourceKind(ENDPOINT, endpoint_pb2.ClusterLoadAssignment, _cluster_name_field, wildcard=False),
    ResourceKind(LISTENER, listener_pb2.Listener, _name_field, wildcard=True),
    ResourceKind(ROUTE, route_pb2.RouteConfiguration, _name_field, wildcard=False),
)
"""In push order: clusters before their endpoints, listeners before their routes, clusters before
listeners (a listener's routes may name a new cluster)."""

KINDS_BY_TYPE_URL: Final = MappingProxyType({kind.type_url: kind for kind in DEFAULT_KINDS})
