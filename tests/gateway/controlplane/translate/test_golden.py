"""Manifests in, Envoy JSON out, compared exactly with the checked-in expectation."""

from __future__ import annotations

import os

import pytest

from kvgate.gateway.controlplane.xds import check_consistent
from tests.gateway.controlplane.translate.golden import CASES, GOLDEN_DIR, render, translate_case

UPDATE = os.environ.get("KVGATE_UPDATE_GOLDEN") == "1"


def test_every_required_case_exists() -> None:
    required = {
        "single_pool",
        "weighted_split",
        "header_canary",
        "model_routing",
        "rules_and_routes",
        "invalid_backend",
        "fail_open",
        "filters_timeouts",
        "service_backend",
    }
    assert required <= set(CASES)


@pytest.mark.parametrize("case", CASES)
def test_golden(case: str) -> None:
    actual = render(translate_case(case))
    expected_path = GOLDEN_DIR / case / "expected.json"
    if UPDATE:
        expected_path.write_text(actual)
    assert expected_path.exists(), f"no {expected_path}: run with KVGATE_UPDATE_GOLDEN=1"
    assert actual == expected_path.read_text(), f"{case}: translation differs from expected.json"


@pytest.mark.parametrize("case", CASES)
def test_golden_snapshot_is_consistent_and_deterministic(case: str) -> None:
    first, second = translate_case(case).snapshot(), translate_case(case).snapshot()
    check_consistent(first)
    assert first.version == second.version
