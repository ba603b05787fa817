"""The simulated paged KV cache with automatic prefix caching (vLLM v1 semantics, simplified).

Model
-----
- The cache has ``num_blocks`` blocks of ``block_size`` token slots. A sequence of ``n`` tokens whose
  KV is (being) computed holds ``ceil(n / block_size)`` blocks; blocks are reference-counted.
- Prefix caching: each *full* block of a prompt has a hash chained on the previous block's hash; the
  first block's chain starts from a seed, the model name or the LoRA adapter name, so different
  adapters never share KV (``prompt_block_hashes``). A request's hashes are computed once, when it is
  submitted. A full prompt block is registered under its hash when it is allocated for computation
  (as vLLM does), so a later request with the same leading blocks reuses them and does not compute
  them again. Only prompt blocks are hashed; generated tokens are not cached.
- vLLM always recomputes at least the last prompt token (it needs its logits), so a lookup never
  matches more than ``(num_tokens - 1) // block_size`` blocks: a 2,048-token prompt seen before hits
  127 blocks (2,032 tokens) and computes the last 16.
- Free blocks (reference count 0) sit in one LRU queue. Blocks that still hold a cached hash stay
  findable until the queue hands them out again (eviction = the hash is dropped when the block is
  reused). Freed blocks go to the back of the queue, a sequence's blocks tail-first (as vLLM does), so
  the shared head of a prompt outlives its unique tail; blocks that hold no hash go to the front,
  since nothing is lost by reusing them first (vLLM queues them at the back too; a harmless
  improvement). A cached block that is hit while free leaves the queue (it is referenced again).
- ``kv_cache_usage`` is ``1 - free / total`` like vLLM's: cached but unreferenced blocks count as free.

Every operation is O(blocks touched); nothing scans the whole cache.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence

import xxhash

_xxh64 = xxhash.xxh3_64_intdigest


def seed_hash(seed: str) -> int:
    """The chain value the first block of a prompt is hashed on (model or adapter name)."""
    return int(_xxh64(seed.encode("utf-8")))


def prompt_block_hashes(tokens: Sequence[int], block_size: int, seed: str,
                        salt: str | None = None,
                        media: Sequence[tuple[str, int, int]] = ()) -> tuple[int, ...]:
    """Chained hashes of the full blocks of ``tokens``: ``h[i] = xxh3_64(block_i, seed=h[i-1])``.

    ``h[-1]`` is ``seed_hash(seed)`` (with the cache salt, when given, after a NUL: vLLM hashes the
    salt into the first block). A trailing partial block has no hash. A block that holds part of a
    ``media`` item (identifier, first token, count) has the item's identifier and offset hashed in
    too, as vLLM's extra keys are: two images behind the same placeholder tokens are other blocks.
    """
    if media:
        return _hashes_with_media(tokens, block_size, seed, salt, media)
    full = len(tokens) // block_size
    if full == 0:
        return ()
    data = array("q", tokens[: full * block_size]).tobytes()
    width = block_size * 8
    prev = seed_hash(seed if salt is None else f"{seed}\x00{salt}")
    out: list[int] = []
    append = out.append
    for start in range(0, full * width, width):
        prev = int(_xxh64(data[start : start + width], seed=prev))
        append(prev)
    return tuple(out)


def _hashes_with_media(tokens: Sequence[int], block_size: int, seed: str, salt: str | None,
                       media: Sequence[tuple[str, int, int]]) -> tuple[int, ...]:
    out: list[int] = []
    prev = seed_hash(seed if salt is None else f"{seed}\x00{salt}")
    for start in range(0, len(tokens) // block_size * block_size, block_size):
        prev = int(_xxh64(array("q", tokens[start:start + block_size]).tobytes(), seed=prev))
        held = [f"{ident}\x00{offset - start}" for ident, offset, count in media
                if offset < start + block_size and offset + count > start]
        if held:
            prev = int(_xxh64("\x01".join(held).encode("utf-8"), seed=prev))
        out.append(prev)
    return tuple(out)


class KVCache:
    """Block pool: reference counts, the hash → block map and the free LRU queue."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._ref = [0] * num_blocks
        self._hash_of: list[int | None] = [None] * num_blocks
        self._block_of: dict[int, int] = {}  # hash -> block id
        # free blocks, front = handed out (and evicted) first
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.on_evict: Callable[[int], None] | None = None
        """Told each hash dropped when its block is reused (the engine's KV events)."""

    # ---- queries (no state change) -------------------------------------------------------------
    @property
    def num_free(self) -> int:
        """Blocks not referenced by any sequence (cached or empty)."""
        return len(self._free)

    @property
    def usage(self) -> float:
        """``1 - free / total``, 0..1."""
        return 1.0 - len(self._free) / self.num_blocks

    @property
    def num_cached_blocks(self) -> int:
        """Blocks currently registered under a hash (referenced or not)."""
        return len(self._block_of)

    def match_prefix(self, hashes: Sequence[int], max_blocks: int) -> list[int]:
        """Block ids holding the leading ``hashes`` (at most ``max_blocks``); changes nothing."""
        if not self.enable_prefix_caching:
            return []
        found: list[int] = []
        block_of = self._block_of
        for h in hashes[:max_blocks]:
            block = block_of.get(h)
            if block is None:
                break
            found.append(block)
        return found

    def count_unreferenced(self, blocks: Sequence[int]) -> int:
        """How many of ``blocks`` are free now (acquiring them takes them out of the free queue)."""
        ref = self._ref
        return sum(1 for b in blocks if ref[b] == 0)

    # ---- mutations -----------------------------------------------------------------------------
    def acquire(self, blocks: Sequence[int]) -> None:
        """Reference cached blocks found by ``match_prefix`` (a prefix hit)."""
        ref = self._ref
        free = self._free
        for b in blocks:
            if ref[b] == 0:
                del free[b]
            ref[b] += 1

    def allocate(self, n: int) -> list[int]:
        """Take ``n`` blocks from the front of the free queue, evicting their cached hashes."""
        if n > len(self._free):
            raise ValueError(f"cannot allocate {n} blocks, {len(self._free)} free")
        out: list[int] = []
        free = self._free
        ref = self._ref
        hash_of = self._hash_of
        for _ in range(n):
            b, _none = free.popitem(last=False)
            h = hash_of[b]
            if h is not None:
                hash_of[b] = None
                if self._block_of.get(h) == b:
                    del self._block_of[h]
                    if self.on_evict is not None:
                        self.on_evict(h)
            ref[b] = 1
            out.append(b)
        return out

    def register(self, block: int, block_hash: int) -> bool:
        """Make a (full, being computed) block findable under ``block_hash``; whether it is new."""
        if not self.enable_prefix_caching or self._hash_of[block] is not None:
            return False
        if block_hash in self._block_of:  # same content already cached in another block
            return False
        self._hash_of[block] = block_hash
        self._block_of[block_hash] = block
        return True

    def release(self, blocks: Sequence[int]) -> None:
        """Drop one reference from each of a sequence's blocks, tail first."""
        ref = self._ref
        free = self._free
        hash_of = self._hash_of
        for b in reversed(blocks):
            ref[b] -= 1
            if ref[b] == 0:
                free[b] = None
                if hash_of[b] is None:
                    free.move_to_end(b, last=False)
