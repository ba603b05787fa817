"""Per-snapshot memos for the scheduling hot path (docs/architecture.md, principle 7).

The scraper publishes each pool's endpoints as a new immutable tuple of immutable views, and that
tuple serves every request until the next publish. Work that depends only on those views (what a
filter keeps, a load score, the per-endpoint constants of a cost model) is done once per tuple and
reused while the same tuple object comes back: these memos hold the tuple they were computed from
and compare by identity, so a recycled ``id`` can never alias a different snapshot. The scraper
publishes after each endpoint's scrape, so a tuple often differs from the last one by one view:
:class:`ViewRecords` then rebuilds only that view's record (and builds none for a subset of views it
has seen), and a subset that says where its views are in a snapshot (:class:`ViewsAt`) takes
the snapshot's records by position.

Only tuples are memoised (a list could change between calls); any other sequence is computed
afresh on every call, with the same result. Each memo holds one entry (one pool per scheduler)
stored as one pair, so a reader never sees a key with another key's value.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from kvgate.policies.pool_views import PoolViews, ViewsAt
from kvgate.policies.types import EndpointView

V = TypeVar("V")
R = TypeVar("R")


class TupleMemo(Generic[V]):
    """One value computed from one endpoints tuple."""

    __slots__ = ("_entry",)

    def __init__(self) -> None:
        self._entry: tuple[Sequence[EndpointView], V] | None = None

    def get(self, endpoints: Sequence[EndpointView], compute: Callable[[Sequence[EndpointView]], V]) -> V:
        entry = self._entry
        if entry is not None and entry[0] is endpoints:
            return entry[1]
        value = compute(endpoints)
        if isinstance(endpoints, tuple):
            self._entry = (endpoints, value)
        return value


class ViewRecords(Generic[R]):
    """One record per endpoint, derived from its view alone, in endpoint order.

    Records are kept per view object, so a new tuple that keeps most views (the scraper replaces
    the view of the endpoint it just scraped) and a subset of a snapshot (what ``candidate-set``
    passes on from a large pool, a new tuple per request) build only the records of views not seen
    before. The cache holds the views themselves, so an ``id`` in it cannot be recycled; it is
    emptied when it outgrows ``max(MIN_CACHED, 4 × the tuple)``: bounded memory whatever the churn.
    """

    __slots__ = ("_build", "_by_view", "_entry", "_positions")

    MIN_CACHED = 8192

    def __init__(self, build: Callable[[EndpointView], R]) -> None:
        self._build = build
        self._entry: tuple[Sequence[EndpointView], list[R]] | None = None
        self._by_view: dict[int, tuple[EndpointView, R]] = {}
        self._positions: dict[str, int] | None = None
        """Address → position in the entry's tuple, when it is a :class:`PoolViews` (built lazily)."""

    def get(self, endpoints: Sequence[EndpointView]) -> Sequence[R]:
        """The records of ``endpoints`` (read-only: the same list serves the next call)."""
        if isinstance(endpoints, ViewsAt) and isinstance(endpoints.parent, PoolViews):
            # a subset of a snapshot that names its changes: the parent's records, by position
            of_parent = self._kept(endpoints.parent)
            return [of_parent[i] for i in endpoints.positions]
        return self._kept(endpoints)

    def _kept(self, endpoints: Sequence[EndpointView]) -> list[R]:
        entry = self._entry
        if entry is not None:
            if entry[0] is endpoints:
                return entry[1]
            if isinstance(endpoints, PoolViews) and len(endpoints) == len(entry[0]):
                changed = endpoints.changed_since(entry[0])
                if changed is not None:
                    replaced = self._replaced(entry[1], endpoints, changed)
                    if replaced is not None:
                        return replaced
        self._positions = None
        build = self._build
        by_view = self._by_view
        if len(by_view) > max(self.MIN_CACHED, 4 * len(endpoints)):
            by_view.clear()
        lookup = by_view.get
        records: list[R] = []
        append = records.append
        for view in endpoints:
            hit = lookup(id(view))
            if hit is None or hit[0] is not view:
                hit = by_view[id(view)] = (view, build(view))
            append(hit[1])
        if isinstance(endpoints, tuple):
            self._entry = (endpoints, records)
        return records

    def _replaced(self, last: list[R], endpoints: PoolViews, changed: set[str]) -> list[R] | None:
        """The last records with those of the ``changed`` endpoints built again (the snapshot names
        them: work for those alone, not a pass over the pool); None when one of them is not where
        the last full pass found it."""
        positions = self._positions
        if positions is None:
            entry = self._entry
            assert entry is not None
            positions = self._positions = {view.address: i for i, view in enumerate(entry[0])}
        records = list(last)
        build, by_view = self._build, self._by_view
        for address in changed:
            i = positions.get(address)
            if i is None or endpoints[i].address != address:
                return None
            view = endpoints[i]
            hit = by_view.get(id(view))
            if hit is None or hit[0] is not view:
                hit = by_view[id(view)] = (view, build(view))
            records[i] = hit[1]
        self._entry = (endpoints, records)
        return records
