"""A rule's ``retry`` (GEP-1731) beside the picker's own retries, as Envoy policies."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kvgate.gateway.controlplane import envoy_config as ec
from kvgate.gateway.controlplane.resources.gateway_api import HTTPRouteRetry
from kvgate.gateway.controlplane.translate.retries import with_rule_retry


def retry(**fields: object) -> HTTPRouteRetry:
    return HTTPRouteRetry.model_validate(fields)


def test_no_retry_leaves_the_routes_own() -> None:
    assert with_rule_retry(ec.pool_retry_policy(2), None) == ec.pool_retry_policy(2)
    assert with_rule_retry(None, None) is None


def test_a_pool_keeps_its_5xx_retries_and_takes_the_rules_attempts_codes_and_backoff() -> None:
    policy = with_rule_retry(ec.pool_retry_policy(2), retry(attempts=4, codes=[429, 503], backoff="50ms"))
    assert policy == {
        "retry_on": "5xx,reset-before-request,refused-stream,retriable-status-codes",
        "retriable_status_codes": [429],  # (every 5xx is retried already)
        "num_retries": 4,
        "retry_back_off": {"base_interval": "0.05s"},
    }
    assert with_rule_retry(ec.pool_retry_policy(2), retry(codes=[503])) == ec.pool_retry_policy(2)
    assert with_rule_retry(ec.pool_retry_policy(2), retry(attempts=0)) is None


def test_without_a_picker_the_rule_is_the_whole_policy() -> None:
    assert with_rule_retry(None, retry()) == {
        "retry_on": "connect-failure,refused-stream,reset,retriable-status-codes",
        "retriable_status_codes": [500, 502, 503, 504],
        "num_retries": 1,
    }
    assert with_rule_retry(None, retry(codes=[429], attempts=3))["retriable_status_codes"] == [429]  # type: ignore[index]
    assert with_rule_retry(None, retry(attempts=0)) is None


@pytest.mark.parametrize(
    "fields", [{"codes": [200]}, {"codes": [600]}, {"attempts": -1}, {"backoff": "soon"}]
)
def test_values_the_crd_refuses_are_refused(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        retry(**fields)
