"""Prompt block hashing for the approximate prefix-cache index (hash once per request).

A prompt is cut into blocks of ``block_chars`` bytes of its UTF-8 encoding (GIE: 16 tokens × 4 chars
= 64); only whole blocks count and at most ``max_blocks`` (GIE: 256). Block ``i``'s hash identifies
the whole prefix ``[0, (i+1)·block_chars)`` and the target model (+ ``cache_salt``), so two
endpoints share a block hash only if they saw the same model and the same leading text.

Two schemes, the same routing meaning:

- ``gie``: exactly GIE's bytes: ``h_i = xxh64(block_i ‖ le64(h_{i-1}))`` with
  ``h_{-1} = xxh64(model ‖ salt)``. One Python-level step per block: about three times the
  default's cost (``bench/results/pick_cost.md``).
- ``chained-xor`` (default): ``h_i = h_{i-1} XOR xxh3_64(block_i, seed=s + i)`` with
  ``s = xxh64(model ‖ salt) >> 1``: every step runs in C (``struct`` splits the blocks, ``map``
  hashes them, ``itertools.accumulate`` chains them). Position-seeded hashes
  XOR-ed together (Zobrist style) still identify the prefix: two different prefixes of equal
  length collide with probability ~2⁻⁶⁴.

Nothing interoperates with GIE's own index, so the faster scheme is kvgate's default.
"""

from __future__ import annotations

import itertools
import operator
import struct
from typing import Literal

import xxhash

HashScheme = Literal["chained-xor", "gie"]

_U64 = struct.Struct("<Q")


class PromptHasher:
    """Computes a request's block hashes; keeps a small cache of compiled splitters (per instance)."""

    def __init__(
        self, block_chars: int = 64, max_blocks: int = 256, scheme: HashScheme = "chained-xor"
    ) -> None:
        if block_chars < 1 or max_blocks < 1:
            raise ValueError("block_chars and max_blocks must be positive")
        self.block_chars = block_chars
        self.max_blocks = max_blocks
        self.scheme: HashScheme = scheme
        self._splitters: dict[int, struct.Struct] = {}

    def hashes(self, target_model: str, prompt: str, cache_salt: str | None = None) -> tuple[int, ...]:
        """Block hashes of ``prompt`` for ``target_model`` (empty when shorter than one block)."""
        if len(prompt) < self.block_chars:
            return ()
        data = prompt[: self.block_chars * self.max_blocks].encode()  # chars ≥ bytes/4, so enough
        n = min(len(data) // self.block_chars, self.max_blocks)
        if n == 0:
            return ()
        seed = xxhash.xxh64_intdigest((target_model + (cache_salt or "")).encode())
        if self.scheme == "gie":
            return self._gie(data, n, seed)  # reads whole blocks only
        splitter = self._splitters.get(n)
        if splitter is None:
            splitter = struct.Struct(f"{self.block_chars}s" * n)
            self._splitters[n] = splitter
        base = seed >> 1
        block_hashes = map(xxhash.xxh3_64_intdigest, splitter.unpack_from(data), range(base, base + n))
        return tuple(itertools.accumulate(block_hashes, operator.xor))

    def _gie(self, data: bytes, n: int, seed: int) -> tuple[int, ...]:
        size = self.block_chars
        out: list[int] = []
        prev = seed
        digest = xxhash.xxh64_intdigest
        pack = _U64.pack
        for i in range(0, n * size, size):
            prev = digest(data[i : i + size] + pack(prev))
            out.append(prev)
        return tuple(out)
