"""Summing weighted scorer outputs by position: the scheduler's inner step, one pass per scorer.

Endpoints are addressed by their position in the candidates sequence. A dense scorer
(``policies.framework.DenseScorer``) adds its list position by position; a sparse one (a mapping
by address: prefix, session) touches only the endpoints it names, clamped to [0, 1]. Sums run in
scorer order, so they are the same floats as summing into a dict keyed by address.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from kvgate.policies.framework import DenseScorer, PluginTimer, SchedulingContext, SchedulingTrace
from kvgate.policies.profile import WeightedScorer
from kvgate.policies.types import EndpointView


class Addresses:
    """The candidates' addresses in order (once per snapshot) and, built on first need, the position
    of each (only sparse scorers that name endpoints need it)."""

    __slots__ = ("_position", "ordered")

    def __init__(self, endpoints: Sequence[EndpointView]) -> None:
        self.ordered = [e.endpoint.address for e in endpoints]
        self._position: dict[str, int] | None = None

    @property
    def position(self) -> Mapping[str, int]:
        if self._position is None:
            self._position = {address: i for i, address in enumerate(self.ordered)}
        return self._position


@dataclass(frozen=True, slots=True)
class BoundScorer:
    """A profile's scorer with its methods looked up once (``dense`` when it is a ``DenseScorer``)."""

    plugin_type: str
    name: str
    weight: float
    score: Callable[[SchedulingContext, Sequence[EndpointView]], Mapping[str, float]]
    dense: Callable[[SchedulingContext, Sequence[EndpointView]], Sequence[float]] | None

    @staticmethod
    def of(scorer: WeightedScorer) -> BoundScorer:
        plugin = scorer.plugin
        dense = plugin.dense_scores if isinstance(plugin, DenseScorer) else None
        return BoundScorer(scorer.plugin_type, scorer.name, scorer.weight, plugin.score, dense)


def total_scores(
    ctx: SchedulingContext,
    endpoints: Sequence[EndpointView],
    addresses: Addresses,
    scorers: Sequence[BoundScorer],
    timer: PluginTimer | None,
    clock: Callable[[], float],
    trace: SchedulingTrace | None = None,
) -> list[float]:
    """Σ weight × score per endpoint, in endpoint order (each scorer timed when ``timer`` is set)."""
    totals: list[float] | None = None
    for s in scorers:
        start = clock() if timer is not None else 0.0
        weight = s.weight
        if s.dense is not None:
            values = s.dense(ctx, endpoints)
            if trace is not None:
                trace.scored(s.name, endpoints, values)
            if totals is None:
                totals = list(values) if weight == 1.0 else [weight * v for v in values]
            else:
                totals = [t + weight * v for t, v in zip(totals, values, strict=True)]
        else:
            sparse = s.score(ctx, endpoints)
            if trace is not None:
                trace.scored(s.name, endpoints, sparse)
            if totals is None:
                totals = [0.0] * len(endpoints)
            if sparse:
                position = addresses.position.get
                for address, value in sparse.items():
                    i = position(address)
                    if i is not None:
                        totals[i] += weight * (0.0 if value < 0.0 else 1.0 if value > 1.0 else value)
        if timer is not None:
            timer.observe("scorer", s.plugin_type, s.name, clock() - start)
    return totals if totals is not None else [0.0] * len(endpoints)


class ScoresView(Mapping[str, float]):
    """``SchedulingResult.scores``: each candidate's total by address, read from the totals list
    (no per-request dict; nothing on the hot path reads it)."""

    __slots__ = ("_addresses", "_totals")

    def __init__(self, addresses: Addresses, totals: Sequence[float]) -> None:
        self._addresses = addresses
        self._totals = totals

    def __getitem__(self, address: str) -> float:
        return self._totals[self._addresses.position[address]]

    def __iter__(self) -> Iterator[str]:
        return iter(self._addresses.ordered)

    def __len__(self) -> int:
        return len(self._totals)

    def __repr__(self) -> str:
        return f"ScoresView({dict(self)!r})"
