"""A publisher's sequence numbers (``gateway.picker.kv_events.sequence``)."""

from __future__ import annotations

from kvgate.gateway.picker.kv_events.sequence import SequenceTracker, Verdict


def test_in_order_duplicates_gaps_and_restarts() -> None:
    t = SequenceTracker()
    assert not t.in_step  # nothing seen yet
    assert [t.observe(s) for s in (0, 1, 1, 2)] == [Verdict.IN_ORDER, Verdict.IN_ORDER, Verdict.DUPLICATE,
                                                   Verdict.IN_ORDER]
    assert t.in_step
    assert t.observe(5) is Verdict.GAP
    assert t.expected_before_gap == 3
    assert t.observe(0) is Verdict.RESTART
    assert t.observe(1) is Verdict.IN_ORDER


def test_joining_late_is_a_gap_from_zero() -> None:
    t = SequenceTracker()
    assert t.observe(40) is Verdict.GAP
    assert t.expected_before_gap == 0


def test_lost_batches_put_it_out_of_step_until_a_clear_or_the_resync_time() -> None:
    now = [0.0]
    t = SequenceTracker(resync_s=60.0, clock=lambda: now[0])
    t.observe(0)
    t.lost()
    assert not t.in_step
    now[0] = 59.0
    assert not t.in_step
    now[0] = 60.0
    assert t.in_step
    t.lost()
    t.cleared()
    assert t.in_step
