"""A pool's endpoints as the scraper publishes them, with which endpoints changed since earlier
publishes.

The scraper publishes a new tuple of a pool's views about once a millisecond at 1,000 endpoints
(every scrape tick), so nearly every pick sees a new one. A plugin that keeps per-pool structures
current (``candidate-set``'s least loaded and adapter holders) had to find what changed by comparing
the whole tuple with the last one it saw: O(pool) per pick (~30 µs at 1,000 endpoints on the 2-core
machine, bench/results/pick_cost.md), the one part of a large pool's pick still linear in the pool.
The scraper knows which views it replaced; :class:`PoolViews` carries that, immutably: each tuple
holds the changed addresses of the last ``KEEP`` publishes of its lineage (one lineage per pool per
scraper), so :meth:`PoolViews.changed_since` answers for any earlier tuple of the same lineage up to
``KEEP`` publishes back, and says ``None`` (compare the tuples) for anything else: a plain tuple, a
tuple from another scraper, a gap longer than ``KEEP``, or a publish that did not say (the pool's
membership changed).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

from kvgate.policies.types import EndpointView


class PoolViews(tuple[EndpointView, ...]):
    """A tuple of views that also says which addresses changed in its last ``KEEP`` publishes.

    Equal to, and usable as, a plain tuple of the same views; build one with :meth:`after`.
    """

    KEEP = 16

    lineage: object
    """Shared by the successive tuples of one pool published by one scraper."""
    generation: int
    """0 for a lineage's first tuple, one more for each publish after it."""
    recent: tuple[frozenset[str] | None, ...]
    """The addresses whose views each of the last (up to ``KEEP``) publishes replaced, oldest first;
    the last entry is this tuple's change against the one before it. None: not known."""

    @classmethod
    def after(
        cls, previous: Sequence[EndpointView] | None, views: Iterable[EndpointView],
        changed: Collection[str] | None,
    ) -> PoolViews:
        """``views``, published after ``previous`` with the views of ``changed`` replaced (None: not
        known, e.g. endpoints came or left). A ``previous`` that is not a :class:`PoolViews` starts
        a new lineage."""
        out = cls(views)
        if isinstance(previous, PoolViews):
            out.lineage = previous.lineage
            out.generation = previous.generation + 1
            out.recent = (*previous.recent[1 - cls.KEEP:], None if changed is None else frozenset(changed))
        else:
            out.lineage = object()
            out.generation = 0
            out.recent = ()
        return out

    @classmethod
    def with_replaced(
        cls, previous: PoolViews, positions: Mapping[str, int], changed: Collection[str],
        view_of: Callable[[str], EndpointView | None],
    ) -> PoolViews | None:
        """``previous`` with the views of ``changed`` replaced by ``view_of`` theirs, at the
        ``positions`` given (a copy of the tuple: no pass over the pool's owner); None when one of
        them is not where ``positions`` says, or has no view."""
        views = list(previous)
        for address in changed:
            i = positions.get(address)
            view = view_of(address)
            if i is None or view is None or i >= len(views) or views[i].address != address:
                return None
            views[i] = view
        return cls.after(previous, views, changed)

    def changed_since(self, earlier: Sequence[EndpointView]) -> set[str] | None:
        """The addresses whose views changed from ``earlier`` to this tuple (an empty set: none),
        or None when this tuple cannot say (then compare the two)."""
        if not isinstance(earlier, PoolViews) or earlier.lineage is not self.lineage:
            return None
        gap = self.generation - earlier.generation
        recent = self.recent
        if gap <= 0 or gap > len(recent):
            return set() if earlier is self else None
        out: set[str] = set()
        for changed in recent[len(recent) - gap:]:
            if changed is None:
                return None
            out |= changed
        return out


class ViewsAt(tuple[EndpointView, ...]):
    """Some views of a snapshot tuple (``parent``), in its order, with their ``positions`` in it:
    what ``candidate-set`` passes on from a large pool, a new tuple per pick. A plugin that keeps
    per-view records for the parent (``policies.memo.ViewRecords``, current by the parent's named
    changes) takes the subset's by position instead of looking up each view.
    """

    parent: tuple[EndpointView, ...]
    positions: tuple[int, ...]
    """Ascending; ``self[k] is parent[positions[k]]``."""

    @classmethod
    def of(cls, parent: tuple[EndpointView, ...], positions: Sequence[int]) -> ViewsAt:
        """The views of ``parent`` at ``positions`` (ascending)."""
        out = cls(map(parent.__getitem__, positions))
        out.parent = parent
        out.positions = tuple(positions)
        return out


class SubsetViews:
    """The views of a pool's tuple that ``keep`` selects (a disaggregated pool's decode or prefill
    endpoints, those a subset hint allows, those not ejected), kept per snapshot. A new snapshot
    that names its changes costs work for those endpoints alone, and the subset it gives names its
    own (a :class:`PoolViews` of one lineage), so the plugins' per-snapshot structures downstream
    follow the subset as they follow a pool. Other snapshots are selected anew (O(pool)); a
    sequence that is not a tuple is selected every time and not kept (it could change in place).
    """

    __slots__ = ("_keep", "_parent", "_parent_positions", "_positions", "_subset")

    def __init__(self, keep: Callable[[EndpointView], bool]) -> None:
        self._keep = keep
        self._parent: Sequence[EndpointView] | None = None
        self._subset: PoolViews | None = None
        self._parent_positions: dict[str, int] = {}
        self._positions: dict[str, int] = {}

    def of(self, endpoints: Sequence[EndpointView]) -> Sequence[EndpointView]:
        parent = self._parent
        if endpoints is parent and self._subset is not None:
            return self._subset
        if not isinstance(endpoints, tuple):
            return [view for view in endpoints if self._keep(view)]
        if isinstance(endpoints, PoolViews) and parent is not None and len(endpoints) == len(parent):
            changed = endpoints.changed_since(parent)
            if changed is not None:
                updated = self._updated(endpoints, changed)
                if updated is not None:
                    return updated
        return self._rebuild(endpoints)

    def _updated(self, endpoints: tuple[EndpointView, ...], changed: set[str]) -> PoolViews | None:
        """The subset with the changed views replaced; None when one is not where the last
        rebuild found it, or would now be selected differently (select again)."""
        assert self._subset is not None
        subset = list(self._subset)
        mine: list[str] = []
        for address in changed:
            i = self._parent_positions.get(address)
            if i is None or endpoints[i].address != address:
                return None
            view = endpoints[i]
            j = self._positions.get(address)
            if (j is not None) != self._keep(view):
                return None
            if j is not None:
                subset[j] = view
                mine.append(address)
        self._parent = endpoints
        self._subset = PoolViews.after(self._subset, subset, mine)
        return self._subset

    def _rebuild(self, endpoints: tuple[EndpointView, ...]) -> PoolViews:
        keep = self._keep
        subset = [view for view in endpoints if keep(view)]
        self._parent = endpoints
        self._parent_positions = {view.address: i for i, view in enumerate(endpoints)}
        self._positions = {view.address: j for j, view in enumerate(subset)}
        self._subset = PoolViews.after(self._subset, subset, None)
        return self._subset
