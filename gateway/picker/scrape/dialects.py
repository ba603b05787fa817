"""Model-server metric dialects: one Prometheus page in, one engine-neutral :class:`EndpointMetrics` out.

Names per engine: docs/metrics.md. Aggregation across several series
of one family (several ``model_name``, data-parallel ``engine`` or ``dp_rank`` series):

- request counts (waiting, running) and block counts are summed;
- KV usage is a fraction, so it is averaged (summing two 0.5 fractions would read as a full cache),
  then clamped to [0, 1];
- block size is the largest reported;
- vLLM LoRA info: the series with the largest value wins (the value is the time it was set, and
  vLLM leaves older label sets on the page).

A page that carries none of the dialect's waiting, running or KV families is an error (a wrong
dialect or not a model server), so the scraper counts it as a failed scrape.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType

from kvgate.gateway.picker.scrape.exposition import LineMemo, MetricsPageError, Sample, SampleReader
from kvgate.policies.types import EndpointMetrics

Samples = Mapping[str, Sequence[Sample]]


class MetricsDialect(StrEnum):
    """Which engine's metric names a pool's replicas speak (the pools file's ``engine``)."""

    VLLM = "vllm"
    SGLANG = "sglang"
    TRTLLM = "trtllm"
    TRITON = "triton"
    JETSTREAM = "jetstream"


@dataclass(frozen=True, slots=True)
class DialectSpec:
    """What to read from an engine's page and how to turn it into :class:`EndpointMetrics`.

    ``metrics_path`` is the engine's default path; Triton serves metrics on its own port (8002 by
    default), which the scraper takes as a per-pool setting.
    """

    dialect: MetricsDialect
    metrics_path: str
    reader: SampleReader
    build: Callable[[Samples, float], EndpointMetrics]

    @property
    def families(self) -> frozenset[str]:
        return frozenset(self.reader.names)


def parse_metrics(
    page: str, dialect: MetricsDialect | str, updated_at: float, memo: LineMemo | None = None
) -> EndpointMetrics:
    """Read one ``/metrics`` page of the given dialect; raises :class:`MetricsPageError`.
    ``memo``: lines parsed before are not parsed again (:class:`LineMemo`, one per scraper)."""
    spec = DIALECTS[MetricsDialect(dialect)]
    return spec.build(spec.reader.read(page, memo), updated_at)


def _finite(samples: Sequence[Sample], where: Mapping[str, str] | None = None) -> list[float]:
    values = []
    for sample in samples:
        if where is not None and any(sample.labels.get(k) != v for k, v in where.items()):
            continue
        if math.isfinite(sample.value):
            values.append(sample.value)
    return values


def _total(values: list[float]) -> float | None:
    return sum(values) if values else None


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _count(value: float | None) -> int:
    return max(0, round(value)) if value is not None else 0


def _fraction(value: float | None) -> float:
    return min(1.0, max(0.0, value)) if value is not None else 0.0


def _positive_int(value: float | None) -> int | None:
    return round(value) if value is not None and value > 0 else None


def _int_label(sample: Sample, name: str) -> int | None:
    try:
        value = int(float(sample.labels.get(name, "")))
    except ValueError:
        return None
    return value if value > 0 else None


def _cache_info(
    samples: Sequence[Sample], size_label: str, count_label: str
) -> tuple[int | None, int | None]:
    """Block size and block count from an info gauge's labels (``None`` labels are skipped)."""
    sizes = [v for v in (_int_label(s, size_label) for s in samples) if v is not None]
    counts = [v for v in (_int_label(s, count_label) for s in samples) if v is not None]
    return (max(sizes) if sizes else None), (sum(counts) if counts else None)


def _check_present(dialect: MetricsDialect, *values: float | None) -> None:
    if all(value is None for value in values):
        raise MetricsPageError(f"the page has no {dialect} waiting, running or KV-usage metrics")


def _adapters(text: str) -> frozenset[str]:
    return frozenset(name for name in (part.strip() for part in text.split(",")) if name)


VLLM_WAITING = "vllm:num_requests_waiting"
VLLM_RUNNING = "vllm:num_requests_running"
VLLM_KV_USAGE = "vllm:kv_cache_usage_perc"
VLLM_KV_USAGE_LEGACY = "vllm:gpu_cache_usage_perc"
VLLM_LORA_INFO = "vllm:lora_requests_info"
VLLM_CACHE_INFO = "vllm:cache_config_info"


def _vllm(samples: Samples, updated_at: float) -> EndpointMetrics:
    waiting = _total(_finite(samples[VLLM_WAITING]))
    running = _total(_finite(samples[VLLM_RUNNING]))
    kv = _mean(_finite(samples[VLLM_KV_USAGE]))
    if kv is None:
        kv = _mean(_finite(samples[VLLM_KV_USAGE_LEGACY]))
    _check_present(MetricsDialect.VLLM, waiting, running, kv)
    active: frozenset[str] = frozenset()
    queued: frozenset[str] = frozenset()
    max_loras = 0
    lora_series = samples[VLLM_LORA_INFO]
    if lora_series:
        # max() keeps the first of equal values; reversed() makes the last on the page win ties.
        newest = max(reversed(lora_series), key=lambda s: s.value if math.isfinite(s.value) else -math.inf)
        active = _adapters(newest.labels.get("running_lora_adapters", ""))
        queued = _adapters(newest.labels.get("waiting_lora_adapters", ""))
        max_loras = _int_label(newest, "max_lora") or 0
    block_size, num_blocks = _cache_info(samples[VLLM_CACHE_INFO], "block_size", "num_gpu_blocks")
    served = frozenset(
        name
        for family in (VLLM_WAITING, VLLM_RUNNING)
        for sample in samples[family]
        if (name := sample.labels.get("model_name"))
    )
    return EndpointMetrics(
        waiting=_count(waiting),
        running=_count(running),
        kv_cache_usage=_fraction(kv),
        active_loras=active,
        waiting_loras=queued,
        max_loras=max_loras,
        block_size=block_size,
        num_gpu_blocks=num_blocks,
        updated_at=updated_at,
        served_models=served,
    )


SGLANG_WAITING = "sglang:num_queue_reqs"
SGLANG_RUNNING = "sglang:num_running_reqs"
SGLANG_KV_USAGE = "sglang:token_usage"
SGLANG_CACHE_INFO = "sglang:cache_config_info"


def _sglang(samples: Samples, updated_at: float) -> EndpointMetrics:
    waiting = _total(_finite(samples[SGLANG_WAITING]))
    running = _total(_finite(samples[SGLANG_RUNNING]))
    kv = _mean(_finite(samples[SGLANG_KV_USAGE]))
    _check_present(MetricsDialect.SGLANG, waiting, running, kv)
    block_size, num_blocks = _cache_info(samples[SGLANG_CACHE_INFO], "page_size", "num_pages")
    return EndpointMetrics(
        waiting=_count(waiting),
        running=_count(running),
        kv_cache_usage=_fraction(kv),
        block_size=block_size,
        num_gpu_blocks=num_blocks,
        updated_at=updated_at,
    )


TRTLLM_WAITING = "trtllm_num_requests_waiting"
TRTLLM_RUNNING = "trtllm_num_requests_running"
TRTLLM_KV_USAGE = "trtllm_kv_cache_utilization"
TRTLLM_TOKENS_PER_BLOCK = "trtllm_kv_cache_tokens_per_block"
TRTLLM_MAX_BLOCKS = "trtllm_kv_cache_max_blocks"


def _trtllm(samples: Samples, updated_at: float) -> EndpointMetrics:
    waiting = _total(_finite(samples[TRTLLM_WAITING]))
    running = _total(_finite(samples[TRTLLM_RUNNING]))
    kv = _mean(_finite(samples[TRTLLM_KV_USAGE]))
    _check_present(MetricsDialect.TRTLLM, waiting, running, kv)
    sizes = _finite(samples[TRTLLM_TOKENS_PER_BLOCK])
    return EndpointMetrics(
        waiting=_count(waiting),
        running=_count(running),
        kv_cache_usage=_fraction(kv),
        block_size=_positive_int(max(sizes) if sizes else None),
        num_gpu_blocks=_positive_int(_total(_finite(samples[TRTLLM_MAX_BLOCKS]))),
        updated_at=updated_at,
    )


TRITON_REQUESTS = "nv_trt_llm_request_metrics"
TRITON_KV_BLOCKS = "nv_trt_llm_kv_cache_block_metrics"


def _triton(samples: Samples, updated_at: float) -> EndpointMetrics:
    requests = samples[TRITON_REQUESTS]
    blocks = samples[TRITON_KV_BLOCKS]
    waiting = _total(_finite(requests, {"request_type": "waiting"}))
    running = _total(_finite(requests, {"request_type": "scheduled"}))
    kv = _mean(_finite(blocks, {"kv_cache_block_type": "fraction"}))
    _check_present(MetricsDialect.TRITON, waiting, running, kv)
    sizes = _finite(blocks, {"kv_cache_block_type": "tokens_per"})
    return EndpointMetrics(
        waiting=_count(waiting),
        running=_count(running),
        kv_cache_usage=_fraction(kv),
        block_size=_positive_int(max(sizes) if sizes else None),
        num_gpu_blocks=_positive_int(_total(_finite(blocks, {"kv_cache_block_type": "max"}))),
        updated_at=updated_at,
    )


JETSTREAM_PREFILL_BACKLOG = "jetstream_prefill_backlog_size"
JETSTREAM_TRANSFER_BACKLOG = "jetstream_transfer_backlog_size"
JETSTREAM_GENERATE_BACKLOG = "jetstream_generate_backlog_size"
JETSTREAM_SLOTS_USED = "jetstream_slots_used_percentage"
JETSTREAM_WAITING = "num_requests_waiting"
JETSTREAM_KV_USAGE = "kv_cache_utilization_perc"
JETSTREAM_LORA_INFO = "lora_request_info"


def _jetstream(samples: Samples, updated_at: float) -> EndpointMetrics:
    """JetStream (TPU): a request waits in the prefill backlog, then (prefilled) in the transfer and
    generate backlogs until a decode slot frees: all three are its queue. Its KV cache is allocated
    per decode slot, so the slots in use (``jetstream_slots_used_percentage``, a fraction per
    generate engine ``idx``, despite its name) are its KV usage, as the Inference Extension reads
    it. It reports no running count. Newer releases add ``num_requests_waiting`` and
    ``kv_cache_utilization_perc`` (read when the older families are absent) and
    ``lora_request_info`` (vLLM's shape, no waiting adapters)."""
    backlog = _finite(samples[JETSTREAM_PREFILL_BACKLOG])
    if backlog:
        backlog += _finite(samples[JETSTREAM_TRANSFER_BACKLOG]) + _finite(samples[JETSTREAM_GENERATE_BACKLOG])
    waiting = _total(backlog) if backlog else _total(_finite(samples[JETSTREAM_WAITING]))
    kv = _mean(_finite(samples[JETSTREAM_SLOTS_USED]))
    if kv is None:
        kv = _mean(_finite(samples[JETSTREAM_KV_USAGE]))
    _check_present(MetricsDialect.JETSTREAM, waiting, kv)
    active: frozenset[str] = frozenset()
    max_loras = 0
    lora_series = samples[JETSTREAM_LORA_INFO]
    if lora_series:
        newest = max(reversed(lora_series), key=lambda s: s.value if math.isfinite(s.value) else -math.inf)
        active = _adapters(newest.labels.get("running_lora_adapters", ""))
        max_loras = _int_label(newest, "max_lora") or 0
    return EndpointMetrics(
        waiting=_count(waiting),
        kv_cache_usage=_fraction(kv),
        active_loras=active,
        max_loras=max_loras,
        updated_at=updated_at,
        running_reported=False,
    )


DIALECTS: Mapping[MetricsDialect, DialectSpec] = MappingProxyType(
    {
        MetricsDialect.VLLM: DialectSpec(
            MetricsDialect.VLLM,
            "/metrics",
            SampleReader(
                {
                    VLLM_WAITING,
                    VLLM_RUNNING,
                    VLLM_KV_USAGE,
                    VLLM_KV_USAGE_LEGACY,
                    VLLM_LORA_INFO,
                    VLLM_CACHE_INFO,
                }
            ),
            _vllm,
        ),
        MetricsDialect.SGLANG: DialectSpec(
            MetricsDialect.SGLANG,
            "/metrics",
            SampleReader({SGLANG_WAITING, SGLANG_RUNNING, SGLANG_KV_USAGE, SGLANG_CACHE_INFO}),
            _sglang,
        ),
        MetricsDialect.TRTLLM: DialectSpec(
            MetricsDialect.TRTLLM,
            "/prometheus/metrics",
            SampleReader(
                {TRTLLM_WAITING, TRTLLM_RUNNING, TRTLLM_KV_USAGE, TRTLLM_TOKENS_PER_BLOCK, TRTLLM_MAX_BLOCKS}
            ),
            _trtllm,
        ),
        MetricsDialect.TRITON: DialectSpec(
            MetricsDialect.TRITON,
            "/metrics",
            SampleReader({TRITON_REQUESTS, TRITON_KV_BLOCKS}),
            _triton,
        ),
        # JetStream serves its metrics on their own port (``prometheus_port``: give the pool's
        # metrics port) at any path (prometheus_client's server).
        MetricsDialect.JETSTREAM: DialectSpec(
            MetricsDialect.JETSTREAM,
            "/metrics",
            SampleReader({JETSTREAM_PREFILL_BACKLOG, JETSTREAM_TRANSFER_BACKLOG, JETSTREAM_GENERATE_BACKLOG,
                          JETSTREAM_SLOTS_USED, JETSTREAM_WAITING, JETSTREAM_KV_USAGE, JETSTREAM_LORA_INFO}),
            _jetstream,
        ),
    }
)
