"""Prometheus metrics under the Inference Extension's names (users' dashboards expect them).

One :class:`GatewayTelemetry` per process owns its own ``CollectorRegistry`` (no global registry).
It implements ``extproc.ports.RequestMetrics`` (per-request figures) and
``policies.framework.PluginTimer`` (per-plugin latency), and exposes pool gauges computed at
scrape time from the live endpoint snapshot, so the hot path only bumps counters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from extproc.ports import RequestLabels
from policies.types import EndpointSnapshot

LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
)
MICRO_BUCKETS = (
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1,
)
TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
SIZE_BUCKETS = (64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216)

SnapshotSource = Callable[[], EndpointSnapshot]
ScrapeCountersSource = Callable[[], Mapping[str, tuple[int, int]]]
"""endpoint address → (successful scrapes, failed scrapes)."""


class _PoolCollector(Collector):
    def __init__(self, snapshot: SnapshotSource, scrapes: ScrapeCountersSource | None) -> None:
        self._snapshot = snapshot
        self._scrapes = scrapes

    def collect(self) -> Iterable[Metric]:
        snapshot = self._snapshot()
        kv = GaugeMetricFamily(
            "inference_pool_average_kv_cache_utilization",
            "Average KV-cache utilisation of the pool's ready endpoints.",
            labels=["name"],
        )
        queue = GaugeMetricFamily(
            "inference_pool_average_queue_size",
            "Average waiting-queue length of the pool's ready endpoints.",
            labels=["name"],
        )
        ready = GaugeMetricFamily(
            "inference_pool_ready_pods", "Endpoints of the pool with fresh, healthy metrics.", labels=["name"]
        )
        for pool, views in snapshot.pools.items():
            live = [v.metrics for v in views if v.healthy and v.metrics is not None]
            ready.add_metric([pool], len(live))
            kv.add_metric([pool], sum(m.kv_cache_usage for m in live) / len(live) if live else 0.0)
            queue.add_metric([pool], sum(m.waiting for m in live) / len(live) if live else 0.0)
        yield from (kv, queue, ready)
        if self._scrapes is not None:
            scrapes = CounterMetricFamily(
                "kvgate_endpoint_scrapes", "Metrics scrapes of each endpoint.", labels=["endpoint", "result"]
            )
            for address, (ok, failed) in sorted(self._scrapes().items()):
                scrapes.add_metric([address, "success"], ok)
                scrapes.add_metric([address, "failure"], failed)
            yield scrapes


class GatewayTelemetry:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        labels = ["model_name", "target_model_name"]
        self._requests = Counter(
            "inference_objective_request_total", "Requests routed by the picker.", labels, registry=r
        )
        self._errors = Counter(
            "inference_objective_request_error_total",
            "Requests the picker answered with an error.",
            [*labels, "error_code"],
            registry=r,
        )
        self._duration = Histogram(
            "inference_objective_request_duration_seconds",
            "Request duration seen by the picker (headers to end of response).",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self._ttft = Histogram(
            "inference_objective_request_ttft_seconds",
            "Time to the first response body chunk.",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self._sizes = Histogram(
            "inference_objective_request_sizes", "Request body sizes in bytes.", labels,
            buckets=SIZE_BUCKETS, registry=r,
        )
        self._input = Histogram(
            "inference_objective_input_tokens", "Prompt tokens per request.", labels,
            buckets=TOKEN_BUCKETS, registry=r,
        )
        self._output = Histogram(
            "inference_objective_output_tokens", "Completion tokens per request.", labels,
            buckets=TOKEN_BUCKETS, registry=r,
        )
        self._running = Gauge(
            "inference_objective_running_requests", "Requests in flight through the picker.",
            ["model_name"], registry=r,
        )
        self._scheduler = Histogram(
            "inference_extension_scheduler_e2e_duration_seconds",
            "Time one scheduling decision took.",
            ["pool"],
            buckets=MICRO_BUCKETS,
            registry=r,
        )
        self._plugins = Histogram(
            "inference_extension_plugin_duration_seconds",
            "Time each scheduling plugin took.",
            ["extension_point", "plugin_type", "plugin_name"],
            buckets=MICRO_BUCKETS,
            registry=r,
        )

    def watch_pools(self, snapshot: SnapshotSource, scrapes: ScrapeCountersSource | None = None) -> None:
        """Export pool gauges (and scrape counters) computed from ``snapshot()`` at scrape time."""
        self.registry.register(_PoolCollector(snapshot, scrapes))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    # extproc.ports.RequestMetrics
    def request_picked(self, labels: RequestLabels, body_size: int) -> None:
        self._requests.labels(labels.model, labels.target_model).inc()
        self._sizes.labels(labels.model, labels.target_model).observe(body_size)
        self._running.labels(labels.model).inc()

    def request_error(self, labels: RequestLabels, code: str) -> None:
        self._errors.labels(labels.model, labels.target_model, code).inc()

    def scheduled(self, pool: str, seconds: float) -> None:
        self._scheduler.labels(pool).observe(seconds)

    def first_token(self, labels: RequestLabels, seconds: float) -> None:
        self._ttft.labels(labels.model, labels.target_model).observe(seconds)

    def tokens(self, labels: RequestLabels, prompt_tokens: int, completion_tokens: int) -> None:
        self._input.labels(labels.model, labels.target_model).observe(prompt_tokens)
        self._output.labels(labels.model, labels.target_model).observe(completion_tokens)

    def request_finished(self, labels: RequestLabels, seconds: float, *, ok: bool) -> None:
        self._duration.labels(labels.model, labels.target_model).observe(seconds)
        self._running.labels(labels.model).dec()

    # policies.framework.PluginTimer
    def observe(self, extension_point: str, plugin_type: str, plugin_name: str, seconds: float) -> None:
        self._plugins.labels(extension_point, plugin_type, plugin_name).observe(seconds)
