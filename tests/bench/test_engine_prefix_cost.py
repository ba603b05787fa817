"""bench/engine_prefix_cost.py runs its measurement (a few requests; no timing asserted)."""

from __future__ import annotations

from kvgate.bench.engine_prefix_cost import TOKENIZER, run
from kvgate.policies.plugins.engine_prefix import EnginePrefixBlueprint


def test_it_times_one_prepare_per_request() -> None:
    blueprint = EnginePrefixBlueprint.from_parameters({"tokenizer": str(TOKENIZER)})
    times = run(256, 4, 2, blueprint)
    assert len(times) == 4
    assert all(t > 0 for t in times)
