"""``policies.latency_objectives``: a request's ``x-slo-ttft-ms`` / ``x-slo-tpot-ms``, a bad value
read as none (as llm-d's picker reads them)."""

from __future__ import annotations

import pytest

from kvgate.policies.latency_objectives import LatencyObjectives, latency_objectives


@pytest.mark.parametrize(("headers", "expected"), [
    ({}, LatencyObjectives()),
    ({"x-slo-ttft-ms": "250"}, LatencyObjectives(ttft_s=0.25)),
    ({"x-slo-tpot-ms": " 12.5 "}, LatencyObjectives(tpot_s=0.0125)),
    ({"x-slo-ttft-ms": "2000", "x-slo-tpot-ms": "50"}, LatencyObjectives(2.0, 0.05)),
    ({"x-slo-ttft-ms": "soon", "x-slo-tpot-ms": "50"}, LatencyObjectives(tpot_s=0.05)),
    ({"x-slo-ttft-ms": "0"}, LatencyObjectives()),
    ({"x-slo-ttft-ms": "-5"}, LatencyObjectives()),
    ({"x-slo-ttft-ms": "nan"}, LatencyObjectives()),
    ({"x-slo-ttft-ms": "inf"}, LatencyObjectives()),
    ({"x-slo-ttft-ms": ""}, LatencyObjectives()),
])
def test_objectives_from_headers(headers: dict[str, str], expected: LatencyObjectives) -> None:
    found = latency_objectives(headers)
    assert found == expected
    assert bool(found) == (expected.ttft_s is not None or expected.tpot_s is not None)
