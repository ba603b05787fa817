"""Pure translation of the validated Gateway API configuration into Envoy xDS resources.

``translate(config, settings) -> EnvoyResources`` (listeners, RDS route configurations, clusters as
proto-JSON dicts, sorted) and ``translate_snapshot(config, settings) -> gateway.controlplane.xds.Snapshot``.
"""

from kvgate.gateway.controlplane.translate.listeners import bbr_filter
from kvgate.gateway.controlplane.translate.names import (
    BBR_FILTER,
    BBR_ROLE,
    INVALID_BACKEND_CLUSTER,
    INVALID_BACKEND_HEADER,
    ROLE_METADATA_KEY,
    listener_name,
    route_config_name,
)
from kvgate.gateway.controlplane.translate.settings import BodyRouting, TranslationSettings
from kvgate.gateway.controlplane.translate.translate import EnvoyResources, translate, translate_snapshot

__all__ = [
    "BBR_FILTER",
    "BBR_ROLE",
    "INVALID_BACKEND_CLUSTER",
    "INVALID_BACKEND_HEADER",
    "ROLE_METADATA_KEY",
    "BodyRouting",
    "EnvoyResources",
    "TranslationSettings",
    "bbr_filter",
    "listener_name",
    "route_config_name",
    "translate",
    "translate_snapshot",
]
