"""Disaggregation deciders: whether a request's prompt is worth a prefill hop (``policies.disaggregation``).

- ``prefix-based-pd-decider`` (llm-d's decider of the same name): disaggregate when the prompt's
  tokens that the chosen decode endpoint does not hold in its prefix cache (as kvgate's prefix index
  predicts) reach ``non_cached_tokens``. A short or mostly cached prompt is computed on the decode
  endpoint itself: the hop, the KV transfer and the prefill's queue cost more than they save.
  ``non_cached_tokens: 0`` disaggregates every request.
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
    def disaggregate(self, ctx: SchedulingContext, decode: EndpointView) -> bool:
        """Whether ``ctx.request``, headed for ``decode``, should be prefilled elsewhere first."""
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

    def non_cached(self, ctx: SchedulingContext, decode: EndpointView) -> int:
        """The prompt tokens ``decode`` would have to compute itself (estimated)."""
        prompt = ctx.request.prompt_tokens_estimate
        cached = ctx.prefix_matches().get(decode.address, 0) * ctx.tokens_per_block if prompt else 0
        return max(0, prompt - cached)

    def disaggregate(self, ctx: SchedulingContext, decode: EndpointView) -> bool:
        if self.non_cached_tokens == 0:
            return True
        return self.non_cached(ctx, decode) >= self.non_cached_tokens
