"""The translation: a :class:`ValidatedConfig` → Envoy listeners, RDS route configurations and clusters.

Pure and deterministic (sorted, stable names), so the xDS versions, content hashes, change only when
the configuration does.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from kvgate.extproc.names import MODEL_NAME_HEADER
from kvgate.gateway.controlplane import envoy_clusters as ecl
from kvgate.gateway.controlplane.resources import ValidatedConfig
from kvgate.gateway.controlplane.translate.backends import ClusterSet, pool_clusters
from kvgate.gateway.controlplane.translate.external_auth import with_auth_off
from kvgate.gateway.controlplane.translate.listeners import envoy_listener
from kvgate.gateway.controlplane.translate.messages import snapshot_of
from kvgate.gateway.controlplane.translate.models import models_cluster, models_routes
from kvgate.gateway.controlplane.translate.routes import RouteGroup, route_groups
from kvgate.gateway.controlplane.translate.settings import TranslationSettings
from kvgate.gateway.controlplane.translate.tracing import otlp_cluster
from kvgate.gateway.controlplane.translate.virtual_hosts import Attached, PortListener, route_configuration
from kvgate.gateway.controlplane.xds import Snapshot

JsonDict = dict[str, Any]


@dataclass(frozen=True, slots=True)
class EnvoyResources:
    """Envoy resources as proto-JSON dicts, each tuple sorted by name. ``warnings``: parts of the
    configuration that could not be expressed and were left out (one line each)."""

    listeners: tuple[JsonDict, ...]
    routes: tuple[JsonDict, ...]
    clusters: tuple[JsonDict, ...]
    warnings: tuple[str, ...] = ()

    def as_json(self) -> JsonDict:
        return {
            "listeners": list(self.listeners),
            "routes": list(self.routes),
            "clusters": list(self.clusters),
        }

    def snapshot(self) -> Snapshot:
        return snapshot_of(self.listeners, self.routes, self.clusters)


def translate(config: ValidatedConfig, settings: TranslationSettings) -> EnvoyResources:
    """Translate ``config``; see the package docstring for what each resource is."""
    clusters = ClusterSet()
    warnings: list[str] = []
    pickers = [ecl.split_host_port(address) for address in settings.picker_addresses]
    clusters.add(ecl.ext_proc_cluster(pickers, settings.ext_proc.cluster_name))
    if settings.ext_proc.outcome_reports and settings.outcome_addresses:
        outcomes = [ecl.split_host_port(address) for address in settings.outcome_addresses]
        clusters.add(ecl.ext_proc_cluster(outcomes, settings.ext_proc.outcome_cluster_name))
    for pool in config.pools:
        for cluster in pool_clusters(pool, settings):
            clusters.add(cluster)
    if settings.models_address is not None:
        clusters.add(models_cluster(settings.models_address))
    if settings.tracing is not None:
        clusters.add(otlp_cluster(settings.tracing))

    listeners: dict[int, list[PortListener]] = defaultdict(list)
    for gateway in config.gateways:
        for listener in gateway.listeners:
            hostname = listener.hostname.lower() if listener.hostname else None
            listeners[listener.port].append(
                PortListener(gateway.key, listener.name, hostname, listener.certificate)
            )

    attached: dict[int, list[Attached]] = defaultdict(list)
    for route in config.routes:
        groups: list[RouteGroup] = route_groups(route, settings, clusters, warnings)
        for attachment in route.attachments:
            attached[attachment.port].append(Attached(route, attachment, groups))

    envoy_listeners: list[JsonDict] = []
    route_configs: list[JsonDict] = []
    for port in sorted(listeners):
        on_port = attached.get(port, [])
        first = models_routes(port) if settings.models_address is not None else []
        auth = {f["name"]: f for item in on_port for group in item.groups for f in group.auth_filters}
        route_configs.append(with_auth_off(
            route_configuration(port, listeners[port], on_port, first, settings.bind_port(port)), sorted(auth)
        ))
        matches_model = any(
            MODEL_NAME_HEADER in group.header_names for item in on_port for group in item.groups
        )
        body_routing = settings.body_based_routing == "on" or (
            settings.body_based_routing == "auto" and matches_model
        )
        cors = any(group.cors for item in on_port for group in item.groups)
        envoy_listeners.append(envoy_listener(port, settings, body_routing, listeners[port], cors=cors,
                                              auth_filters=tuple(auth[name] for name in sorted(auth))))
    return EnvoyResources(
        listeners=tuple(envoy_listeners),
        routes=tuple(route_configs),
        clusters=clusters.sorted(),
        warnings=tuple(dict.fromkeys(warnings)),
    )


def translate_snapshot(config: ValidatedConfig, settings: TranslationSettings) -> Snapshot:
    """``translate(config, settings).snapshot()``: the xDS snapshot to publish."""
    return translate(config, settings).snapshot()
