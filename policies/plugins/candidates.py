"""``candidate-set``: in a large pool, score a few endpoints likely to win, not every endpoint
(issue 35: the pick cost was linear in the pool, ~1.5 ms at 1,000 endpoints).

A filter that runs first. At or below ``above`` endpoints it returns its input unchanged (the same
object: the per-snapshot memos downstream hold). Above, it keeps, in the pool's order:

- the endpoints holding the longest cached prefix of the prompt (``holders`` of them, longest first:
  the prefix index's or the engines' matches, which the scorers read anyway),
- those running the request's LoRA adapter, or with it queued,
- the ``least_loaded`` by what their last scrape says (waiting requests, then KV-cache usage, then
  running requests),
- and ``sample`` more at random (an endpoint the scrape ranks low still gets the chance the
  scorers give it).

What it gives up: an endpoint outside these sets is not scored, though the full model might have
preferred it (one whose queue drained since its scrape, with no prefix and no adapter). Below
``above`` nothing changes, so the routing benchmark's fleets (8-16 replicas) route as before.
Measured without the least loaded (a random sample of 24 alone: the power of d choices) in the
virtual-time replay at 256 replicas: p90 TTFT +5 % on shared-prefix-fit and p99 +10 %, LoRA mix's
p99 worse too; with them kept by a tournament among each pick's sample (no pass over the snapshot)
LoRA mix's p90 TTFT went 20 -> 26 ms (bench/results/candidate-set.md).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
import operator
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from pydantic import Field

from kvgate.policies.framework import SchedulingContext
from kvgate.policies.plugins.params import Params, parse_params
from kvgate.policies.pool_views import PoolViews, ViewsAt
from kvgate.policies.types import EndpointView


class CandidateSetParams(Params):
    above: Annotated[int, Field(ge=1)] = 128
    holders: Annotated[int, Field(ge=0)] = 16
    least_loaded: Annotated[int, Field(ge=0)] = 24
    sample: Annotated[int, Field(ge=0)] = 16


_Key = tuple[int, float, int, int]
"""An endpoint's rank among the least loaded: waiting requests, KV-cache usage, running, position."""


class _Pool:
    """What depends on the endpoints alone: each address's position, the least loaded and the
    endpoints running or queueing each adapter, kept current as the scraper replaces views.

    The scraper publishes a new tuple per scrape tick (at 1,000 endpoints about one a millisecond,
    so nearly every pick sees a new one) and a rebuild is O(pool) in Python (~0.5 ms at 1,000 on the
    2-core machine). A new tuple of the same size costs work for the replaced views only, which
    the scraper's tuple names (``policies.pool_views``; another tuple is compared with the last
    one: a C-level identity diff, ~30 µs at 1,000): the least loaded are ranked again among the previous
    ones and the replaced ones, and the replaced views' adapters counted (an endpoint that improved
    or loaded an adapter counts at its next scrape, as with a rebuild). One that did not change but
    would now rank among the least loaded (others got worse) waits for its next scrape or the next
    rebuild (every ``REBUILD_S``). Ranking instead every 20 ms from a full rebuild cost the replay
    at 256 replicas p90 TTFT 21.5 -> 24.1 ms on shared-prefix-exceed at 1.2x. Rebuilt at once when
    the pool's size changes or a position no longer names its address (one endpoint left and
    another came); an endpoint that came in place of one that left, the pool's size unchanged, is
    a candidate from the next rebuild.
    """

    __slots__ = ("adapters", "built_at", "endpoints", "least_keys", "least_loaded", "position", "size")

    REBUILD_S = 0.05

    def __init__(self, size: int) -> None:
        self.size = size
        self.endpoints: Sequence[EndpointView] = ()
        self.built_at = -math.inf
        self.position: dict[str, int] = {}
        self.least_keys: list[_Key] = []
        """The least loaded's ranking keys, ascending (``_load``)."""
        self.least_loaded: list[int] = []
        """Their positions, in that order."""
        self.adapters: dict[str, set[int]] = {}

    def update(self, endpoints: Sequence[EndpointView], now: float) -> None:
        old = self.endpoints
        if (
            not isinstance(endpoints, tuple)  # a list may have changed in place (``policies.memo``)
            or len(endpoints) != len(old)
            or not 0.0 <= now - self.built_at <= self.REBUILD_S
        ):
            self.rebuild(endpoints, now)
            return
        if endpoints is old:
            return
        changed = self._changed(old, endpoints)
        if changed is None:
            self.rebuild(endpoints, now)  # the positions moved
            return
        self.endpoints = endpoints
        adapters = self.adapters
        for i in changed:
            before, after = _adapters(old[i]), _adapters(endpoints[i])
            if before == after:
                continue
            for adapter in before - after:
                holders = adapters.get(adapter)
                if holders is not None:
                    holders.discard(i)
                    if not holders:
                        del adapters[adapter]
            for adapter in after - before:
                adapters.setdefault(adapter, set()).add(i)
        if self.size:  # the least loaded among the last ones and the replaced ones, by their new keys
            replaced = set(changed)
            keys = [key for key in self.least_keys if key[3] not in replaced]
            for i in changed:
                key = _load(endpoints[i], i)
                if key is not None:
                    bisect.insort(keys, key)
            del keys[self.size:]
            self.least_keys = keys
            self.least_loaded = [key[3] for key in keys]

    def _changed(self, old: Sequence[EndpointView], endpoints: tuple[EndpointView, ...]) -> list[int] | None:
        """The positions whose views differ between ``old`` and ``endpoints`` (same size), from what
        the scraper says it replaced (:class:`PoolViews`) or, where it cannot say, by comparing the
        tuples (O(pool): ~30 µs at 1,000 endpoints); None when a named endpoint is not at the position
        the last rebuild gave it."""
        addresses = endpoints.changed_since(old) if isinstance(endpoints, PoolViews) else None
        if addresses is None:
            return list(itertools.compress(range(len(endpoints)), map(operator.is_not, old, endpoints)))
        position = self.position
        changed = [position.get(address, -1) for address in addresses]
        if any(i < 0 or endpoints[i].address != a for i, a in zip(changed, addresses, strict=True)):
            return None
        return changed

    def positions_of(self, endpoints: Sequence[EndpointView], addresses: list[str], now: float) -> list[int]:
        """The positions in ``endpoints`` of those of ``addresses`` in the pool as last rebuilt (an
        endpoint that left keeps its prefix entries until they age out: not a reason to rebuild)."""
        position = self.position
        found = [(address, i) for address in addresses if (i := position.get(address)) is not None]
        if any(endpoints[i].address != address for address, i in found):
            self.rebuild(endpoints, now)  # the positions moved
            position = self.position
            return [i for address in addresses if (i := position.get(address)) is not None]
        return [i for _, i in found]

    def rebuild(self, endpoints: Sequence[EndpointView], now: float) -> None:
        self.endpoints = endpoints
        self.built_at = now
        self.position = {e.address: i for i, e in enumerate(endpoints)}
        keyed: list[_Key] = []
        adapters: dict[str, set[int]] = {}
        for i, view in enumerate(endpoints):
            m = view.metrics
            if m is None:
                continue
            if view.healthy:
                keyed.append((m.waiting, m.kv_cache_usage, m.running, i))
            if m.active_loras or m.waiting_loras:
                for adapter in m.active_loras | m.waiting_loras:
                    adapters.setdefault(adapter, set()).add(i)
        self.least_keys = heapq.nsmallest(self.size, keyed)
        self.least_loaded = [key[3] for key in self.least_keys]
        self.adapters = adapters


def _load(view: EndpointView, i: int) -> _Key | None:
    m = view.metrics
    return None if m is None or not view.healthy else (m.waiting, m.kv_cache_usage, m.running, i)


def _adapters(view: EndpointView) -> frozenset[str]:
    m = view.metrics
    return frozenset() if m is None else m.active_loras | m.waiting_loras


class CandidateSetFilter:
    REBUILD_S = _Pool.REBUILD_S

    def __init__(self, params: CandidateSetParams | None = None) -> None:
        self.params = params or CandidateSetParams()
        self._pool = _Pool(self.params.least_loaded)

    @staticmethod
    def from_parameters(parameters: Mapping[str, Any] | None) -> CandidateSetFilter:
        return CandidateSetFilter(parse_params(CandidateSetParams, parameters, "candidate-set"))

    def filter(self, ctx: SchedulingContext, endpoints: Sequence[EndpointView]) -> Sequence[EndpointView]:
        p = self.params
        n = len(endpoints)
        if n <= p.above:
            return endpoints
        pool = self._pool
        pool.update(endpoints, ctx.now)
        keep = set(pool.least_loaded)
        matches = ctx.prefix_matches()
        if matches and p.holders:
            best = matches.items() if len(matches) <= p.holders else \
                heapq.nlargest(p.holders, matches.items(), key=operator.itemgetter(1))
            keep.update(pool.positions_of(endpoints, [address for address, _ in best], ctx.now))
        keep.update(pool.adapters.get(ctx.request.target_model, ()))
        if p.sample:
            keep.update(ctx.rng.choices(range(n), k=p.sample))  # (with replacement: half the cost)
        if isinstance(endpoints, tuple):  # (the scorers take their per-view records by position)
            return ViewsAt.of(endpoints, sorted(keep))
        return tuple(endpoints[i] for i in sorted(keep))
