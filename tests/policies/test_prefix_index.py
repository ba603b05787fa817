from __future__ import annotations

import itertools
import random
import tracemalloc
from collections.abc import Mapping

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


def test_match_agrees_with_a_walk_over_the_blocks_whatever_the_holders_lengths() -> None:
    # many holders of one shared prefix at equal lengths (the matcher's shortcut) and at others
    rng = random.Random(11)
    index = PrefixIndex()
    prompts = [[1, *(rng.randrange(1 << 60) for _ in range(40))] for _ in range(6)]
    for e in range(60):
        prompt = prompts[e % len(prompts)]
        cut = rng.choice([5, 5, 5, 17, 40, rng.randrange(1, 41)])
        index.insert(f"e{e}", prompt[:cut], capacity=rng.choice([8, 1000]))
    for prompt in prompts:
        for length in (1, 3, 5, 6, 17, 30, 41):
            hashes = prompt[:length]
            expected: dict[str, int] = {}
            for e in range(60):
                lru: Mapping[int, None] = index._lru.get(f"e{e}", {})
                held = sum(1 for _ in itertools.takewhile(lru.__contains__, hashes))
                if held:
                    expected[f"e{e}"] = held
            assert index.match(hashes) == expected
