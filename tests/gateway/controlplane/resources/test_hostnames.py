from __future__ import annotations

import pytest

from kvgate.gateway.controlplane.resources.hostnames import covers, intersect


@pytest.mark.parametrize(
    ("pattern", "name", "expected"),
    [
        ("a.example.com", "A.example.com", True),
        ("*.example.com", "a.example.com", True),
        ("*.example.com", "a.b.example.com", True),
        ("*.example.com", "*.b.example.com", True),
        ("*.example.com", "example.com", False),
        ("a.example.com", "*.example.com", False),
    ],
)
def test_covers(pattern: str, name: str, expected: bool) -> None:
    assert covers(pattern, name) is expected


def test_intersect() -> None:
    assert intersect(None, ()) == ("*",)
    assert intersect("api.example.com", ()) == ("api.example.com",)
    assert intersect(None, ("A.com", "a.com")) == ("a.com",)
    assert intersect("*.example.com", ("*", "x.example.com")) == ("x.example.com",)
    assert intersect("x.example.com", ("*.example.com",)) == ("x.example.com",)
    assert intersect("x.example.com", ("y.example.com",)) == ()
