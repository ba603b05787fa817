"""Which endpoint holds which KV block, as the engines report it (issue 37; sans-IO).

The engines' own block hashes are opaque here (vLLM's depend on its hash function and seed); each
stored block is keyed instead by kvgate's chained hash of its tokens (:func:`block_keys`), which the
picker computes the same way from a request's tokens. An endpoint's engine hash → key map resolves
its later events: a stored block's parent (the key chain continues from it) and a removal. So an
index fed by several engines needs no agreement on hash functions, and a request's keys match a
block on every endpoint that holds the same tokens after the same prefix (same LoRA, same salt).

Per medium (``GPU``; ``CPU`` and others for offloaded tiers) an endpoint's blocks are kept in
insertion order and bounded (``max_blocks_per_endpoint``: the oldest forgotten first), so a lost
removal cannot grow the index without bound. A block stored after a parent this index never saw
(a missed event) cannot be keyed and is counted in ``unresolved``; the subscriber recovers missed
events by replay, and when it cannot, clears the endpoint (``forget``) and scoring falls back to the
approximate index for it.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import msgspec
import xxhash

from kvgate.policies.model_tokenizer import ModelTokenizer

ROOT_KEY = 0x9E3779B97F4A7C15
"""The chain's start: the key a first block's parent has."""
GPU = "GPU"
_NOBODY: frozenset[str] = frozenset()
_NO_HOLDERS: Mapping[int, set[str]] = {}
MAX_ADAPTERS = 4096
PREFIX_KINDS = frozenset({"full_attention", "mla_attention", "sink_full_attention", "unknown"})
"""vLLM's ``KVCacheSpecKind`` values of groups that keep every block of a prefix (the others:
``sliding_window``, ``sliding_window_mla``, ``chunked_local_attention``, ``mamba``, keep a window;
``cross_attention``, ``encoder_only_attention`` cache no prefix)."""


def chain_root(lora: str | None = None, salt: str | None = None) -> int:
    """The key a first block's parent has: ``ROOT_KEY``, mixed with the LoRA adapter's name and the
    cache salt when given."""
    if lora or salt:
        return xxhash.xxh3_64_intdigest(f"{lora or ''}\x00{salt or ''}".encode(), seed=ROOT_KEY)
    return ROOT_KEY


def block_keys(tokens: Sequence[int], block_size: int, *, lora: str | None = None, salt: str | None = None,
               parent: int = ROOT_KEY) -> list[int]:
    """The chained key of each whole block of ``tokens``: ``k_i = xxh3_64(tokens_i, seed=k_{i-1})``,
    the chain starting from ``parent`` (for a first block ``ROOT_KEY``, mixed with the LoRA adapter's
    name and the cache salt when given: blocks under another adapter or salt are other blocks, as in
    the engine). One C call per block over a view of the packed tokens (no copies)."""
    key = parent
    if lora or salt:
        key = xxhash.xxh3_64_intdigest(f"{lora or ''}\x00{salt or ''}".encode(), seed=key)
    whole = len(tokens) - len(tokens) % block_size
    if not whole:
        return []
    view = memoryview(array("I", tokens[:whole])).cast("B")
    width = 4 * block_size
    keys: list[int] = []
    append = keys.append
    digest = xxhash.xxh3_64_intdigest
    for start in range(0, len(view), width):
        key = digest(view[start:start + width], seed=key)
        append(key)
    return keys


def first_block_salt(extra_keys: Sequence[object] | None, lora: str | None) -> str | None:
    """The cache salt in a first block's extra keys (vLLM: the adapter's name, the multimodal
    items' ``(identifier, offset)`` pairs, then the salt, then a prompt-embeds digest)."""
    extras = extra_keys[0] if extra_keys else None
    if not isinstance(extras, list | tuple):
        return None
    for item in _without_adapter(extras, lora):
        if isinstance(item, str):
            return item
    return None


def _without_adapter(extras: Sequence[object], lora: str | None) -> Sequence[object]:
    return extras[1:] if lora and extras and extras[0] == lora else extras


def _unmatched(extras: object, lora: str | None, first: bool) -> bool:
    """Whether a block's extra keys hold something a request's keys do not carry (a multimodal
    item, a prompt-embeds digest): anything but the adapter's name and a first block's salt."""
    if not isinstance(extras, list | tuple):
        return extras is not None
    rest = _without_adapter(extras, lora)
    if first and rest and isinstance(rest[-1], str):
        rest = rest[:-1]
    return bool(rest)


def block_keys_with_extras(tokens: Sequence[int], block_size: int, parent: int,
                           extra_keys: Sequence[object], lora: str | None, *, first: bool) -> list[int]:
    """``block_keys`` where a block whose extra keys name something a request's keys cannot (a
    multimodal item, a prompt-embeds digest) has that mixed into its key, and so into every key
    after it: two images behind the same placeholder tokens are other blocks, as in the engine,
    and no text-only request matches them. ``first``: the blocks start a prompt (the first one's
    extra keys may hold the salt, which the chain's root has)."""
    keys: list[int] = []
    key = parent
    for i, start in enumerate(range(0, len(tokens) - len(tokens) % block_size, block_size)):
        key = block_keys(tokens[start:start + block_size], block_size, parent=key)[0]
        extras = extra_keys[i] if i < len(extra_keys) else None
        if _unmatched(extras, lora, first and i == 0):
            key = xxhash.xxh3_64_intdigest(msgspec.msgpack.encode(extras), seed=key)
        keys.append(key)
    return keys


class EngineCacheView(Protocol):
    """The engines' reported blocks of one pool (the picker's KV-event runtime provides it)."""

    def matches(self, keys: Sequence[int]) -> Mapping[str, int]:
        """Leading blocks of ``keys`` each endpoint holds (GPU)."""
        ...

    def in_step(self, endpoint: str) -> bool:
        """Whether ``endpoint``'s events are followed without loss."""
        ...

    def knows_adapter(self, name: str) -> bool:
        """Whether an engine stored blocks under LoRA adapter ``name`` (a base model never is one)."""
        ...

    def held(self, key: int) -> bool:
        """Whether any endpoint holds the block ``key`` (GPU)."""
        ...

    def tokenizer(self) -> ModelTokenizer | None:
        """The pool's model tokenizer as configured (None: none; a profile may name its own)."""
        ...

    def block_size(self) -> int | None:
        """The engines' block size as their events report it (None before any block was stored)."""
        ...

    def key_checked(self, endpoint: str, *, held: bool, trusted: bool) -> None:
        """A served request's last keyed block was (not) in ``endpoint``'s report a moment after it
        ended; ``trusted``: whether the pool's keys are, after it (``policies.key_checks``)."""
        ...


@dataclass(slots=True)
class _Tier:
    by_engine: OrderedDict[Hashable, int] = field(default_factory=OrderedDict)
    """Engine block hash → kvgate key, oldest first."""


class EngineBlockIndex:
    def __init__(self, max_blocks_per_endpoint: int = 262_144) -> None:
        self.max_blocks = max_blocks_per_endpoint
        self._tiers: dict[tuple[str, str], _Tier] = {}
        """(endpoint, medium) → its blocks."""
        self._holders: dict[str, dict[int, set[str]]] = {}
        """medium → key → endpoints holding that block."""
        self.unresolved = 0
        """Stored blocks whose parent was never seen (not indexed)."""
        self._adapters: OrderedDict[str, None] = OrderedDict()
        """LoRA adapter names blocks were stored under (most recent last, bounded)."""
        self.block_size: int | None = None
        """The block size of the last stored blocks (the engines of one pool share one)."""
        self._followed: dict[str, int] = {}
        """Endpoint → the KV-cache group whose blocks are indexed (hybrid models report several)."""
        self.other_groups = 0
        """Stored blocks of other groups (sliding-window, Mamba, a second full-attention group)."""

    # --- events -----------------------------------------------------------------------------------

    def stored(self, endpoint: str, engine_hashes: Sequence[Hashable], parent: Hashable | None,
               token_ids: Sequence[int], block_size: int, *, lora: str | None = None,
               medium: str = GPU, extra_keys: Sequence[object] | None = None,
               group: int | None = None, kind: str | None = None) -> None:
        """Blocks an engine stored, chained from ``parent`` (None: a prompt's first block).
        ``extra_keys``: vLLM's per-block extra keys (the adapter's name, the cache salt on a first
        block, a multimodal item's identifier and offset, a prompt-embeds digest), when the engine
        reports them. ``group``, ``kind``: the KV-cache group and its spec kind (hybrid models)."""
        if not self._follows(endpoint, group, kind):
            self.other_groups += len(engine_hashes)
            return
        self.block_size = block_size
        tier = self._tier(endpoint, medium)
        parent_key = ROOT_KEY if parent is None else self._key_of(endpoint, parent, medium)
        if parent_key is None or len(token_ids) < block_size * len(engine_hashes):
            self.unresolved += len(engine_hashes)
            return
        if lora:
            self._adapters[lora] = None
            self._adapters.move_to_end(lora)
            if len(self._adapters) > MAX_ADAPTERS:
                self._adapters.popitem(last=False)
        covered = token_ids[:block_size * len(engine_hashes)]
        if parent is None:
            # the adapter and the salt enter the chain at its root, as the request's keys have them;
            # a continuation chains on from its parent's key, which has them already
            parent_key = chain_root(lora, first_block_salt(extra_keys, lora))
        first = parent is None
        keys = (block_keys_with_extras(covered, block_size, parent_key, extra_keys, lora, first=first)
                if extra_keys and any(_unmatched(extras, lora, first and i == 0)
                                      for i, extras in enumerate(extra_keys))
                else block_keys(covered, block_size, parent=parent_key))
        holders = self._holders.setdefault(medium, {})
        for engine_hash, key in zip(engine_hashes, keys, strict=True):
            old = tier.by_engine.pop(engine_hash, None)
            if old is not None and old != key:
                self._drop_holder(holders, old, endpoint)
            tier.by_engine[engine_hash] = key
            holders.setdefault(key, set()).add(endpoint)
        while len(tier.by_engine) > self.max_blocks:
            _, oldest = tier.by_engine.popitem(last=False)
            self._drop_holder(holders, oldest, endpoint)

    def removed(self, endpoint: str, engine_hashes: Iterable[Hashable], *, medium: str = GPU,
                group: int | None = None) -> None:
        if self._followed.get(endpoint, group or 0) != (group or 0):
            return  # another KV-cache group's blocks (not indexed)
        tier = self._tiers.get((endpoint, medium))
        if tier is None:
            return
        holders = self._holders.get(medium, {})
        for engine_hash in engine_hashes:
            key = tier.by_engine.pop(engine_hash, None)
            if key is not None:
                self._drop_holder(holders, key, endpoint)

    def forget(self, endpoint: str) -> None:
        """Everything ``endpoint`` held, every medium (AllBlocksCleared, a restart, an unrecoverable gap)."""
        self._followed.pop(endpoint, None)
        for (address, medium) in [k for k in self._tiers if k[0] == endpoint]:
            tier = self._tiers.pop((address, medium))
            holders = self._holders.get(medium, {})
            for key in tier.by_engine.values():
                self._drop_holder(holders, key, endpoint)

    # --- queries ----------------------------------------------------------------------------------

    def matches(self, keys: Sequence[int], *, medium: str = GPU) -> Mapping[str, int]:
        """Leading blocks of ``keys`` each endpoint holds in ``medium`` (endpoints with none left out).

        What an endpoint holds of a chain is a leading run of its blocks: an engine frees a
        sequence's blocks tail first (vLLM queues them for eviction in reverse order), so a block
        goes before its parent. So the run's length per candidate (the holders of the first block)
        is found by binary search: O(log blocks) lookups each, not a walk over every block.
        """
        holders = self._holders.get(medium)
        if not holders or not keys:
            return {}
        first = holders.get(keys[0])
        if not first:
            return {}
        n = len(keys)
        get = holders.get
        last = get(keys[n - 1]) or _NOBODY
        counts: dict[str, int] = {}
        for endpoint in first:
            if endpoint in last:
                counts[endpoint] = n
                continue
            lo, hi = 1, n - 1  # keys[:lo] held, keys[hi] not
            while lo < hi:
                mid = (lo + hi) // 2
                here = get(keys[mid])
                if here is not None and endpoint in here:
                    lo = mid + 1
                else:
                    hi = mid
            counts[endpoint] = lo
        return counts

    def knows_adapter(self, name: str) -> bool:
        return name in self._adapters

    def held(self, key: int, medium: str = GPU) -> bool:
        return key in self._holders.get(medium, _NO_HOLDERS)

    def blocks(self, endpoint: str, medium: str = GPU) -> int:
        tier = self._tiers.get((endpoint, medium))
        return len(tier.by_engine) if tier is not None else 0

    # --- internals --------------------------------------------------------------------------------

    def _tier(self, endpoint: str, medium: str) -> _Tier:
        tier = self._tiers.get((endpoint, medium))
        if tier is None:
            tier = self._tiers[(endpoint, medium)] = _Tier()
        return tier

    def _key_of(self, endpoint: str, engine_hash: Hashable, medium: str) -> int | None:
        """The key of a block the endpoint stored earlier: looked up in this medium, then any (an
        offloaded block's parent may sit on the GPU)."""
        tier = self._tiers.get((endpoint, medium))
        if tier is not None and engine_hash in tier.by_engine:
            return tier.by_engine[engine_hash]
        for (address, _), other in self._tiers.items():
            if address == endpoint and engine_hash in other.by_engine:
                return other.by_engine[engine_hash]
        return None

    def _follows(self, endpoint: str, group: int | None, kind: str | None) -> bool:
        """Whether ``group``'s stored blocks are indexed for ``endpoint``: the first group of a
        full-attention kind it reports (or of no stated kind: a model of one group), and only it.
        A prefix hit needs a full-attention group's every leading block; a sliding-window or Mamba
        group keeps only the last window's, and its evictions say nothing of the prefix. (vLLM
        reports the same block hash in each group that stores the tokens, so two groups in one
        tier would remove each other's blocks.) Other groups' windows are not checked: on a hybrid
        model a match can overstate the hit by the part whose window was evicted."""
        group = group or 0
        followed = self._followed.get(endpoint)
        if followed is not None:
            return group == followed
        if kind is not None and kind not in PREFIX_KINDS:
            return False
        self._followed[endpoint] = group
        return True

    @staticmethod
    def _drop_holder(holders: dict[int, set[str]], key: int, endpoint: str) -> None:
        held = holders.get(key)
        if held is not None:
            held.discard(endpoint)
            if not held:
                del holders[key]
