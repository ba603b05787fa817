"""One route configuration per listener port: a virtual host per hostname, routes in precedence order.

A request's Host first selects the Gateway listener (the most specific listener hostname on the port
that covers it), then the routes attached to that listener whose hostnames cover it, most specific
route hostname first, then the Gateway API's match precedence. Each virtual host therefore holds
the routes of less specific hostnames too (after its own), so a request falls through to them as
the Gateway API says.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvgate.gateway.controlplane.resources import ObjectKey, ResolvedRoute, RouteAttachment
from kvgate.gateway.controlplane.resources.certificates import ListenerCertificate
from kvgate.gateway.controlplane.resources.hostnames import ANY_HOST, covers
from kvgate.gateway.controlplane.translate.matches import hostname_precedence, listener_redirect
from kvgate.gateway.controlplane.translate.names import route_config_name
from kvgate.gateway.controlplane.translate.routes import RouteGroup

JsonDict = dict[str, Any]


@dataclass(frozen=True, slots=True)
class PortListener:
    """A Gateway listener on the port: ``hostname`` lower-case, None for any host."""

    gateway: ObjectKey
    name: str
    hostname: str | None
    certificate: ListenerCertificate | None = None
    """An HTTPS listener's certificate (``listeners.envoy_listener`` terminates TLS with it)."""


@dataclass(frozen=True, slots=True)
class Attached:
    route: ResolvedRoute
    attachment: RouteAttachment
    groups: Sequence[RouteGroup]


def _listener_score(listener: PortListener, host: str) -> tuple[int, int] | None:
    if listener.hostname is None:
        return (0, 0)
    if host == ANY_HOST:
        return None
    if listener.hostname == host:
        return (2, len(host))
    if covers(listener.hostname, host):
        return (1, len(listener.hostname))
    return None


def _owners(listeners: Sequence[PortListener], host: str) -> set[tuple[ObjectKey, str]]:
    scored = [(score, ls) for ls in listeners if (score := _listener_score(ls, host)) is not None]
    if not scored:
        return set()
    best = max(score for score, _ in scored)
    return {(ls.gateway, ls.name) for score, ls in scored if score == best}


def _route_hostname(attachment: RouteAttachment, host: str) -> str | None:
    """The most specific of the attachment's hostnames that covers ``host``."""
    found = [name for name in attachment.hostnames if name == ANY_HOST or covers(name, host)]
    return min(found, key=hostname_precedence) if found else None


def route_configuration(
    port: int,
    listeners: Sequence[PortListener],
    attached: Sequence[Attached],
    first: Sequence[JsonDict] = (),
    bound_port: int | None = None,
) -> JsonDict:
    """``first``: routes put ahead of the HTTPRoutes' in every virtual host (``/v1/models``);
    ``bound_port``: the port Envoy binds for the listener ``port`` (redirects name it)."""
    hosts = {ls.hostname if ls.hostname is not None else ANY_HOST for ls in listeners}
    scheme = "https" if any(ls.certificate is not None for ls in listeners) else "http"
    hosts.update(name for item in attached for name in item.attachment.hostnames)
    virtual_hosts = []
    for host in sorted(hosts):
        owners = _owners(listeners, host)
        entries: list[tuple[tuple[tuple[int, int], Any], tuple[JsonDict, ...]]] = []
        for item in attached:
            if (item.attachment.gateway, item.attachment.listener) not in owners:
                continue
            hostname = _route_hostname(item.attachment, host)
            if hostname is None:
                continue
            precedence = hostname_precedence(hostname)
            entries.extend(((precedence, group.key), group.routes) for group in item.groups)
        entries.sort(key=lambda entry: entry[0])
        routes = [*first, *(listener_redirect(route, bound_port or port, scheme)
                            for _, group_routes in entries for route in group_routes)]
        virtual_hosts.append({"name": f"{port}/{host}", "domains": [host], "routes": routes})
    return {"name": route_config_name(port), "virtual_hosts": virtual_hosts}
