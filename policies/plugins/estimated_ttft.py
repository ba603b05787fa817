"""Load-aware prefix affinity: score each endpoint by an estimate of this request's TTFT there.

Why not "prefix score + load score" (GIE) or "prefix unless imbalanced" (cache-aware routers)?

- A weighted sum of a prefix score and a queue score has no common unit: a 2k-token shared prompt
  saves ~35 ms of prefill, one queued request costs anywhere from 2 ms to seconds. Fixed weights
  either pile a hot prefix onto one replica until it drowns (the cache-aware "death spiral": the
  replica holding the prefix is always preferred, so its queue grows, so it keeps its prefix hot)
  or throw affinity away.
- An imbalance switch (route by shortest queue once loads differ by X) drops affinity for every
  request at once, and every replica then recomputes every prefix.

Here both sides are seconds, per endpoint ``e``::

    uncached(e) = prompt_tokens − matched_blocks(e) · tokens_per_block      (this request's prefill)
    unknown(e)  = max(0, waiting(e) − max(0, own_requests(e) − running(e)))   (scraped waiting that
                                                our own not-yet-running requests do not explain: others')
    pending(e)  = own_prefill_tokens(e) + unknown(e) · uncached(e)          (work ahead of us)
    step(e)     = step_s + decode_s_per_token · running(e)                  (decode batch slows steps)
    work        = pending(e) + uncached(e)
    ttft(e)     = step(e) · (1 + ceil(work / max_batched_tokens)) + prefill_s_per_token · work
                  + queue_wait_s · unknown(e)        (a queue we did not send may wait for free slots)
                  + kv_penalty_s · max(0, kv − kv_knee) / (1 − kv_knee)   (near-full KV: preemption)
                  + LoRA cost (0 active or ours in flight there, unless the scrape shows it only
                    waiting; lora_load_s when the distinct adapters shown plus ours the scrape does
                    not show yet (``policies.inflight_models``) leave a slot free; lora_wait_s
                    queued there; else lora_no_slot_s · (1 + adapters queued there for a slot))
                  + miss_penalty_factor · prefill_s_per_token · (uncached(e) − min_e' uncached(e'))
    cost(e)     = ttft(e) · (1 + delay_externality · prefill_s_per_token · uncached(e) · λ(e))

The miss penalty is the cost a spill leaves behind: the prefix it rebuilds on ``e`` evicts another
group's cached blocks there (full caches are the steady state), which that group pays again later,
and the replica that holds the prefix keeps it only while it is used. With factor 1 a request
leaves its prefix's replica only when the queueing there costs about twice the prefill it saves.

The ``cost`` line prices what this request's prefill costs *other* requests: every request that
reaches ``e`` while this one waits and prefills there (about ``λ(e) · ttft(e)`` of them) waits
``prefill(e)`` longer. ``λ(e)`` is the pool's arrival rate over the last 64 requests, split like the
requests in flight (``λ · own_requests(e) / this picker's requests in flight``: by Little's law,
with similar service times, requests in flight are in proportion to arrivals; with several pickers
sharing state, ``own_requests(e)`` counts theirs too and ``λ`` is this picker's, so ``λ(e)`` is
every picker's arrivals at ``e``), or ``λ / N`` when this picker has none in flight: a replica that
serves many requests has many waiting behind a long prefill there, an idle one few. A greedy
estimate of one request's TTFT misses this: in a burst where every replica is busy, a request whose
document's replica had the longest queue re-read the document elsewhere and delayed everyone queued
behind that re-read (long prompts at 0.9 × capacity re-read documents after warm-up without it,
and none with factor 0.5: docs/routing.md, finding 11). A request whose prefix is cached has little
prefill and so little externality; spills of long prompts and new documents on a busy fleet get the
most.

``score(e) = min_cost / cost(e)`` in (0, 1]. A hot prefix stays on its replica while the
queueing there costs less than the prefill it saves, then spills to the next-cheapest replica,
which learns the prefix at pick time (the index is updated in ``on_picked``): hot groups spread
over as many replicas as their load needs, and cold groups keep their affinity. ``own_requests`` /
``own_prefill_tokens`` (this picker's in-flight requests, and the uncached prompt tokens of those
that have not produced their first token yet: ``Scheduler.on_first_token``) change at pick time, so
a burst between two scrapes spreads instead of herding onto the replica that looked best at the
last scrape, and a replica busy decoding does not look queued. Our own waiting requests are priced
by their exact prefill work, not again per waiting request (``queue_wait_s`` would double-count
them and push a hot prefix off its replica at the first burst). Ties (e.g. an idle fleet and a new
prompt) are left to the picker's random tie-break.

Defaults are the simulator's physics (docs/simulator.md: 5752.7 µs + 17.25 µs/prefill token + 6 µs/decode
token per step); ``queue_wait_s``, ``kv_*`` and the LoRA costs are starting points the routing
benchmark (issue 5) tunes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from pydantic import Field

from kvgate.policies.arrival_rate import ArrivalRate
from kvgate.policies.framework import IN_FLIGHT, OWN_MODELS, PREFIX_INDEX, TTFT_ESTIMATES, SchedulingContext
from kvgate.policies.latency_objectives import TPOT_SLO_HEADER
from kvgate.policies.memo import ViewRecords
from kvgate.policies.plugins.params import Params, parse_params
from kvgate.policies.types import EndpointMetrics, EndpointView

ARRIVAL_WINDOW = 64  # requests the arrival rate λ is measured over
MAX_KNOWN_ADAPTERS = 4096
"""Adapter names remembered (oldest forgotten first): a model is priced as a LoRA adapter once any
scrape showed it active or waiting, even when no replica runs it at the moment. (Judged from the
current scrape alone, a rarely used adapter looked like a base model whenever none of its requests
was running, and was sent to replicas with every slot busy: the lora-mix tail, docs/routing.md,
finding 14.) Before
any scrape shows it, a model is an adapter on a LoRA-enabled endpoint whose page labels its gauges
with other model names (vLLM's ``model_name``: ``EndpointMetrics.served_models``), so a rare
adapter's first request is priced as one too. Limit: a base model requested by a second
``--served-model-name`` alias (vLLM labels with the first) is then priced as an adapter."""


class EstimatedTtftParams(Params):
    step_s: Annotated[float, Field(ge=0.0)] = 0.0057527
    prefill_s_per_token: Annotated[float, Field(ge=0.0)] = 17.25e-6
    decode_s_per_token: Annotated[float, Field(ge=0.0)] = 6.0e-6
    max_batched_tokens: Annotated[int, Field(ge=1)] = 8192
    queue_wait_s: Annotated[float, Field(ge=0.0)] = 0.02
    kv_knee: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.9
    kv_penalty_s: Annotated[float, Field(ge=0.0)] = 0.2
    lora_load_s: Annotated[float, Field(ge=0.0)] = 0.02
    lora_wait_s: Annotated[float, Field(ge=0.0)] = 0.2
    lora_no_slot_s: Annotated[float, Field(ge=0.0)] = 1.0
    miss_penalty_factor: Annotated[float, Field(ge=0.0)] = 0.0
    """Extra cost of leaving the best-cached replica, per prefill second lost (see the docstring)."""
    delay_externality: Annotated[float, Field(ge=0.0)] = 0.0
    """Weight of the delay this request's prefill imposes on requests arriving behind it (docstring)."""
    time_scale: Annotated[float, Field(gt=0.0)] = 1.0
    """Clock seconds per cost-model second: 1 in production; a benchmark's slowed fleet sets its own."""


_Record = tuple[str, int, int, float, float, EndpointMetrics | None, frozenset[str]]
"""Per endpoint, from its view alone: address, waiting, running, step seconds, near-full-KV penalty seconds,
the metrics when the endpoint serves LoRA adapters (else None) and the adapters its scrape shows
(active or waiting)."""


class EstimatedTtftScorer:
    """Scores endpoints by ``min_cost / cost`` (estimated TTFT and externality; see the module docstring).

    What depends only on an endpoint's view is computed once per snapshot (:class:`ViewRecords`);
    per request the loop adds what changes per request: the prompt's prefix match and this picker's
    in-flight work, which is read fresh every time (the anti-herding signal).
    """

    consumes = frozenset({PREFIX_INDEX, IN_FLIGHT, OWN_MODELS})
    produces = frozenset({TTFT_ESTIMATES})

    def __init__(self, params: EstimatedTtftParams | None = None) -> None:
        self.params = params or EstimatedTtftParams()
        self._records: ViewRecords[_Record] = ViewRecords(self._record)
        self._known_adapters: dict[str, None] = {}  # insertion-ordered, bounded: MAX_KNOWN_ADAPTERS
        self._arrivals = ArrivalRate(ARRIVAL_WINDOW, self.params.time_scale)

    @staticmethod
    def from_parameters(parameters: Mapping[str, Any] | None) -> EstimatedTtftScorer:
        return EstimatedTtftScorer(parse_params(EstimatedTtftParams, parameters, "estimated-ttft-scorer"))

    def _record(self, view: EndpointView) -> _Record:
        p = self.params
        m = view.metrics
        if m is None:
            waiting = running = 0
            kv = 0.0
        else:
            waiting, running, kv = m.waiting, m.running, m.kv_cache_usage
        kv_s = p.kv_penalty_s / (1.0 - p.kv_knee) * (kv - p.kv_knee) if kv > p.kv_knee else 0.0
        lora = m if m is not None and (m.max_loras or m.active_loras) else None
        shown = m.active_loras | m.waiting_loras if m is not None else frozenset()
        if shown:
            self._learn_adapters(shown)
        step = p.step_s + p.decode_s_per_token * running
        return (view.endpoint.address, waiting, running, step, kv_s, lora, shown)

    def _learn_adapters(self, names: frozenset[str]) -> None:
        known = self._known_adapters
        for name in names:
            if name not in known:
                known[name] = None
                if len(known) > MAX_KNOWN_ADAPTERS:
                    del known[next(iter(known))]

    def estimates(self, ctx: SchedulingContext, endpoints: Sequence[EndpointView]) -> list[float]:
        """Cost per endpoint in seconds, in order: the estimated TTFT, times the externality factor
        when ``delay_externality`` is set (one pass; the hot path of ``default``)."""
        p = self.params
        prompt_tokens = ctx.prompt_tokens()
        tokens_per_block = ctx.tokens_per_block
        matches = ctx.prefix_matches() if prompt_tokens else {}
        uncached_on = {  # this request's prefill per endpoint holding part of its prompt (a few)
            address: max(0, prompt_tokens - blocks * tokens_per_block) for address, blocks in matches.items()
        }.get
        adapter = ctx.request.target_model
        own_inflight = ctx.state.inflight_by_endpoint().get
        own_models = ctx.own_models.get
        prefill_s, max_batched, queue_wait_s = p.prefill_s_per_token, p.max_batched_tokens, p.queue_wait_s
        miss_s = p.miss_penalty_factor * prefill_s
        if miss_s and matches:  # the least prefill any endpoint offers (a miss elsewhere costs more)
            best_uncached = max(0, prompt_tokens - max(matches.values()) * tokens_per_block)
        else:
            miss_s = 0.0
            best_uncached = prompt_tokens
        by_share = by_endpoint = 0.0  # externality, of ttft per uncached token: × own requests there
        if p.delay_externality:  # (λ split by in-flight requests) or not (λ / N, none in flight)
            self._arrivals.observe(ctx.request.request_id, ctx.now)
            externality = p.delay_externality * prefill_s * self._arrivals.per_second()
            if ctx.own_requests:  # λ(e) = λ · in_flight(e) / own (Little's law; own: this picker's)
                by_share = externality / ctx.own_requests
            else:
                by_endpoint = externality / len(endpoints)
        out: list[float] = []
        append = out.append
        ttfts: dict[str, float] = {}  # clock seconds to the first token, for on_first_token_unseen
        time_scale = p.time_scale
        records = self._records.get(endpoints)  # (learns the adapters these views show)
        known_adapters = self._known_adapters
        is_adapter = adapter in known_adapters
        for address, waiting, running, step, kv_s, lora, shown in records:
            uncached = uncached_on(address, prompt_tokens)
            own = own_inflight(address)
            if own is None:
                unknown = waiting
                work: float = waiting * uncached + uncached
            else:
                # ours not yet running at the scrape, or picked since (never negative: when fewer of
                # ours are in flight than the scrape shows running, ours finished since or others'
                # run there, and neither is a queue)
                unseen = own.requests - running if own.requests > running else 0
                unknown = waiting - unseen if waiting > unseen else 0
                work = own.tokens + unknown * uncached + uncached
            ttft = step * (1.0 + -(-work // max_batched)) + prefill_s * work
            if unknown and queue_wait_s:
                ttft += queue_wait_s * unknown
            if kv_s:
                ttft += kv_s
            if miss_s and uncached > best_uncached:
                ttft += miss_s * (uncached - best_uncached)
            if (
                lora is not None
                and adapter not in lora.active_loras
                and (is_adapter or (lora.served_models and adapter not in lora.served_models))
            ):
                mine = own_models(address)
                # ours in flight there: resident, unless the scrape shows it only waiting (no slot yet)
                if not (mine and adapter in mine) or adapter in lora.waiting_loras:
                    ttft += _lora_cost(p, lora, adapter, shown, _new_slots(shown, mine, known_adapters))
            ttfts[address] = ttft * time_scale
            if by_share:
                if own is not None:
                    ttft *= 1.0 + by_share * own.requests * uncached
            elif by_endpoint:
                ttft *= 1.0 + by_endpoint * uncached
            append(ttft)
        ctx.ttft_estimates = ttfts
        if TPOT_SLO_HEADER in ctx.request.headers:  # (the latency admission's: policies.scheduler)
            ctx.tpot_estimates = {record[0]: record[3] * time_scale for record in records}
        return out

    def dense_scores(self, ctx: SchedulingContext, endpoints: Sequence[EndpointView]) -> list[float]:
        """``min_cost / cost`` per endpoint, in order (1.0 for zero estimates when the best is zero)."""
        estimates = self.estimates(ctx, endpoints)
        best = min(estimates)
        if best <= 0.0:
            return [1.0 if t <= 0.0 else 0.0 for t in estimates]
        return [best / t for t in estimates]

    def score(self, ctx: SchedulingContext, endpoints: Sequence[EndpointView]) -> Mapping[str, float]:
        scores = self.dense_scores(ctx, endpoints)
        return dict(zip([e.endpoint.address for e in endpoints], scores, strict=True))


def _lora_cost(
    p: EstimatedTtftParams, m: EndpointMetrics, adapter: str, shown: frozenset[str], taken: int = 0
) -> float:
    """Extra wait for an adapter not active on the endpoint: load it, wait for it, or wait for a slot.

    ``shown``: the distinct adapters the scrape shows (active or waiting: one slot each; the
    snapshot record's union). ``taken``: slots this picker's in-flight adapters occupy beyond them.
    """
    if m.max_loras > 0 and len(shown) + taken < m.max_loras:
        return p.lora_load_s
    if adapter in m.waiting_loras:
        return p.lora_wait_s
    # each adapter already queued there for a slot is served first
    return p.lora_no_slot_s * (1 + len(m.waiting_loras - m.active_loras))


def _new_slots(shown: frozenset[str], mine: Mapping[str, int] | None, known: Mapping[str, None]) -> int:
    """Adapters this picker has in flight on the endpoint that its scrape does not show yet."""
    if not mine:
        return 0
    return sum(1 for name in mine if name in known and name not in shown)
