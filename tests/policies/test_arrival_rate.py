from __future__ import annotations

import pytest

from kvgate.policies.arrival_rate import ArrivalRate


def test_rate_over_the_window_counts_each_request_once() -> None:
    rate = ArrivalRate(window=5)
    assert rate.per_second() == 0.0
    rate.observe("a", 10.0)
    rate.observe("a", 10.5)  # the same request scored again: not a new arrival
    assert rate.per_second() == 0.0
    for i, t in enumerate((10.1, 10.2, 10.3, 10.4)):
        rate.observe(f"r{i}", t)
    assert rate.per_second() == pytest.approx(10.0)
    for i in range(5):  # the window slides: only the last 5 arrivals count
        rate.observe(f"s{i}", 20.0 + i)
    assert rate.per_second() == pytest.approx(1.0)


def test_same_instant_arrivals_give_no_rate_and_time_scale_converts_clocks() -> None:
    rate = ArrivalRate(window=3)
    rate.observe("a", 1.0)
    rate.observe("b", 1.0)
    assert rate.per_second() == 0.0
    slowed = ArrivalRate(window=3, time_scale=40.0)  # the clock runs 40x slower than the model's
    slowed.observe("a", 0.0)
    slowed.observe("b", 2.0)
    assert slowed.per_second() == pytest.approx(20.0)


@pytest.mark.parametrize(("window", "scale"), [(1, 1.0), (4, 0.0), (4, -1.0)])
def test_invalid_settings_are_rejected(window: int, scale: float) -> None:
    with pytest.raises(ValueError, match="must be"):
        ArrivalRate(window=window, time_scale=scale)
