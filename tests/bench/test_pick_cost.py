"""``bench.pick_cost``: one sample per request, for ordinary and disaggregated profiles."""

from __future__ import annotations

import random

import pytest

from kvgate.bench import pick_cost


@pytest.mark.parametrize("profile", ["default", "pd"])
def test_one_positive_sample_per_request_under_churn(profile: str) -> None:
    samples = pick_cost.measure(profile, 8, 30, churn=True)
    assert len(samples) == 30
    assert all(sample > 0 for sample in samples)


def test_a_disaggregated_fleet_is_half_prefill_and_half_decode() -> None:
    views = pick_cost.fleet(6, random.Random(1), 1000.0, roles=True)
    assert [v.endpoint.role.value for v in views] == ["prefill"] * 3 + ["decode"] * 3
