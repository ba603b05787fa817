"""The control plane's state as Prometheus metrics, for alerts: a configuration that no longer loads,
resources in a bad condition, Envoy refusing an update, a listener certificate about to expire.

Computed at scrape time from what the control plane already keeps (no counter on any hot path);
``kvgate up`` registers it on the picker's registry, so it is on the same ``/metrics``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kvgate.gateway.controlplane.resources import ValidatedConfig
from kvgate.gateway.controlplane.resources.certificates import not_after
from kvgate.gateway.controlplane.resources.provider import ProviderStatus
from kvgate.gateway.controlplane.xds.observer import XdsStatus


class ControlPlaneState(Protocol):
    """What the collector reads (``ControlPlane``)."""

    config: ValidatedConfig | None
    last_error: str | None

    def provider_status(self) -> ProviderStatus: ...


@dataclass(frozen=True, slots=True)
class _Expiry:
    chain: str
    not_after: float


class ControlPlaneCollector(Collector):
    def __init__(self, state: ControlPlaneState, xds: XdsStatus) -> None:
        self._state = state
        self._xds = xds
        self._expiries: dict[tuple[str, str], _Expiry] = {}
        """A listener's certificate expiry, parsed once per chain."""

    def collect(self) -> Iterable[Metric]:
        state = self._state
        provider = state.provider_status()
        version = GaugeMetricFamily("kvgate_config_version", "Configuration version loaded (files, cluster).")
        version.add_metric([], provider.version)
        failing = GaugeMetricFamily(
            "kvgate_config_errors",
            "1 while the configuration does not load or apply (the last good one is served), else 0.",
            labels=["stage"],
        )
        failing.add_metric(["load"], int(provider.last_error is not None))
        failing.add_metric(["apply"], int(state.last_error is not None))
        yield from (version, failing)
        yield from self._xds_families()
        config = state.config
        if config is not None:
            yield self._conditions(config)
            yield self._certificates(config)

    def _xds_families(self) -> Iterable[Metric]:
        pushes = CounterMetricFamily("kvgate_xds_pushes", "xDS updates sent to Envoy.", labels=["type"])
        rejections = CounterMetricFamily(
            "kvgate_xds_rejections", "xDS updates Envoy refused (NACK): it keeps the last good one.",
            labels=["type"],
        )
        for type_url, counters in sorted(self._xds.counters.items()):
            name = type_url.rsplit(".", 1)[-1]
            pushes.add_metric([name], counters.pushes)
            rejections.add_metric([name], counters.nacks)
        yield from (pushes, rejections)

    @staticmethod
    def _conditions(config: ValidatedConfig) -> Metric:
        family = GaugeMetricFamily(
            "kvgate_resource_conditions",
            "Conditions of the Gateway API resources by kind, type and status (alert on a bad one).",
            labels=["kind", "condition", "status"],
        )
        counts: dict[tuple[str, str, str], int] = {}
        for entry in config.status.entries:
            for cond in entry.conditions:
                key = (entry.resource.kind, cond.type, str(cond.status))
                counts[key] = counts.get(key, 0) + 1
        for key, count in sorted(counts.items()):
            family.add_metric(list(key), count)
        return family

    def _certificates(self, config: ValidatedConfig) -> Metric:
        family = GaugeMetricFamily(
            "kvgate_listener_certificate_expiry_timestamp_seconds",
            "When each HTTPS listener's certificate expires (notAfter, Unix seconds).",
            labels=["gateway", "listener"],
        )
        seen: dict[tuple[str, str], _Expiry] = {}
        for (gateway, listener), certificate in sorted(config.certificates().items(), key=_by_name):
            key = (str(gateway), listener)
            known = self._expiries.get(key)
            if known is None or known.chain != certificate.certificate_chain:
                known = _Expiry(certificate.certificate_chain, not_after(certificate))
            seen[key] = known
            family.add_metric(list(key), known.not_after)
        self._expiries = seen
        return family


def _by_name(item: tuple[tuple[object, str], object]) -> tuple[str, str]:
    return str(item[0][0]), item[0][1]

