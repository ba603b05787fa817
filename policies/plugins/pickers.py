"""Pickers: turn scored endpoints into the pick followed by fallbacks.

Every picker breaks ties with the context's seeded ``random.Random``: identical scores must not
always choose the same replica (an idle fleet would otherwise send every new prompt to replica 0).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from pydantic import Field

from kvgate.policies.framework import SchedulingContext, ScoredEndpoints
from kvgate.policies.plugins.params import Params, parse_params
from kvgate.policies.types import EndpointView


class MaxScoreParams(Params):
    tie_tolerance: Annotated[float, Field(ge=0.0)] = 0.0


class MaxScorePicker:
    """Highest total score; endpoints within ``tie_tolerance`` of the best are ties, chosen at random.

    Fallbacks: the remaining ties in random order, then the rest by descending score.
    """

    def __init__(self, tie_tolerance: float = 0.0) -> None:
        self.tie_tolerance = tie_tolerance

    @staticmethod
    def from_parameters(parameters: Mapping[str, Any] | None) -> MaxScorePicker:
        return MaxScorePicker(parse_params(MaxScoreParams, parameters, "max-score-picker").tie_tolerance)

    def pick(
        self, ctx: SchedulingContext, scored: Sequence[tuple[EndpointView, float]], count: int
    ) -> Sequence[EndpointView]:
        count = max(1, count)
        if isinstance(scored, ScoredEndpoints):
            endpoints, scores = scored.endpoints, scored.scores
        else:
            endpoints, scores = [e for e, _s in scored], [s for _e, s in scored]
        order = sorted(range(len(scores)), key=scores.__getitem__, reverse=True)
        floor = scores[order[0]] - self.tie_tolerance
        n_ties = 1
        while n_ties < len(order) and scores[order[n_ties]] >= floor:
            n_ties += 1
        rng = ctx.rng
        if n_ties >= count:
            return [endpoints[i] for i in rng.sample(order[:n_ties], count)]
        ranked = rng.sample(order[:n_ties], n_ties) + order[n_ties:count]
        return [endpoints[i] for i in ranked]


class WeightedRandomPicker:
    """Random, proportional to score (a tiny floor keeps zero-score endpoints reachable).

    Draws a weighted permutation with Efraimidis–Spirakis keys ``u^(1/w)``; the first ``count`` are
    the pick and fallbacks.
    """

    def pick(
        self, ctx: SchedulingContext, scored: Sequence[tuple[EndpointView, float]], count: int
    ) -> Sequence[EndpointView]:
        random = ctx.rng.random
        keyed = ((random() ** (1.0 / max(s, 1e-6)), i) for i, (_e, s) in enumerate(scored))
        return [scored[i][0] for _k, i in heapq.nlargest(max(1, count), keyed)]


class RandomPicker:
    """Uniformly random, ignoring scores."""

    def pick(
        self, ctx: SchedulingContext, scored: Sequence[tuple[EndpointView, float]], count: int
    ) -> Sequence[EndpointView]:
        return [e for e, _s in ctx.rng.sample(list(scored), min(max(1, count), len(scored)))]


class RoundRobinPicker:
    """Cycles through the candidates in the order given (the snapshot's order), ignoring scores."""

    def __init__(self) -> None:
        self._next = 0

    def pick(
        self, ctx: SchedulingContext, scored: Sequence[tuple[EndpointView, float]], count: int
    ) -> Sequence[EndpointView]:
        n = len(scored)
        start = self._next % n
        self._next = start + 1
        return [scored[(start + k) % n][0] for k in range(min(max(1, count), n))]
