"""Outlier ejection (``policies.outliers``) and its use by the scheduler."""

from __future__ import annotations

from kvgate.policies.outliers import OutlierSettings, OutlierTracker
from kvgate.policies.profile import load_profile
from kvgate.policies.scheduler import ProfileScheduler
from tests.policies.helpers import NOW, request, view

SETTINGS = OutlierSettings(consecutive=3, base_ejection_s=5.0, max_ejection_s=12.0)


def test_consecutive_failures_eject_for_a_back_off_that_doubles_and_is_capped() -> None:
    t = OutlierTracker(SETTINGS)
    assert not t.failed("a", 0.0)
    assert not t.failed("a", 0.1)
    assert t.failed("a", 0.2)  # the third in a row
    assert t.ejected("a", 1.0)
    assert t.any_ejected(1.0)
    assert not t.ejected("b", 1.0)
    assert not t.failed("a", 3.0)  # failures while ejected (requests already sent) do not count
    assert not t.ejected("a", 5.2)  # back after 5 s
    for step in range(3):
        t.failed("a", 6.0 + step)
    assert t.ejected("a", 17.9)  # second ejection: 10 s
    assert not t.ejected("a", 18.1)
    for step in range(3):
        t.failed("a", 20.0 + step)
    assert t.ejected("a", 33.9)  # third: 20 s, capped at 12
    assert not t.ejected("a", 34.1)
    assert not t.any_ejected(34.1)
    assert (t.ejections("a"), t.ejections("b")) == (3, 0)
    t.succeeded("a")
    assert t.ejections("a") == 0


def test_a_success_resets_the_count_and_the_back_off() -> None:
    t = OutlierTracker(SETTINGS)
    t.failed("a", 0.0)
    t.failed("a", 0.1)
    t.succeeded("a")
    assert not t.failed("a", 0.2)
    assert not t.failed("a", 0.3)
    assert t.failed("a", 0.4)
    t.succeeded("a")  # a request picked before the ejection went well: back-off starts over
    for step in range(3):
        t.failed("a", 10.0 + step)
    assert not t.ejected("a", 17.1)  # 5 s again, not 10


def test_the_scheduler_leaves_an_ejected_endpoint_out_and_takes_it_back_later() -> None:
    s = ProfileScheduler(load_profile("round-robin"), outliers=SETTINGS)
    eps = [view(i) for i in range(1, 4)]
    bad = eps[0].endpoint
    for k in range(3):
        s.on_endpoint_failed(request(f"f{k}"), bad, NOW)
    picks = {s.schedule(request(f"r{k}"), eps, NOW + 1.0).pick.address for k in range(30)}
    assert bad.address not in picks
    assert len(picks) == 2
    later = {s.schedule(request(f"l{k}"), eps, NOW + 6.0).pick.address for k in range(30)}
    assert bad.address in later


def test_ejection_never_leaves_the_pool_without_candidates() -> None:
    s = ProfileScheduler(load_profile("default"), outliers=SETTINGS)
    eps = [view(1), view(2)]
    for endpoint in (eps[0].endpoint, eps[1].endpoint):
        for k in range(3):
            s.on_endpoint_failed(request(f"{endpoint.address}{k}"), endpoint, NOW)
    assert s.schedule(request("r"), eps, NOW + 1.0).pick.address in {e.address for e in eps}
