"""The approximate prefix-cache index: which endpoint probably holds which prompt blocks.

Per endpoint, an LRU of block hashes (an ``OrderedDict``) whose capacity comes from the replica's
``num_gpu_blocks`` (converted to index blocks by the caller). Block hashes are chained, so a block
hash names a whole prefix and a match must start at block 0: a reverse map from FIRST-block hashes
to the endpoints holding them finds the candidates in one lookup, whatever the number of endpoints.

Memory is bounded HARD: ``max_entries`` caps the (endpoint, hash) entries across all endpoints,
whatever the endpoints' own capacities say (peers have run out of memory here: 512 replicas ×
GIE's 31,250 default is 16 M entries). When the cap is reached the inserting endpoint evicts its
own oldest entries while it holds more than its fair share (``max_entries / endpoints``), otherwise
the largest endpoint does. Measured cost: about ``BYTES_PER_ENTRY`` bytes per entry on CPython 3.11
(LRU slot + int, amortised; see tests/policies/test_prefix_index.py).

Blocks of one request are inserted last block first, so the first block is the most recently used:
eviction then trims a cached prompt from its tail, as vLLM's free-block queue does. Invariant: what
an endpoint holds of any prompt is a LEADING RUN of its blocks (a later prompt sharing blocks 0..j
refreshes all of them together, and eviction takes the least recent, i.e. the tail, first). So the
matched length per candidate is found by binary search over the prompt's blocks: O(log blocks)
dict lookups per candidate instead of a walk over all blocks, and two when it holds as many blocks as the
candidate before it (the holders of a shared system prompt: bench/results/pick_cost.md).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

BYTES_PER_ENTRY = 200
"""Upper bound of resident bytes per index entry: ~100 measured with tracemalloc (LRU slot), ~130
with the hash's own int object, rounded up to 200 for the per-endpoint dicts and the first-block map."""

DEFAULT_MAX_ENTRIES = 1_000_000
"""Default hard cap: at most ~200 MB at ``BYTES_PER_ENTRY`` (64 replicas × GIE's 31,250 would be 2 M)."""


class PrefixIndex:
    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be positive")
        self.max_entries = max_entries
        self._lru: dict[str, OrderedDict[int, None]] = {}
        self._first: dict[int, set[str]] = {}
        self._total = 0

    @property
    def total_entries(self) -> int:
        return self._total

    def entries(self, address: str) -> int:
        lru = self._lru.get(address)
        return 0 if lru is None else len(lru)

    def match(self, hashes: Sequence[int]) -> dict[str, int]:
        """Leading blocks of ``hashes`` each endpoint holds (endpoints with none are absent)."""
        if not hashes:
            return {}
        holders = self._first.get(hashes[0])
        if not holders:
            return {}
        n = len(hashes)
        last = hashes[n - 1]
        matched: dict[str, int] = {}
        guess = 0  # the last holder's length: holders of a shared prompt mostly hold the same run
        for address in holders:
            lru = self._lru[address]
            if last in lru:
                matched[address] = n
                continue
            if 0 < guess < n and hashes[guess - 1] in lru and hashes[guess] not in lru:
                matched[address] = guess
                continue
            lo, hi = 1, n - 1  # hashes[:lo] held; hashes[hi] not held
            while hi - lo > 0:
                mid = (lo + hi) // 2
                if hashes[mid] in lru:
                    lo = mid + 1
                else:
                    hi = mid
            matched[address] = guess = lo
        return matched

    def insert(self, address: str, hashes: Sequence[int], capacity: int) -> None:
        """Record that ``address`` now holds ``hashes``; trims it to ``capacity`` and the global cap."""
        if not hashes:
            return
        lru = self._lru.get(address)
        if lru is None:
            lru = self._lru[address] = OrderedDict()
        before = len(lru)
        move = lru.move_to_end
        for h in reversed(hashes):
            if h in lru:
                move(h)
            else:
                lru[h] = None
        self._total += len(lru) - before
        first = self._first.get(hashes[0])
        if first is None:
            self._first[hashes[0]] = {address}
        else:
            first.add(address)
        self._evict(address, lru, max(1, capacity))
        if self._total > self.max_entries:
            self._enforce_global(address)

    def forget(self, address: str) -> None:
        lru = self._lru.pop(address, None)
        if lru is None:
            return
        self._total -= len(lru)
        first = self._first
        for h in lru:
            held = first.get(h)
            if held is not None:
                held.discard(address)
                if not held:
                    del first[h]

    def _evict(self, address: str, lru: OrderedDict[int, None], keep: int) -> None:
        excess = len(lru) - keep
        if excess <= 0:
            return
        first = self._first
        for _ in range(excess):
            h, _none = lru.popitem(last=False)
            held = first.get(h)
            if held is not None:
                held.discard(address)
                if not held:
                    del first[h]
        self._total -= excess
        if not lru:
            del self._lru[address]

    def _enforce_global(self, inserting: str) -> None:
        fair = max(1, self.max_entries // max(1, len(self._lru)))
        lru = self._lru.get(inserting)
        if lru is not None and len(lru) > fair:
            self._evict(inserting, lru, max(fair, len(lru) - (self._total - self.max_entries)))
        while self._total > self.max_entries:
            victim = max(self._lru, key=lambda a: len(self._lru[a]))
            victim_lru = self._lru[victim]
            over = self._total - self.max_entries
            self._evict(victim, victim_lru, max(0, len(victim_lru) - over))
