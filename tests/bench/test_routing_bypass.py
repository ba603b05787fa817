"""``bench.routing.bypassing``: another router's share of a plan, drawn once per seed, the same for
every contender."""

from __future__ import annotations

from kvgate.bench.routing import bypassing
from kvgate.bench.workloads import WORKLOADS, run_plan


def test_the_same_requests_go_to_the_same_replicas_for_every_contender() -> None:
    spec = WORKLOADS["shared-prefix-exceed"]
    planned, _ = run_plan(spec, 100.0, 0.5, 400, seed=1)
    first = bypassing(planned, 0.3, 8, seed=1)
    assert first == bypassing(planned, 0.3, 8, seed=1)
    assert 0.2 * len(planned) < len(first) < 0.4 * len(planned)
    assert set(first.values()) <= set(range(8))
    assert bypassing(planned, 0.0, 8, seed=1) == {}
    assert first != bypassing(planned, 0.3, 8, seed=2)
