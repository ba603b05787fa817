"""A request's plan (``extproc.request_plan``): which of the lifecycle's paths it takes."""

from __future__ import annotations

from kvgate.extproc.events import BodyMode, BodyModes
from kvgate.extproc.lifecycle_config import EveryNth, LifecycleConfig
from kvgate.extproc.request_plan import plan_request
from tests.extproc.fakes import make_pool

ONE_PASS = BodyModes(BodyMode.BUFFERED, BodyMode.NONE)
FULL_DUPLEX = BodyModes(BodyMode.FULL_DUPLEX_STREAMED, BodyMode.FULL_DUPLEX_STREAMED)
LEAN = LifecycleConfig(skip_unread_responses=True, outcome_reports=True)


def test_a_one_pass_request_nothing_reads_skips_its_response_and_is_reported() -> None:
    plan = plan_request(ONE_PASS, has_body=True, pool=make_pool(), config=LEAN)
    assert (plan.observe, plan.skip_response, plan.reported) == (False, True, True)
    assert plan.read_headers_later


def test_what_reads_the_response_keeps_it() -> None:
    sampled = LifecycleConfig(skip_unread_responses=True, observe_usage=EveryNth(2))
    first = plan_request(ONE_PASS, has_body=True, pool=make_pool(), config=sampled)
    second = plan_request(ONE_PASS, has_body=True, pool=make_pool(), config=sampled)
    assert (first.observe, first.skip_response) == (True, False)  # the sampler is asked once per plan
    assert (second.observe, second.skip_response) == (False, True)
    rewriting = plan_request(ONE_PASS, has_body=True, pool=make_pool(rewrites={"m": "m2"}), config=LEAN)
    assert not rewriting.skip_response  # its response's model is renamed back
    duplex = plan_request(FULL_DUPLEX, has_body=True, pool=make_pool(), config=LEAN)
    assert (duplex.observe, duplex.skip_response, duplex.read_headers_later) == (True, False, False)


def test_a_request_stating_latency_objectives_has_its_response_read() -> None:
    """Its first token and usage say whether its ``x-slo-*-ms`` objectives were met."""
    for headers in ((("x-slo-ttft-ms", "200"),), (("accept", "*/*"), ("x-slo-tpot-ms", "bad"))):
        plan = plan_request(ONE_PASS, has_body=True, pool=make_pool(), config=LEAN, headers=headers)
        assert (plan.observe, plan.skip_response) == (True, False)
    plain = plan_request(ONE_PASS, has_body=True, pool=make_pool(), config=LEAN, headers=(("x-slo", "1"),))
    assert (plain.observe, plain.skip_response) == (False, True)


def test_a_request_renaming_its_model_keeps_its_response() -> None:
    """``x-gateway-model-name-rewrite``: the response's ``model`` is renamed back to the client's."""
    plan = plan_request(ONE_PASS, has_body=True, pool=make_pool(), config=LEAN,
                        headers=(("x-gateway-model-name-rewrite", "m-lora"),))
    assert (plan.observe, plan.skip_response) == (False, False)


def test_a_bodyless_request_is_never_skipped_nor_read_later() -> None:
    plan = plan_request(ONE_PASS, has_body=False, pool=make_pool(), config=LEAN)
    assert (plan.skip_response, plan.read_headers_later) == (False, False)
