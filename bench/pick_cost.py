"""Pick cost per request: µs per ``schedule()`` call, prefix hashing included.

``python -m kvgate.bench.pick_cost [--requests N] [--endpoints 8,64,512] [--profiles default,gie-default]
[--churn] [--timer] [--hint all|half]``

Setup per (profile, fleet size): endpoints with varied scraped metrics (fresh), handed to the
scheduler as one tuple like ``EndpointSnapshot.endpoints`` returns (a disaggregated profile, e.g.
``pd``: half of them prefill, half decode, and the time is the decode pick plus, for the prompts
the decider splits, the prefill pick), then a warm-up of prior traffic
so the prefix index holds every group on a few endpoints. Each measured request carries an 8k-token
prompt (32,768 chars): one of 32 shared 20,000-char system prompts followed by a unique question,
so all hashed blocks of the system prompt match somewhere. Only ``schedule()`` is timed;
``on_picked``/``on_finished`` run untimed between calls (up to 4 × endpoints requests in flight).

``--churn``: before every request one endpoint's view is replaced by a new object and the tuple is
rebuilt, as the scraper publishes after each endpoint's scrape (64 endpoints every 50 ms is ~1,300
new tuples a second), so per-snapshot memos hit only for the views that did not change.
``--hint all|half``: each measured request carries a subset hint (the data plane's
``x-gateway-destination-endpoint-subset``) naming every endpoint or every second one by ``ip:port``,
a new set per request as the picker's codec builds one (built untimed).
``--timer``: per-plugin timing into a prometheus_client histogram, as the picker process runs it.
Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import statistics
import time
from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Histogram

from kvgate.policies.contracts import Scheduler
from kvgate.policies.disaggregation import DisaggregatedProfile, load_scheduling
from kvgate.policies.flow_control import FlowControlSettings, endpoint_has_room
from kvgate.policies.framework import PluginTimer
from kvgate.policies.outliers import OutlierSettings
from kvgate.policies.pd_scheduler import DisaggregatedScheduler
from kvgate.policies.pool_views import PoolViews
from kvgate.policies.scheduler import ProfileScheduler
from kvgate.policies.types import Endpoint, EndpointMetrics, EndpointView, InferenceRequest, Role

PROMPT_CHARS = 32_768
SYSTEM_CHARS = 20_000
GROUPS = 32


def fleet(n: int, rng: random.Random, now: float, *, roles: bool = False) -> PoolViews:
    """``n`` endpoints; with ``roles``, the first half prefill and the rest decode (P/D profiles)."""
    views = []
    for i in range(n):
        metrics = EndpointMetrics(
            waiting=rng.randint(0, 3),
            running=rng.randint(0, 40),
            kv_cache_usage=rng.uniform(0.1, 0.7),
            num_gpu_blocks=30_000,
            block_size=16,
            updated_at=now - 0.01,
        )
        role = (Role.PREFILL if i < n // 2 else Role.DECODE) if roles else Role.BOTH
        views.append(EndpointView(Endpoint(f"10.0.{i // 250}.{i % 250}:8000", "bench", role=role), metrics))
    return PoolViews.after(None, views, None)


def rescraped(views: PoolViews, i: int) -> PoolViews:
    """The tuple the scraper publishes after scraping endpoint ``i`` again (same values, new objects),
    naming it as the scraper does (``policies.pool_views``)."""
    old = views[i]
    m = old.metrics
    assert m is not None
    metrics = EndpointMetrics(
        m.waiting, m.running, m.kv_cache_usage, block_size=16, num_gpu_blocks=30_000, updated_at=m.updated_at
    )
    replaced = (*views[:i], EndpointView(old.endpoint, metrics), *views[i + 1 :])
    return PoolViews.after(views, replaced, {old.address})


class Requests:
    """8k-token prompts: a shared system prompt of one of ``GROUPS`` groups + a unique question."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        alphabet = "abcdefghijklmnopqrstuvwxyz     "
        self.systems = ["".join(rng.choices(alphabet, k=SYSTEM_CHARS)) for _ in range(GROUPS)]
        self.questions = "".join(rng.choices("abcdefghij ", k=2 * PROMPT_CHARS))

    def make(self, i: int, group: int) -> InferenceRequest:
        start = self.rng.randrange(PROMPT_CHARS)
        question = f"question {i} " + self.questions[start : start + PROMPT_CHARS]
        prompt = (self.systems[group] + question)[:PROMPT_CHARS]
        return InferenceRequest(request_id=f"r{i}", pool="bench", model="m", target_model="m", prompt=prompt)


class HistogramTimer:
    """The picker's per-plugin histogram (``inference_extension_plugin_duration_seconds``)."""

    def __init__(self) -> None:
        self._h = Histogram(
            "plugin_duration_seconds",
            "bench",
            ["extension_point", "plugin_type", "plugin_name"],
            registry=CollectorRegistry(),
        )

    def observe(self, extension_point: str, plugin_type: str, plugin_name: str, seconds: float) -> None:
        self._h.labels(extension_point, plugin_type, plugin_name).observe(seconds)


def measure(
    profile: str,
    n_endpoints: int,
    n_requests: int,
    *,
    churn: bool = False,
    timed: bool = False,
    seed: int = 7,
    ejected: int = 0,
    room: str = "",
    hint: str = "",
) -> list[float]:
    """µs per ``schedule()`` call, one sample per request; ``ejected`` endpoints failed enough
    requests before the measured ones to be left out of picking (outlier ejection) meanwhile.
    ``room``: a flow-controlled pool's check for endpoints with room (``policies.flow_control``,
    default settings), timed with the pick: ``prefilter`` over the pool before it (as the picker
    did before session 26), ``keep`` as the scheduler's ``keep`` (after the profile's filters)."""
    rng = random.Random(seed)
    now = 1000.0
    loaded = load_scheduling(profile)
    disaggregated = isinstance(loaded, DisaggregatedProfile)
    views = fleet(n_endpoints, rng, now, roles=disaggregated)
    requests = Requests(rng)
    timer: PluginTimer | None = HistogramTimer() if timed else None
    scheduler: Scheduler
    if isinstance(loaded, DisaggregatedProfile):  # the decode pick, then (long prompts) the prefill's
        scheduler = DisaggregatedScheduler(loaded, rng=random.Random(seed), timer=timer)
    else:
        scheduler = ProfileScheduler(loaded, rng=random.Random(seed), timer=timer)
    for i in range(4 * GROUPS):
        req = requests.make(i, i % GROUPS)
        pick = scheduler.schedule(req, views, now).pick
        scheduler.on_picked(req, pick, now)
        scheduler.on_finished(req, pick, ok=True, now=now)
    for view in views[:ejected]:  # ejected for 5 s (the default), past the measured requests' span
        for _ in range(OutlierSettings().consecutive):
            scheduler.on_endpoint_outcome(view.address, ok=False, now=now)
    reqs = [requests.make(10_000 + i, rng.randrange(GROUPS)) for i in range(n_requests)]
    hinted = [v.address for v in views[:: 2 if hint == "half" else 1]] if hint else None
    clock = [now]
    flow = FlowControlSettings()

    def with_room(endpoints: Sequence[EndpointView]) -> Sequence[EndpointView]:
        inflight = scheduler.state.inflight_by_endpoint()
        kept = tuple(v for v in endpoints if endpoint_has_room(v, inflight.get(v.address), flow, clock[0]))
        return endpoints if len(kept) == len(endpoints) else kept

    samples: list[float] = []
    in_flight: list[tuple[InferenceRequest, Endpoint]] = []
    for i, req in enumerate(reqs):
        if churn:
            views = rescraped(views, i % n_endpoints)
        now += ARRIVAL_GAP_S  # arrivals at distinct times: the estimated-TTFT arrival rate is live
        clock[0] = now
        if hinted is not None:
            req = dataclasses.replace(req, subset=frozenset(hinted))
        start = time.perf_counter_ns()
        if room == "prefilter":
            result = scheduler.schedule(req, with_room(views) or views, now)
        else:
            result = scheduler.schedule(req, views, now, keep=with_room if room == "keep" else None)
        samples.append((time.perf_counter_ns() - start) / 1000.0)
        scheduler.on_picked(req, result.pick, now)
        in_flight.append((req, result.pick))
        # (a disaggregated request's prefill half is told with it, and ends with its decode here)
        if len(in_flight) > 4 * n_endpoints:
            done, pick = in_flight.pop(0)
            scheduler.on_finished(done, pick, ok=True, now=now)
    return samples


ARRIVAL_GAP_S = 1e-5
"""Between timed requests (2,000 requests span 20 ms: the views stay fresh). With every request at one
instant the arrival rate is 0 and ``delay_externality`` (default) would skip its work."""


def percentile(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--endpoints", default="8,64,512")
    parser.add_argument("--profiles", default="default,gie-default")
    parser.add_argument("--churn", action="store_true", help="a new snapshot tuple before every request")
    parser.add_argument("--timer", action="store_true", help="per-plugin timing into a histogram")
    parser.add_argument("--room", choices=["prefilter", "keep"], default="",
                        help="a flow-controlled pool's check for room, before the pick or as its keep")
    parser.add_argument("--hint", choices=["all", "half"], default="",
                        help="a subset hint on every request: every endpoint or every second one")
    parser.add_argument("--ejected", type=int, default=0,
                        help="endpoints left out of picking (outlier ejection) during the measured requests")
    args = parser.parse_args()
    mode = ", ".join(m for m, on in (("churn", args.churn), ("timer", args.timer),
                                     (f"{args.ejected} ejected", args.ejected),
                                     (f"room: {args.room}", args.room),
                                     (f"subset hint: {args.hint}", args.hint)) if on) or "static snapshot"
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"({args.requests} requests, 8k-token prompts, {mode}; load average {load})\n")
    print("| profile | endpoints | median µs | p99 µs |")
    print("|---|---|---|---|")
    for profile in args.profiles.split(","):
        for n in (int(x) for x in args.endpoints.split(",")):
            samples = measure(profile, n, args.requests, churn=args.churn, timed=args.timer,
                              ejected=args.ejected, room=args.room, hint=args.hint)
            print(
                f"| {profile} | {n} | {statistics.median(samples):.1f} | {percentile(samples, 0.99):.1f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
