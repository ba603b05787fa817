"""Hostname matching between a listener and a route, as the Gateway API defines it.

A wildcard ``*.example.com`` matches any name with at least one more label before
``.example.com``. The hostnames a route serves on a listener are the intersection: for each
route hostname, the more specific of the pair when one matches the other.
"""

from __future__ import annotations

ANY_HOST = "*"


def covers(pattern: str, name: str) -> bool:
    """True when ``pattern`` (a name or ``*.suffix``) matches ``name`` (which may be a wildcard)."""
    pattern, name = pattern.lower(), name.lower()
    if pattern == name:
        return True
    if pattern.startswith("*."):
        suffix = pattern[1:]
        return name.endswith(suffix) and len(name) > len(suffix)
    return False


def intersect(listener: str | None, route: tuple[str, ...]) -> tuple[str, ...]:
    """The hostnames a route serves on a listener; empty when they share none."""
    if not route:
        return (listener,) if listener else (ANY_HOST,)
    if not listener:
        return tuple(dict.fromkeys(name.lower() for name in route))
    found: list[str] = []
    for name in route:
        if covers(listener, name):
            found.append(name.lower())
        elif covers(name, listener):
            found.append(listener.lower())
    return tuple(dict.fromkeys(found))
