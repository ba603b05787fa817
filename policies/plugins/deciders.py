"""Disaggregation deciders: whether a request's prompt is worth a prefill hop (``policies.disaggregation``).

- ``prefix-based-pd-decider`` (llm-d's decider of the same name): disaggregate when the prompt's
  tokens that the chosen decode endpoint does not hold in its prefix cache (as kvgate's prefix index
  predicts) reach ``non_cached_tokens``. A short or mostly cached prompt is computed on the decode
  endpoint itself: the hop, the KV transfer and the prefill's queue cost more than they save.
  ``non_cached_tokens: 0`` disaggregates every request.

Blocks *arriving* at the decode endpoint are not held yet: a request split moments ago is still
being prefilled elsewhere, and its KV reaches the decode endpoint only when its decode starts. The
prefix index learns them at pick time (right for the request's own later turns), so a second request
for the same document, headed for the same decode endpoint in that window, would look cached, be
kept whole, and have the decode endpoint compute the whole document itself beside its decodes (the
pd-docs workload: TPOT p90 above aggregated serving's). The scheduler tells the decider how many of
the prompt's leading blocks are in transit to the decode endpoint; a match no longer than that
counts as not held.

- ``conditional-pd-decider`` (Dynamo's conditional disaggregation, in time rather than queue
  length): the prefix-based decider first; then, with the prefill endpoint picked, the prompt is
  computed on the decode endpoint itself when that is sooner by more than ``min_saving_s``: the
  decode side's estimated TTFT there against the prefill side's estimate on the prefill endpoint
  plus the KV transfer (``transfer_s_per_token`` × prompt tokens + ``transfer_latency_s``). At low
  load the prefill endpoints are idle and the hop wins (the decode batches run undisturbed); when
  the prefill endpoints queue (their share of the fleet is short of the load), decode endpoints
  absorb the overflow, each one only while its own queued prefill work keeps it sooner (the
  estimate counts it), and never a prompt of more than ``max_local_tokens`` uncached tokens (each
  of its chunks stalls every decode in the batch for one long step). Needs both profiles to score
  with ``estimated-ttft-scorer`` (it produces the estimates); without estimates it splits.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Protocol, runtime_checkable

from pydantic import Field

from kvgate.policies.framework import PREFIX_INDEX, TTFT_ESTIMATES, SchedulingContext
from kvgate.policies.plugins.params import Params, parse_params
from kvgate.policies.types import EndpointView


@runtime_checkable
class DisaggregationDecider(Protocol):
    def disaggregate(self, ctx: SchedulingContext, decode: EndpointView, arriving_blocks: int = 0) -> bool:
        """Whether ``ctx.request``, headed for ``decode``, should be prefilled elsewhere first;
        ``arriving_blocks``: the prompt's leading blocks on their way to ``decode`` (module docstring)."""
        ...


class _PrefixDeciderParams(Params):
    non_cached_tokens: Annotated[int, Field(ge=0)] = 1024


class PrefixBasedDecider:
    consumes = frozenset({PREFIX_INDEX})

    def __init__(self, non_cached_tokens: int = 1024) -> None:
        self.non_cached_tokens = non_cached_tokens

    @staticmethod
    def from_parameters(parameters: Mapping[str, Any] | None) -> PrefixBasedDecider:
        p = parse_params(_PrefixDeciderParams, parameters, "prefix-based-pd-decider")
        return PrefixBasedDecider(p.non_cached_tokens)

    def non_cached(self, ctx: SchedulingContext, decode: EndpointView, arriving_blocks: int = 0) -> int:
        """The prompt tokens ``decode`` would have to compute itself (estimated)."""
        prompt = ctx.prompt_tokens()
        if not prompt:
            return 0
        blocks = ctx.prefix_matches().get(decode.address, 0)
        if blocks <= arriving_blocks:  # what it matches may all be still on its way
            blocks = 0
        return max(0, prompt - blocks * ctx.tokens_per_block)

    def disaggregate(self, ctx: SchedulingContext, decode: EndpointView, arriving_blocks: int = 0) -> bool:
        if self.non_cached_tokens == 0:
            return True
        return self.non_cached(ctx, decode, arriving_blocks) >= self.non_cached_tokens


@runtime_checkable
class HopJudge(Protocol):
    def worth_the_hop(
        self, ctx: SchedulingContext, decode: EndpointView, prefill_ctx: SchedulingContext, prefill: str
    ) -> bool:
        """With the prefill endpoint ``prefill`` picked (``prefill_ctx``: its half's context), whether
        the split is still better than computing the prompt on ``decode``."""
        ...


class _ConditionalDeciderParams(_PrefixDeciderParams):
    max_local_tokens: Annotated[int, Field(ge=0)] = 8192
    min_saving_s: Annotated[float, Field(ge=0.0)] = 0.05
    transfer_s_per_token: Annotated[float, Field(ge=0.0)] = 3.3e-6
    """Llama-3.1-8B's KV in bf16 (131,072 bytes a token) at 40 GB/s: the simulator's default fabric."""
    transfer_latency_s: Annotated[float, Field(ge=0.0)] = 0.002
    time_scale: Annotated[float, Field(gt=0.0)] = 1.0
    """Clock seconds per model second (a benchmark's slowed fleet), as the TTFT scorer's."""


class ConditionalDecider(PrefixBasedDecider):
    consumes = frozenset({PREFIX_INDEX, TTFT_ESTIMATES})

    def __init__(self, params: _ConditionalDeciderParams | None = None) -> None:
        p = params or _ConditionalDeciderParams()
        super().__init__(p.non_cached_tokens)
        self.params = p

    @staticmethod
    def from_parameters(parameters: Mapping[str, Any] | None) -> ConditionalDecider:
        params = parse_params(_ConditionalDeciderParams, parameters, "conditional-pd-decider")
        return ConditionalDecider(params)

    def worth_the_hop(
        self, ctx: SchedulingContext, decode: EndpointView, prefill_ctx: SchedulingContext, prefill: str
    ) -> bool:
        p = self.params
        if self.non_cached(ctx, decode) > p.max_local_tokens:
            return True
        local = ctx.ttft_estimates.get(decode.address) if ctx.ttft_estimates else None
        remote = prefill_ctx.ttft_estimates.get(prefill) if prefill_ctx.ttft_estimates else None
        if local is None or remote is None:
            return True
        transfer = p.transfer_latency_s + p.transfer_s_per_token * ctx.prompt_tokens()
        return local + p.min_saving_s * p.time_scale >= remote + transfer * p.time_scale
