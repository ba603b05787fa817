"""``DisaggregatedScheduler``: picks a decode endpoint and, when the decider says so, a prefill
endpoint for one request (``policies.disaggregation``); implements ``policies.contracts.Scheduler``.

It is two :class:`~policies.scheduler.ProfileScheduler` s over one state, and a router of the
lifecycle's calls: a call about a decode request goes to the decode scheduler; a call about a
prefill pick (its :class:`~policies.contracts.PrefillPick` request, with its own id) goes to the
prefill scheduler. A prefill nobody reported ends (successfully) with its decode's first token, and
at the latest with the decode's finish, so neither side's in-flight counts leak whatever the data
plane shows (a sidecar runs the prefill where the picker cannot see it).
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence

from kvgate.policies.contracts import Keep, PrefillPick, SchedulingResult
from kvgate.policies.disaggregation import DisaggregatedProfile
from kvgate.policies.engine_blocks import EngineCacheView
from kvgate.policies.errors import NoEligibleEndpointError
from kvgate.policies.framework import PluginTimer, SchedulingContext, SchedulingTrace
from kvgate.policies.outliers import OutlierSettings
from kvgate.policies.plugins.deciders import HopJudge
from kvgate.policies.pool_views import SubsetViews
from kvgate.policies.profile import SchedulingProfile
from kvgate.policies.scheduler import ProfileScheduler
from kvgate.policies.state import InProcessState, SchedulerState
from kvgate.policies.types import ApiKind, Endpoint, EndpointView, InferenceRequest, Usage

_SPLITTABLE = frozenset({ApiKind.COMPLETIONS, ApiKind.CHAT_COMPLETIONS})
"""The APIs vLLM's disaggregated protocol serves (kv_transfer_params); others are served aggregated."""
PREFILL_SUFFIX = ":prefill"
"""Appended to a request's id for its prefill half (the state keys in-flight work by request id)."""


class DisaggregatedScheduler:
    def __init__(
        self,
        profile: DisaggregatedProfile,
        *,
        state: SchedulerState | None = None,
        rng: random.Random | None = None,
        timer: PluginTimer | None = None,
        clock: Callable[[], float] = time.perf_counter,
        timing_every: int = 1,
        max_pending: int = 4096,
        outliers: OutlierSettings | None = None,
        engine_cache: EngineCacheView | None = None,
    ) -> None:
        self.profile = profile
        self.state: SchedulerState = state if state is not None else InProcessState()
        rng = rng if rng is not None else random.Random()
        def side(half: SchedulingProfile) -> ProfileScheduler:
            return ProfileScheduler(half, state=self.state, rng=rng, timer=timer, clock=clock,
                                    timing_every=timing_every, max_pending=max_pending, outliers=outliers,
                                    engine_cache=engine_cache)

        self.decode = side(profile.decode)
        self.prefill = side(profile.prefill)
        self._decider = profile.decider.plugin
        self._judge = self._decider if isinstance(self._decider, HopJudge) else None
        self._max_pending = max_pending
        self._decoders = SubsetViews(lambda view: view.endpoint.role.decodes)
        self._prefillers = SubsetViews(lambda view: view.endpoint.role.prefills)
        """Each side's endpoints, kept per snapshot (a new list per request rebuilt every
        per-snapshot structure downstream: O(pool) in Python per pick)."""
        self._scheduled: OrderedDict[str, PrefillPick] = OrderedDict()
        """Decode request id → the prefill scheduled with it, until the pick is told (``on_picked``)."""
        self._pending: OrderedDict[str, PrefillPick] = OrderedDict()
        """Decode request id → its prefill, until the prefill is reported finished."""
        self._prefill_of: dict[str, str] = {}
        """Prefill request id → its decode request id."""
        self._decode_of: dict[str, tuple[InferenceRequest, Endpoint]] = {}
        """Decode request id → (the request, its decode endpoint), while its prefill is pending: a
        failed prefill leaves the decode endpoint the whole prompt to compute."""
        self._hashes: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        """Decode request id → its prompt's block hashes, for a split scheduled and not yet picked."""
        self._arriving: OrderedDict[str, str] = OrderedDict()
        """Decode request id → its decode endpoint, for a split request whose KV has not reached
        its decode endpoint: until the decode's first token, or its finish when the first token goes
        unseen (``policies.plugins.deciders``: arriving blocks)."""
        self._arriving_at: dict[str, dict[str, tuple[int, ...]]] = {}
        """The same by decode endpoint: request id → its prompt's block hashes (a pick reads its
        decode endpoint's alone; reading them all cost ~250 µs a pick with a few thousand in flight)."""

    def expected_cached_tokens(self, request: InferenceRequest, now: float) -> int:
        """``ProfileScheduler.expected_cached_tokens`` on the decode side (one state for both)."""
        return self.decode.expected_cached_tokens(request, now)

    # --- scheduling ---------------------------------------------------------------------------

    def schedule(
        self, request: InferenceRequest, candidates: Sequence[EndpointView], now: float,
        trace: SchedulingTrace | None = None, keep: Keep | None = None,
    ) -> SchedulingResult:
        decoders = self._decoders.of(candidates)
        split = request.api in _SPLITTABLE
        if not decoders:
            raise NoEligibleEndpointError(f"pool {request.pool!r} has no decode endpoints")
        ctx = self.decode.context(request, now)
        result = self.decode.schedule_in(ctx, decoders, trace, keep)
        decode = result.ranked[0]
        decode_view = next(c for c in decoders if c.endpoint is decode or c.address == decode.address)
        if not split:
            return _whole(result, trace, "api")
        if not self._decider.disaggregate(ctx, decode_view, self._arriving_blocks(ctx, decode.address)):
            return _whole(result, trace, "cached")  # little of the prompt to compute: no hop
        prefillers = self._prefillers.of(candidates)
        if decode_view.endpoint.role.prefills:  # (an endpoint of both roles) not its own prefill
            prefillers = [c for c in prefillers if c.address != decode.address]
        if not prefillers:
            return _whole(result, trace, "no_prefill_endpoint")  # the decode endpoint computes it
        half = dataclasses.replace(request, request_id=request.request_id + PREFILL_SUFFIX, max_tokens=1,
                                   stream=False)
        # the same prompt, model and salt, hashed the same way (load_scheduling checks it): once
        prefill_ctx = self.prefill.context(half, now, ctx.prefix_hashes())
        try:
            prefill = self.prefill.schedule_in(prefill_ctx, prefillers, trace, keep)
        except NoEligibleEndpointError:
            # every prefill endpoint is filtered out (unhealthy, saturated): aggregated
            return _whole(result, trace, "no_eligible_prefill_endpoint")
        judge, prefill_address = self._judge, prefill.ranked[0].address
        if judge is not None and not judge.worth_the_hop(ctx, decode_view, prefill_ctx, prefill_address):
            return _whole(result, trace, "sooner_on_decode")  # the prefill endpoints queue
        if trace is not None:
            trace.note("kvgate.pd.split", True)
        pick = PrefillPick(half, prefill.ranked[0])
        self._scheduled[request.request_id] = pick
        self._hashes[request.request_id] = ctx.prefix_hashes()
        while len(self._scheduled) > self._max_pending:  # scheduled, never picked (refused after)
            old_id, _ = self._scheduled.popitem(last=False)
            self._hashes.pop(old_id, None)
        return dataclasses.replace(result, prefill=pick, profile=self.profile.name)

    def _arriving_blocks(self, ctx: SchedulingContext, address: str) -> int:
        """The prompt's leading blocks that split requests are bringing to ``address`` (KV not there yet)."""
        arriving = self._arriving_at.get(address)
        if not arriving:
            return 0
        mine = ctx.prefix_hashes()
        return max(_common_prefix(mine, hashes) for hashes in arriving.values())

    # --- lifecycle ----------------------------------------------------------------------------

    def _side(self, request: InferenceRequest) -> ProfileScheduler:
        return self.prefill if request.request_id in self._prefill_of else self.decode

    def on_picked(self, request: InferenceRequest, endpoint: Endpoint, now: float) -> None:
        """The data plane was told the pick: the decode endpoint, and the prefill scheduled with it.
        A split request's decode half adds no prefill work to its decode endpoint's bookkeeping
        (it reads the KV; counted with its whole prompt, every split request in flight made its
        decode endpoint look as queued as a prefill endpoint to the next pick)."""
        prefill = self._scheduled.pop(request.request_id, None)
        if prefill is None:
            self.decode.on_picked(request, endpoint, now)
            return
        self.decode.on_picked(dataclasses.replace(request, prefilled_elsewhere=True), endpoint, now)
        self._pending[request.request_id] = prefill
        self._decode_of[request.request_id] = (request, endpoint)
        self._prefill_of[prefill.request.request_id] = request.request_id
        hashes = self._hashes.pop(request.request_id, ())
        if hashes:
            self._arriving[request.request_id] = endpoint.address
            self._arriving_at.setdefault(endpoint.address, {})[request.request_id] = hashes
            while len(self._arriving) > self._max_pending:
                self._arrived(next(iter(self._arriving)))
        self.prefill.on_picked(prefill.request, prefill.endpoint, now)
        while len(self._pending) > self._max_pending:  # never reported and never finished: drop
            old_id, old = self._pending.popitem(last=False)
            self._end_prefill(old_id, old, ok=False, now=now)

    def on_served(self, request: InferenceRequest, endpoint: Endpoint, now: float) -> None:
        self._side(request).on_served(request, endpoint, now)

    def on_first_token(self, request: InferenceRequest, endpoint: Endpoint, now: float) -> None:
        side = self._side(request)
        side.on_first_token(request, endpoint, now)
        if side is self.decode:
            self._arrived(request.request_id)  # its KV has been read
            self._end_unreported_prefill(request.request_id, ok=True, now=now)

    def on_first_token_unseen(self, request: InferenceRequest, endpoint: Endpoint, now: float) -> None:
        """No response will show this request's first token (told at the pick, for a skipped
        stream). A decode request's prefill has not run yet then: its prefill tokens end at the
        prefill side's own estimate (or earlier, when the picker reports the prefill done), and
        the prefill stays in flight until reported or the decode finishes. (Ending it here left
        every prefill endpoint looking idle to the next pick while it computed a long prompt.)"""
        side = self._side(request)
        side.on_first_token_unseen(request, endpoint, now)
        if side is self.decode:
            prefill = self._pending.get(request.request_id)
            if prefill is not None:
                self.prefill.on_first_token_unseen(prefill.request, prefill.endpoint, now)

    def on_endpoint_failed(self, request: InferenceRequest, endpoint: Endpoint, now: float) -> None:
        self._side(request).on_endpoint_failed(request, endpoint, now)

    def on_endpoint_outcome(self, address: str, *, ok: bool, now: float) -> None:
        self.decode.on_endpoint_outcome(address, ok=ok, now=now)
        self.prefill.on_endpoint_outcome(address, ok=ok, now=now)

    def on_usage(self, request: InferenceRequest, endpoint: Endpoint, usage: Usage, now: float) -> None:
        self._side(request).on_usage(request, endpoint, usage, now)

    def on_finished(self, request: InferenceRequest, endpoint: Endpoint, *, ok: bool, now: float) -> None:
        decode_id = self._prefill_of.pop(request.request_id, None)
        if decode_id is not None:  # a prefill reported finished
            self._pending.pop(decode_id, None)
            self.prefill.on_finished(request, endpoint, ok=ok, now=now)
            decode = self._decode_of.pop(decode_id, None)
            if not ok and decode is not None:  # served whole on its decode endpoint: it prefills there
                self.decode.on_served(decode[0], decode[1], now)
            return
        self._decode_of.pop(request.request_id, None)
        self.decode.on_finished(request, endpoint, ok=ok, now=now)
        self._arrived(request.request_id)
        self._end_unreported_prefill(request.request_id, ok=ok, now=now)

    def _arrived(self, decode_id: str) -> None:
        """The split request's KV is at its decode endpoint (or it ended): no longer arriving."""
        address = self._arriving.pop(decode_id, None)
        if address is None:
            return
        at = self._arriving_at.get(address)
        if at is not None:
            at.pop(decode_id, None)
            if not at:
                del self._arriving_at[address]

    def _end_unreported_prefill(self, decode_id: str, *, ok: bool, now: float) -> None:
        prefill = self._pending.pop(decode_id, None)
        if prefill is not None:
            self._end_prefill(decode_id, prefill, ok=ok, now=now)

    def _end_prefill(self, decode_id: str, prefill: PrefillPick, *, ok: bool, now: float) -> None:
        self._decode_of.pop(decode_id, None)
        self._prefill_of.pop(prefill.request.request_id, None)
        self.prefill.on_first_token(prefill.request, prefill.endpoint, now)
        self.prefill.on_finished(prefill.request, prefill.endpoint, ok=ok, now=now)

    # --- pool membership ----------------------------------------------------------------------

    @property
    def inflight_models(self) -> Mapping[str, Mapping[str, int]]:
        """The decode side's in-flight requests per endpoint and target model (reports, tests)."""
        return self.decode.inflight_models

    def forget_endpoint(self, address: str) -> None:
        self.decode.forget_endpoint(address)
        self.prefill.forget_endpoint(address)


def _whole(result: SchedulingResult, trace: SchedulingTrace | None, why: str) -> SchedulingResult:
    """``result`` served whole on its decode endpoint (traced: why)."""
    if trace is not None:
        trace.note("kvgate.pd.split", False)
        trace.note("kvgate.pd.kept_whole_because", why)
    return result


def _common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """Leading blocks two prompts share. Block hashes are chained (each names its whole prefix), so
    they are equal up to the first difference and unequal after it: a binary search finds it."""
    lo, hi = 0, min(len(a), len(b))  # a[:lo] == b[:lo]; a[hi:] differs (or ends)
    while lo < hi:
        mid = (lo + hi) // 2
        if a[mid] == b[mid]:
            lo = mid + 1
        else:
            hi = mid
    return lo
