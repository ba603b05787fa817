"""``bench/slo_order.py``'s plan: one tenant, a share of its requests stating the TTFT objective."""

from __future__ import annotations

import argparse

from kvgate.bench.slo_order import SLO_HEADER, plan


def test_a_share_of_one_tenants_requests_state_the_objective() -> None:
    args = argparse.Namespace(seed=3, load=1.3, duration=200.0, output_tokens=64, prompt_tokens=128,
                              interactive=0.25, objective_ms=1500.0)
    requests, interactive = plan(args, capacity=4.0)
    assert 900 < len(requests) < 1200  # 5.2 requests/s for 200 s
    assert 0.2 < len(interactive) / len(requests) < 0.3
    for request in requests:
        headers = dict(request.headers)
        assert headers["x-gateway-inference-fairness-id"] == "team"
        assert (SLO_HEADER in headers) is (request.index in interactive)
        if SLO_HEADER in headers:
            assert headers[SLO_HEADER] == "1500"
    assert [r.at_s for r in requests] == sorted(r.at_s for r in requests)
