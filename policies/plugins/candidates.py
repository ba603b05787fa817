"""``candidate-set``: in a large pool, score a few endpoints likely to win, not every endpoint
(issue 35: the pick cost was linear in the pool, ~1.5 ms at 1,000 endpoints).

A filter that runs first. At or below ``above`` endpoints it returns its input unchanged (the same
object: the per-snapshot memos downstream hold). Above, it keeps, in the pool's order:

- the endpoints holding the longest cached prefix of the prompt (``holders`` of them, longest first:
  the prefix index's or the engines' matches, which the scorers read anyway),
- those running the request's LoRA adapter, or with it queued,
- the ``least_loaded`` by what their last scrape says (waiting requests, then KV-cache usage, then
  running requests): computed once per snapshot,
- and ``sample`` more at random (load spreads over the pool, and an endpoint the snapshot ranks low
  still gets the chance the scorers give it).

What it gives up: an endpoint outside all four sets is not scored, though the full model might have
preferred it (one whose queue drained since its scrape, with no prefix and no adapter). Below
``above`` nothing changes, so the routing benchmark's fleets (8-16 replicas) route as before.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from pydantic import Field

from kvgate.policies.framework import SchedulingContext
from kvgate.policies.memo import TupleMemo
from kvgate.policies.plugins.params import Params, parse_params
from kvgate.policies.types import EndpointView


class CandidateSetParams(Params):
    above: Annotated[int, Field(ge=1)] = 128
    holders: Annotated[int, Field(ge=0)] = 16
    least_loaded: Annotated[int, Field(ge=0)] = 24
    sample: Annotated[int, Field(ge=0)] = 16


class _Snapshot:
    """What depends on the endpoints tuple alone: each address's position, the least loaded, the
    endpoints running or queueing each adapter."""

    __slots__ = ("adapters", "least_loaded", "position")

    def __init__(self, endpoints: Sequence[EndpointView], least_loaded: int) -> None:
        self.position = {e.address: i for i, e in enumerate(endpoints)}
        keyed = [(_load(e), i) for i, e in enumerate(endpoints)]
        self.least_loaded = [i for _, i in heapq.nsmallest(least_loaded, keyed)]
        self.adapters: dict[str, list[int]] = {}
        for i, view in enumerate(endpoints):
            m = view.metrics
            if m is not None:
                for adapter in m.active_loras | m.waiting_loras:
                    self.adapters.setdefault(adapter, []).append(i)


def _load(view: EndpointView) -> tuple[int, float, int]:
    m = view.metrics
    if m is None or not view.healthy:
        return (1 << 30, 1.0, 0)
    return (m.waiting, m.kv_cache_usage, m.running)


class CandidateSetFilter:
    def __init__(self, params: CandidateSetParams | None = None) -> None:
        self.params = params or CandidateSetParams()
        self._memo: TupleMemo[_Snapshot] = TupleMemo()

    @staticmethod
    def from_parameters(parameters: Mapping[str, Any] | None) -> CandidateSetFilter:
        return CandidateSetFilter(parse_params(CandidateSetParams, parameters, "candidate-set"))

    def filter(self, ctx: SchedulingContext, endpoints: Sequence[EndpointView]) -> Sequence[EndpointView]:
        p = self.params
        n = len(endpoints)
        if n <= p.above:
            return endpoints
        snapshot = self._memo.get(endpoints, lambda e: _Snapshot(e, p.least_loaded))
        keep = set(snapshot.least_loaded)
        position = snapshot.position
        matches = ctx.prefix_matches()
        if matches and p.holders:
            best = matches.items() if len(matches) <= p.holders else \
                heapq.nlargest(p.holders, matches.items(), key=lambda item: item[1])
            keep.update(i for address, _ in best if (i := position.get(address)) is not None)
        keep.update(snapshot.adapters.get(ctx.request.target_model, ()))
        if p.sample:
            keep.update(ctx.rng.sample(range(n), min(p.sample, n)))
        return tuple(endpoints[i] for i in sorted(keep))
