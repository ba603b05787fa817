"""The overload benchmark's traffic and its accounting (``bench/overload.py`` runs it).

Streams: three tenants at one priority (``heavy`` sending 8 times what ``light-a`` and ``light-b``
each send: together ``load`` × the pool's capacity) and a sheddable band (objective ``batch``,
priority -1, ``sheddable`` × capacity on top), open-loop Poisson, each request a unique prompt (no
prefix sharing: every request costs the same prefill) and an output length drawn uniformly around
the mean, streamed back.

Served GPU work is counted as flow control estimates it (``policies.flow_control.work_seconds``)
from each response's usage. Each tenant's fair share of the work the pool served them is the
max-min share of it against what each offered (light tenants offering less than an equal share
get all they offered; the heavy tenant the rest).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kvgate.bench.loadgen import RequestResult
from kvgate.bench.workloads import PlannedRequest, text_of
from kvgate.policies.flow_control import WorkCosts, work_seconds

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
TENANT_HEADER = "x-gateway-inference-fairness-id"
OBJECTIVE_HEADER = "x-gateway-inference-objective"
COSTS = WorkCosts()


@dataclass(frozen=True, slots=True)
class Stream:
    name: str
    share: float
    """Of the pool's capacity (requests/s)."""
    sheddable: bool = False


def streams(load: float, sheddable: float) -> tuple[Stream, ...]:
    """heavy : light-a : light-b = 8 : 1 : 1 at ``load`` × capacity, and the sheddable band."""
    unit = load / 10
    out = [Stream("heavy", 8 * unit), Stream("light-a", unit), Stream("light-b", unit)]
    if sheddable > 0:
        out.append(Stream("batch", sheddable, sheddable=True))
    return tuple(out)


def plan(streams_: Sequence[Stream], capacity: float, duration_s: float, prompt_tokens: int,
         output_tokens: int, seed: int) -> tuple[list[PlannedRequest], dict[int, str]]:
    """Requests in real seconds, and each request's stream."""
    rng = random.Random(seed)
    timed: list[tuple[float, str, bool]] = []
    for stream in streams_:
        rate = stream.share * capacity
        t = rng.expovariate(rate)
        while t < duration_s:
            timed.append((t, stream.name, stream.sheddable))
            t += rng.expovariate(rate)
    timed.sort()
    requests: list[PlannedRequest] = []
    owner: dict[int, str] = {}
    for index, (at, name, sheddable) in enumerate(timed):
        # output lengths vary (uniform, the mean output_tokens): with equal lengths the replicas'
        # slots free in synchronised waves and nothing frees between them
        output = rng.randint(max(1, output_tokens // 4), output_tokens * 7 // 4)
        body = json.dumps({"model": MODEL, "prompt": text_of(rng, prompt_tokens), "max_tokens": output,
                           "stream": True, "stream_options": {"include_usage": True}}).encode()
        headers = ((OBJECTIVE_HEADER, "batch"),) if sheddable else ((TENANT_HEADER, name),)
        requests.append(PlannedRequest(index, at, "/v1/completions", body, MODEL, prompt_tokens,
                                       output, headers))
        owner[index] = name
    return requests, owner


def served_work(result: RequestResult, prompt_tokens: int) -> float:
    """The GPU seconds a successful request cost, from its usage."""
    return work_seconds(prompt_tokens * 4, result.cached_tokens, result.completion_tokens, COSTS)


def max_min_shares(capacity: float, demands: Mapping[str, float]) -> dict[str, float]:
    """Water-filling: each gets min(demand, an equal share of what is left)."""
    shares: dict[str, float] = {}
    left = capacity
    pending = sorted(demands, key=demands.__getitem__)
    while pending:
        equal = left / len(pending)
        name = pending[0]
        if demands[name] <= equal:
            shares[name] = demands[name]
            left -= demands[name]
            pending.pop(0)
        else:
            for rest in pending:
                shares[rest] = equal
            break
    return shares


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(v for v in values if not math.isnan(v))
    if not ordered:
        return math.nan
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class StreamStats:
    sent: int = 0
    ok: int = 0
    shed_429: int = 0
    timeout_503: int = 0
    other_failures: int = 0
    early_failures: int = 0
    """Failures other than a 429 or a 503 after the queue timeout (what must not happen at priority >= 0)."""
    ttft_s: list[float] | None = None
    offered_work: float = 0.0
    served_work: float = 0.0


def account(results: Sequence[RequestResult], requests: Sequence[PlannedRequest], owner: Mapping[int, str],
            window: tuple[float, float], queue_timeout_s: float) -> dict[str, StreamStats]:
    """Per stream, over the requests sent within ``window`` (real seconds from the start)."""
    by_index = {r.index: r for r in requests}
    stats: dict[str, StreamStats] = {}
    for result in results:
        request = by_index[result.index]
        if not window[0] <= request.at_s < window[1]:
            continue
        s = stats.setdefault(owner[result.index], StreamStats(ttft_s=[]))
        s.sent += 1
        s.offered_work += work_seconds(request.prompt_tokens * 4, 0, request.output_tokens, COSTS)
        if result.ok:
            s.ok += 1
            s.served_work += served_work(result, request.prompt_tokens)
            assert s.ttft_s is not None
            s.ttft_s.append(result.ttft_s)
        elif result.status == 429:
            s.shed_429 += 1
        elif result.status == 503 and "queue_timeout" in result.error:
            s.timeout_503 += 1
            if result.e2e_s < queue_timeout_s * 0.95:
                s.early_failures += 1
        else:
            s.other_failures += 1
            s.early_failures += 1
    return stats
