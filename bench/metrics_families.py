"""What the fixture pages of ``bench.metrics_pages`` share: the engines' histogram buckets, the
families prometheus_client renders for every Python process (``python_``/``process_``) and the HTTP
instrumentator's, and rendering a page from metric families."""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "gateway" / "picker" / "fixtures"
"""Where the pages are written (a source checkout's test fixtures; the tests compare them with
what this module renders now)."""
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
CREATED = 1760000000.25

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
REQUEST_TIME_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
CUDAGRAPH_SIZES = (1, 2, 4, *range(8, 513, 8))
HTTP_HIGHR_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    1.5,
    2.0,
    2.5,
    3.0,
    3.5,
    4.0,
    4.5,
    5.0,
    7.5,
    10.0,
    30.0,
    60.0,
)


def one_two_five(limit: int) -> tuple[float, ...]:
    """vLLM's ``build_1_2_5_buckets``: 1, 2, 5, 10, 20, 50, ... up to ``limit``."""
    out: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > limit:
                return tuple(float(v) for v in out)
            out.append(value)
        exponent += 1


class Families:
    """Deterministic family builders (the random source only shapes the counts)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def gauge(
        self, name: str, doc: str, labels: Sequence[str], rows: Iterable[tuple[Sequence[str], float]]
    ) -> Metric:
        family = GaugeMetricFamily(name, doc, labels=list(labels))
        for values, value in rows:
            family.add_metric(list(values), value)
        return family

    def counter(
        self, name: str, doc: str, labels: Sequence[str], rows: Iterable[tuple[Sequence[str], float]]
    ) -> Metric:
        family = CounterMetricFamily(name, doc, labels=list(labels))
        for values, value in rows:
            family.add_metric(list(values), value, created=CREATED)
        return family

    def histogram(
        self,
        name: str,
        doc: str,
        labels: Sequence[str],
        label_rows: Iterable[Sequence[str]],
        bounds: Sequence[float],
        *,
        count: int,
        created: bool = True,
    ) -> Metric:
        family = HistogramMetricFamily(name, doc, labels=list(labels))
        for values in label_rows:
            cumulative = 0.0
            buckets: list[tuple[str, float]] = []
            weights = [self.rng.random() ** 3 for _ in bounds]
            total_weight = sum(weights) or 1.0
            total = 0.0
            for bound, weight in zip(bounds, weights, strict=True):
                landed = float(int(count * weight / total_weight))
                cumulative += landed
                total += landed * bound * 0.7
                buckets.append((str(float(bound)), cumulative))
            buckets.append(("+Inf", cumulative))
            family.add_metric(list(values), buckets, sum_value=round(total, 6))
            if created:
                family.add_sample(name + "_created", dict(zip(labels, values, strict=True)), CREATED)
        return family


def render(families: Iterable[Metric]) -> str:
    class _Static(Collector):
        def __init__(self, items: list[Metric]) -> None:
            self.items = items

        def collect(self) -> Iterator[Metric]:
            yield from self.items

    registry = CollectorRegistry()
    registry.register(_Static(list(families)))
    return generate_latest(registry).decode()


def python_and_process(fam: Families) -> list[Metric]:
    gens = [(str(g),) for g in range(3)]
    info = GaugeMetricFamily(
        "python_info",
        "Python platform information",
        labels=["implementation", "major", "minor", "patchlevel", "version"],
    )
    info.add_metric(["CPython", "3", "12", "11", "3.12.11"], 1.0)
    return [
        fam.counter(
            "python_gc_objects_collected",
            "Objects collected during gc",
            ["generation"],
            zip(gens, (14210.0, 3517.0, 822.0), strict=True),
        ),
        fam.counter(
            "python_gc_objects_uncollectable",
            "Uncollectable objects found during GC",
            ["generation"],
            zip(gens, (0.0, 0.0, 0.0), strict=True),
        ),
        fam.counter(
            "python_gc_collections",
            "Number of times this generation was collected",
            ["generation"],
            zip(gens, (1871.0, 170.0, 9.0), strict=True),
        ),
        info,
        fam.gauge("process_virtual_memory_bytes", "Virtual memory size in bytes.", [], [((), 1.1385e11)]),
        fam.gauge("process_resident_memory_bytes", "Resident memory size in bytes.", [], [((), 2.58e9)]),
        fam.gauge(
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
            [],
            [((), 1.76e9)],
        ),
        fam.counter(
            "process_cpu_seconds", "Total user and system CPU time spent in seconds.", [], [((), 913.27)]
        ),
        fam.gauge("process_open_fds", "Number of open file descriptors.", [], [((), 94.0)]),
        fam.gauge("process_max_fds", "Maximum number of open file descriptors.", [], [((), 1048576.0)]),
    ]


def http_families(fam: Families) -> list[Metric]:
    handlers = ("/v1/completions", "/v1/chat/completions", "/metrics", "/health", "/v1/models")
    size_req = SummaryMetricFamily(
        "http_request_size_bytes",
        "Content length of incoming requests by handler. "
        "Only value of header is respected. Otherwise ignored. No percentile "
        "calculated. ",
        labels=["handler"],
    )
    size_resp = SummaryMetricFamily(
        "http_response_size_bytes",
        "Content length of outgoing responses by handler. "
        "Only value of header is respected. Otherwise ignored. No percentile "
        "calculated. ",
        labels=["handler"],
    )
    for handler in handlers:
        size_req.add_metric([handler], count_value=11031, sum_value=4.1e8)
        size_req.add_sample("http_request_size_bytes_created", {"handler": handler}, CREATED)
        size_resp.add_metric([handler], count_value=11031, sum_value=2.7e7)
        size_resp.add_sample("http_response_size_bytes_created", {"handler": handler}, CREATED)
    return [
        fam.counter(
            "http_requests",
            "Total number of requests by method, status and handler.",
            ("handler", "method", "status"),
            [((h, "POST" if h.startswith("/v1/c") else "GET", "2xx"), 11031.0) for h in handlers],
        ),
        size_req,
        size_resp,
        fam.histogram(
            "http_request_duration_highr_seconds",
            "Latency with many buckets but no API specific "
            "labels. Made for more accurate percentile calculations. ",
            (),
            [()],
            HTTP_HIGHR_BUCKETS,
            count=55155,
        ),
        fam.histogram(
            "http_request_duration_seconds",
            "Latency with only few buckets by handler. Made to be "
            "only used if aggregation by handler is important. ",
            ("handler", "method"),
            [(h, "POST" if h.startswith("/v1/c") else "GET") for h in handlers],
            (0.1, 0.5, 1.0),
            count=11031,
        ),
    ]


