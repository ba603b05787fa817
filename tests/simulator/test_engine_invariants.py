"""Randomised workloads: whatever the pressure, limits hold and every request finishes."""

from __future__ import annotations

import random

import pytest

from kvgate.simulator.engine import FirstToken, SimRequest, TokenOut
from kvgate.simulator.virtual_time import Arrival, run_virtual
from tests.simulator.test_engine_support import make_engine, prompt


@pytest.mark.parametrize("seed", range(6))
def test_random_workload_keeps_limits_and_loses_nothing(seed: int) -> None:
    rng = random.Random(seed)
    max_seqs = rng.choice([2, 8, 64])
    budget = rng.choice([64, 512, 8192])
    blocks = rng.choice([40, 120, 1000])
    engine = make_engine(num_gpu_blocks=blocks, block_size=16, max_num_seqs=max_seqs,
                         max_num_batched_tokens=budget, served_loras=("a", "b", "c"), max_loras=2)
    shared = prompt(300, salt=seed)
    arrivals: list[Arrival] = []
    for i in range(120):
        n = rng.randint(1, 400)
        tokens = shared[: rng.randint(0, 300)] + prompt(n, salt=1000 * seed + i)
        max_tokens = rng.randint(1, 60)
        if -(-(len(tokens) + max_tokens - 1) // 16) > blocks:
            tokens = tokens[: 16 * blocks - max_tokens]
        lora = rng.choice([None, None, "a", "b", "c"])
        arrivals.append(Arrival(rng.uniform(0, 2.0), SimRequest(f"r{i}", tokens, max_tokens, lora)))
    run = run_virtual(engine, arrivals, record_metrics=True)
    assert not run.rejected
    assert sorted(run.finished) == sorted(f"r{i}" for i in range(120))
    for step in run.steps:
        plan, metrics = step.plan, step.metrics
        assert metrics is not None
        assert plan.prefill_tokens + plan.decode_tokens <= budget
        assert plan.batch_size <= max_seqs
        assert metrics.running <= max_seqs
        assert len(metrics.running_loras) <= 2
        assert 0.0 <= metrics.kv_cache_usage <= 1.0
    by_request: dict[str, list[int]] = {}
    for event in run.events:
        if isinstance(event, TokenOut):
            by_request.setdefault(event.request_id, []).append(event.index)
    for a in arrivals:
        assert by_request[a.request.request_id] == list(range(a.request.max_tokens))
        done = run.finished[a.request.request_id]
        assert done.completion_tokens == a.request.max_tokens
        assert done.cached_tokens <= len(a.request.prompt_tokens) - 1
    assert len([e for e in run.events if isinstance(e, FirstToken)]) == 120
    end = engine.metrics()
    assert (end.waiting, end.running, end.request_success_total) == (0, 0, 120)
    assert end.generation_tokens_total == sum(a.request.max_tokens for a in arrivals)
    assert end.prefix_cache_hits <= end.prefix_cache_queries
    assert engine.kv_cache.num_free == blocks
