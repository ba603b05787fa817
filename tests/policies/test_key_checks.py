"""``policies.key_checks``: served requests' last keyed blocks checked against their endpoints'
reports; a pool whose engines hold almost none of them is not trusted, and is again once they do."""

from __future__ import annotations

from kvgate.policies.key_checks import KeyCheck, KeyChecks, KeyCheckSettings

SETTINGS = KeyCheckSettings(delay_s=1.0, window=8, min_checks=4, distrust_below=0.3, trust_at=0.5)


def serve(checks: KeyChecks, n: int, *, start: int = 0, endpoint: str = "a", now: float = 0.0) -> None:
    for i in range(start, start + n):
        checks.expect(f"r{i}", endpoint, i)
        checks.finished(f"r{i}", now)


def test_a_request_is_checked_a_moment_after_it_ended_against_its_endpoint() -> None:
    checks = KeyChecks(SETTINGS)
    checks.expect("r1", "a", 11)
    asked: list[tuple[str, int]] = []

    def holds(endpoint: str, key: int) -> bool:
        asked.append((endpoint, key))
        return True

    assert checks.poll(5.0, holds) == []  # still in flight
    checks.finished("r1", 5.0)
    assert checks.poll(5.5, holds) == []  # its events may not have arrived yet
    assert checks.poll(6.0, holds) == [KeyCheck("a", True, True)]
    assert asked == [("a", 11)]
    assert checks.poll(9.0, holds) == []  # once


def test_a_fallback_is_checked_where_it_was_served() -> None:
    checks = KeyChecks(SETTINGS)
    checks.expect("r1", "a", 1)
    checks.moved("r1", "b")
    checks.expect("r2", "a", 2)
    checks.finished("r1", 0.0)
    checks.finished("r2", 0.0)
    assert [c.endpoint for c in checks.poll(1.0, lambda e, k: True)] == ["b", "a"]


def test_keys_the_engines_never_hold_are_distrusted_and_trusted_again_when_they_do() -> None:
    checks = KeyChecks(SETTINGS)
    serve(checks, 3)
    assert [c.trusted for c in checks.poll(1.0, lambda e, k: False)] == [True] * 3  # too few to judge
    serve(checks, 1, start=3, now=1.0)
    assert [c.trusted for c in checks.poll(2.0, lambda e, k: False)] == [False]
    assert not checks.trusted
    serve(checks, 4, start=4, now=2.0)  # window: 4 missing, 4 held -> half
    outcomes = checks.poll(3.0, lambda e, k: True)
    assert [c.trusted for c in outcomes] == [False, False, False, True]
    assert checks.trusted


def test_a_few_evicted_blocks_do_not_distrust_right_keys() -> None:
    checks = KeyChecks(SETTINGS)
    serve(checks, 40)
    outcomes = checks.poll(1.0, lambda e, k: k % 4 != 0)  # a quarter evicted before the check
    assert all(c.trusted for c in outcomes)


def test_an_endpoint_no_longer_followed_is_not_counted() -> None:
    checks = KeyChecks(SETTINGS)
    serve(checks, 10)
    assert checks.poll(1.0, lambda e, k: None) == []
    assert checks.trusted


def test_an_endpoint_that_left_is_not_checked_and_memory_is_bounded() -> None:
    checks = KeyChecks(SETTINGS, max_pending=5)
    serve(checks, 3, endpoint="gone")
    checks.expect("in-flight", "gone", 99)
    checks.forget_endpoint("gone")
    checks.finished("in-flight", 0.0)
    assert checks.poll(1.0, lambda e, k: False) == []
    for i in range(20):
        checks.expect(f"x{i}", "a", i)
    serve(checks, 20, start=100)
    assert len(checks.poll(1.0, lambda e, k: True)) == 5
