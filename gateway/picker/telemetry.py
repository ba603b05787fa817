"""Prometheus metrics under the Inference Extension's names (users' dashboards expect them).

One :class:`GatewayTelemetry` per process owns its own ``CollectorRegistry`` (no global registry).
It implements ``extproc.ports.RequestMetrics`` (per-request figures) and
``policies.framework.PluginTimer`` (per-plugin latency), and exposes pool gauges computed at
scrape time from the live endpoint snapshot, so the hot path only bumps counters.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kvgate.extproc.ports import OTHER_MODELS, RequestLabels
from kvgate.gateway.picker.metric_aliases import exposition
from kvgate.policies.saturation import SaturationThresholds, pool_saturation
from kvgate.policies.state import SessionCounts
from kvgate.policies.types import EndpointSnapshot

LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
)
MICRO_BUCKETS = (
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1,
)
TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
SIZE_BUCKETS = (64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216)

MAX_MODEL_LABEL_SETS = 1000
"""Distinct (model, target model) label sets kept; beyond it requests count under ``__other__``.
A backstop: the picker already labels names its pool does not know ``__other__``
(``extproc.ports.OTHER_MODELS``), so only configured and served names reach here."""
OTHER = OTHER_MODELS

SnapshotSource = Callable[[], EndpointSnapshot]
ScrapeCountersSource = Callable[[], Mapping[str, tuple[int, int]]]
"""endpoint address → (successful scrapes, failed scrapes)."""


ThresholdsSource = Callable[[], Mapping[str, SaturationThresholds]]
"""pool → the thresholds its saturation is measured against (flow control's, else admission's)."""


class _PoolCollector(Collector):
    def __init__(self, snapshot: SnapshotSource, scrapes: ScrapeCountersSource | None,
                 thresholds: ThresholdsSource | None = None) -> None:
        self._snapshot = snapshot
        self._scrapes = scrapes
        self._thresholds = thresholds

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
        saturation = GaugeMetricFamily(
            "inference_extension_flow_control_pool_saturation",
            "The pool's saturation: the mean over its endpoints of max(waiting / queue threshold, KV "
            "usage / KV threshold), 1 for one stale or down (above 1: overloaded, requests held or shed).",
            labels=["inference_pool"],
        )
        thresholds = self._thresholds() if self._thresholds is not None else {}
        now = time.monotonic()
        for pool, views in snapshot.pools.items():
            live = [v.metrics for v in views if v.healthy and v.metrics is not None]
            ready.add_metric([pool], len(live))
            kv.add_metric([pool], sum(m.kv_cache_usage for m in live) / len(live) if live else 0.0)
            queue.add_metric([pool], sum(m.waiting for m in live) / len(live) if live else 0.0)
            if pool in thresholds:
                saturation.add_metric([pool], pool_saturation(views, thresholds[pool], now))
        yield from (kv, queue, ready)
        if self._thresholds is not None:
            yield saturation
        if self._scrapes is not None:
            scrapes = CounterMetricFamily(
                "kvgate_endpoint_scrapes", "Metrics scrapes of each endpoint.", labels=["endpoint", "result"]
            )
            for address, (ok, failed) in sorted(self._scrapes().items()):
                scrapes.add_metric([address, "success"], ok)
                scrapes.add_metric([address, "failure"], failed)
            yield scrapes


class OutcomeReportsCollector(Collector):
    """``kvgate_outcome_reports_total{result}``: Envoy's access-log entries of skipped requests
    (``extproc.outcomes``) by what became of them. Flat while traffic flows through ``kvgate up``:
    the reports are not arriving (the access log cannot reach the picker), so 5xx and fallbacks of
    skipped requests eject nothing."""

    def __init__(self, counts: Callable[[], Mapping[str, int]]) -> None:
        self._counts = counts

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(
            "kvgate_outcome_reports", "Outcome reports from Envoy's access log, by result.", labels=["result"]
        )
        for result, count in self._counts().items():
            family.add_metric([result], count)
        yield family


class SessionPinsCollector(Collector):
    """``kvgate_session_pins{pool}`` (kept now) and ``kvgate_session_pins_dropped_total{pool}``
    (dropped for room): a growing drop count while stored responses are in use means continuations
    reach replicas that no longer hold them; raise ``--max-session-pins``."""

    def __init__(self, counts: Callable[[], Mapping[str, SessionCounts]]) -> None:
        self._counts = counts

    def collect(self) -> Iterable[Metric]:
        kept = GaugeMetricFamily(
            "kvgate_session_pins", "Session pins (session ids, stored responses) kept per pool.",
            labels=["pool"],
        )
        dropped = CounterMetricFamily(
            "kvgate_session_pins_dropped", "Session pins dropped for room, least recent first.",
            labels=["pool"],
        )
        for pool, counts in sorted(self._counts().items()):
            kept.add_metric([pool], counts.kept)
            dropped.add_metric([pool], counts.dropped)
        yield from (kept, dropped)


@dataclass(frozen=True, slots=True)
class _RequestSeries:
    """The labelled children of one (model, target model): looked up once, reused per request."""

    requests: Any
    sizes: Any
    running: Any
    ttft: Any
    input: Any
    output: Any
    duration: Any


class GatewayTelemetry:
    def __init__(self) -> None:
        self._series: dict[tuple[str, str], _RequestSeries] = {}
        self._plugin_series: dict[tuple[str, str, str], Any] = {}
        self._scheduler_series: dict[str, Any] = {}
        """The scheduler-latency histogram's child per pool (``labels()`` costs a lock and a tuple
        on every call; the children are kept by prometheus_client anyway)."""
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
        self._fallbacks = Counter(
            "kvgate_fallback_served_total",
            "Requests served by a fallback endpoint: the picked one failed and the data plane retried.",
            ["pool"],
            registry=r,
        )
        self._prefills = Counter(
            "kvgate_prefill_total",
            "Disaggregated requests' prefills run by the picker, by outcome (failed: served aggregated "
            "on the decode endpoint).",
            ["pool", "outcome"],
            registry=r,
        )
        self._spilled = Counter(
            "kvgate_spilled_requests_total",
            "Requests a full pool sent down its spill chain (kvgate.io/spill-to), by the pool they went to.",
            ["inference_pool", "to_pool"],
            registry=r,
        )
        self._slo = Counter(
            "kvgate_request_slo",
            "Requests' own latency objectives (x-slo-ttft-ms, x-slo-tpot-ms) checked at their end, by "
            "objective (ttft, tpot) and outcome (met, missed).",
            ["pool", "objective", "outcome"],
            registry=r,
        )
        self._prefill_duration = Histogram(
            "kvgate_prefill_duration_seconds",
            "Time from sending a disaggregated request's prefill to its answer (or failure).",
            ["pool"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self._prefix_tokens = Counter(
            "kvgate_prefix_tokens_total",
            "Prompt tokens of responses that reported cached_tokens, by kind: predicted (the prefix "
            "index's expected hit on the pick), best (its expected hit on the best endpoint), cached "
            "(what the replica reported).",
            ["pool", "kind"],
            registry=r,
        )
        self._prefix_checks = Counter(
            "kvgate_prefix_checks_total",
            "Responses whose cached_tokens were checked against the prefix index's prediction, by "
            "outcome: as_predicted, missed (under half the predicted hit), unpredicted (more than "
            "predicted by a block or more).",
            ["pool", "outcome"],
            registry=r,
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

    def watch_pools(self, snapshot: SnapshotSource, scrapes: ScrapeCountersSource | None = None,
                    thresholds: ThresholdsSource | None = None) -> None:
        """Export pool gauges (and scrape counters, and each pool's saturation against
        ``thresholds()``) computed from ``snapshot()`` at scrape time."""
        self.registry.register(_PoolCollector(snapshot, scrapes, thresholds))

    def exposition(self) -> bytes:
        """``/metrics``: the registry, with llm-d's names for the Inference Extension's families
        (``gateway.picker.metric_aliases``)."""
        return exposition(self.registry)

    def _of(self, labels: RequestLabels) -> _RequestSeries:
        key = (labels.model, labels.target_model)
        series = self._series.get(key)
        if series is None:
            if len(self._series) >= MAX_MODEL_LABEL_SETS:
                key = (OTHER, OTHER)
                series = self._series.get(key)
            if series is None:
                model, target = key
                series = _RequestSeries(
                    requests=self._requests.labels(model, target),
                    sizes=self._sizes.labels(model, target),
                    running=self._running.labels(model),
                    ttft=self._ttft.labels(model, target),
                    input=self._input.labels(model, target),
                    output=self._output.labels(model, target),
                    duration=self._duration.labels(model, target),
                )
                self._series[key] = series
        return series

    # extproc.ports.RequestMetrics
    def request_picked(self, labels: RequestLabels, body_size: int) -> None:
        series = self._of(labels)
        series.requests.inc()
        series.sizes.observe(body_size)
        series.running.inc()

    def request_error(self, labels: RequestLabels, code: str) -> None:
        model, target = (labels.model, labels.target_model)
        if (model, target) not in self._series and len(self._series) >= MAX_MODEL_LABEL_SETS:
            model = target = OTHER
        self._errors.labels(model, target, code).inc()

    def scheduled(self, pool: str, seconds: float) -> None:
        child = self._scheduler_series.get(pool)
        if child is None:
            child = self._scheduler_series[pool] = self._scheduler.labels(pool)
        child.observe(seconds)

    def served_by_fallback(self, labels: RequestLabels) -> None:
        self._fallbacks.labels(labels.pool).inc()

    def first_token(self, labels: RequestLabels, seconds: float) -> None:
        self._of(labels).ttft.observe(seconds)

    def tokens(self, labels: RequestLabels, prompt_tokens: int, completion_tokens: int) -> None:
        series = self._of(labels)
        series.input.observe(prompt_tokens)
        series.output.observe(completion_tokens)

    def request_finished(self, labels: RequestLabels, seconds: float, *, ok: bool) -> None:
        series = self._of(labels)
        series.duration.observe(seconds)
        series.running.dec()

    def spilled(self, pool: str, to_pool: str) -> None:
        self._spilled.labels(pool, to_pool).inc()

    def slo_checked(self, labels: RequestLabels, objective: str, met: bool) -> None:
        self._slo.labels(labels.pool, objective, "met" if met else "missed").inc()

    def prefill_finished(self, labels: RequestLabels, seconds: float, *, ok: bool) -> None:
        self._prefills.labels(labels.pool, "ok" if ok else "failed").inc()
        self._prefill_duration.labels(labels.pool).observe(seconds)

    def prefix_checked(
        self, labels: RequestLabels, predicted: int, best: int, actual: int, block: int
    ) -> None:
        tokens = self._prefix_tokens
        tokens.labels(labels.pool, "predicted").inc(predicted)
        tokens.labels(labels.pool, "best").inc(best)
        tokens.labels(labels.pool, "cached").inc(actual)
        self._prefix_checks.labels(labels.pool, prefix_outcome(predicted, actual, block)).inc()

    # policies.framework.PluginTimer
    def observe(self, extension_point: str, plugin_type: str, plugin_name: str, seconds: float) -> None:
        key = (extension_point, plugin_type, plugin_name)
        child = self._plugin_series.get(key)
        if child is None:
            child = self._plugin_series[key] = self._plugins.labels(*key)
        child.observe(seconds)


def prefix_outcome(predicted: int, actual: int, block: int) -> str:
    """How a response's cached tokens compare with the prefix index's prediction, which counts in
    whole blocks of ``block`` tokens: a hit up to a block above it is as predicted (the engine's
    blocks are finer than the index's)."""
    if actual < predicted / 2:
        return "missed"
    if actual >= predicted + max(1, block):
        return "unpredicted"
    return "as_predicted"
