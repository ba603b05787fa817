"""Pick cost per request: µs per ``ProfileScheduler.schedule()`` call, prefix hashing included.

``python -m bench.pick_cost [--requests N] [--endpoints 8,64,512] [--profiles default,gie-default]``

Setup per (profile, fleet size): endpoints with varied scraped metrics (fresh), then a warm-up of
prior traffic so the prefix index holds every group on a few endpoints. Each measured request
carries an 8k-token prompt (32,768 chars): one of 32 shared 20,000-char system prompts followed by
a unique question, so all 256 hashed blocks match somewhere (the longest index walk). Only
``schedule()`` is timed; ``on_picked``/``on_finished`` run untimed between calls to keep the
state realistic. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Sequence

from policies.profile import load_profile
from policies.scheduler import ProfileScheduler
from policies.types import Endpoint, EndpointMetrics, EndpointView, InferenceRequest

PROMPT_CHARS = 32_768
SYSTEM_CHARS = 20_000
GROUPS = 32


def fleet(n: int, rng: random.Random, now: float) -> list[EndpointView]:
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
        views.append(EndpointView(Endpoint(f"10.0.{i // 250}.{i % 250}:8000", "bench"), metrics))
    return views


def prompts(rng: random.Random) -> list[str]:
    alphabet = "abcdefghijklmnopqrstuvwxyz     "
    return ["".join(rng.choices(alphabet, k=SYSTEM_CHARS)) for _ in range(GROUPS)]


def request(i: int, system: str, rng: random.Random) -> InferenceRequest:
    question = f"question {i} " + "".join(rng.choices("abcdefghij ", k=PROMPT_CHARS))
    prompt = (system + question)[:PROMPT_CHARS]
    return InferenceRequest(request_id=f"r{i}", pool="bench", model="m", target_model="m", prompt=prompt)


def measure(profile_name: str, n_endpoints: int, n_requests: int, seed: int = 7) -> tuple[float, float]:
    rng = random.Random(seed)
    now = 1000.0
    views = fleet(n_endpoints, rng, now)
    systems = prompts(rng)
    scheduler = ProfileScheduler(load_profile(profile_name), rng=random.Random(seed))
    warm = [request(i, systems[i % GROUPS], rng) for i in range(4 * GROUPS)]
    for req in warm:
        pick = scheduler.schedule(req, views, now).pick
        scheduler.on_picked(req, pick, now)
        scheduler.on_finished(req, pick, ok=True, now=now)
    reqs = [request(10_000 + i, systems[rng.randrange(GROUPS)], rng) for i in range(n_requests)]
    samples: list[float] = []
    in_flight: list[tuple[InferenceRequest, Endpoint]] = []
    for req in reqs:
        start = time.perf_counter_ns()
        result = scheduler.schedule(req, views, now)
        samples.append((time.perf_counter_ns() - start) / 1000.0)
        scheduler.on_picked(req, result.pick, now)
        in_flight.append((req, result.pick))
        if len(in_flight) > 4 * n_endpoints:
            done, pick = in_flight.pop(0)
            scheduler.on_finished(done, pick, ok=True, now=now)
    return statistics.median(samples), percentile(samples, 0.99)


def percentile(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--endpoints", default="8,64,512")
    parser.add_argument("--profiles", default="default,gie-default")
    args = parser.parse_args()
    print(f"| profile | endpoints | median µs | p99 µs |  ({args.requests} requests, 8k-token prompts)")
    print("|---|---|---|---|")
    for profile in args.profiles.split(","):
        for n in (int(x) for x in args.endpoints.split(",")):
            median, p99 = measure(profile, n, args.requests)
            print(f"| {profile} | {n} | {median:.1f} | {p99:.1f} |", flush=True)


if __name__ == "__main__":
    main()
