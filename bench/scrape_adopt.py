"""What adopting another picker's scrapes costs (shared scrapes): µs per batch of rows.

``python -m kvgate.bench.scrape_adopt [--endpoints 1000] [--rows 50] [--batches 3000]``

A scraper (not started: no HTTP) over ``--endpoints`` endpoints adopts ``--batches`` batches of
``--rows`` peers' views each (``MetricsScraper.adopt``, what ``SharedScrapes`` calls per received
batch), each a new snapshot. Prints the median and p99 µs per batch and per row. Run it against
another checkout with ``PYTHONPATH`` to compare (public calls only).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from kvgate.gateway.picker.scraper import MetricsScraper
from kvgate.policies.types import EndpointMetrics


def measure(endpoints: int, rows: int, batches: int) -> list[float]:
    scraper = MetricsScraper(interval=0.05, timeout=0.5, stale_after=0.2, rng=random.Random(1))
    addresses = [f"10.0.{i // 250}.{i % 250}:8000" for i in range(endpoints)]
    scraper.set_endpoints("bench", "vllm", addresses)
    samples: list[float] = []
    for k in range(batches):
        now = scraper.now()
        batch = [(addresses[(k * rows + j) % endpoints], EndpointMetrics(waiting=j % 4, updated_at=now), True)
                 for j in range(rows)]
        start = time.perf_counter_ns()
        scraper.adopt("bench", batch)
        samples.append((time.perf_counter_ns() - start) / 1000.0)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--endpoints", type=int, default=1000)
    parser.add_argument("--rows", type=int, default=50)
    parser.add_argument("--batches", type=int, default=3000)
    args = parser.parse_args()
    samples = sorted(measure(args.endpoints, args.rows, args.batches))
    median, p99 = statistics.median(samples), samples[min(len(samples) - 1, int(0.99 * len(samples)))]
    print(f"| {args.endpoints} | {args.rows} | {median:.1f} | {p99:.1f} | {median / args.rows:.2f} |")


if __name__ == "__main__":
    main()
