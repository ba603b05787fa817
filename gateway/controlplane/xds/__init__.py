"""kvgate's xDS control plane: versioned consistent snapshots, a per-node snapshot cache, an ADS server
(State of the World) with ACK/NACK handling, and Envoy's bootstrap pointing at it."""

from kvgate.gateway.controlplane.xds.bootstrap import (
    XDS_CLUSTER,
    ads_config_source,
    bootstrap_for_ads,
    http2_protocol_options,
)
from kvgate.gateway.controlplane.xds.cache import ANY_NODE, SnapshotCache
from kvgate.gateway.controlplane.xds.consistency import check_consistent, inconsistencies
from kvgate.gateway.controlplane.xds.observer import (
    FanoutObserver,
    NullObserver,
    Rejection,
    XdsObserver,
    XdsStatus,
)
from kvgate.gateway.controlplane.xds.resource_types import (
    CLUSTER,
    DEFAULT_KINDS,
    ENDPOINT,
    LISTENER,
    ROUTE,
    ResourceKind,
)
from kvgate.gateway.controlplane.xds.server import AdsServer, AggregatedDiscoveryServicer
from kvgate.gateway.controlplane.xds.snapshot import Snapshot, parse_resource
from kvgate.gateway.controlplane.xds.stream import Acked, AdsStream, Ignored, Nacked, Send

__all__ = [
    "ANY_NODE",
    "CLUSTER",
    "DEFAULT_KINDS",
    "ENDPOINT",
    "LISTENER",
    "ROUTE",
    "XDS_CLUSTER",
    "Acked",
    "AdsServer",
    "AdsStream",
    "AggregatedDiscoveryServicer",
    "FanoutObserver",
    "Ignored",
    "Nacked",
    "NullObserver",
    "Rejection",
    "ResourceKind",
    "Send",
    "Snapshot",
    "SnapshotCache",
    "XdsObserver",
    "XdsStatus",
    "ads_config_source",
    "bootstrap_for_ads",
    "check_consistent",
    "http2_protocol_options",
    "inconsistencies",
    "parse_resource",
]
