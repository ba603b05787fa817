"""A multimodal chat prompt's tokens and block keys as the engine has them (issue 37; sans-IO).

The rendered prompt is cut at each media item's placeholder; the text between is tokenized piece by
piece (a placeholder that is a special token splits the text the same way in the engine's
tokenizer) and each placeholder becomes the item's placeholder tokens (``MediaTokens.count``). A
block that holds part of an item is keyed as ``EngineBlockIndex`` keys what an engine stored with
vLLM's extra keys (``engine_blocks.block_keys_with_extras``): its tokens, then the block's extra
keys (the adapter's name, each item's ``(identifier, offset from the block's start)``, the salt on
a first block) mixed in. Keys stop before the first block that holds an item without an identifier
(its engine key is a hash of the decoded media).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import msgspec
import xxhash

from kvgate.policies.engine_blocks import block_keys
from kvgate.policies.media import MediaItem, MediaTokens

Span = tuple[str | None, int, int]
"""A media item's identifier, its first placeholder token's index and its token count."""


def split_media(text: str, items: Sequence[MediaItem], media: Mapping[str, MediaTokens],
                token_ids: Mapping[str, int]) -> tuple[list[str], list[MediaItem]] | None:
    """The text between the items' placeholders (one piece more than items) and the items in the
    order their placeholders come; None when the text does not hold exactly one placeholder per
    item of each modality (or a modality is not modelled): nothing to predict past the text."""
    by_modality: dict[str, list[MediaItem]] = {}
    for item in items:
        if item.modality not in media or item.modality not in token_ids:
            return None
        by_modality.setdefault(item.modality, []).append(item)
    found: list[tuple[int, str]] = []
    for modality, its in by_modality.items():
        positions = _occurrences(text, media[modality].placeholder)
        if len(positions) != len(its):
            return None
        found.extend((pos, modality) for pos in positions)
    found.sort()
    pieces: list[str] = []
    ordered: list[MediaItem] = []
    taken: dict[str, int] = {}
    pos = 0
    for start, modality in found:
        if start < pos:
            return None  # two placeholders overlap
        pieces.append(text[pos:start])
        index = taken.get(modality, 0)
        taken[modality] = index + 1
        ordered.append(by_modality[modality][index])
        pos = start + len(media[modality].placeholder)
    pieces.append(text[pos:])
    return pieces, ordered


def media_prompt_tokens(text: str, items: Sequence[MediaItem], media: Mapping[str, MediaTokens],
                        token_ids: Mapping[str, int], encode: Callable[[str], Sequence[int]],
                        ) -> tuple[list[int], list[Span]] | None:
    """The prompt's tokens and its items' spans (None: as ``split_media``, or an item whose count
    kvgate cannot tell)."""
    split = split_media(text, items, media, token_ids)
    if split is None:
        return None
    pieces, ordered = split
    tokens: list[int] = list(encode(pieces[0]))
    spans: list[Span] = []
    for item, piece in zip(ordered, pieces[1:], strict=True):
        count = media[item.modality].count(item)
        if count is None:  # its size unknown: its tokens cannot be told
            return None
        spans.append((item.identifier, len(tokens), count))
        tokens.extend([token_ids[item.modality]] * count)
        tokens.extend(encode(piece))
    return tokens, spans


def _occurrences(text: str, needle: str) -> list[int]:
    out: list[int] = []
    at = text.find(needle)
    while at >= 0:
        out.append(at)
        at = text.find(needle, at + len(needle))
    return out


def media_block_keys(tokens: Sequence[int], block_size: int, parent: int, spans: Sequence[Span],
                     lora: str | None, salt: str | None, first_block: int = 0) -> list[int]:
    """The chained keys of the whole blocks of ``tokens`` from ``parent`` (for a prompt's first block
    ``chain_root(lora, salt)``), a block that holds part of an item keyed with its extra keys as vLLM
    makes them; stops before a block that holds an item without an identifier. ``first_block``: the
    prompt's block that ``tokens`` start (the salt is a first block's extra key)."""
    whole = len(tokens) // block_size
    keys: list[int] = []
    key = parent
    block = 0
    for ident, offset, count in sorted(spans, key=lambda span: span[1]):
        first, last = offset // block_size, min((offset + count - 1) // block_size, whole - 1)
        if first >= whole:
            break
        if first > block:  # the text blocks before the item, in one call
            keys.extend(block_keys(tokens[block * block_size:first * block_size], block_size, parent=key))
            key, block = keys[-1], first
        if ident is None:
            return keys
        for b in range(max(block, first), last + 1):
            start = b * block_size
            key = block_keys(tokens[start:start + block_size], block_size, parent=key)[0]
            pairs = [(i, o - start) for i, o, n in spans if o < start + block_size and o + n > start]
            if any(i is None for i, _ in pairs):
                return keys
            extras = [*([lora] if lora else []), *pairs, *([salt] if b + first_block == 0 and salt else [])]
            key = xxhash.xxh3_64_intdigest(msgspec.msgpack.encode(extras), seed=key)
            keys.append(key)
        block = max(block, last + 1)
    if block < whole:
        keys.extend(block_keys(tokens[block * block_size:whole * block_size], block_size, parent=key))
    return keys
