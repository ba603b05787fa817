"""``bench.replay``: the routing benchmark's plan through kvgate's scheduler and the simulator's
engines in virtual time (no sockets). Small plans; what is checked is the bookkeeping, and that the
replay tells routing policies apart the way the HTTP benchmark does."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvgate.bench.replay import Replay, ReplayResult, timeline
from kvgate.bench.workloads import WORKLOADS, PlannedRequest, offered_rate, run_plan

PROFILES = Path(__file__).parents[2] / "policies" / "profiles"


def replay(workload: str, profile: str, requests: int,
           fraction: float = 0.9) -> tuple[list[PlannedRequest], int, ReplayResult]:
    spec = WORKLOADS[workload].with_output_tokens(16)
    planned, warmup = run_plan(spec, offered_rate(spec, fraction), fraction, requests, 1)
    result = Replay(spec, str(PROFILES / f"{profile}.yaml"), 0.05, 1).run(
        [(r.at_s, r.body) for r in planned], warmup)
    return planned, warmup, result


def test_every_request_is_scheduled_served_and_counted_after_the_warm_up() -> None:
    planned, warmup, result = replay("shared-prefix-fit", "default", 120)
    assert [r.index for r in result.records] == list(range(len(planned)))
    assert all(r.ttft > 0 and r.prompt_tokens > 0 for r in result.records)
    assert len(result.ttfts_ms) == len(planned) - warmup > 0
    assert 0 < result.hits < result.queries
    assert result.percentile(50) <= result.percentile(90) <= result.percentile(99)
    lines = timeline(result.records, 0.25)
    assert lines
    assert sum(int(line.split(":")[1].split()[0]) for line in lines) == len(planned)


@pytest.mark.parametrize("workload", ["shared-prefix-fit", "multi-turn"])
def test_prefix_aware_default_hits_the_cache_more_than_random_routing(workload: str) -> None:
    _, _, smart = replay(workload, "default", 200)
    _, _, blind = replay(workload, "random", 200)
    assert smart.hits / smart.queries > blind.hits / blind.queries + 0.1
    assert smart.rereads < blind.rereads
