"""Realtime sessions spread over a pool by their recent picks (sans-IO: times given)."""

from __future__ import annotations

from kvgate.extproc.session_spread import RecentSessions
from kvgate.policies.types import Endpoint, EndpointView

VIEWS = [EndpointView(Endpoint(f"10.0.0.{i}:8000", "p")) for i in range(1, 4)]


def addresses(views: object) -> list[str]:
    return [view.address for view in views]  # type: ignore[attr-defined]


def test_the_endpoints_that_took_the_fewest_sessions_lately_are_kept() -> None:
    recent = RecentSessions(window_s=60.0)
    assert recent.fewest("p", VIEWS, 0.0) == VIEWS  # (none taken: all)
    recent.picked("p", "10.0.0.1:8000", 1.0)
    recent.picked("p", "10.0.0.2:8000", 2.0)
    assert addresses(recent.fewest("p", VIEWS, 3.0)) == ["10.0.0.3:8000"]
    recent.picked("p", "10.0.0.3:8000", 3.0)
    recent.picked("p", "10.0.0.3:8000", 4.0)
    assert addresses(recent.fewest("p", VIEWS, 5.0)) == ["10.0.0.1:8000", "10.0.0.2:8000"]
    assert recent.fewest("other", VIEWS, 5.0) == VIEWS  # (per pool)


def test_picks_older_than_the_window_no_longer_count_and_memory_is_bounded() -> None:
    recent = RecentSessions(window_s=10.0, max_tracked=3)
    recent.picked("p", "10.0.0.1:8000", 0.0)
    recent.picked("p", "10.0.0.1:8000", 5.0)
    assert addresses(recent.fewest("p", VIEWS, 9.0)) == ["10.0.0.2:8000", "10.0.0.3:8000"]
    assert recent.fewest("p", VIEWS, 16.0) == VIEWS  # (both picks out of the window)
    for t in range(10):
        recent.picked("p", "10.0.0.2:8000", 20.0 + t * 0.1)
    recent.picked("p", "10.0.0.3:8000", 21.0)
    assert addresses(recent.fewest("p", VIEWS, 21.0)) == ["10.0.0.1:8000"]  # (at most 3 remembered)
