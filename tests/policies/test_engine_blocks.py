"""The index of the engines' reported blocks (``policies.engine_blocks``)."""

from __future__ import annotations

from kvgate.policies.engine_blocks import EngineBlockIndex, block_keys

A, B = "10.0.0.1:8000", "10.0.0.2:8000"
DOC = list(range(100, 164))  # 64 tokens: 4 blocks of 16


def test_keys_chain_the_prefix_and_name_the_adapter() -> None:
    keys = block_keys(DOC, 16)
    assert len(keys) == 4
    assert block_keys(DOC[:40], 16) == keys[:2]  # a partial block is no block
    assert block_keys([1, *DOC[1:]], 16)[1] != keys[1]  # a different first block changes every key after
    assert block_keys(DOC, 16, lora="sql") != keys
    assert block_keys(DOC, 16, salt="tenant-a") != keys


def test_a_stored_prefix_matches_from_the_first_block_on() -> None:
    index = EngineBlockIndex()
    index.stored(A, [b"a1", b"a2"], None, DOC[:32], 16)
    index.stored(A, [b"a3"], b"a2", DOC[32:48], 16)  # continues from its parent
    index.stored(B, [901, 902, 903, 904], None, DOC, 16)  # another engine, other hashes, same tokens
    keys = block_keys(DOC, 16)
    assert index.matches(keys) == {A: 3, B: 4}
    assert index.matches(block_keys([7, *DOC[1:]], 16)) == {}  # the first block differs
    index.removed(B, [904, 903])  # an engine evicts a sequence's blocks tail first
    assert index.matches(keys) == {A: 3, B: 2}


def test_a_block_whose_parent_was_missed_is_not_indexed_and_is_counted() -> None:
    index = EngineBlockIndex()
    index.stored(A, [b"x3"], b"x2", DOC[32:48], 16)
    assert index.unresolved == 1
    assert index.blocks(A) == 0


def test_tiers_are_apart_and_forget_clears_every_tier_of_one_endpoint() -> None:
    index = EngineBlockIndex()
    index.stored(A, [1, 2], None, DOC[:32], 16)
    index.stored(A, [1, 2], None, DOC[:32], 16, medium="CPU")
    index.stored(B, [1, 2], None, DOC[:32], 16)
    keys = block_keys(DOC, 16)
    assert index.matches(keys, medium="CPU") == {A: 2}
    index.forget(A)
    assert index.matches(keys) == {B: 2}
    assert index.matches(keys, medium="CPU") == {}


def test_each_endpoint_is_bounded_oldest_first() -> None:
    index = EngineBlockIndex(max_blocks_per_endpoint=2)
    index.stored(A, [1, 2, 3], None, list(range(48)), 16)
    assert index.blocks(A) == 2
    assert index.matches(block_keys(list(range(48)), 16)) == {}  # its first block was forgotten


def test_matches_by_binary_search_equal_a_walk_over_leading_runs() -> None:
    """Each endpoint holding a leading run of a chain (what engines hold: tail-first eviction), of
    random lengths: the binary search's counts are the runs' lengths."""
    import random

    rng = random.Random(11)
    doc = list(range(5000, 5000 + 16 * 64))  # 64 blocks
    keys = block_keys(doc, 16)
    for _ in range(50):
        index = EngineBlockIndex()
        runs = {f"10.0.0.{i}:8000": rng.randint(0, 64) for i in range(8)}
        for endpoint, run in runs.items():
            if run:
                index.stored(endpoint, list(range(run)), None, doc[:16 * run], 16)
        assert index.matches(keys) == {e: run for e, run in runs.items() if run}
        assert index.matches(keys[:10]) == {e: min(run, 10) for e, run in runs.items() if run}


def test_an_adapters_continued_chain_matches_as_the_request_keys_it() -> None:
    """vLLM stores a prompt's new blocks after a prefix hit (or a later prefill chunk) as another
    event whose parent is the last block before them: under an adapter, those keys chain on from
    the parent's (the adapter's name entered at the root), as the request's keys do."""
    index = EngineBlockIndex()
    index.stored(A, [1, 2], None, DOC[:32], 16, lora="sql")
    index.stored(A, [3, 4], 2, DOC[32:], 16, lora="sql")
    assert index.matches(block_keys(DOC, 16, lora="sql")) == {A: 4}
    assert index.matches(block_keys(DOC, 16)) == {}  # the base model's blocks are others


def test_the_cache_salt_in_a_first_blocks_extra_keys_enters_the_chain() -> None:
    """vLLM's extra keys: the adapter's name on every block, the salt on a prompt's first."""
    index = EngineBlockIndex()
    index.stored(A, [1, 2], None, DOC[:32], 16, lora="sql", extra_keys=[["sql", "tenant-a"], ["sql"]])
    index.stored(A, [3, 4], 2, DOC[32:], 16, lora="sql", extra_keys=[["sql"], ["sql"]])
    index.stored(B, [1, 2, 3, 4], None, DOC, 16, extra_keys=[["tenant-b"], None, None, None])
    assert index.matches(block_keys(DOC, 16, lora="sql", salt="tenant-a")) == {A: 4}
    assert index.matches(block_keys(DOC, 16, salt="tenant-b")) == {B: 4}
    assert index.matches(block_keys(DOC, 16)) == {}  # salted blocks are no one else's


def test_a_multimodal_block_is_its_images_and_no_text_request_matches_past_it() -> None:
    """Two prompts whose image placeholders are the same tokens but whose images differ are other
    blocks from the image on, as in the engine; the text before the image matches."""
    index = EngineBlockIndex()
    image_a = [None, [["img-a", 4]], [["img-a", -12]], None]
    image_b = [None, [["img-b", 4]], [["img-b", -12]], None]
    index.stored(A, [1, 2, 3, 4], None, DOC, 16, extra_keys=image_a)
    index.stored(B, [1, 2, 3, 4], None, DOC, 16, extra_keys=image_b)
    assert index.matches(block_keys(DOC, 16)) == {A: 1, B: 1}
    index.stored(A, [5], 4, DOC[:16], 16)  # a later block chains on from the image's
    assert index.blocks(A) == 5


def test_a_hybrid_models_sliding_window_group_does_not_touch_the_prefix() -> None:
    """vLLM reports each KV-cache group's blocks, the same hashes in each: the sliding-window
    group's evictions must not take the full-attention group's blocks away."""
    index = EngineBlockIndex()
    index.stored(A, [1, 2, 3, 4], None, DOC, 16, group=0, kind="full_attention")
    index.stored(A, [1, 2, 3, 4], None, DOC, 16, group=1, kind="sliding_window")
    index.removed(A, [1, 2], group=1)  # out of the window
    assert index.matches(block_keys(DOC, 16)) == {A: 4}
    assert index.other_groups == 4
    index.removed(A, [4, 3], group=0)
    assert index.matches(block_keys(DOC, 16)) == {A: 2}
    # an engine whose first report is a window group's follows the full-attention group after it
    index.stored(B, [1, 2], None, DOC[:32], 16, group=0, kind="sliding_window")
    index.stored(B, [1, 2], None, DOC[:32], 16, group=1, kind="mla_attention")
    assert index.matches(block_keys(DOC, 16)) == {A: 2, B: 2}
    index.forget(B)  # a restart: the groups are learned again
    index.stored(B, [1], None, DOC[:16], 16)
    assert index.matches(block_keys(DOC, 16)) == {A: 2, B: 1}
