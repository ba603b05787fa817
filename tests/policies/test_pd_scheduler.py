"""Disaggregated scheduling (``policies.pd_scheduler``): the decode pick among decoders, the decider,
the prefill pick among prefillers, and the bookkeeping of both halves."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import msgspec
import pytest

from kvgate.policies.disaggregation import DisaggregatedProfile, build_disaggregated, load_scheduling
from kvgate.policies.errors import ConfigError, NoEligibleEndpointError
from kvgate.policies.pd_scheduler import PREFILL_SUFFIX, DisaggregatedScheduler
from kvgate.policies.plugins.deciders import PrefixBasedDecider
from kvgate.policies.profile import load_profile
from kvgate.policies.schedulers import make_scheduler
from kvgate.policies.state import InProcessState
from kvgate.policies.types import EndpointView, Role
from tests.policies.helpers import NOW, request, text, view

LONG = text(1, 8000)  # ~2,000 estimated tokens
SHORT = text(2, 400)  # ~100


def roled(i: int, role: Role, **metrics: Any) -> EndpointView:
    v = view(i, **metrics)
    return msgspec.structs.replace(v, endpoint=dataclasses.replace(v.endpoint, role=role))


FLEET = (roled(1, Role.PREFILL), roled(2, Role.PREFILL), roled(3, Role.DECODE), roled(4, Role.DECODE))


def scheduler(threshold: int = 256) -> DisaggregatedScheduler:
    profile = load_scheduling("pd")
    assert isinstance(profile, DisaggregatedProfile)
    decider = dataclasses.replace(profile.decider, plugin=PrefixBasedDecider(threshold))
    return DisaggregatedScheduler(dataclasses.replace(profile, decider=decider), rng=random.Random(3))


def test_a_long_prompt_gets_a_decode_endpoint_and_a_prefill_endpoint() -> None:
    result = scheduler().schedule(request("r", LONG), FLEET, NOW)
    assert result.pick.role is Role.DECODE
    assert result.prefill is not None
    assert result.prefill.endpoint.role is Role.PREFILL
    assert result.prefill.request.request_id == "r" + PREFILL_SUFFIX
    assert result.prefill.request.max_tokens == 1
    assert result.profile == "pd"
    assert all(e.role is Role.DECODE for e in result.ranked)  # fallbacks decode too


def test_a_short_prompt_is_served_by_the_decode_endpoint_alone() -> None:
    result = scheduler().schedule(request("r", SHORT), FLEET, NOW)
    assert result.prefill is None
    assert result.pick.role is Role.DECODE


def test_a_prompt_the_decode_endpoint_holds_is_not_prefilled_again() -> None:
    s = scheduler()
    first = s.schedule(request("a", LONG), FLEET, NOW)
    s.on_picked(request("a", LONG), first.pick, NOW)  # the prefix index now has it on the decoder
    s.on_finished(request("a", LONG), first.pick, ok=True, now=NOW)
    again = s.schedule(request("b", LONG + " and one more question"), FLEET, NOW)
    assert again.pick == first.pick  # prefix affinity
    assert again.prefill is None


def test_a_document_still_on_its_way_to_the_decode_endpoint_is_not_counted_as_held() -> None:
    """A second request for a document split a moment ago heads for the same decode endpoint (the
    index learned it there at the pick; the first's prefill there is past its estimate, a skipped
    stream's first token being unseen), but the KV arrives only when the first one's decode starts:
    it is split again, not computed whole beside the decode endpoint's decodes. Once the first has
    ended (the KV was read), the next one is kept whole there."""
    s = scheduler()
    doc = text(30, 8000)
    first = request("a", doc + " first question")
    result = s.schedule(first, FLEET, NOW)
    assert result.prefill is not None
    s.on_picked(first, result.pick, NOW)
    s.on_first_token_unseen(first, result.pick, NOW)
    second = request("b", doc + " second question")
    again = s.schedule(second, FLEET, NOW + 1.0)
    assert again.pick == result.pick  # prefix affinity on the decode side
    assert again.prefill is not None  # ... but its blocks may still be arriving: split
    s.on_finished(first, result.pick, ok=True, now=NOW + 1.5)
    third = s.schedule(request("c", doc + " third question"), FLEET, NOW + 2.0)
    assert third.pick == result.pick
    assert third.prefill is None  # held now: the decode endpoint computes the question alone


def test_threshold_zero_always_disaggregates_and_never_prefills_on_the_decode_pick() -> None:
    both = (roled(1, Role.BOTH), roled(2, Role.BOTH))
    for rid in "abcdef":
        result = scheduler(0).schedule(request(rid, SHORT), both, NOW)
        assert result.prefill is not None
        assert result.prefill.endpoint != result.pick


def test_without_decoders_the_request_is_refused_and_without_prefillers_it_is_aggregated() -> None:
    with pytest.raises(NoEligibleEndpointError, match="decode"):
        scheduler().schedule(request("r", LONG), FLEET[:2], NOW)
    alone = scheduler().schedule(request("r", LONG), FLEET[2:], NOW)
    assert alone.prefill is None


def test_both_halves_are_in_flight_until_each_ends() -> None:
    s = scheduler()
    req = request("r", LONG)
    result = s.schedule(req, FLEET, NOW)
    assert result.prefill is not None
    p_addr, d_addr = result.prefill.endpoint.address, result.pick.address
    s.on_picked(req, result.pick, NOW)
    assert isinstance(s.state, InProcessState)
    assert s.state.inflight(p_addr).requests == 1
    assert s.state.inflight(d_addr).requests == 1
    assert s.state.inflight(p_addr).tokens > 1000  # the prompt's prefill is queued on the prefiller
    # the picker ran the prefill and reports it on the prefill's own request
    s.on_first_token(result.prefill.request, result.prefill.endpoint, NOW)
    s.on_finished(result.prefill.request, result.prefill.endpoint, ok=True, now=NOW)
    assert s.state.inflight(p_addr).requests == 0
    assert s.state.inflight(d_addr).requests == 1
    s.on_finished(req, result.pick, ok=True, now=NOW)
    assert s.state.inflight_requests() == 0


def test_a_split_request_adds_no_prefill_work_to_its_decode_endpoint_unless_its_prefill_fails() -> None:
    """The decode endpoint reads a split request's KV: it is in flight there with no prompt tokens
    to compute (counted with the whole prompt, every split request made its decode endpoint look as
    queued as a prefill endpoint). A failed prefill leaves it the whole prompt to compute."""
    s = scheduler()
    assert isinstance(s.state, InProcessState)
    req = request("r", LONG)
    result = s.schedule(req, FLEET, NOW)
    assert result.prefill is not None
    d_addr = result.pick.address
    s.on_picked(req, result.pick, NOW)
    assert s.state.inflight(d_addr).requests == 1
    assert s.state.inflight(d_addr).tokens == 0
    s.on_endpoint_failed(result.prefill.request, result.prefill.endpoint, NOW)
    s.on_finished(result.prefill.request, result.prefill.endpoint, ok=False, now=NOW)
    assert s.state.inflight(d_addr).requests == 1
    assert s.state.inflight(d_addr).tokens > 1000
    s.on_first_token(req, result.pick, NOW)
    assert s.state.inflight(d_addr).tokens == 0
    s.on_finished(req, result.pick, ok=True, now=NOW)
    assert s.state.inflight_requests() == 0


def test_an_unreported_prefill_ends_with_the_decode_first_token_or_finish() -> None:
    s = scheduler()
    for ending in ("first_token", "finished"):
        req = request(ending, text(10 + len(ending), 8000))  # prompts that share no prefix
        result = s.schedule(req, FLEET, NOW)
        assert result.prefill is not None
        s.on_picked(req, result.pick, NOW)
        if ending == "first_token":
            s.on_first_token(req, result.pick, NOW)
        else:
            s.on_finished(req, result.pick, ok=False, now=NOW)
        assert s.state.inflight(result.prefill.endpoint.address).requests == 0, ending
        s.on_finished(req, result.pick, ok=True, now=NOW)
    assert isinstance(s.state, InProcessState)
    assert s.state.inflight_requests() == 0


def test_a_skipped_stream_keeps_its_prefill_queued_on_the_prefill_endpoint_until_it_ends() -> None:
    """A skipped stream's first token is unseen from the pick on: its prefill still occupies the
    prefill endpoint (the next long prompt goes to the other one) until the picker reports it done,
    or, unreported (a sidecar ran it), until the prefill side's estimate of it has passed."""
    s = scheduler()
    first = request("a", text(21, 8000))
    result = s.schedule(first, FLEET, NOW)
    assert result.prefill is not None
    busy = result.prefill.endpoint.address
    s.on_picked(first, result.pick, NOW)
    s.on_first_token_unseen(first, result.pick, NOW)
    assert isinstance(s.state, InProcessState)
    assert s.state.inflight(busy).tokens > 1000
    second = s.schedule(request("b", text(22, 8000)), FLEET, NOW)
    assert second.prefill is not None
    assert second.prefill.endpoint.address != busy
    # reported done by the picker: the prefill endpoint is free at once
    s.on_first_token(result.prefill.request, result.prefill.endpoint, NOW)
    s.on_finished(result.prefill.request, result.prefill.endpoint, ok=True, now=NOW)
    assert s.state.inflight(busy).requests == 0
    s.on_finished(first, result.pick, ok=True, now=NOW)
    # unreported: its tokens end at the estimate, the request at the decode's finish
    third = request("c", text(23, 8000))
    result = s.schedule(third, FLEET, NOW)
    assert result.prefill is not None
    p_addr = result.prefill.endpoint.address
    s.on_picked(third, result.pick, NOW)
    s.on_first_token_unseen(third, result.pick, NOW)
    assert s.state.inflight(p_addr).tokens > 1000
    later = NOW + 60.0
    s.schedule(request("d", text(24, 8000)), FLEET, later)  # the next prefill pick ends past estimates
    assert s.state.inflight(p_addr).tokens == 0
    assert s.state.inflight(p_addr).requests == 1
    s.on_finished(third, result.pick, ok=True, now=later)
    assert s.state.inflight(p_addr).requests == 0


def test_a_failed_prefill_counts_against_the_prefill_endpoint_only() -> None:
    s = scheduler()
    bad, failures, i = FLEET[0].address, 0, 0
    while failures < 5:
        i += 1
        req = request(f"r{i}", text(20 + i, 8000))
        result = s.schedule(req, FLEET, NOW)
        assert result.prefill is not None
        s.on_picked(req, result.pick, NOW)
        half = result.prefill
        ok = half.endpoint.address != bad
        if not ok:
            failures += 1
            s.on_endpoint_failed(half.request, half.endpoint, NOW)
        s.on_finished(half.request, half.endpoint, ok=ok, now=NOW)
        s.on_finished(req, result.pick, ok=True, now=NOW)
    results = [s.schedule(request(f"x{i}", text(200 + i, 8000)), FLEET, NOW) for i in range(8)]
    assert {r.prefill.endpoint.address for r in results if r.prefill is not None} == {FLEET[1].address}
    assert all(r.prefill is not None for r in results)  # ejected from prefilling, the other one does it


def test_make_scheduler_builds_the_kind_the_profile_names() -> None:
    assert isinstance(make_scheduler("pd"), DisaggregatedScheduler)
    assert not isinstance(make_scheduler("default"), DisaggregatedScheduler)


def _pd(**disaggregation: Any) -> dict[str, Any]:
    spec = {"decider": {"type": "prefix-based-pd-decider"}, "decode": "pd-decode", "prefill": "pd-prefill"}
    spec.update(disaggregation)
    return {"name": "x", "disaggregation": spec}


def test_the_halves_must_share_prefix_settings_and_the_prefill_half_must_not_pin_sessions() -> None:
    with pytest.raises(ConfigError, match="prefix settings"):
        build_disaggregated(_pd(prefill="gie-default"))
    with pytest.raises(ConfigError, match="must not pin sessions"):
        build_disaggregated(_pd(prefill="default"))
    with pytest.raises(ConfigError, match="not a disaggregation decider"):
        build_disaggregated(_pd(decider={"type": "healthy-filter"}))
    with pytest.raises(ConfigError, match="non_cached_tokens"):
        build_disaggregated(_pd(decider={"type": "prefix-based-pd-decider",
                                         "parameters": {"non_cached_tokens": -1}}))
    with pytest.raises(ConfigError, match="disaggregated profile"):
        load_profile("pd")


def conditional(**parameters: Any) -> DisaggregatedScheduler:
    profile = build_disaggregated(_pd(decider={"type": "conditional-pd-decider", "parameters": parameters}))
    return DisaggregatedScheduler(profile, rng=random.Random(3))


def test_the_conditional_decider_keeps_a_prompt_whole_while_the_prefill_endpoints_queue() -> None:
    """Conditional disaggregation: idle prefill endpoints get the prompt (the decode batch runs
    undisturbed); once their queued prefill work makes the hop later than computing the prompt on
    the decode endpoint, the decode endpoints absorb the overflow."""
    s = conditional(min_saving_s=0.02)
    assert isinstance(s.state, InProcessState)
    splits, queued_when_kept = [], []
    for i in range(12):
        req = request(f"r{i}", text(100 + i, 8000))  # ~2,000 tokens each: ~35 ms of prefill
        queued = min(s.state.inflight(v.address).tokens for v in FLEET[:2])
        result = s.schedule(req, FLEET, NOW)
        s.on_picked(req, result.pick, NOW)  # none finishes: the queues grow
        splits.append(result.prefill is not None)
        if result.prefill is None:
            queued_when_kept.append(queued)
    assert splits[:2] == [True, True]  # both prefill endpoints idle
    assert queued_when_kept
    assert min(queued_when_kept) >= 1900  # only while each prefill endpoint had work
    assert 0 < sum(splits[2:]) < 10  # the decode endpoints' own queued prompts make the hop sooner again


def test_the_conditional_decider_never_keeps_a_prompt_above_max_local_tokens() -> None:
    s = conditional(min_saving_s=0.0, max_local_tokens=1000)
    for i in range(12):
        req = request(f"r{i}", text(100 + i, 8000))
        result = s.schedule(req, FLEET, NOW)
        s.on_picked(req, result.pick, NOW)
        assert result.prefill is not None


def test_the_conditional_decider_needs_ttft_estimates_from_both_halves(tmp_path: Any) -> None:
    prefill = tmp_path / "no-estimates.yaml"
    prefill.write_text(
        "name: no-estimates\n"
        "plugins:\n"
        "  - type: inflight-requests-scorer\n"
        "  - type: max-score-picker\n"
        "  - type: inflight-recorder\n"
        "  - type: prefix-index-recorder\n"
        "profile:\n"
        "  scorers: [{plugin: inflight-requests-scorer, weight: 1.0}]\n"
        "  picker: max-score-picker\n"
        "  feedback: [inflight-recorder, prefix-index-recorder]\n"
        "prefix: {block_chars: 256, max_blocks: 512, hash: chained-xor, default_capacity_blocks: 7812}\n"
    )
    build_disaggregated(_pd(prefill=str(prefill)))  # the prefix-based decider reads no estimates
    with pytest.raises(ConfigError, match="ttft-estimates"):
        build_disaggregated(_pd(prefill=str(prefill), decider={"type": "conditional-pd-decider"}))


def test_arriving_blocks_are_bounded_and_forgotten_with_their_requests() -> None:
    profile = load_scheduling("pd")
    assert isinstance(profile, DisaggregatedProfile)
    s = DisaggregatedScheduler(profile, rng=random.Random(3), max_pending=3)
    requests = [request(f"r{i}", text(40 + i, 8000)) for i in range(6)]
    picks = []
    for r in requests:
        result = s.schedule(r, FLEET, NOW)
        assert result.prefill is not None
        s.on_picked(r, result.pick, NOW)
        picks.append(result.pick)

    def arriving() -> int:
        return sum(len(by_id) for by_id in s._arriving_at.values())

    assert arriving() == 3  # the oldest forgotten past max_pending
    for r, pick in zip(requests, picks, strict=True):
        s.on_finished(r, pick, ok=True, now=NOW)
    assert arriving() == 0
    assert s._arriving_at == {}
