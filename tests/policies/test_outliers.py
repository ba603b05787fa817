"""Outlier ejection (``policies.outliers``) and its use by the scheduler."""

from __future__ import annotations

from kvgate.policies.outliers import OutlierSettings, OutlierTracker
from kvgate.policies.plugins.recorders import OutlierEjection
from kvgate.policies.pool_views import PoolViews
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


def test_the_ejected_set_stays_one_object_until_an_ejection_begins_or_ends() -> None:
    t = OutlierTracker(SETTINGS)
    for step in range(3):
        t.failed("a", step * 0.1)
    first = t.ejected_at(1.0)
    assert first == {"a"}
    assert t.ejected_at(2.0) is first
    for step in range(3):
        t.failed("b", 3.0 + step * 0.1)
    both = t.ejected_at(3.5)
    assert both == {"a", "b"}
    assert t.ejected_at(4.0) is both
    assert t.ejected_at(5.3) == {"b"}  # a's 5 s are up
    t.forget("b")
    assert t.ejected_at(5.4) == frozenset()
    assert t.ejected_at(60.0) == frozenset()


def test_the_gate_keeps_its_pool_per_snapshot_and_follows_the_ejections() -> None:
    s = ProfileScheduler(load_profile("default"), outliers=SETTINGS)
    [gate] = [plugin for plugin in s.feedback if isinstance(plugin, OutlierEjection)]
    eps = PoolViews.after(None, [view(i) for i in range(1, 5)], None)
    assert gate.gate(eps, NOW) is eps  # nothing ejected
    for k in range(3):
        s.on_endpoint_failed(request(f"f{k}"), eps[0].endpoint, NOW)
    kept = gate.gate(eps, NOW + 1.0)
    assert [v.address for v in kept] == [v.address for v in eps[1:]]
    assert gate.gate(eps, NOW + 2.0) is kept  # the same snapshot, the same ejections: the same tuple
    rescraped = PoolViews.after(eps, (eps[0], view(2, waiting=3), *eps[2:]), {eps[1].address})
    after = gate.gate(rescraped, NOW + 2.0)
    assert isinstance(after, PoolViews)
    assert after.changed_since(kept) == {eps[1].address}  # the change flows on to the filters
    assert gate.gate(rescraped, NOW + 6.0) is rescraped  # the ejection is over
