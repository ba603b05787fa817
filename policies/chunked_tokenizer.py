"""A prompt's token ids and block keys, tokenized in chunks that are remembered (issue 37): most
prompts share a long system prompt or document, so only their tail is tokenized and keyed again.
``engine-prefix-matches`` (``policies.plugins.engine_prefix``) keys every prompt with it."""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterator

import xxhash
from tokenizers import Tokenizer

from kvgate.policies.engine_blocks import block_keys


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
        self._encode_fast = getattr(tokenizer, "encode_batch_fast", None)
        """Without offsets: ~25 % less CPU per chunk than ``encode`` (tokenizers >= 0.21)."""
        self._keyed: OrderedDict[tuple[int, int, int, bool], tuple[list[int], array[int]]] = OrderedDict()
        """(chunk key, chain root, block size, specials in front) → the keys of the blocks that end
        in the chunk and the tokens it leaves over (``keys``)."""

    def _pieces(self, text: str, pos: int = 0, key: int = 0, width: int = 0) -> Iterator[tuple[int, str]]:
        """The text's chunks from ``pos`` (``width`` characters at most, ``chunk_chars`` unless
        given), each with the chained key of the text up to its end (``key``: the text's before)."""
        n, width = len(text), width or self.chunk_chars
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
            fast = self._encode_fast
            encoding = (fast([piece], add_special_tokens=False)[0] if fast is not None
                        else self.tokenizer.encode(piece, add_special_tokens=False))
            found = array("I", encoding.ids)
            chunks[key] = found
            if len(chunks) > self.max_chunks:
                chunks.popitem(last=False)
        else:
            chunks.move_to_end(key)
        return found

    def encode(self, text: str, *, specials: bool = True) -> list[int]:
        """``text``'s ids (with the tokenizer's special tokens in front unless ``specials`` is false:
        a rendered chat template holds its own)."""
        ids = list(self._specials) if specials else []
        for key, piece in self._pieces(text):
            ids.extend(self._ids(key, piece))
        return ids

    def keys(self, text: str, block_size: int, root: int, *, specials: bool = True,
             held: Callable[[int], bool] | None = None) -> list[int]:
        """``block_keys`` of ``encode(text)`` from ``root`` (``engine_blocks.chain_root``), each
        chunk's keys remembered: keyed by the chunk's chained text key, the chain's root and the
        block size, a chunk's blocks (and the tokens it leaves to the next block) are the same
        whenever its prefix is, so a shared prefix is keyed once.

        ``held(key)``: whether any endpoint holds that block. With it, keying stops at the first
        block nobody holds (no later block can be held: keys chain): from the first chunk not
        remembered on, the text goes in ``chunk_chars // 4`` pieces, and after the first piece
        with such a block nothing more is tokenized. A warm prefix's unshared tail (a question) is
        tokenized only as far as its first block, a prompt nobody holds only as far as its first
        piece; a chunk keyed whole piece by piece is remembered whole.
        """
        return self.keys_and_rest(text, block_size, root, specials=specials, held=held)[0]

    def keys_and_rest(self, text: str, block_size: int, root: int, *, specials: bool = True,
                      held: Callable[[int], bool] | None = None) -> tuple[list[int], array[int] | None]:
        """``keys``, and the tokens after its last whole block (None when keying stopped at a block
        nobody holds: what follows the text cannot be held either)."""
        keys: list[int] = []
        carry = array("I", self._specials if specials else ())
        last = root
        pos = key_before = 0
        for key, piece in self._pieces(text):
            slot = (key, root, block_size, specials)
            entry = self._keyed.get(slot)
            if entry is None and held is not None:
                if keys and not held(keys[-1]):
                    return keys, None  # the held run ended in a remembered chunk
                chunk_keys, carry, stopped = self._span(text, pos, pos + len(piece), key_before,
                                                        (carry, last), block_size, root, specials, held)
                keys.extend(chunk_keys)
                if stopped:
                    return keys, None
                self._remember(slot, (chunk_keys, carry))  # the whole chunk, keyed piece by piece
            else:
                chunk_keys, carry = self._entry(slot, entry, key, piece, carry, last, block_size)
                keys.extend(chunk_keys)
            if chunk_keys:
                last = chunk_keys[-1]
            pos += len(piece)
            key_before = key
        if keys and held is not None and not held(keys[-1]):
            return keys, None
        return keys, carry

    def _span(self, text: str, start: int, end: int, key: int, state: tuple[array[int], int],
              block_size: int, root: int, specials: bool, held: Callable[[int], bool],
              ) -> tuple[list[int], array[int], bool]:
        """A chunk never keyed before, in ``chunk_chars // 4`` pieces (each remembered): its keys,
        the tokens it leaves, and whether it stopped early (after the first piece with a block
        nobody holds: nothing after such a block can be held)."""
        carry, last = state
        keys: list[int] = []
        for piece_key, piece in self._pieces(text[:end], start, key, max(64, self.chunk_chars // 4)):
            slot = (piece_key, root, block_size, specials)
            chunk_keys, carry = self._entry(slot, self._keyed.get(slot), piece_key, piece, carry, last,
                                            block_size)
            if chunk_keys:
                keys.extend(chunk_keys)
                last = chunk_keys[-1]
                if not held(last):
                    return keys, carry, True
        return keys, carry, False

    def _entry(self, slot: tuple[int, int, int, bool], entry: tuple[list[int], array[int]] | None, key: int,
               piece: str, carry: array[int], last: int, block_size: int) -> tuple[list[int], array[int]]:
        """The remembered keys and leftover tokens of a chunk (computed and remembered when new)."""
        if entry is None:
            tokens = carry + self._ids(key, piece)
            whole = len(tokens) - len(tokens) % block_size
            entry = (block_keys(tokens[:whole], block_size, parent=last), tokens[whole:])
            self._remember(slot, entry)
        else:
            self._keyed.move_to_end(slot)
        return entry

    def _remember(self, slot: tuple[int, int, int, bool], entry: tuple[list[int], array[int]]) -> None:
        memo = self._keyed
        memo[slot] = entry
        if len(memo) > self.max_chunks:
            memo.popitem(last=False)

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
