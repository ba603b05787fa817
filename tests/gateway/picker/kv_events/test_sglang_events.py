"""SGLang's KV events where they differ from vLLM's (``sglang/srt/mem_cache/radix_cache.py``,
``_record_store_event``/``_record_remove_event``, transcribed below): one ``BlockStored`` per page
(``block_size`` the page's length; SGLang's default page size is 1 token), each page's hash the first
64 bits of a SHA-256 chain over the pages' token ids as a *signed* int64, a node's first page
chained on its parent node's last page, no adapter or salt in the event. Encoded in the positional
(``array_like``) form. kvgate's decoder and index follow such a stream as they follow vLLM's."""

from __future__ import annotations

import hashlib
from typing import Any

from kvgate.gateway.picker.kv_events.subscriber import apply_batch
from kvgate.gateway.picker.kv_events.wire import decode_message
from kvgate.policies.engine_blocks import EngineBlockIndex, block_keys
from tests.gateway.picker.kv_events import vllm_format as v


def page_hash(tokens: list[int], prior: str | None) -> str:
    """SGLang's ``get_hash_str``: SHA-256 over the prior page's digest and each token id (4 bytes, LE)."""
    hasher = hashlib.sha256()
    if prior:
        hasher.update(bytes.fromhex(prior))
    for t in tokens:
        hasher.update(t.to_bytes(4, byteorder="little", signed=False))
    return hasher.hexdigest()


def to_int64(hexdigest: str) -> int:
    """SGLang's ``hash_str_to_int64``."""
    value = int(hexdigest[:16], 16)
    return value - 2**64 if value >= 2**63 else value


class RadixNode:
    """A radix-tree node as its events describe it: its tokens, its pages' digests."""

    def __init__(self, tokens: list[int], parent: RadixNode | None, page_size: int) -> None:
        prior = parent.digests[-1] if parent is not None else None
        self.parent = parent
        self.pages = [tokens[i:i + page_size] for i in range(0, len(tokens), page_size)]
        self.digests: list[str] = []
        for page in self.pages:
            prior = page_hash(page, prior)
            self.digests.append(prior)

    def stored(self) -> list[Any]:
        parent = to_int64(self.parent.digests[-1]) if self.parent is not None else None
        events: list[Any] = []
        for page, digest in zip(self.pages, self.digests, strict=True):
            events.append(v.OldBlockStored(block_hashes=[to_int64(digest)], parent_block_hash=parent,
                                           token_ids=page, block_size=len(page), lora_id=None, medium="GPU"))
            parent = to_int64(digest)
        return events

    def removed(self) -> list[Any]:
        return [v.OldBlockRemoved(block_hashes=[to_int64(d)], medium="GPU") for d in self.digests]


def follow(index: EngineBlockIndex, seq: int, events: list[Any]) -> None:
    apply_batch(index, "10.0.0.1:30000", decode_message(v.message(seq, events, old=True)))


def test_a_radix_trees_pages_are_followed_with_signed_hashes_and_node_chains() -> None:
    page = 16
    system = list(range(1000, 1000 + 64))
    first = RadixNode(system, None, page)  # the shared system prompt: a node of 4 pages
    question = RadixNode(list(range(5000, 5032)), first, page)  # a child node: 2 pages
    index = EngineBlockIndex()
    follow(index, 0, first.stored() + question.stored())
    keys = block_keys(system + list(range(5000, 5032)), page)
    assert index.matches(keys) == {"10.0.0.1:30000": 6}
    other = block_keys(system + list(range(7000, 7032)), page)
    assert index.matches(other) == {"10.0.0.1:30000": 4}  # the system prompt only
    follow(index, 1, question.removed())  # the leaf evicted
    assert index.matches(keys) == {"10.0.0.1:30000": 4}


def test_negative_hashes_decode_and_resolve() -> None:
    """Half of SGLang's published hashes are negative (the signed view of 64 bits)."""
    node = RadixNode(list(range(200)), None, 8)
    hashes = [to_int64(d) for d in node.digests]
    assert any(h < 0 for h in hashes)
    assert any(h > 0 for h in hashes)
    index = EngineBlockIndex()
    follow(index, 0, node.stored())
    assert index.matches(block_keys(list(range(200)), 8)) == {"10.0.0.1:30000": 25}


def test_sglangs_default_page_of_one_token_is_followed_token_by_token() -> None:
    """``--page-size 1`` (SGLang's default): every token its own block and event. Followed, at a
    block per token (docs/kv-events.md advises a page size of 16 or more for the picker's sake)."""
    tokens = list(range(300, 340))
    node = RadixNode(tokens, None, 1)
    index = EngineBlockIndex()
    follow(index, 0, node.stored())
    assert index.block_size == 1
    assert index.matches(block_keys([*tokens, 9, 9], 1)) == {"10.0.0.1:30000": 40}
