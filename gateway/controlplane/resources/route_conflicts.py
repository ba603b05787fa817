"""An HTTPRoute and a GRPCRoute on one listener with hostnames in common: the Gateway API says
exactly one of the two is accepted there, the oldest by creation timestamp, then the first by
``{namespace}/{name}``; the other loses that listener, and a parent it keeps no listener of sets
its ``Accepted`` False (reason ``Conflicted``). A pure pass over the routes' validation results.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from kvgate.gateway.controlplane.resources.conditions import ConditionType, Reason, ResourceStatus, condition
from kvgate.gateway.controlplane.resources.grpc_route import GRPC_ROUTE
from kvgate.gateway.controlplane.resources.hostnames import ANY_HOST, covers
from kvgate.gateway.controlplane.resources.resolved import ResolvedRoute, RouteAttachment
from kvgate.gateway.controlplane.resources.routes import RouteResult


def settle_kind_conflicts(results: Sequence[RouteResult]) -> list[RouteResult]:
    """``results`` with each HTTPRoute/GRPCRoute conflict decided (module docstring)."""
    routes = [result.route for result in results]
    grpc = [route for route in routes if route is not None and route.kind == GRPC_ROUTE]
    http = [route for route in routes if route is not None and route.kind != GRPC_ROUTE]
    lost: dict[tuple[str, str], dict[RouteAttachment, ResolvedRoute]] = {}
    for a in http:
        for b in grpc:
            loser, winner = (b, a) if _first(a, b) else (a, b)
            for mine in loser.attachments:
                if any(_shared(mine, theirs) for theirs in winner.attachments):
                    lost.setdefault(_id(loser), {})[mine] = winner
    if not lost:
        return list(results)
    return [_without(result, lost.get(_id(result.route), {})) if result.route is not None else result
            for result in results]


def _id(route: ResolvedRoute) -> tuple[str, str]:
    return route.kind, str(route.key)


def _first(a: ResolvedRoute, b: ResolvedRoute) -> bool:
    """Whether ``a`` is accepted over ``b``: the older (no timestamp: the newest), then by name."""
    return (a.creation_timestamp or "~", str(a.key)) <= (b.creation_timestamp or "~", str(b.key))


def _shared(a: RouteAttachment, b: RouteAttachment) -> bool:
    """Both on one listener with a hostname in common."""
    if (a.gateway, a.listener) != (b.gateway, b.listener):
        return False
    return any(x == ANY_HOST or y == ANY_HOST or covers(x, y) or covers(y, x)
               for x in a.hostnames for y in b.hostnames)


def _without(result: RouteResult, lost: dict[RouteAttachment, ResolvedRoute]) -> RouteResult:
    route = result.route
    if route is None or not lost:
        return result
    kept = tuple(a for a in route.attachments if a not in lost)
    statuses: list[ResourceStatus] = []
    for status in result.statuses:
        accepted = status.get(ConditionType.ACCEPTED)
        parent = status.parent
        if parent is None or accepted is None or not accepted.is_true:
            statuses.append(status)
            continue
        gone = [(a, w) for a, w in lost.items() if a.gateway == parent.key]
        if not gone:
            statuses.append(status)
            continue
        if any(a.gateway == parent.key for a in kept):  # accepted still, by fewer listeners
            listeners = tuple(dict.fromkeys(a.listener for a in kept if a.gateway == parent.key))
            statuses.append(dataclasses.replace(status, listeners=listeners))
            continue
        attachment, winner = gone[0]
        message = (f"listener {attachment.listener} serves {winner.kind} {winner.key}, older or first by "
                   f"name, for the same hostnames: an HTTPRoute and a GRPCRoute cannot share them")
        rejected = condition(ConditionType.ACCEPTED, False, Reason.CONFLICTED, message,
                             accepted.observed_generation)
        conditions = tuple(rejected if c is accepted else c for c in status.conditions)
        statuses.append(dataclasses.replace(status, conditions=conditions, listeners=()))
    refused = {s.parent for s in statuses if s.parent is not None and _refused(s)}
    parents = [(ref, ok and ref not in refused) for ref, ok in result.parents]
    return dataclasses.replace(
        result, route=dataclasses.replace(route, attachments=kept) if kept else None,
        statuses=tuple(statuses), parents=tuple(parents))


def _refused(status: ResourceStatus) -> bool:
    accepted = status.get(ConditionType.ACCEPTED)
    return accepted is not None and not accepted.is_true
