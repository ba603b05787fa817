"""``engine-prefix-matches``: the prefix matches every scorer reads, from the engines' own reports
where they are followed (issue 37; ``policies.engine_blocks``, kept by the picker's KV-event
subscribers).

Before a request is scheduled (``prepare``) the prompt is tokenized with the model's tokenizer (a
Hugging Face ``tokenizer.json``, loaded once; never a network call), cut into the engine's blocks
(``block_size``, vLLM's 16) and keyed as the index keys what the engines stored (with the adapter's
name when the request's target model is an adapter the engines have stored blocks under). For each
endpoint whose events are followed without loss (``EngineCacheView.in_step``) the match is what its
engine reports; for the others the approximate index's guess stays. The result replaces the
context's prefix matches, in the approximate index's units (its blocks of ``tokens_per_block``
estimated tokens), so the TTFT cost model, the disaggregation decider and the recorders read it
unchanged.

Limits of this first version (docs/kv-events.md): completions' prompts are tokenized as they are;
chat requests are tokenized from their flattened messages, not through the model's chat template,
so they match only where a template adds nothing before the text.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any

import xxhash
from pydantic import Field
from tokenizers import Tokenizer

from kvgate.policies.engine_blocks import EngineCacheView, block_keys, chain_root
from kvgate.policies.errors import ConfigError
from kvgate.policies.feedback import FeedbackEnv, FeedbackPlugin
from kvgate.policies.framework import PREFIX_INDEX, SchedulingContext
from kvgate.policies.plugins.params import Params, parse_params


class ChunkedTokenizer:
    """A prompt's token ids, tokenized in chunks whose ids are remembered: most prompts share a long
    system prompt or document, so only their tail is tokenized again.

    A prompt is cut about every ``chunk_chars`` characters, only before a single space that follows
    a non-space and precedes one (the pre-tokenizers of byte-level BPE tokenizers, GPT-2's and
    Llama-3's, start a word's token with its leading space there, so the chunks' ids joined are the
    whole text's: a test checks it on the repository's tokenizer); a chunk is keyed by the chained
    hash of the text up to its end, so a chunk's ids are reused only after the same prefix. The
    special tokens the tokenizer adds to a whole text (a BOS) are added once, in front. Remembered
    chunks are bounded (least recently used dropped first).
    """

    def __init__(self, tokenizer: Tokenizer, chunk_chars: int = 512, max_chunks: int = 65536) -> None:
        self.tokenizer = tokenizer
        self.chunk_chars = chunk_chars
        self.max_chunks = max_chunks
        self._chunks: OrderedDict[int, array[int]] = OrderedDict()
        """Chunk key → its token ids (4 bytes each: 65,536 chunks of ~100 tokens hold ~30 MB)."""
        self._specials = tokenizer.encode("", add_special_tokens=True).ids
        self._keyed: OrderedDict[tuple[int, int, int], tuple[list[int], array[int]]] = OrderedDict()
        """(chunk key, chain root, block size) → the keys of the blocks that end in the chunk and
        the tokens it leaves over (``keys``)."""

    def _pieces(self, text: str) -> Iterator[tuple[int, str]]:
        """The text's chunks, each with the chained key of the text up to its end."""
        key = 0
        pos, n, width = 0, len(text), self.chunk_chars
        while pos < n:
            end = n if n - pos <= width else self._cut(text, pos + width // 2, pos + width)
            piece = text[pos:end]
            key = xxhash.xxh3_64_intdigest(piece.encode("utf-8", "surrogatepass"), seed=key)
            yield key, piece
            pos = end

    def _ids(self, key: int, piece: str) -> array[int]:
        chunks = self._chunks
        found = chunks.get(key)
        if found is None:
            found = array("I", self.tokenizer.encode(piece, add_special_tokens=False).ids)
            chunks[key] = found
            if len(chunks) > self.max_chunks:
                chunks.popitem(last=False)
        else:
            chunks.move_to_end(key)
        return found

    def encode(self, text: str) -> list[int]:
        ids = list(self._specials)
        for key, piece in self._pieces(text):
            ids.extend(self._ids(key, piece))
        return ids

    def keys(self, text: str, block_size: int, root: int) -> list[int]:
        """``block_keys`` of ``encode(text)`` from ``root`` (``engine_blocks.chain_root``), each
        chunk's keys remembered: keyed by the chunk's chained text key, the chain's root and the
        block size, a chunk's blocks (and the tokens it leaves to the next block) are the same
        whenever its prefix is, so a shared prefix is keyed once."""
        keys: list[int] = []
        carry = array("I", self._specials)
        last = root
        memo = self._keyed
        for key, piece in self._pieces(text):
            slot = (key, root, block_size)
            entry = memo.get(slot)
            if entry is None:
                tokens = carry + self._ids(key, piece)
                whole = len(tokens) - len(tokens) % block_size
                entry = (block_keys(tokens[:whole], block_size, parent=last), tokens[whole:])
                memo[slot] = entry
                if len(memo) > self.max_chunks:
                    memo.popitem(last=False)
            else:
                memo.move_to_end(slot)
            chunk_keys, carry = entry
            if chunk_keys:
                keys.extend(chunk_keys)
                last = chunk_keys[-1]
        return keys

    @staticmethod
    def _cut(text: str, lo: int, hi: int) -> int:
        """A cut in ``[lo, hi)``: before a single space between two non-spaces (else ``len(text)``:
        the rest is one chunk)."""
        cut = text.rfind(" ", lo, hi)
        while cut > lo:
            if not text[cut - 1].isspace() and cut + 1 < len(text) and not text[cut + 1].isspace():
                return cut
            cut = text.rfind(" ", lo, cut)
        return len(text)


class _Params(Params):
    tokenizer: str
    """Path of the model's ``tokenizer.json``."""
    block_size: Annotated[int, Field(ge=1)] = 16
    chunk_chars: Annotated[int, Field(ge=64)] = 512


class EnginePrefixBlueprint:
    """Built from the profile's YAML; each scheduler creates its own plugin (``FeedbackBlueprint``)."""

    produces: frozenset[str] = frozenset()
    consumes: frozenset[str] = frozenset({PREFIX_INDEX})

    def __init__(self, tokenizer: Tokenizer, block_size: int, chunk_chars: int = 512) -> None:
        self.tokenizer = tokenizer
        self.block_size = block_size
        self.chunk_chars = chunk_chars

    @staticmethod
    def from_parameters(parameters: Mapping[str, Any] | None) -> EnginePrefixBlueprint:
        p = parse_params(_Params, parameters, "engine-prefix-matches")
        path = Path(p.tokenizer).expanduser()
        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises its own Exception type for a bad file
            raise ConfigError(f"engine-prefix-matches: cannot load tokenizer {str(path)!r}: {exc}") from exc
        return EnginePrefixBlueprint(tokenizer, p.block_size, p.chunk_chars)

    def create(self, env: FeedbackEnv) -> FeedbackPlugin:
        return EnginePrefixMatches(self, env)


class EnginePrefixMatches(FeedbackPlugin):
    consumes = frozenset({PREFIX_INDEX})

    def __init__(self, blueprint: EnginePrefixBlueprint, env: FeedbackEnv) -> None:
        self._tokenizer = ChunkedTokenizer(blueprint.tokenizer, blueprint.chunk_chars)
        self._block_size = blueprint.block_size
        self._cache: EngineCacheView | None = env.engine_cache

    def prepare(self, ctx: SchedulingContext) -> None:
        cache = self._cache
        request = ctx.request
        if cache is None or not request.prompt:
            return
        size = self._block_size
        adapter = request.target_model if cache.knows_adapter(request.target_model) else None
        keys = self._tokenizer.keys(request.prompt, size, chain_root(adapter, request.cache_salt))
        if not keys:
            return
        reported = cache.matches(keys)
        approximate = ctx.prefix_matches()
        per_block = ctx.tokens_per_block
        merged = {address: blocks for address, blocks in approximate.items() if not cache.in_step(address)}
        for address, blocks in reported.items():
            if cache.in_step(address):
                merged[address] = blocks * size // per_block
        ctx.set_prefix_matches(merged)
