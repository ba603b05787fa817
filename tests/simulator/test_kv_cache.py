"""The simulated KV block pool: chained hashes, prefix hits, reference counts and LRU eviction."""

from __future__ import annotations

import pytest

from kvgate.simulator.kv_cache import KVCache, prompt_block_hashes


def test_hashes_are_chained_and_seeded() -> None:
    tokens = list(range(40))
    hashes = prompt_block_hashes(tokens, 16, "model")
    assert len(hashes) == 2  # the 8-token tail is not a full block
    assert prompt_block_hashes(tokens[:32], 16, "model") == hashes
    assert prompt_block_hashes(tokens, 16, "adapter") != hashes
    assert prompt_block_hashes(tokens, 16, "adapter")[0] != hashes[0]
    changed_first = [99, *tokens[1:]]
    other = prompt_block_hashes(changed_first, 16, "model")
    assert other[0] != hashes[0]
    assert other[1] != hashes[1]  # same second block, different chain
    assert prompt_block_hashes(tokens[:15], 16, "model") == ()


def _cached_sequence(cache: KVCache, hashes: tuple[int, ...]) -> list[int]:
    blocks = cache.allocate(len(hashes))
    for block, h in zip(blocks, hashes, strict=True):
        cache.register(block, h)
    return blocks


def test_prefix_hit_survives_release_until_the_block_is_reused() -> None:
    cache = KVCache(4, 16)
    hashes = prompt_block_hashes(list(range(48)), 16, "m")
    blocks = _cached_sequence(cache, hashes)
    assert cache.usage == 0.75
    cache.release(blocks)
    assert cache.usage == 0.0
    assert cache.match_prefix(hashes, 10) == blocks
    assert cache.match_prefix(hashes, 2) == blocks[:2]
    # the empty block is handed out first, then the tail of the released sequence
    cache.allocate(2)
    assert cache.match_prefix(hashes, 10) == blocks[:2]
    assert cache.count_unreferenced(blocks[:2]) == 2
    cache.acquire(blocks[:2])  # hit on free cached blocks takes them out of the free queue
    assert cache.num_free == 0
    with pytest.raises(ValueError, match="cannot allocate"):
        cache.allocate(1)


def test_lru_evicts_the_least_recently_released_first() -> None:
    cache = KVCache(2, 4)
    a = prompt_block_hashes([1, 2, 3, 4], 4, "m")
    b = prompt_block_hashes([5, 6, 7, 8], 4, "m")
    block_a = _cached_sequence(cache, a)
    block_b = _cached_sequence(cache, b)
    cache.release(block_a)
    cache.release(block_b)
    cache.acquire(cache.match_prefix(a, 1))  # touch a
    cache.release(block_a)
    cache.allocate(1)  # evicts b, released longest ago
    assert cache.match_prefix(b, 1) == []
    assert cache.match_prefix(a, 1) == block_a
    assert cache.num_cached_blocks == 1


def test_shared_blocks_are_reference_counted() -> None:
    cache = KVCache(3, 4)
    h = prompt_block_hashes([1, 2, 3, 4], 4, "m")
    first = _cached_sequence(cache, h)
    hit = cache.match_prefix(h, 1)
    cache.acquire(hit)
    cache.release(first)
    assert cache.num_free == 2  # still referenced by the second sequence
    cache.release(hit)
    assert cache.num_free == 3


def test_disabled_prefix_caching_never_matches() -> None:
    cache = KVCache(2, 4, enable_prefix_caching=False)
    h = prompt_block_hashes([1, 2, 3, 4], 4, "m")
    _cached_sequence(cache, h)
    assert cache.match_prefix(h, 1) == []
    assert cache.num_cached_blocks == 0
