"""A rule's CORS filter (the Gateway API's HTTPCORSFilter) as Envoy's per-route ``CorsPolicy``.

Envoy's CORS filter runs in the chain of a listener whose routes have a policy, after the body-based
router (which holds a request's headers until its body names the model and re-matches the route:
the policy read is the final route's) and before ExternalAuth and the picker: it answers a
browser's preflight (``OPTIONS`` with ``Access-Control-Request-Method``) itself and adds
``Access-Control-Allow-Origin`` (and the rest) to the answers of allowed origins, so a web page can
call the gateway's OpenAI API directly. Origins are exact, ``*``, or with ``*`` in the host
(``https://*.example.com``), as the Gateway API writes them; without a policy a route's preflight
goes to the model server as before (vLLM answers it).
"""

from __future__ import annotations

import re
from typing import Any

from kvgate.gateway.controlplane.resources.gateway_api import HTTPCORSFilter

JsonDict = dict[str, Any]
CORS_FILTER = "envoy.filters.http.cors"
_TYPE = "type.googleapis.com/envoy.extensions.filters.http.cors.v3."


def cors_filter() -> JsonDict:
    """The HTTP filter (its policies are per route)."""
    return {"name": CORS_FILTER, "typed_config": {"@type": _TYPE + "Cors"}}


def _origin_match(origin: str) -> JsonDict:
    if origin == "*":
        return {"safe_regex": {"regex": ".*"}}
    if "*" in origin:
        return {"safe_regex": {"regex": re.escape(origin).replace(r"\*", "[^/]*")}}
    return {"exact": origin}


def cors_policy(cors: HTTPCORSFilter) -> JsonDict:
    """The route's ``typed_per_filter_config`` entry for the CORS filter."""
    policy: JsonDict = {
        "@type": _TYPE + "CorsPolicy",
        "allow_origin_string_match": [_origin_match(origin) for origin in cors.allow_origins],
        "max_age": str(cors.max_age),
    }
    for field, values in (("allow_methods", cors.allow_methods), ("allow_headers", cors.allow_headers),
                          ("expose_headers", cors.expose_headers)):
        if values:
            policy[field] = ", ".join(values)
    if cors.allow_credentials is not None:
        policy["allow_credentials"] = cors.allow_credentials
    return policy
