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
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Protocol, runtime_checkable

from pydantic import Field

from kvgate.policies.framework import PREFIX_INDEX, SchedulingContext
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
        prompt = ctx.request.prompt_tokens_estimate
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
