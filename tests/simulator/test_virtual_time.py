"""The virtual-time driver: arrivals, aborts and rejections without any clock."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from kvgate.simulator.engine import Engine, FirstToken, SimRequest, StepPlan, TokenOut
from kvgate.simulator.virtual_time import Abort, Arrival, run_fleet_virtual, run_virtual
from tests.simulator.test_engine_support import formula, make_engine, request


def test_idle_time_jumps_to_the_next_arrival() -> None:
    engine = make_engine()
    run = run_virtual(engine, [Arrival(5.0, request("late", 100, 1)), Arrival(1.0, request("early", 50, 1))])
    assert [s.start for s in run.steps] == [1.0, 5.0]
    assert run.finished["early"].time == pytest.approx(1.0 + formula(50, 0))
    assert run.end_time == run.finished["late"].time


def test_aborts_and_rejections_are_reported_not_lost() -> None:
    engine = make_engine(num_gpu_blocks=10)
    arrivals: list[Arrival | Abort] = [
        Arrival(0.0, request("kept", 20, 30)),
        Arrival(0.0, request("gone", 20, 30, salt=1)),
        Abort(0.05, "gone"),
        Arrival(0.0, SimRequest("huge", tuple(range(500)), 1)),
    ]
    run = run_virtual(engine, arrivals)
    assert sorted(run.finished) == ["kept"]
    assert "KV blocks" in run.rejected["huge"]
    gone_tokens = [e for e in run.events if isinstance(e, TokenOut) and e.request_id == "gone"]
    assert 0 < len(gone_tokens) < 30
    assert all(e.time < 0.05 for e in gone_tokens)
    assert engine.metrics().requests_aborted_total == 1


def test_on_step_sees_every_step_and_events_are_in_time_order() -> None:
    engine = make_engine()
    seen: list[tuple[float, StepPlan]] = []
    arrivals = [Arrival(0.002 * i, request(f"r{i}", 64 + i, 3, salt=i)) for i in range(20)]
    run = run_virtual(engine, arrivals, on_step=lambda t, plan, _engine: seen.append((t, plan)),
                      record_events=True)
    assert [(s.start, s.plan) for s in run.steps] == seen
    times = [e.time for e in run.events]
    assert times == sorted(times)
    assert len([e for e in run.events if isinstance(e, FirstToken)]) == 20
    assert sorted(run.finished) == sorted(f"r{i}" for i in range(20))


def test_max_steps_guard() -> None:
    with pytest.raises(RuntimeError, match="exceeded"):
        run_virtual(make_engine(), [Arrival(0.0, request("a", 10, 50))], max_steps=5)


def test_fleet_run_routes_and_matches_single_replica_runs() -> None:
    arrivals = [Arrival(0.003 * i, request(f"r{i}", 100 + 10 * i, 4, salt=i)) for i in range(12)]
    fleet = [make_engine(), make_engine()]
    run = run_fleet_virtual(fleet, arrivals, lambda req, _now, _engines: int(req.request_id[1:]) % 2)
    assert sorted(run.finished) == sorted(a.request.request_id for a in arrivals)
    assert {index for index, _ in run.finished.values()} == {0, 1}
    for replica in (0, 1):
        alone = run_virtual(make_engine(), [a for i, a in enumerate(arrivals) if i % 2 == replica])
        assert {rid: f for rid, (i, f) in run.finished.items() if i == replica} == alone.finished
        assert run.steps[replica] == len(alone.steps)


def test_fleet_router_can_use_peek_for_cache_affinity() -> None:
    shared = request("x", 512, 1).prompt_tokens
    arrivals = [Arrival(float(i), SimRequest(f"r{i}", (*shared, i), 1)) for i in range(6)]
    fleet = [make_engine(), make_engine(), make_engine()]

    def most_cached(req: SimRequest, now: float, engines: Sequence[Engine]) -> int:
        cached = [e.peek(req.prompt_tokens, req.lora, now).cached_tokens for e in engines]
        return cached.index(max(cached))

    run = run_fleet_virtual(fleet, arrivals, most_cached)
    assert {index for index, _ in run.finished.values()} == {0}
    in_order = sorted((f for _, f in run.finished.values()), key=lambda f: f.time)
    assert [f.cached_tokens for f in in_order] == [0] + [512] * 5
