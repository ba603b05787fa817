"""What reading one model-server ``/metrics`` page costs: prometheus_client's parser vs kvgate's.

``python -m kvgate.bench.metrics_parse [--repeat N] [--repeat-reference N] [--engines 1,4,8]``

Both contenders turn the same page into the same :class:`EndpointMetrics` with the same vLLM
dialect logic; only the parser differs:

- ``prometheus_client``: ``prometheus_client.parser.text_string_to_metric_families`` over the whole
  page, keeping the samples of the wanted names;
- ``selective``: ``gateway.picker.scrape.exposition.read_samples``, which finds the wanted names with
  one regular-expression scan and parses only their lines;
- ``selective + memo``: the same with a ``LineMemo``, as the scraper reads (a line read on an earlier
  page is not parsed again): over the same page again (an idle endpoint: every line known), and
  over pages whose load gauges (waiting, running, KV usage) change on every read (a busy endpoint:
  those lines are new each time, the label-heavy info lines repeat).

Pages: the vLLM 0.11 fixture (one engine, ``tests/gateway/picker/fixtures/vllm_0_11.prom``) and the same
page rendered for 4 and 8 data-parallel engines. The UTF-8 decode of the body (both need it) is
timed apart. Prints a Markdown table of per-page µs (min, median and p99 over ``--repeat`` runs;
prometheus_client, ~100× slower, over ``--repeat-reference`` runs).
"""

from __future__ import annotations

import argparse
import gc
import re
import statistics
import time
from collections.abc import Callable, Sequence
from functools import partial

from prometheus_client.parser import text_string_to_metric_families

from kvgate.bench.metrics_pages import vllm_page
from kvgate.gateway.picker.scrape.dialects import DIALECTS, MetricsDialect, parse_metrics
from kvgate.gateway.picker.scrape.exposition import LineMemo, Sample
from kvgate.policies.types import EndpointMetrics

SPEC = DIALECTS[MetricsDialect.VLLM]


def with_prometheus_client(page: str) -> EndpointMetrics:
    wanted: dict[str, list[Sample]] = {name: [] for name in SPEC.families}
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            found = wanted.get(sample.name)
            if found is not None:
                found.append(Sample(sample.name, sample.labels, float(sample.value)))
    return SPEC.build(wanted, 0.0)


def selective(page: str) -> EndpointMetrics:
    return parse_metrics(page, MetricsDialect.VLLM, 0.0)


_LOAD_GAUGES = re.compile(
    r"^((?:vllm:num_requests_waiting|vllm:num_requests_running|vllm:kv_cache_usage_perc)"
    r"(?:\{[^\n]*\})?) [^\n]*$",
    re.M,
)


def busy_pages(page: str) -> Callable[[int], str]:
    """Page ``i``: ``page`` with its load gauges' values set to ``i`` (new lines on every read)."""
    template = _LOAD_GAUGES.sub(lambda m: m.group(1) + " \x00", page)
    if "\x00" not in template:
        raise ValueError("the page has no load gauge")
    return lambda i: template.replace("\x00", str(i))


def timings_busy_us(pages: Callable[[int], str], repeat: int) -> list[float]:
    """Each read through one memo, of a page whose load gauges changed since the last (built untimed)."""
    memo = LineMemo()
    out = []
    gc.disable()
    try:
        for i in range(min(50, repeat) + repeat):
            text = pages(i)
            start = time.perf_counter_ns()
            parse_metrics(text, MetricsDialect.VLLM, 0.0, memo)
            out.append((time.perf_counter_ns() - start) / 1000)
    finally:
        gc.enable()
    return out[min(50, repeat):]


def timings_us(run: Callable[[], object], repeat: int) -> list[float]:
    for _ in range(min(50, repeat)):  # warm-up
        run()
    out = []
    gc.disable()
    try:
        for _ in range(repeat):
            start = time.perf_counter_ns()
            run()
            out.append((time.perf_counter_ns() - start) / 1000)
    finally:
        gc.enable()
    return out


def p99(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeat", type=int, default=2000)
    parser.add_argument("--repeat-reference", type=int, default=40)
    parser.add_argument("--engines", default="1,4,8", help="data-parallel engines per page")
    args = parser.parse_args(argv)
    print("| page | bytes | lines | contender | min µs | median µs | p99 µs | speed-up (median) |")
    print("|---|---:|---:|---|---:|---:|---:|---:|")
    for engines in (int(n) for n in args.engines.split(",")):
        page = vllm_page(engines)
        body = page.encode()
        reference = with_prometheus_client(page)
        assert selective(page) == reference, "the two parsers disagree"
        label = f"vLLM 0.11, {engines} engine{'s' if engines > 1 else ''}"
        lines = page.count("\n")
        rows = [
            ("prometheus_client", timings_us(partial(with_prometheus_client, page), args.repeat_reference)),
            ("selective (kvgate)", timings_us(partial(selective, page), args.repeat)),
            ("selective + memo, same page", timings_us(
                partial(parse_metrics, page, MetricsDialect.VLLM, 0.0, LineMemo()), args.repeat)),
            ("selective + memo, load gauges changed", timings_busy_us(busy_pages(page), args.repeat)),
            ("utf-8 decode only", timings_us(partial(body.decode, "utf-8", "replace"), args.repeat)),
        ]
        base = statistics.median(rows[0][1])
        for name, values in rows:
            median = statistics.median(values)
            speedup = f"{base / median:.0f}×" if name != "utf-8 decode only" else ""
            figures = f"{min(values):,.1f} | {median:,.1f} | {p99(values):,.1f}"
            print(f"| {label} | {len(body):,} | {lines:,} | {name} | {figures} | {speedup} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
