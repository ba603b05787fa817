"""``ProfileScheduler``: runs one :class:`SchedulingProfile`, and tells its feedback plugins what
became of each pick.

``schedule`` (pure apart from reading the state): subset hint → the feedback plugins' gates
(outlier ejection) → filters → admission → weighted scorers → picker. Admission: when every
remaining candidate is saturated, a sheddable request (priority < 0) gets ``RequestShedError``
(429, ``retry-after``); other requests are never shed and go to the best-scored (least-loaded)
endpoint. A sheddable request stating latency objectives (``x-slo-ttft-ms``, ``x-slo-tpot-ms``) is
shed too when the profile's cost model (the estimated-TTFT scorer) expects no candidate to meet
them together and none is idle (llm-d's ``latency-slo-admitter``; without estimates it is admitted).

Hot path (docs/architecture.md, principle 7): what depends only on the snapshot's views is computed once
per snapshot tuple (``policies.memo``: filter results, load scores, the cost model's per-endpoint
constants, the candidates' addresses); per request, one pass per scorer adds what changes per
request (prefix matches, this picker's in-flight work, sessions, LoRA), scores are summed by
position (``policies.scoring``) and ``SchedulingResult.scores`` is a view over the sums. Per-plugin
timing runs only with a ``timer``, on every request or on one in ``timing_every``.

Everything the scheduler learns from a pick (in-flight counts, the prefix index and its capacity
learning, sessions, outlier ejection, the first-token deadlines of responses the data plane does
not show) is a feedback plugin of the profile (``policies.feedback``, ``policies.plugins.recorders``):
the lifecycle calls of ``policies.contracts`` go to each plugin that implements them, in the
profile's order, and ``on_finished`` removes exactly what the plugins added.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence

from kvgate.policies.contracts import Keep, SchedulingResult
from kvgate.policies.engine_blocks import EngineCacheView
from kvgate.policies.errors import NoEligibleEndpointError, RequestShedError
from kvgate.policies.feedback import EndpointGate, FeedbackEnv, FeedbackPlugin, overridden
from kvgate.policies.framework import PluginTimer, SchedulingContext, SchedulingTrace, ScoredEndpoints
from kvgate.policies.hashing import PromptHasher
from kvgate.policies.latency_objectives import TPOT_SLO_HEADER, TTFT_SLO_HEADER, latency_objectives
from kvgate.policies.memo import TupleMemo
from kvgate.policies.outliers import OutlierSettings
from kvgate.policies.plugins.filters import SubsetHintFilter
from kvgate.policies.plugins.recorders import InflightRecorder
from kvgate.policies.profile import SchedulingProfile
from kvgate.policies.scoring import Addresses, BoundScorer, ScoresView, total_scores
from kvgate.policies.state import InProcessState, SchedulerState
from kvgate.policies.types import Endpoint, EndpointView, InferenceRequest, Usage


class ProfileScheduler:
    """Implements ``policies.contracts.Scheduler`` for one profile (one instance per pool)."""

    def __init__(
        self,
        profile: SchedulingProfile,
        *,
        state: SchedulerState | None = None,
        rng: random.Random | None = None,
        timer: PluginTimer | None = None,
        clock: Callable[[], float] = time.perf_counter,
        fallbacks: int | None = None,
        max_pending: int = 4096,
        timing_every: int = 1,
        outliers: OutlierSettings | None = None,
        engine_cache: EngineCacheView | None = None,
    ) -> None:
        """``engine_cache``: the pool's blocks as its engines report them (KV events), for the
        plugins that read it (``engine-prefix-matches``)."""
        self.profile = profile
        self.state: SchedulerState = state if state is not None else InProcessState()
        self.rng = rng if rng is not None else random.Random()
        self.timer = timer
        self._clock = clock
        self.fallbacks = profile.fallbacks if fallbacks is None else max(0, fallbacks)
        prefix = profile.prefix
        self._hasher = PromptHasher(prefix.block_chars, prefix.max_blocks, prefix.hash_scheme)
        self._subset = SubsetHintFilter()
        self._timing_every = max(1, timing_every)
        self._timing_countdown = 0
        self._scorers = tuple(BoundScorer.of(s) for s in profile.scorers)
        self._addresses: TupleMemo[Addresses] = TupleMemo()
        env = FeedbackEnv(self.state, self._hasher, prefix.default_capacity_blocks, profile.session_header,
                          max_pending, outliers, engine_cache)
        self.feedback: tuple[FeedbackPlugin, ...] = tuple(f.plugin.create(env) for f in profile.feedback)
        """This scheduler's feedback plugins, in the profile's order."""
        feedback = self.feedback
        self._gates = tuple(f for f in feedback if isinstance(f, EndpointGate))
        self._prepare = overridden(feedback, "prepare")
        self._on_scheduled = overridden(feedback, "on_scheduled")
        self._on_picked = overridden(feedback, "on_picked")
        self._on_served = overridden(feedback, "on_served")
        self._on_first_token = overridden(feedback, "on_first_token")
        self._on_first_token_unseen = overridden(feedback, "on_first_token_unseen")
        self._on_usage = overridden(feedback, "on_usage")
        self._on_failed = overridden(feedback, "on_endpoint_failed")
        self._on_ok = overridden(feedback, "on_endpoint_ok")
        self._on_finished = overridden(feedback, "on_finished")

    # --- scheduling ---------------------------------------------------------------------------

    def schedule(
        self, request: InferenceRequest, candidates: Sequence[EndpointView], now: float,
        trace: SchedulingTrace | None = None, keep: Keep | None = None,
    ) -> SchedulingResult:
        if not candidates:
            raise NoEligibleEndpointError(f"pool {request.pool!r} has no endpoints")
        return self.schedule_in(self.context(request, now), candidates, trace, keep)

    def schedule_in(self, ctx: SchedulingContext, candidates: Sequence[EndpointView],
                    trace: SchedulingTrace | None = None, keep: Keep | None = None) -> SchedulingResult:
        """``schedule`` with a context from :meth:`context` (a caller that reads it afterwards, as the
        disaggregation decider reads the prefix matches, passes its own)."""
        request, now = ctx.request, ctx.now
        if not candidates:
            raise NoEligibleEndpointError(f"pool {request.pool!r} has no endpoints")
        gated = self._subset.filter(ctx, candidates)
        for gate in self._gates:
            gated = gate.gate(gated, now)
        timer = self._timer_for_this_request()
        if trace is not None:
            timer = trace if timer is None else _BothTimers(trace, timer)
        endpoints = self._filtered(ctx, gated, timer)
        if keep is not None:
            endpoints = self._kept(ctx, endpoints, gated, keep, timer)
        if request.sheddable:
            self._admit(endpoints, now)
        addresses = self._addresses.get(endpoints, Addresses)
        totals = total_scores(ctx, endpoints, addresses, self._scorers, timer, self._clock, trace)
        if request.sheddable and ctx.ttft_estimates:
            self._admit_objective(ctx, endpoints)
        scored = ScoredEndpoints(endpoints, totals)
        picker = self.profile.picker
        if timer is None:
            ranked = picker.plugin.pick(ctx, scored, 1 + self.fallbacks)
        else:
            start = self._clock()
            ranked = picker.plugin.pick(ctx, scored, 1 + self.fallbacks)
            timer.observe("picker", picker.plugin_type, picker.name, self._clock() - start)
        if not ranked:
            raise NoEligibleEndpointError(f"picker {picker.name!r} picked nothing")
        for plugin in self._on_scheduled:
            plugin.on_scheduled(ctx, ranked)
        scores = ScoresView(addresses, totals)
        if trace is not None:
            trace.ranked(ctx, self.profile.name, len(candidates), ranked, scores)
        matches = ctx.known_prefix_matches()
        if matches is None:
            return SchedulingResult(tuple(e.endpoint for e in ranked), self.profile.name, scores)
        per_block = ctx.tokens_per_block
        return SchedulingResult(tuple(e.endpoint for e in ranked), self.profile.name, scores,
                                predicted_cached_tokens=matches.get(ranked[0].address, 0) * per_block,
                                best_cached_tokens=max(matches.values(), default=0) * per_block,
                                prefix_block_tokens=per_block)

    def _filtered(self, ctx: SchedulingContext, endpoints: Sequence[EndpointView],
                  timer: PluginTimer | None) -> Sequence[EndpointView]:
        """The profile's filters, in order."""
        for f in self.profile.filters:
            if timer is None:
                endpoints = f.plugin.filter(ctx, endpoints)
            else:
                start = self._clock()
                endpoints = f.plugin.filter(ctx, endpoints)
                timer.observe("filter", f.plugin_type, f.name, self._clock() - start)
            if not endpoints:
                raise NoEligibleEndpointError(f"no eligible endpoint after filter {f.name!r}")
        return endpoints

    def _kept(self, ctx: SchedulingContext, filtered: Sequence[EndpointView], gated: Sequence[EndpointView],
              keep: Keep, timer: PluginTimer | None) -> Sequence[EndpointView]:
        """What ``keep`` keeps of the filtered endpoints; when none, the filters over what it keeps
        of all (the filters had narrowed the pool to a candidate set); when none at all, the
        filtered endpoints as they were."""
        kept = keep(filtered)
        if kept:
            return kept
        if len(filtered) == len(gated):  # the filters kept all: nothing more to ask about
            return filtered
        wider = keep(gated)
        return self._filtered(ctx, wider, timer) if wider else filtered

    def context(self, request: InferenceRequest, now: float,
                prefix_hashes: tuple[int, ...] | None = None) -> SchedulingContext:
        """What the plugins read while ``request`` is scheduled at ``now`` (``schedule`` builds one;
        tools that ask a scorer directly, e.g. ``bench/replay.py --explain``, use it too).
        ``prefix_hashes``: the prompt's block hashes where the caller has them already, by a
        hasher of this profile's settings (a disaggregated request's prefill half: its decode's)."""
        ctx = SchedulingContext(request, now, self.state, self.rng, self._hasher, self._session_id(request),
                                _hashes=prefix_hashes)
        for plugin in self._prepare:
            plugin.prepare(ctx)
        return ctx

    def _timer_for_this_request(self) -> PluginTimer | None:
        """``timer`` on one request in ``timing_every`` (the first one included), else None."""
        if self._timing_every == 1 or self.timer is None:
            return self.timer
        countdown = self._timing_countdown
        self._timing_countdown = countdown - 1 if countdown > 0 else self._timing_every - 1
        return self.timer if countdown == 0 else None

    def _admit(self, endpoints: Sequence[EndpointView], now: float) -> None:
        admission = self.profile.admission
        saturated = admission.thresholds.saturated
        if all(saturated(e, now) for e in endpoints):
            raise RequestShedError(
                "every eligible endpoint is saturated; sheddable request rejected",
                retry_after=admission.retry_after_s,
            )

    def _admit_objective(self, ctx: SchedulingContext, endpoints: Sequence[EndpointView]) -> None:
        """Shed a sheddable request whose objectives no candidate is expected to meet together
        (its first token within ``x-slo-ttft-ms``, each next one within ``x-slo-tpot-ms``: the
        endpoint's decode step as scraped), unless one is idle (nothing running or waiting: the
        estimate is then the prompt's prefill alone, and the request would be its only work)."""
        objectives = latency_objectives(ctx.request.headers)
        ttfts = ctx.ttft_estimates
        if not objectives or not ttfts:
            return
        ttft, tpot = objectives.ttft_s, objectives.tpot_s
        tpots = ctx.tpot_estimates
        for address, estimate in ttfts.items():
            if ttft is not None and estimate > ttft:
                continue
            if tpot is not None and tpots is not None and tpots.get(address, 0.0) > tpot:
                continue
            return
        if any(m is None or (m.running == 0 and m.waiting == 0) for m in (e.metrics for e in endpoints)):
            return
        named = " and ".join(f"{header} ({seconds * 1000:g} ms)" for header, seconds in
                             ((TTFT_SLO_HEADER, ttft), (TPOT_SLO_HEADER, tpot)) if seconds is not None)
        raise RequestShedError(
            f"no endpoint is expected to meet the request's {named}; sheddable request rejected",
            retry_after=self.profile.admission.retry_after_s,
        )

    def _session_id(self, request: InferenceRequest) -> str | None:
        return request.session_id or request.headers.get(self.profile.session_header) or None

    # --- lifecycle: told to the feedback plugins --------------------------------------------

    def on_picked(self, request: InferenceRequest, endpoint: Endpoint, now: float) -> None:
        for plugin in self._on_picked:
            plugin.on_picked(request, endpoint, now)

    def on_served(self, request: InferenceRequest, endpoint: Endpoint, now: float) -> None:
        for plugin in self._on_served:
            plugin.on_served(request, endpoint, now)

    def on_first_token(self, request: InferenceRequest, endpoint: Endpoint, now: float) -> None:
        for plugin in self._on_first_token:
            plugin.on_first_token(request, endpoint, now)

    def on_first_token_unseen(self, request: InferenceRequest, endpoint: Endpoint, now: float) -> None:
        for plugin in self._on_first_token_unseen:
            plugin.on_first_token_unseen(request, endpoint, now)

    def on_endpoint_failed(self, request: InferenceRequest, endpoint: Endpoint, now: float) -> None:
        for plugin in self._on_failed:
            plugin.on_endpoint_failed(endpoint.address, now)

    def on_endpoint_outcome(self, address: str, *, ok: bool, now: float) -> None:
        for plugin in self._on_ok if ok else self._on_failed:
            (plugin.on_endpoint_ok if ok else plugin.on_endpoint_failed)(address, now)

    def on_usage(self, request: InferenceRequest, endpoint: Endpoint, usage: Usage, now: float) -> None:
        for plugin in self._on_usage:
            plugin.on_usage(request, endpoint, usage, now)

    def on_finished(self, request: InferenceRequest, endpoint: Endpoint, *, ok: bool, now: float) -> None:
        for plugin in self._on_finished:
            plugin.on_finished(request, endpoint, ok=ok, now=now)

    def expected_cached_tokens(self, request: InferenceRequest, now: float) -> int:
        """Prompt tokens the endpoint that caches most of ``request``'s prompt probably holds (the
        engines' reports where the profile reads them, else the approximate index): what its
        prefill will not cost (flow control's cost of a held request, ``policies.flow_control``)."""
        ctx = self.context(request, now)
        matches = ctx.prefix_matches()
        return max(matches.values(), default=0) * ctx.tokens_per_block

    # --- pool membership ----------------------------------------------------------------------

    @property
    def inflight_models(self) -> Mapping[str, Mapping[str, int]]:
        """This scheduler's in-flight requests per endpoint and target model (read-only view; empty
        without an ``inflight-recorder``), for reports and tests."""
        recorder = next((f for f in self.feedback if isinstance(f, InflightRecorder)), None)
        return recorder.models_view if recorder is not None else {}

    def forget_endpoint(self, address: str) -> None:
        """Call when an endpoint leaves the pool: drops its state (prefix, in-flight, sessions) and
        what the feedback plugins keep about it."""
        self.state.forget_endpoint(address)
        for plugin in self.feedback:
            plugin.forget_endpoint(address)


class _BothTimers:
    """A traced request on which the plugin-duration histogram samples too."""

    __slots__ = ("_first", "_second")

    def __init__(self, first: PluginTimer, second: PluginTimer) -> None:
        self._first, self._second = first, second

    def observe(self, extension_point: str, plugin_type: str, plugin_name: str, seconds: float) -> None:
        self._first.observe(extension_point, plugin_type, plugin_name, seconds)
        self._second.observe(extension_point, plugin_type, plugin_name, seconds)
