"""What a flow-controlled pool's look for room costs while the pool is full.

``python -m kvgate.bench.holding_looks [--endpoints 64,1000] [--looks 2000]``

A holding area (``extproc.holding``) over ``--endpoints`` endpoints, each at its in-flight limit
(full), asked ``must_wait()`` (a look for room: nothing is held) ``--looks`` times; before each
look one endpoint is rescraped (a new snapshot naming it, as the scraper publishes one per scrape
tick) and one request of ours ends on an endpoint that still has another in flight (the lifecycle's
``kick``), so nothing ever has room. Prints µs per look, median and p99. Run it against another
checkout with ``PYTHONPATH`` to compare (the area's public calls only).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import msgspec

from kvgate.extproc.holding import HoldingArea, PoolLoad
from kvgate.extproc.ports import MonotonicClock
from kvgate.policies.flow_control import FlowControlSettings
from kvgate.policies.pool_views import PoolViews
from kvgate.policies.state import InFlight
from kvgate.policies.types import Endpoint, EndpointMetrics, EndpointView


async def measure(n: int, looks: int) -> list[float]:
    clock = MonotonicClock()
    addresses = [f"10.0.{i // 250}.{i % 250}:8000" for i in range(n)]
    fresh = clock.now() + 3600.0  # never stale during the run
    views = PoolViews.after(None, [EndpointView(Endpoint(a, "bench"), EndpointMetrics(updated_at=fresh))
                                   for a in addresses], None)
    inflight = {a: InFlight(1) for a in addresses}
    snapshot = [views]
    area = HoldingArea("bench", FlowControlSettings(max_inflight_per_endpoint=1),
                       PoolLoad(lambda: snapshot[0], lambda: inflight, lambda request, now: 0), clock)
    samples: list[float] = []
    for i in range(looks):
        old = snapshot[0]
        k = i % n
        view = msgspec.structs.replace(old[k], metrics=EndpointMetrics(updated_at=fresh))
        snapshot[0] = PoolViews.after(old, (*old[:k], view, *old[k + 1:]), {view.address})
        try:
            area.kick(addresses[(7 * i) % n])
        except TypeError:  # a checkout before session 26: its kick is told no endpoint
            area.kick()
        start = time.perf_counter_ns()
        assert area.must_wait()
        samples.append((time.perf_counter_ns() - start) / 1000.0)
    await area.stop()
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--endpoints", default="64,1000")
    parser.add_argument("--looks", type=int, default=2000)
    args = parser.parse_args()
    print("| endpoints | median µs | p99 µs |")
    print("|---|---|---|")
    for n in (int(x) for x in args.endpoints.split(",")):
        samples = sorted(asyncio.run(measure(n, args.looks)))
        p99 = samples[min(len(samples) - 1, int(0.99 * len(samples)))]
        print(f"| {n} | {statistics.median(samples):.1f} | {p99:.1f} |", flush=True)


if __name__ == "__main__":
    main()
