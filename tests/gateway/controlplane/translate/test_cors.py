"""An HTTPRoute CORS filter as Envoy's CorsPolicy, and the origins the CRD accepts."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from kvgate.gateway.controlplane.resources.gateway_api import HTTPCORSFilter
from kvgate.gateway.controlplane.translate.cors import cors_policy


def test_a_policy_names_each_origin_as_the_gateway_api_writes_it() -> None:
    cors = HTTPCORSFilter.model_validate({"allowOrigins": ["https://a.example", "https://*.b.example", "*"]})
    policy = cors_policy(cors)
    exact, wildcard, anything = policy["allow_origin_string_match"]
    assert exact == {"exact": "https://a.example"}
    assert re.fullmatch(wildcard["safe_regex"]["regex"], "https://eu.b.example")
    assert not re.fullmatch(wildcard["safe_regex"]["regex"], "https://b.example.evil.com/x")
    assert not re.fullmatch(wildcard["safe_regex"]["regex"], "http://eu.b.example")
    assert anything == {"safe_regex": {"regex": ".*"}}
    assert policy["max_age"] == "5"  # the Gateway API's default
    assert "allow_methods" not in policy
    assert "allow_credentials" not in policy


@pytest.mark.parametrize("origin", ["a.example", "https://a.example/path", "ftp://a.example", ""])
def test_an_origin_the_crd_refuses_is_refused(origin: str) -> None:
    with pytest.raises(ValidationError):
        HTTPCORSFilter.model_validate({"allowOrigins": [origin]})
