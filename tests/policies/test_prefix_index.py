from __future__ import annotations

import tracemalloc

from kvgate.policies.hashing import PromptHasher
from kvgate.policies.prefix_index import BYTES_PER_ENTRY, PrefixIndex
from tests.policies.helpers import text


def hashes(seed: int, chars: int = 64 * 100) -> tuple[int, ...]:
    return PromptHasher().hashes("m", text(seed, chars))


def test_match_counts_leading_blocks_per_endpoint() -> None:
    index = PrefixIndex()
    full = hashes(1)
    index.insert("a", full, capacity=1000)
    index.insert("b", full[:40], capacity=1000)
    assert index.match(full) == {"a": 100, "b": 40}
    assert index.match(hashes(2)) == {}
    assert index.match(full[:10]) == {"a": 10, "b": 10}


def test_lru_capacity_trims_tail_first() -> None:
    index = PrefixIndex()
    full = hashes(1)
    index.insert("a", full, capacity=30)
    assert index.entries("a") == 30
    assert index.match(full) == {"a": 30}  # the leading 30 blocks survive


def test_forget_endpoint() -> None:
    index = PrefixIndex()
    index.insert("a", hashes(1), capacity=1000)
    index.forget("a")
    assert index.total_entries == 0
    assert index.match(hashes(1)) == {}


def test_hard_global_bound_under_a_flood_of_distinct_prompts() -> None:
    index = PrefixIndex(max_entries=5_000)
    for i in range(400):
        index.insert(f"10.0.0.{i % 16}:8000", hashes(i, 64 * 64), capacity=31_250)
        assert index.total_entries <= 5_000
    assert sum(index.entries(f"10.0.0.{i}:8000") for i in range(16)) == index.total_entries
    # recent prompts stay matchable
    assert index.match(hashes(399, 64 * 64))


def test_bytes_per_entry_documented_bound() -> None:
    prompts = [hashes(i, 64 * 256) for i in range(40)]
    tracemalloc.start()
    index = PrefixIndex()
    before = tracemalloc.get_traced_memory()[0]
    for i, h in enumerate(prompts):
        index.insert(f"e{i % 8}", h, capacity=100_000)
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert index.total_entries == 40 * 256
    assert used / index.total_entries <= BYTES_PER_ENTRY
