"""A straightforward reference of ``ProfileScheduler.schedule``: the pipeline as first written,
with no memo, no positional summing and no fast paths (what the optimised scheduler must equal).

Every plugin is re-implemented here from its definition, by plugin type, reading the parameters of
the profile's plugin instances; scores are summed into a dict keyed by address, clamped, in scorer
order; pickers sort everything. It reads the scheduler's state and never writes it.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Mapping, Sequence

from kvgate.policies.contracts import SchedulingResult
from kvgate.policies.errors import NoEligibleEndpointError, RequestShedError
from kvgate.policies.plugins.estimated_ttft import ARRIVAL_WINDOW, EstimatedTtftParams
from kvgate.policies.profile import SchedulingProfile
from kvgate.policies.scheduler import ProfileScheduler
from kvgate.policies.types import EndpointView, InferenceRequest

Views = list[EndpointView]


class Reference:
    """Schedules like ``scheduler`` would, given a copy of its random generator's state."""

    def __init__(
        self,
        scheduler: ProfileScheduler,
        request: InferenceRequest,
        now: float,
        known_adapters: set[str] | None = None,
        arrivals: list[float] | None = None,
    ) -> None:
        self.s = scheduler
        self.known_adapters = known_adapters if known_adapters is not None else set()
        """Adapters the estimated-TTFT scorer has seen in any scored view (kept across requests)."""
        self.arrivals = arrivals if arrivals is not None else []
        """Times of the requests the estimated-TTFT scorer has scored (kept across requests)."""
        self.profile: SchedulingProfile = scheduler.profile
        self.request = request
        self.now = now
        self.rng = random.Random()
        self.rng.setstate(scheduler.rng.getstate())
        prefix = self.profile.prefix
        self.tokens_per_block = max(1, prefix.block_chars // 4)
        self.hashes = scheduler._hasher.hashes(request.target_model, request.prompt, request.cache_salt)
        self.matches: Mapping[str, int] = scheduler.state.prefix_match(self.hashes) if self.hashes else {}
        header = request.headers.get(self.profile.session_header)
        self.session = request.session_id or header or None

    def schedule(self, candidates: Sequence[EndpointView]) -> SchedulingResult:
        if not candidates:
            raise NoEligibleEndpointError("no endpoints")
        endpoints = list(candidates)
        subset = self.request.subset
        if subset is not None:
            endpoints = [e for e in endpoints if e.address in subset or e.endpoint.host in subset]
            if not endpoints:
                raise NoEligibleEndpointError("subset")
        for f in self.profile.filters:
            endpoints = self.filter(f.plugin_type, f.plugin, endpoints)
        if self.request.sheddable:
            saturated = self.profile.admission.thresholds.saturated
            if all(saturated(e, self.now) for e in endpoints):
                raise RequestShedError("shed", retry_after=1.0)
        totals = {e.address: 0.0 for e in endpoints}
        for s in self.profile.scorers:
            for address, value in self.score(s.plugin_type, s.plugin, endpoints).items():
                if address in totals:
                    totals[address] += s.weight * min(1.0, max(0.0, value))
        scored = [(e, totals[e.address]) for e in endpoints]
        picker = self.profile.picker
        ranked = self.pick(picker.plugin_type, picker.plugin, scored, 1 + self.s.fallbacks)
        return SchedulingResult(tuple(e.endpoint for e in ranked), self.profile.name, totals)

    # --- filters ------------------------------------------------------------------------------

    def filter(self, plugin_type: str, plugin: object, endpoints: Views) -> Views:
        if plugin_type == "candidate-set":  # the equivalence pools are small: it keeps them whole
            assert len(endpoints) <= plugin.params.above, "the reference scores whole pools"  # type: ignore[attr-defined]
            return endpoints
        if plugin_type == "healthy-filter":
            kept = [e for e in endpoints if e.healthy and e.metrics is not None]
        elif plugin_type == "saturation-filter":
            t = plugin.thresholds  # type: ignore[attr-defined]
            oldest = self.now - t.metrics_staleness_s
            kept = [
                e
                for e in endpoints
                if e.metrics is not None
                and e.healthy
                and e.metrics.updated_at >= oldest
                and e.metrics.waiting < t.queue_threshold
                and e.metrics.kv_cache_usage < t.kv_threshold
            ]
        elif plugin_type == "lora-filter":
            return self.lora_filter(endpoints)
        elif plugin_type == "stored-response-filter":
            previous = self.request.previous_response_id
            stored = self.s.state.session_get("response:" + previous) if previous else None
            kept = [e for e in endpoints if e.address == stored]
        else:
            raise AssertionError(f"no reference for {plugin_type}")
        return kept or endpoints

    def lora_filter(self, endpoints: Views) -> Views:
        adapter = self.request.target_model
        active = [e for e in endpoints if e.metrics is not None and adapter in e.metrics.active_loras]
        if active:
            return active
        free = [e for e in endpoints if e.metrics is not None and _free_slot(e)]
        known = any(
            e.metrics is not None
            and (adapter in e.metrics.active_loras or adapter in e.metrics.waiting_loras)
            for e in endpoints
        )
        return free if free and known else endpoints

    # --- scorers ------------------------------------------------------------------------------

    def score(self, plugin_type: str, plugin: object, endpoints: Views) -> Mapping[str, float]:
        state = self.s.state
        spread_of: dict[str, Callable[[EndpointView], float]] = {
            "queue-scorer": lambda e: e.metrics.waiting if e.metrics else 0,
            "running-requests-scorer": lambda e: e.metrics.running if e.metrics else 0,
            "inflight-requests-scorer": lambda e: state.inflight(e.address).requests,
            "inflight-tokens-scorer": lambda e: state.inflight(e.address).tokens,
        }
        if plugin_type in spread_of:
            values = [spread_of[plugin_type](e) for e in endpoints]
            high, low = max(values), min(values)
            return {
                e.address: 1.0 if high == low else (high - v) / (high - low)
                for e, v in zip(endpoints, values, strict=True)
            }
        if plugin_type == "kv-cache-utilization-scorer":
            return {e.address: 1.0 - e.metrics.kv_cache_usage if e.metrics else 1.0 for e in endpoints}
        if plugin_type == "lora-affinity-scorer":
            return {e.address: self.lora_affinity(e) for e in endpoints}
        if plugin_type == "prefix-cache-scorer":
            total = len(self.hashes)
            return {
                e.address: self.matches[e.address] / total for e in endpoints if e.address in self.matches
            }
        if plugin_type == "session-affinity-scorer":
            sticky = state.session_get(self.session) if self.session else None
            return {sticky: 1.0} if sticky else {}
        if plugin_type == "estimated-ttft-scorer":
            for e in endpoints:
                if e.metrics is not None:
                    self.known_adapters |= e.metrics.active_loras | e.metrics.waiting_loras
            params: EstimatedTtftParams = plugin.params  # type: ignore[attr-defined]
            self.arrivals.append(self.now)
            estimates = [self.cost(params, e, endpoints) for e in endpoints]
            best = min(estimates)
            if best <= 0.0:
                return {
                    e.address: 1.0 if t <= 0.0 else 0.0 for e, t in zip(endpoints, estimates, strict=True)
                }
            return {e.address: best / t for e, t in zip(endpoints, estimates, strict=True)}
        raise AssertionError(f"no reference for {plugin_type}")

    def lora_affinity(self, e: EndpointView) -> float:
        m, adapter = e.metrics, self.request.target_model
        if m is None:
            return 0.0
        if adapter in m.active_loras:
            return 1.0
        if _free_slot(e):
            return 0.8
        if adapter in m.waiting_loras:
            return 0.6
        return 1.0 if m.max_loras == 0 and not m.active_loras else 0.0

    def cost(self, p: EstimatedTtftParams, e: EndpointView, endpoints: Views) -> float:
        """TTFT times the externality factor: the last line of the formula in the docstring."""
        ttft = self.ttft(p, e, endpoints)
        window = self.arrivals[-ARRIVAL_WINDOW:]
        if not p.delay_externality or len(window) < 2 or window[-1] == window[0]:
            return ttft
        rate = (len(window) - 1) / (window[-1] - window[0]) * p.time_scale
        externality = p.delay_externality * p.prefill_s_per_token * rate
        if not externality:
            return ttft
        prompt_tokens = self.request.prompt_tokens_estimate
        matched = self.matches.get(e.address, 0) if prompt_tokens else 0
        uncached = max(0, prompt_tokens - matched * self.tokens_per_block)
        total_own = sum(sum(models.values()) for models in self.s.inflight_models.values())
        if total_own == 0:  # λ / N
            return ttft * (1.0 + externality / len(endpoints) * uncached)
        own = self.s.state.inflight(e.address).requests  # λ · own(e) / Σ own
        return ttft * (1.0 + externality / total_own * own * uncached) if own else ttft

    def ttft(self, p: EstimatedTtftParams, e: EndpointView, endpoints: Views) -> float:
        """The module docstring of ``policies.plugins.estimated_ttft``, term by term."""
        prompt_tokens = self.request.prompt_tokens_estimate
        matched = self.matches.get(e.address, 0) if prompt_tokens else 0
        uncached = max(0, prompt_tokens - matched * self.tokens_per_block)
        m = e.metrics
        waiting, running, kv = (m.waiting, m.running, m.kv_cache_usage) if m else (0, 0, 0.0)
        own = self.s.state.inflight(e.address)
        unknown = waiting if own.requests == 0 else max(0, waiting - max(0, own.requests - running))
        work: float = own.tokens + unknown * uncached + uncached
        batches = -(-work // p.max_batched_tokens)
        ttft = (p.step_s + p.decode_s_per_token * running) * (1.0 + batches) + p.prefill_s_per_token * work
        ttft += p.queue_wait_s * unknown
        if kv > p.kv_knee:
            ttft += p.kv_penalty_s / (1.0 - p.kv_knee) * (kv - p.kv_knee)
        if prompt_tokens and self.matches:
            best = max(0, prompt_tokens - max(self.matches.values()) * self.tokens_per_block)
            ttft += p.miss_penalty_factor * p.prefill_s_per_token * max(0, uncached - best)
        adapter = self.request.target_model
        mine = self.s.inflight_models.get(e.address, {})
        if m is not None and (m.max_loras or m.active_loras) and adapter not in m.active_loras:
            # an adapter: seen in a scrape once, or not the model the endpoint's metrics are labelled with
            known = adapter in self.known_adapters or (m.served_models and adapter not in m.served_models)
            # ours in flight make it resident, unless the scrape shows it waiting for a slot
            resident = adapter in mine and adapter not in m.waiting_loras
            if known and not resident:
                shown = m.active_loras | m.waiting_loras
                taken = len({n for n in mine if n in self.known_adapters} - shown)
                if m.max_loras > 0 and len(shown) + taken < m.max_loras:
                    ttft += p.lora_load_s
                elif adapter in m.waiting_loras:
                    ttft += p.lora_wait_s
                else:  # behind every adapter already waiting there for a slot
                    ttft += p.lora_no_slot_s * (1 + len(m.waiting_loras - m.active_loras))
        return ttft

    # --- pickers ------------------------------------------------------------------------------

    def pick(
        self, plugin_type: str, plugin: object, scored: list[tuple[EndpointView, float]], count: int
    ) -> Views:
        rng = self.rng
        if plugin_type == "max-score-picker":
            scores = [s for _e, s in scored]
            order = sorted(range(len(scored)), key=lambda i: scores[i], reverse=True)
            floor = scores[order[0]] - plugin.tie_tolerance  # type: ignore[attr-defined]
            n_ties = sum(1 for i in order if scores[i] >= floor)
            if n_ties >= count:
                return [scored[i][0] for i in rng.sample(order[:n_ties], count)]
            return [scored[i][0] for i in rng.sample(order[:n_ties], n_ties) + order[n_ties:count]]
        if plugin_type == "weighted-random-picker":
            keyed = [(rng.random() ** (1.0 / max(s, 1e-6)), i) for i, (_e, s) in enumerate(scored)]
            return [scored[i][0] for _k, i in heapq.nlargest(count, keyed)]
        if plugin_type == "random-picker":
            return [e for e, _s in rng.sample(scored, min(count, len(scored)))]
        raise AssertionError(f"no reference for {plugin_type}")


def _free_slot(e: EndpointView) -> bool:
    m = e.metrics
    return m is not None and m.max_loras > 0 and len(m.active_loras) + len(m.waiting_loras) < m.max_loras
