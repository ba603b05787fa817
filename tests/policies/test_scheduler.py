from __future__ import annotations

import random
from collections import Counter

import pytest

from kvgate.policies.contracts import Scheduler
from kvgate.policies.errors import NoEligibleEndpointError, RequestShedError
from kvgate.policies.plugins.estimated_ttft import EstimatedTtftScorer
from kvgate.policies.plugins.recorders import PrefixIndexRecorder
from kvgate.policies.profile import load_profile
from kvgate.policies.scheduler import ProfileScheduler
from kvgate.policies.state import InProcessState
from kvgate.policies.types import EndpointView, InferenceRequest, Usage
from tests.policies.helpers import NOW, index_of, request, text, view


def scheduler(profile: str = "default", seed: int = 1, **kwargs: object) -> ProfileScheduler:
    return ProfileScheduler(load_profile(profile), rng=random.Random(seed), **kwargs)  # type: ignore[arg-type]


def run(s: ProfileScheduler, req: InferenceRequest, eps: list[EndpointView], finish: bool = True) -> str:
    pick = s.schedule(req, eps, NOW).pick
    s.on_picked(req, pick, NOW)
    if finish:
        s.on_finished(req, pick, ok=True, now=NOW)
    return pick.address


def test_implements_the_contract_and_ranks_fallbacks() -> None:
    s: Scheduler = scheduler()
    result = s.schedule(request(prompt=text(1, 1000)), [view(i) for i in range(1, 6)], NOW)
    assert len(result.ranked) == 3
    assert len(set(result.ranked)) == 3
    assert result.profile == "default"
    assert set(result.scores) == {f"10.0.0.{i}:8000" for i in range(1, 6)}
    assert len(scheduler(fallbacks=0).schedule(request(), [view(1), view(2)], NOW).ranked) == 1


@pytest.mark.parametrize("profile", ["default", "gie-default", "random", "round-robin"])
def test_identical_endpoints_share_the_load(profile: str) -> None:
    s = scheduler(profile)
    eps = [view(i) for i in range(1, 9)]
    picks = Counter(run(s, request(f"r{i}", text(i, 2000)), eps) for i in range(400))
    assert len(picks) == 8
    assert min(picks.values()) > 15


def test_no_candidates_or_subset_miss_is_503() -> None:
    with pytest.raises(NoEligibleEndpointError):
        scheduler().schedule(request(), [], NOW)
    with pytest.raises(NoEligibleEndpointError):
        scheduler().schedule(request(subset=frozenset({"10.9.9.9"})), [view(1)], NOW)


def test_subset_hint_is_honoured_by_every_profile() -> None:
    eps = [view(i) for i in range(1, 6)]
    for profile in ("default", "gie-default", "random", "round-robin"):
        s = scheduler(profile)
        for i in range(20):
            result = s.schedule(request(f"r{i}", subset=frozenset({"10.0.0.2", "10.0.0.4:8000"})), eps, NOW)
            assert {e.address for e in result.ranked} <= {"10.0.0.2:8000", "10.0.0.4:8000"}


def test_sheddable_request_is_shed_when_all_saturated_and_critical_is_served() -> None:
    eps = [view(1, waiting=9), view(2, kv=0.95), view(3, age=1.0)]
    s = scheduler()
    with pytest.raises(RequestShedError) as shed:
        s.schedule(request(priority=-1), eps, NOW)
    assert shed.value.status == 429
    assert shed.value.headers["retry-after"] == "1"
    # priority >= 0 is never shed: it goes to the least-loaded (the stale one has zero queue)
    picked = s.schedule(request(priority=0), eps, NOW).pick.address
    assert picked in {"10.0.0.2:8000", "10.0.0.3:8000"}
    # one unsaturated endpoint: the sheddable request is admitted and goes there
    assert s.schedule(request(priority=-1), [*eps, view(4)], NOW).pick.address == "10.0.0.4:8000"
    with pytest.raises(RequestShedError):
        scheduler("gie-default").schedule(request(priority=-5), eps, NOW)


def test_a_sheddable_request_is_shed_when_no_endpoint_is_expected_to_meet_its_ttft_objective() -> None:
    """llm-d's latency-slo-admitter, on kvgate's cost model: busy endpoints (work queued and running,
    nothing saturated) expected at hundreds of ms; a sheddable request asking 5 ms is 429, one asking
    60 s is served, a critical one is never shed, and an idle endpoint admits it (its estimate is
    the prompt alone)."""
    busy = [view(1, waiting=3, running=20), view(2, waiting=2, running=30)]
    prompt = text(7, 4000)
    s = scheduler()
    tight = {"x-slo-ttft-ms": "5"}
    with pytest.raises(RequestShedError) as shed:
        s.schedule(request(prompt=prompt, priority=-1, headers=tight), busy, NOW)
    assert shed.value.status == 429
    assert "x-slo-ttft-ms" in str(shed.value)
    assert shed.value.headers["retry-after"] == "1"
    s.schedule(request(prompt=prompt, priority=-1, headers={"x-slo-ttft-ms": "60000"}), busy, NOW)
    s.schedule(request(prompt=prompt, priority=0, headers=tight), busy, NOW)
    s.schedule(request(prompt=prompt, priority=-1, headers={"x-slo-ttft-ms": "bad"}), busy, NOW)
    s.schedule(request(prompt=prompt, priority=-1, headers=tight), [*busy, view(3)], NOW)
    # a profile without the cost model has no estimates: admitted
    scheduler("gie-default").schedule(request(prompt=prompt, priority=-1, headers=tight), busy, NOW)


def test_the_latency_admission_weighs_both_objectives_on_one_endpoint() -> None:
    """A TPOT objective: the decode step as scraped (5.75 ms + 6 µs × running). One endpoint with
    a short queue but a large batch, one with a long queue and a small batch: a sheddable request
    asking both a tight TTFT and a tight TPOT meets neither anywhere (429); either alone is met."""
    endpoints = [view(1, waiting=1, running=400), view(2, waiting=30, running=2)]
    prompt = text(9, 2000)
    s = scheduler()

    def ask(**objectives: str) -> None:
        headers = {f"x-slo-{name}-ms": value for name, value in objectives.items()}
        s.schedule(request(prompt=prompt, priority=-1, headers=headers), endpoints, NOW)

    ask(ttft="80")  # endpoint 1's short queue
    ask(tpot="7")  # endpoint 2's small batch
    with pytest.raises(RequestShedError, match=r"x-slo-ttft-ms .* and x-slo-tpot-ms"):
        ask(ttft="80", tpot="7")
    ask(ttft="60000", tpot="60000")


def test_saturated_replicas_get_nothing_while_others_have_room() -> None:
    s = scheduler()
    eps = [view(1, waiting=20), view(2, kv=0.97), view(3), view(4)]
    picks = {run(s, request(f"r{i}", text(i, 3000)), eps) for i in range(100)}
    assert picks == {"10.0.0.3:8000", "10.0.0.4:8000"}


@pytest.mark.parametrize("profile", ["default", "gie-default"])
def test_shared_prefix_concentrates(profile: str) -> None:
    s = scheduler(profile)
    eps = [view(i) for i in range(1, 9)]
    system = text(99, 8000)
    picks = Counter(run(s, request(f"r{i}", system + text(i, 400)), eps) for i in range(100))
    assert len(picks) <= 2
    rr = scheduler("round-robin")
    assert len(Counter(run(rr, request(f"r{i}", system + text(i, 400)), eps) for i in range(100))) == 8


def test_death_spiral_avoided_hot_prefix_leaves_a_deeply_queued_sticky_endpoint() -> None:
    s = scheduler()
    system = text(7, 8000)
    warm = [view(i) for i in range(1, 5)]
    sticky = run(s, request("warm", system + "q0"), warm)
    # the sticky endpoint is now deep in queue (below the saturation threshold: the cost model decides)
    idx = index_of(sticky)
    busy = [view(i, waiting=4, running=200, kv=0.7) if i == idx else view(i) for i in range(1, 5)]
    assert all(run(s, request(f"r{i}", system + text(i, 200)), busy) != sticky for i in range(20))
    # ...while a lightly loaded sticky endpoint keeps its affinity
    light = [view(i, running=2) if i == idx else view(i) for i in range(1, 5)]
    s2 = scheduler()
    run(s2, request("warm", system + "q0"), warm)
    first = run(s2, request("again", system + "q1"), light)
    assert first == run(s2, request("again2", system + "q2"), light)


def test_burst_between_scrapes_spreads_via_own_inflight_counts() -> None:
    s = scheduler()
    system = text(5, 16000)
    eps = [view(i) for i in range(1, 5)]  # metrics never change during the burst
    # ~1,000 uncached tokens per request: 40 of them are seconds of prefill on one replica (40 short
    # questions would rightly stay: they fit one batch, and leaving costs the 4k-token prefix twice)
    picks = Counter(run(s, request(f"r{i}", system + text(i, 4000)), eps, finish=False) for i in range(40))
    assert len(picks) >= 2
    assert max(picks.values()) < 40


def test_inflight_accounting_never_leaks() -> None:
    state = InProcessState()
    s = scheduler(state=state)
    eps = [view(i) for i in range(1, 4)]
    reqs = [request(f"r{i}", text(i, 1000)) for i in range(30)]
    picks = {}
    for r in reqs:
        picks[r.request_id] = s.schedule(r, eps, NOW).pick
        s.on_picked(r, picks[r.request_id], NOW)
    assert state.inflight_requests() == 30
    assert sum(state.inflight(e.address).requests for e in eps) == 30
    moved = reqs[0]
    other = next(e.endpoint for e in eps if e.endpoint != picks[moved.request_id])
    s.on_served(moved, other, NOW)
    assert sum(state.inflight(e.address).requests for e in eps) == 30
    for r in reqs:
        s.on_finished(r, picks[r.request_id], ok=False, now=NOW)
        s.on_finished(r, picks[r.request_id], ok=False, now=NOW)  # twice: idempotent
    assert state.inflight_requests() == 0
    assert all(state.inflight(e.address).requests == 0 and state.inflight(e.address).tokens == 0 for e in eps)


def test_forget_endpoint_drops_its_state() -> None:
    state = InProcessState()
    s = scheduler(state=state)
    req = request("r1", text(1, 2000), session="s1")
    run(s, req, [view(1)], finish=False)
    s.forget_endpoint("10.0.0.1:8000")
    assert state.inflight_requests() == 0
    assert state.session_get("s1") is None
    assert state.prefix.total_entries == 0
    s.on_finished(req, view(1).endpoint, ok=True, now=NOW)  # late finish: harmless
    assert state.inflight_requests() == 0


def test_session_affinity_sticks_while_eligible() -> None:
    s = scheduler()
    eps = [view(i) for i in range(1, 9)]
    first = run(s, request("r0", text(0, 300), headers={"x-session-id": "abc"}), eps)
    header = {"x-session-id": "abc"}
    assert all(run(s, request(f"r{i}", text(i, 300), headers=header), eps) == first for i in range(1, 30))
    idx = index_of(first)
    saturated = [view(i, waiting=10) if i == idx else view(i) for i in range(1, 9)]
    assert run(s, request("rx", text(50, 300), headers={"x-session-id": "abc"}), saturated) != first


def test_usage_feedback_shrinks_and_regrows_capacity() -> None:
    state = InProcessState()
    s = scheduler("gie-default", state=state)
    eps = [view(1, num_gpu_blocks=1000)]
    system = text(3, 64 * 100)
    run(s, request("warm", system), eps)
    req = request("r2", system + "x" * 64)
    pick = s.schedule(req, eps, NOW).pick
    s.on_picked(req, pick, NOW)
    s.on_usage(req, pick, Usage(prompt_tokens=1616, completion_tokens=5, cached_tokens=0), NOW)
    s.on_finished(req, pick, ok=True, now=NOW)
    [recorder] = [f for f in s.feedback if isinstance(f, PrefixIndexRecorder)]
    assert recorder.capacity(eps[0]) < 1000  # learned: this replica evicts sooner than its size suggests
    for i in range(20):
        r = request(f"h{i}", system + text(i, 64))
        p = s.schedule(r, eps, NOW).pick
        s.on_picked(r, p, NOW)
        s.on_usage(r, p, Usage(prompt_tokens=1616, completion_tokens=5, cached_tokens=1600), NOW)
        s.on_finished(r, p, ok=True, now=NOW)
    assert recorder.capacity(eps[0]) == 1000


class Recorder:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str, float]] = []

    def observe(self, extension_point: str, plugin_type: str, plugin_name: str, seconds: float) -> None:
        self.seen.append((extension_point, plugin_type, plugin_name, seconds))


def test_per_plugin_timing_through_injected_timer_and_clock() -> None:
    ticks = iter(range(1000))
    recorder = Recorder()
    s = scheduler("default", timer=recorder, clock=lambda: float(next(ticks)))
    s.schedule(request(prompt=text(1, 500)), [view(1), view(2)], NOW)
    assert [(p, t, n) for p, t, n, _s in recorder.seen] == [
        ("filter", "stored-response-filter", "stored-response-filter"),
        ("filter", "candidate-set", "candidate-set"),
        ("filter", "healthy-filter", "healthy-filter"),
        ("filter", "saturation-filter", "saturation-filter"),
        ("scorer", "estimated-ttft-scorer", "ttft"),
        ("scorer", "session-affinity-scorer", "session-affinity-scorer"),
        ("picker", "max-score-picker", "max-score-picker"),
    ]
    assert all(seconds == 1.0 for *_x, seconds in recorder.seen)


def test_same_seed_same_decisions() -> None:
    eps = [view(i) for i in range(1, 9)]
    a = [run(scheduler(seed=3), request(f"r{i}", text(i, 500)), eps) for i in range(20)]
    b = [run(scheduler(seed=3), request(f"r{i}", text(i, 500)), eps) for i in range(20)]
    assert a == b


def test_timing_can_sample_one_request_in_n() -> None:
    recorder = Recorder()
    s = scheduler("gie-default", timer=recorder, timing_every=3)
    for i in range(7):
        s.schedule(request(f"r{i}", text(i, 300)), [view(1), view(2)], NOW)
    timed_requests = sum(1 for point, *_rest in recorder.seen if point == "picker")
    assert timed_requests == 3  # requests 0, 3 and 6
    assert len(recorder.seen) == 3 * 6  # stored-response and healthy filters, three scorers, picker


def test_scores_are_a_mapping_by_address_in_candidate_order() -> None:
    eps = [view(3, waiting=2), view(1), view(2, waiting=4)]
    scores = scheduler("gie-default").schedule(request(), eps, NOW).scores
    assert list(scores) == [e.address for e in eps]
    assert len(scores) == 3
    assert scores["10.0.0.1:8000"] > scores["10.0.0.3:8000"] > scores["10.0.0.2:8000"]
    assert "10.0.0.9:8000" not in scores


def test_a_spilled_adapter_burst_stays_on_the_replica_already_loading_it() -> None:
    """Between two scrapes, the picker's own in-flight adapters count as resident (no new slot):
    requests for adapter x that must leave its busy home replica follow the first spill instead of
    taking a LoRA slot on every replica (``policies.inflight_models``)."""
    s = scheduler()
    both = frozenset({"x", "y"})
    eps = [
        view(1, active=both, max_loras=2, waiting=24, running=200),  # x's home: a deep queue
        *(view(i, active=frozenset({"y"}), max_loras=2) for i in range(2, 6)),
    ]
    picks = [run(s, request(f"r{i}", text(i, 400), model="x"), eps, finish=False) for i in range(12)]
    assert "10.0.0.1:8000" not in picks
    assert len(set(picks)) == 1, Counter(picks)  # the first spill, then its resident adapter
    assert s.inflight_models[picks[0]] == {"x": 12}
    for i in range(12):  # finished requests leave nothing behind
        s.on_finished(request(f"r{i}", model="x"), eps[0].endpoint, ok=True, now=NOW)
    assert dict(s.inflight_models) == {}


def test_an_adapter_stays_known_when_none_of_its_requests_runs() -> None:
    """A rarely used adapter with nothing running anywhere is still an adapter: it goes to a
    replica with a free slot, not to a lighter one whose slots are all taken by other adapters."""
    s = scheduler()
    full = frozenset({"a", "b", "c"})
    seen = [view(1, active=frozenset({"x"}), max_loras=3), view(2, active=full, max_loras=3)]
    run(s, request("warm", text(1, 400), model="x"), seen)  # a scrape once showed x on replica 1
    now = [
        view(1, active=frozenset({"y"}), max_loras=3, running=60),  # a free slot, busier
        view(2, active=full, max_loras=3),  # lighter, but every slot taken
    ]
    for i in range(5):
        assert run(s, request(f"r{i}", text(i + 10, 400), model="x"), now) == "10.0.0.1:8000"
    # a base model (never seen as an adapter) just takes the lighter replica
    assert run(s, request("base", text(99, 400), model="base"), now) == "10.0.0.2:8000"


def test_ours_in_flight_do_not_make_an_adapter_resident_where_the_scrape_shows_it_waiting() -> None:
    """An adapter sent to a replica whose slots were all taken waits there for one: once the scrape
    shows it only waiting, the next request for it goes where a slot is free, instead of queueing
    behind (the lora-mix p99 of 250-460 ms in replays: rare adapters piled onto a starved replica)."""
    s = scheduler()
    full = frozenset({"a", "b", "c"})
    served = frozenset({"base"})
    eps = [view(1, active=full, max_loras=3, served=served), view(2, active=full, max_loras=3, served=served)]
    first = run(s, request("r0", text(1, 400), model="x"), eps, finish=False)
    other = 3 - index_of(first)
    stuck = [
        view(index_of(first), active=full, waiting_loras=frozenset({"x"}), waiting=1, max_loras=3,
             served=served),
        view(other, active=frozenset({"a"}), max_loras=3, running=40, served=served),  # busier, a free slot
    ]
    assert run(s, request("r1", text(2, 400), model="x"), stuck) == f"10.0.0.{other}:8000"


def test_a_long_document_stays_on_the_replica_that_read_it_while_its_queue_is_short() -> None:
    # a 20k-token document (80,000 chars): its replica saves ~345 ms of prefill, which two queued
    # requests there do not outweigh. With an index reach of 128 blocks (~8k tokens) the saving looked
    # like 8k tokens and the document went elsewhere to be read again (long-prompts p90 2.6 s).
    s = scheduler()
    document = text(11, 80_000)
    eps = [view(i) for i in range(1, 5)]
    owner = run(s, request("read", document + "first question"), eps)
    idx = index_of(owner)
    queued = [view(i, waiting=2, running=8) if i == idx else view(i, running=8) for i in range(1, 5)]
    assert all(run(s, request(f"q{i}", document + text(i, 250)), queued) == owner for i in range(10))


def test_requests_running_at_the_scrape_are_not_a_queue_when_fewer_of_ours_are_in_flight() -> None:
    # The scrape shows 10 running; since then most of ours finished and one is still decoding. The
    # 9 running requests that are not ours in flight (finished since, or another picker's) are no
    # queue: a chat's next turn stays where its history is cached. (They were counted as waiting,
    # ~20 ms + a prefill each, and pushed 36 % of multi-turn follow-ups off their replica.)
    s = scheduler()
    eps = [view(i, running=10) for i in range(1, 5)]
    history = text(21, 3000)
    owner = run(s, request("turn0", history), eps)
    decoding = request("other", text(22, 1200))
    owner_endpoint = eps[index_of(owner) - 1].endpoint
    s.on_picked(decoding, owner_endpoint, NOW)
    s.on_first_token(decoding, owner_endpoint, NOW)
    assert all(run(s, request(f"t{i}", history + text(30 + i, 400)), eps, finish=False) == owner
               for i in range(3))


def _busy_owner_of_a_document(s: ProfileScheduler, gap_s: float) -> tuple[str, str, float]:
    """40 short requests ``gap_s`` apart, still decoding on 4 replicas, then a 20k-token document
    read on one of them that then gets three other 20k-token reads queued (~1 s of prefill):
    (owner, document, now)."""
    eps = [view(i) for i in range(1, 5)]
    now = NOW
    for k in range(40):
        now += gap_s
        req = request(f"w{k}", text(100 + k, 400))
        pick = s.schedule(req, eps, now).pick
        s.on_picked(req, pick, now)
        s.on_first_token(req, pick, now)
    document = text(11, 80_000)
    read = request("read", document + "first question")
    owner = s.schedule(read, eps, now).pick
    s.on_picked(read, owner, now)
    s.on_first_token(read, owner, now)
    for k in range(3):  # other documents' first reads, still queued there
        s.on_picked(request(f"other{k}", text(200 + k, 80_000)), owner, now)
    return owner.address, document, now


def test_a_long_document_is_not_read_again_elsewhere_while_requests_arrive_often() -> None:
    # 100 req/s over 4 replicas, each serving ~10: a second read of the document elsewhere (~345 ms
    # of prefill) would delay the ~25/s arriving there, which the externality prices
    # (delay_externality); waiting ~1 s behind the owner's queue costs only this request. (Re-reads
    # like this in the cold-start burst of the long-prompts benchmark set its p90 TTFT: 206 -> 38 ms
    # in bench/replay.py.)
    s = scheduler()
    owner, document, now = _busy_owner_of_a_document(s, gap_s=0.01)
    eps = [view(i) for i in range(1, 5)]
    req = request("q", document + text(5, 250))
    assert s.schedule(req, eps, now).pick.address == owner


def test_a_long_document_is_read_again_on_an_idle_replica_when_requests_are_rare() -> None:
    # The same queue at 1 req/s: few requests would wait behind a second read, so the request takes
    # the replica where it starts soonest (the externality scales with the arrival rate).
    s = scheduler()
    owner, document, now = _busy_owner_of_a_document(s, gap_s=1.0)
    eps = [view(i) for i in range(1, 5)]
    req = request("q", document + text(5, 250))
    assert s.schedule(req, eps, now).pick.address != owner


def _document_estimates(pickers: list[ProfileScheduler]) -> list[float]:
    """40 short requests 10 ms apart, dealt round-robin to ``pickers`` (one shared state) and placed
    on 4 replicas in turn, still decoding; the first picker's estimated costs for a new 20k-token
    document there (one per replica, in order)."""
    eps = [view(i) for i in range(1, 5)]
    now = NOW
    for k in range(40):
        now += 0.01
        s = pickers[k % len(pickers)]
        req = request(f"w{k}", text(100 + k, 400))
        s.schedule(req, eps, now)  # counted as an arrival by the picker that scored it
        endpoint = eps[(0, 0, 1, 2)[k % 4]].endpoint  # 20, 10, 10 and no requests
        s.on_picked(req, endpoint, now)
        s.on_first_token(req, endpoint, now)
    first = pickers[0]
    scorer = next(w.plugin for w in first.profile.scorers if w.plugin_type == "estimated-ttft-scorer")
    assert isinstance(scorer, EstimatedTtftScorer)
    return scorer.estimates(first.context(request("doc", text(7, 80_000)), now + 0.01), eps)


def test_pickers_sharing_state_price_the_arrivals_of_all_of_them() -> None:
    # Two pickers share one state (as through Redis) and each sees half the arrivals: each must
    # still price a long prefill by every picker's arrivals at the replica (its own rate × the
    # shared in-flight counts / its own in-flight count), as one picker seeing them all does.
    alone = _document_estimates([scheduler()])
    shared = InProcessState()
    together = _document_estimates([scheduler(state=shared), scheduler(state=shared, seed=2)])
    assert together == pytest.approx(alone, rel=0.05)


def _prefill_tokens(s: ProfileScheduler, address: str) -> int:
    inflight = s.state.inflight_by_endpoint().get(address)
    return inflight.tokens if inflight is not None else 0


def test_an_unseen_first_token_ends_the_prefill_at_the_estimated_ttft_not_before() -> None:
    # kvgate's one-pass data path does not show the response body: the prompt's prefill tokens stay
    # counted until the TTFT the scorer estimated for the pick, then leave at the next schedule.
    s = scheduler()
    eps = [view(i) for i in range(1, 5)]
    long_read = request("doc", text(5, 40_000))
    pick = s.schedule(long_read, eps, NOW).pick
    s.on_picked(long_read, pick, NOW)
    s.on_first_token_unseen(long_read, pick, NOW + 0.001)
    assert _prefill_tokens(s, pick.address) > 5_000  # ~10k tokens: ~0.2 s of estimated prefill
    s.schedule(request("soon", text(6, 400)), eps, NOW + 0.01)
    assert _prefill_tokens(s, pick.address) > 5_000
    s.schedule(request("later", text(7, 400)), eps, NOW + 5.0)
    assert _prefill_tokens(s, pick.address) == 0
    assert s.state.inflight_by_endpoint()[pick.address].requests == 1  # still decoding there
    s.on_finished(long_read, pick, ok=True, now=NOW + 6.0)
    assert pick.address not in s.state.inflight_by_endpoint()


def test_an_unseen_first_token_without_a_ttft_estimate_ends_the_prefill_at_once() -> None:
    s = scheduler("gie-default")
    eps = [view(i) for i in range(1, 5)]
    req = request("r", text(5, 4_000))
    pick = s.schedule(req, eps, NOW).pick
    s.on_picked(req, pick, NOW)
    s.on_first_token_unseen(req, pick, NOW)
    assert _prefill_tokens(s, pick.address) == 0


def test_a_request_finished_before_its_estimated_first_token_leaves_nothing_behind() -> None:
    s = scheduler()
    eps = [view(i) for i in range(1, 5)]
    req = request("short", text(5, 40_000))
    pick = s.schedule(req, eps, NOW).pick
    s.on_picked(req, pick, NOW)
    s.on_first_token_unseen(req, pick, NOW)
    s.on_finished(req, pick, ok=False, now=NOW + 0.001)
    s.schedule(request("later", text(7, 400)), eps, NOW + 5.0)  # the due entry fires on nothing
    assert pick.address not in s.state.inflight_by_endpoint()


def test_the_result_names_the_hit_expected_on_the_pick_and_on_the_best_endpoint() -> None:
    """What the regret check compares with a response's cached tokens (``extproc.picked_request``):
    the pick's expected hit, and the best endpoint's; a profile without the prefix index names none."""
    s = scheduler()
    doc = text(5, 4000)  # 15 whole blocks of 256 characters: 960 estimated tokens
    warm = request("warm", doc)
    s.on_picked(warm, view(2).endpoint, NOW)
    result = s.schedule(request("r", doc + " and more"), [view(1), view(2), view(3)], NOW)
    assert result.best_cached_tokens == 960
    assert result.predicted_cached_tokens == (960 if result.pick.address == view(2).address else 0)
    plain = scheduler("round-robin").schedule(request("x", doc), [view(1), view(2)], NOW)
    assert plain.predicted_cached_tokens is None
