"""bench/overload_plan.py: the tenants' traffic, max-min fair shares and the accounting of a run."""

from __future__ import annotations

import json
import math

import pytest

from kvgate.bench.loadgen import RequestResult
from kvgate.bench.overload_plan import (
    OBJECTIVE_HEADER,
    TENANT_HEADER,
    account,
    max_min_shares,
    plan,
    streams,
)


def test_the_heavy_tenant_sends_eight_times_each_light_one_and_the_sheddable_band_is_on_top() -> None:
    shares = {s.name: s.share for s in streams(2.0, 0.2)}
    assert shares == pytest.approx({"heavy": 1.6, "light-a": 0.2, "light-b": 0.2, "batch": 0.2})
    requests, owner = plan(streams(2.0, 0.2), 10.0, 100.0, 32, 64, seed=3)
    counts = {name: sum(1 for o in owner.values() if o == name) for name in shares}
    assert counts["heavy"] == pytest.approx(1600, rel=0.1)
    assert counts["light-a"] == pytest.approx(200, rel=0.2)
    assert [r.at_s for r in requests] == sorted(r.at_s for r in requests)
    heavy = next(r for r in requests if owner[r.index] == "heavy")
    batch = next(r for r in requests if owner[r.index] == "batch")
    assert heavy.headers == ((TENANT_HEADER, "heavy"),)
    assert batch.headers == ((OBJECTIVE_HEADER, "batch"),)
    outputs = [json.loads(r.body)["max_tokens"] for r in requests]
    assert min(outputs) >= 16
    assert max(outputs) <= 112
    assert sum(outputs) / len(outputs) == pytest.approx(64, rel=0.05)


def test_max_min_shares_give_the_light_ones_what_they_ask_and_the_heavy_one_the_rest() -> None:
    assert max_min_shares(10.0, {"heavy": 16.0, "a": 2.0, "b": 2.0}) == {"a": 2.0, "b": 2.0, "heavy": 6.0}
    assert max_min_shares(9.0, {"x": 10.0, "y": 10.0, "z": 10.0}) == pytest.approx({"x": 3, "y": 3, "z": 3})
    assert max_min_shares(10.0, {"a": 1.0}) == {"a": 1.0}


def result(index: int, status: int = 200, error: str = "", e2e: float = 1.0) -> RequestResult:
    return RequestResult(index, status, error, 0.0, 0.1 if status == 200 else math.nan, e2e, 64, 0)


def test_accounting_counts_sheds_timeouts_and_failures_before_the_timeout() -> None:
    requests, owner = plan(streams(2.0, 0.0), 10.0, 3.0, 32, 64, seed=1)
    heavy = [r.index for r in requests if owner[r.index] == "heavy"][:4]
    results = [result(heavy[0]), result(heavy[1], 429, "request_shed"),
               result(heavy[2], 503, '{"code":"queue_timeout"}', e2e=20.5),
               result(heavy[3], 503, '{"code":"queue_timeout"}', e2e=2.0)]
    stats = account(results, requests, owner, (0.0, 3.0), queue_timeout_s=20.0)["heavy"]
    assert (stats.sent, stats.ok, stats.shed_429, stats.timeout_503, stats.early_failures) == (4, 1, 1, 2, 1)
    assert stats.served_work > 0
    assert stats.offered_work > stats.served_work
