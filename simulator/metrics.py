"""Prometheus text for one replica, in the metric dialect of the engine it plays.

Names, labels and semantics follow the engines' own (docs/metrics.md):

- ``vllm``: ``vllm:num_requests_waiting``, ``vllm:num_requests_running``, ``vllm:kv_cache_usage_perc``
  and the older ``vllm:gpu_cache_usage_perc`` (0..1), ``vllm:lora_requests_info{running_lora_adapters,
  waiting_lora_adapters,max_lora}`` (value: the Unix time the label set was last current; earlier
  label sets stay exported, as in vLLM, so the newest series wins), ``vllm:cache_config_info{block_size,
  num_gpu_blocks,…}`` (value 1), counters ``vllm:prefix_cache_queries_total``,
  ``vllm:prefix_cache_hits_total`` (tokens), ``vllm:prompt_tokens_total``,
  ``vllm:generation_tokens_total``, ``vllm:request_success_total{finished_reason}``,
  ``vllm:num_preemptions_total``, histograms ``vllm:time_to_first_token_seconds`` and
  ``vllm:e2e_request_latency_seconds``; all (but the info gauges) labelled ``model_name``.
- ``sglang``: ``sglang:num_queue_reqs``, ``sglang:num_running_reqs``, ``sglang:token_usage``,
  ``sglang:cache_config_info{page_size,num_pages}``, token counters, ``sglang:cache_hit_rate`` and the
  two histograms.
- ``trtllm`` (trtllm-serve): ``trtllm_num_requests_waiting``, ``trtllm_num_requests_running``,
  ``trtllm_kv_cache_utilization``, ``trtllm_kv_cache_tokens_per_block``, ``trtllm_kv_cache_max_blocks``,
  ``trtllm_request_success_total`` and the two histograms.
- ``jetstream`` (JetStream on TPUs, ``jetstream/core/metrics/prometheus.py``): labels ``id`` (the
  host) and ``model_name``; ``jetstream_prefill_backlog_size`` (the waiting requests),
  ``jetstream_transfer_backlog_size{idx}`` and ``jetstream_generate_backlog_size{idx}`` (0: the
  simulated engine has no such stages), ``jetstream_slots_used_percentage{idx}`` (running /
  max-num-seqs, a fraction), the newer ``num_requests_waiting`` and ``kv_cache_utilization_perc``,
  ``jetstream_request_success_count_total``, histograms ``jetstream_time_to_first_token`` and
  ``jetstream_time_per_request``; no running count (JetStream has none).

Latencies are in simulated seconds. Each replica has its own ``CollectorRegistry``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from kvgate.simulator.engine import EngineMetrics, Finished

Dialect = Literal["vllm", "sglang", "trtllm", "jetstream"]
DIALECTS: tuple[Dialect, ...] = ("vllm", "sglang", "trtllm", "jetstream")

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
               240.0, 480.0, 960.0, 1920.0, 7680.0)
LORA_INFO_SERIES_KEPT = 32

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

NIXL_TIME_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
"""vLLM's ``vllm:nixl_xfer_time_seconds`` buckets (NixlPromMetrics)."""
NIXL_BYTES_BUCKETS = tuple(float(2 ** p) for p in range(20, 35))  # 1 MiB .. 16 GiB


@dataclass(frozen=True)
class _Names:
    prefix: str
    waiting: str
    running: str
    kv_usage: tuple[str, ...]
    ttft: str
    e2e: str


_NAMES: dict[Dialect, _Names] = {
    "vllm": _Names("vllm:", "vllm:num_requests_waiting", "vllm:num_requests_running",
                   ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
                   "vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds"),
    "sglang": _Names("sglang:", "sglang:num_queue_reqs", "sglang:num_running_reqs", ("sglang:token_usage",),
                     "sglang:time_to_first_token_seconds", "sglang:e2e_request_latency_seconds"),
    "trtllm": _Names("trtllm_", "trtllm_num_requests_waiting", "trtllm_num_requests_running",
                     ("trtllm_kv_cache_utilization",),
                     "trtllm_time_to_first_token_seconds", "trtllm_e2e_request_latency_seconds"),
    "jetstream": _Names("jetstream_", "jetstream_prefill_backlog_size", "", ("kv_cache_utilization_perc",),
                        "jetstream_time_to_first_token", "jetstream_time_per_request"),
}


class _EngineCollector(Collector):
    """Gauges and counters read from the engine's snapshot at scrape time."""

    def __init__(self, dialect: Dialect, model_name: str, snapshot: Callable[[], EngineMetrics]) -> None:
        self._dialect = dialect
        self._model = model_name
        self._snapshot = snapshot
        self._lora_series: dict[tuple[str, str, str], float] = {}

    def collect(self) -> Iterable[Metric]:
        m = self._snapshot()
        if self._dialect == "jetstream":
            yield from self._jetstream(m)
            return
        names = _NAMES[self._dialect]
        yield self._gauge(names.waiting, "Number of requests waiting to be processed.", m.waiting)
        yield self._gauge(names.running, "Number of requests in model execution batches.", m.running)
        for name in names.kv_usage:
            yield self._gauge(name, "KV-cache usage. 1 means 100 percent usage.", m.kv_cache_usage)
        if self._dialect == "vllm":
            yield from self._vllm_only(m)
        elif self._dialect == "sglang":
            yield from self._sglang_only(m)
        else:
            yield from self._trtllm_only(m)

    def _jetstream(self, m: EngineMetrics) -> Iterable[Metric]:
        host = f"sim-{self._model}"
        model = self._model.replace("-", "_")  # JetStream's label-safe model name

        def gauge(name: str, doc: str, value: float, idx: bool = False) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=["id", "model_name", *(["idx"] if idx else [])])
            family.add_metric([host, model, *(["0"] if idx else [])], value)
            return family

        yield gauge("jetstream_prefill_backlog_size", "Size of prefill queue", m.waiting)
        yield gauge("jetstream_transfer_backlog_size", "Size of transfer queue", 0, idx=True)
        yield gauge("jetstream_generate_backlog_size", "Size of generate queue", 0, idx=True)
        yield gauge("jetstream_slots_used_percentage", "The percentage of decode slots currently being used",
                    m.running / m.max_num_seqs if m.max_num_seqs else 0.0, idx=True)
        yield gauge("num_requests_waiting", "Number of requests waiting to be processed for inference.",
                    m.waiting)
        yield gauge("kv_cache_utilization_perc", "kv-cache utilization % by the requests under processing.",
                    m.kv_cache_usage)
        success = CounterMetricFamily("jetstream_request_success_count", "Number of requests successfully "
                                      "completed", labels=["id", "model_name"])
        success.add_metric([host, model], m.request_success_total)
        yield success

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, doc, labels=["model_name"])
        family.add_metric([self._model], value)
        return family

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        family = CounterMetricFamily(name, doc, labels=["model_name"])
        family.add_metric([self._model], value)
        return family

    def _vllm_only(self, m: EngineMetrics) -> Iterable[Metric]:
        yield self._lora_info(m)
        info = GaugeMetricFamily(
            "vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
            labels=["block_size", "cache_dtype", "enable_prefix_caching", "num_cpu_blocks", "num_gpu_blocks"],
        )
        info.add_metric([str(m.block_size), "auto", "True", "0", str(m.num_gpu_blocks)], 1.0)
        yield info
        yield self._counter("vllm:prefix_cache_queries",
                            "Prefix cache queries, in terms of number of queried tokens.",
                            m.prefix_cache_queries)
        yield self._counter("vllm:prefix_cache_hits",
                            "Prefix cache hits, in terms of number of cached tokens.", m.prefix_cache_hits)
        yield self._counter("vllm:prompt_tokens", "Number of prefill tokens processed.",
                            m.prompt_tokens_total)
        yield self._counter("vllm:generation_tokens", "Number of generation tokens processed.",
                            m.generation_tokens_total)
        yield self._counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.",
                            m.preemptions_total)
        success = CounterMetricFamily("vllm:request_success", "Count of successfully processed requests.",
                                      labels=["finished_reason", "model_name"])
        success.add_metric(["length", self._model], m.request_success_total)
        yield success

    def _lora_info(self, m: EngineMetrics) -> GaugeMetricFamily:
        key = (",".join(m.running_loras), ",".join(m.waiting_loras), str(m.max_loras))
        self._lora_series.pop(key, None)
        self._lora_series[key] = time.time()
        while len(self._lora_series) > LORA_INFO_SERIES_KEPT:
            del self._lora_series[next(iter(self._lora_series))]
        family = GaugeMetricFamily("vllm:lora_requests_info", "Running stats on lora requests.",
                                   labels=["running_lora_adapters", "waiting_lora_adapters", "max_lora"])
        for (running, waiting, max_lora), stamp in self._lora_series.items():
            family.add_metric([running, waiting, max_lora], stamp)
        return family

    def _sglang_only(self, m: EngineMetrics) -> Iterable[Metric]:
        info = GaugeMetricFamily("sglang:cache_config_info", "Cache configuration",
                                 labels=["page_size", "num_pages"])
        info.add_metric([str(m.block_size), str(m.num_gpu_blocks)], 1.0)
        yield info
        yield self._counter("sglang:prompt_tokens", "Number of prefill tokens processed.",
                            m.prompt_tokens_total)
        yield self._counter("sglang:generation_tokens", "Number of generation tokens processed.",
                            m.generation_tokens_total)
        yield self._counter("sglang:num_requests", "Number of requests processed.", m.request_success_total)
        hit_rate = m.prefix_cache_hits / m.prefix_cache_queries if m.prefix_cache_queries else 0.0
        yield self._gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", hit_rate)

    def _trtllm_only(self, m: EngineMetrics) -> Iterable[Metric]:
        yield self._gauge("trtllm_kv_cache_tokens_per_block", "Tokens per KV-cache block.", m.block_size)
        yield self._gauge("trtllm_kv_cache_max_blocks", "Maximum number of KV-cache blocks.",
                          m.num_gpu_blocks)
        yield self._counter("trtllm_request_success", "Count of successfully processed requests.",
                            m.request_success_total)


class ReplicaMetrics:
    """One replica's metrics page: engine gauges at scrape time plus latency histograms."""

    def __init__(self, dialect: Dialect, model_name: str, snapshot: Callable[[], EngineMetrics]) -> None:
        if dialect not in _NAMES:
            raise ValueError(f"unknown engine dialect {dialect!r}; known: {', '.join(DIALECTS)}")
        names = _NAMES[dialect]
        self.dialect = dialect
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_EngineCollector(dialect, model_name, snapshot))
        self._ttft = Histogram(names.ttft, "Histogram of time to first token in seconds.", ["model_name"],
                               registry=self.registry, buckets=TTFT_BUCKETS).labels(model_name)
        self._e2e = Histogram(names.e2e, "Histogram of end to end request latency in seconds.",
                              ["model_name"], registry=self.registry, buckets=E2E_BUCKETS).labels(model_name)

        self._nixl = _NixlMetrics(self.registry, model_name) if dialect == "vllm" else None

    def observe(self, finished: Finished) -> None:
        self._ttft.observe(finished.ttft)
        self._e2e.observe(finished.e2e)

    def kv_transferred(self, seconds: float, nbytes: int) -> None:
        """A decode read a remote prefill's KV (vLLM: ``vllm:nixl_xfer_time_seconds``,
        ``vllm:nixl_bytes_transferred``)."""
        if self._nixl is not None:
            self._nixl.xfer_time.observe(seconds)
            self._nixl.bytes.observe(nbytes)

    def kv_transfer_failed(self) -> None:
        if self._nixl is not None:
            self._nixl.failed.inc()

    def kv_expired(self) -> None:
        """Held prefill KV that no decode read in time (tracked on the prefill instance, as vLLM's)."""
        if self._nixl is not None:
            self._nixl.expired.inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _NixlMetrics:
    """vLLM's NixlConnector metrics (``NixlPromMetrics``), labelled ``model_name`` and ``engine``."""

    def __init__(self, registry: CollectorRegistry, model_name: str) -> None:
        labels = ["model_name", "engine"]
        values = (model_name, "0")
        self.xfer_time = Histogram("vllm:nixl_xfer_time_seconds",
                                   "Histogram of transfer duration for NIXL KV Cache transfers.", labels,
                                   registry=registry, buckets=NIXL_TIME_BUCKETS).labels(*values)
        self.bytes = Histogram("vllm:nixl_bytes_transferred",
                               "Histogram of bytes transferred per NIXL KV Cache transfers.", labels,
                               registry=registry, buckets=NIXL_BYTES_BUCKETS).labels(*values)
        self.failed = Counter("vllm:nixl_num_failed_transfers", "Number of failed NIXL KV Cache transfers.",
                              labels, registry=registry).labels(*values)
        self.expired = Counter("vllm:nixl_num_kv_expired_reqs",
                               "Number of requests that had their KV expire.", labels,
                               registry=registry).labels(*values)
