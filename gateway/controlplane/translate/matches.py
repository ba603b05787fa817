"""One HTTPRoute match → an Envoy ``RouteMatch``; the Gateway API's precedence between matches.

Path ``PathPrefix`` is element-wise in the Gateway API (``/abc`` matches ``/abc`` and ``/abc/d``,
not ``/abcd``; a trailing ``/`` is ignored): Envoy's ``path_separated_prefix`` is exactly that.
"""

from __future__ import annotations

import re
from typing import Any

from kvgate.gateway.controlplane.resources.gateway_api import HTTPRouteMatch, PathModifier, RequestRedirect

JsonDict = dict[str, Any]

_PATH_RANK = {"Exact": 0, "PathPrefix": 1, "RegularExpression": 2}


def normalized_prefix(value: str) -> str:
    """A PathPrefix value without its trailing slashes (``/`` stays ``/``)."""
    return value.rstrip("/") or "/"


def _string_match(kind: str, value: str) -> JsonDict:
    if kind == "RegularExpression":
        return {"safe_regex": {"regex": value}}
    return {"exact": value}


def _path_match(match: HTTPRouteMatch) -> JsonDict:
    path = match.path
    if path.type == "Exact":
        return {"path": path.value}
    if path.type == "RegularExpression":
        return {"safe_regex": {"regex": path.value}}
    prefix = normalized_prefix(path.value)
    return {"prefix": "/"} if prefix == "/" else {"path_separated_prefix": prefix}


def envoy_match(match: HTTPRouteMatch) -> JsonDict:
    """The Envoy ``RouteMatch``; a header or query parameter named twice counts once (the first)."""
    result = _path_match(match)
    headers: list[JsonDict] = []
    seen: set[str] = set()
    for header in match.headers:
        name = header.name.lower()
        if name not in seen:
            seen.add(name)
            headers.append({"name": name, "string_match": _string_match(header.type, header.value)})
    if match.method is not None:
        headers.append({"name": ":method", "string_match": {"exact": match.method}})
    if headers:
        result["headers"] = headers
    params: list[JsonDict] = []
    seen_params: set[str] = set()
    for param in match.query_params:
        if param.name not in seen_params:
            seen_params.add(param.name)
            params.append({"name": param.name, "string_match": _string_match(param.type, param.value)})
    if params:
        result["query_parameters"] = params
    return result


def header_names(match: HTTPRouteMatch) -> frozenset[str]:
    return frozenset(header.name.lower() for header in match.headers)


def match_precedence(match: HTTPRouteMatch) -> tuple[int, int, int, int, int]:
    """Smaller sorts first: Exact path, then the longest PathPrefix, then RegularExpression; then a
    method match, most header matches, most query-parameter matches (Gateway API rule precedence)."""
    path = match.path
    length = len(normalized_prefix(path.value)) if path.type == "PathPrefix" else len(path.value)
    return (
        _PATH_RANK[path.type],
        -length if path.type == "PathPrefix" else 0,
        0 if match.method is not None else 1,
        -len({h.name.lower() for h in match.headers}),
        -len({q.name for q in match.query_params}),
    )


def hostname_precedence(hostname: str) -> tuple[int, int]:
    """More characters in a non-wildcard hostname first, then more characters in any hostname."""
    if hostname == "*":
        return (0, 0)
    return (0 if hostname.startswith("*") else -len(hostname), -len(hostname))


def path_rewrite(match: HTTPRouteMatch, modifier: PathModifier) -> JsonDict:
    """Route-action fields for a URLRewrite path modifier under ``match``.

    ``ReplacePrefixMatch`` keeps the rest of the path after a ``/`` (``/foo`` → ``/`` on ``/foo/bar``
    gives ``/bar``, not ``//bar``), hence a regex where Envoy's plain ``prefix_rewrite`` would not.
    """
    if modifier.type == "ReplaceFullPath":
        return {"regex_rewrite": {"pattern": {"regex": "^/.*$"}, "substitution": modifier.replace_full_path}}
    replacement = normalized_prefix(modifier.replace_prefix_match or "/")
    prefix = normalized_prefix(match.path.value)
    if prefix == "/":
        if replacement == "/":
            return {}
        return {"regex_rewrite": {"pattern": {"regex": "^/"}, "substitution": replacement + "/"}}
    if replacement == "/":
        return {"regex_rewrite": {"pattern": {"regex": "^" + re.escape(prefix) + "/*"}, "substitution": "/"}}
    return {"prefix_rewrite": replacement}


_REDIRECT_CODES = {301: "MOVED_PERMANENTLY", 302: "FOUND", 303: "SEE_OTHER", 307: "TEMPORARY_REDIRECT",
                   308: "PERMANENT_REDIRECT"}
_SCHEME_PORTS = {"http": 80, "https": 443}


def redirect_action(match: HTTPRouteMatch, redirect: RequestRedirect) -> JsonDict:
    """Envoy's ``RedirectAction`` for a RequestRedirect under ``match``.

    The port, as the Gateway API says: the one given, else the scheme's well-known port where the
    scheme changes, else the listener's (``port_redirect`` 0 here, Envoy's "unset", filled in per
    listener by ``listener_redirect``); left out of the Location where it is the scheme's default
    (the listeners strip the port from the Host, so Envoy writes none unless told).
    """
    action: JsonDict = {"response_code": _REDIRECT_CODES[redirect.status_code]}
    if redirect.scheme is not None:
        action["scheme_redirect"] = redirect.scheme
    if redirect.hostname is not None:
        action["host_redirect"] = redirect.hostname
    if redirect.port is None and redirect.scheme is None:
        action["port_redirect"] = 0
    elif redirect.port is not None and redirect.port != _SCHEME_PORTS[redirect.scheme or "http"]:
        action["port_redirect"] = redirect.port
    if redirect.path is not None:
        rewrite = path_rewrite(match, redirect.path)
        if redirect.path.type == "ReplaceFullPath":
            rewrite = {"path_redirect": redirect.path.replace_full_path}
        action.update(rewrite)
    return action


def listener_redirect(route: JsonDict, port: int, scheme: str = "http") -> JsonDict:
    """``route`` on the listener bound at ``port``: a redirect to the listener's port names it
    (``redirect_action``; none for the listener's scheme's own, 80 or 443)."""
    redirect = route.get("redirect")
    if redirect is None or redirect.get("port_redirect") != 0:
        return route
    redirect = {key: value for key, value in redirect.items() if key != "port_redirect"}
    if port != _SCHEME_PORTS[scheme]:
        redirect["port_redirect"] = port
    return {**route, "redirect": redirect}
