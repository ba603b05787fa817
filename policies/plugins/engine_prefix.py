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

The tokenizer is the profile's (``tokenizer``: a ``tokenizer.json`` or a model directory) or else
the pool's (``kvgate.io/tokenizer``, loaded by the picker); with neither, or for a pool without KV
events, the plugin does nothing, so the default profile carries it. Completions' prompts are
tokenized as they are (the tokenizer's special tokens in front); chat requests through the model's
chat template (``policies.model_tokenizer``), as vLLM renders them.

A request picked and not finished counts as holding its prompt on its endpoint
(``policies.pending_blocks``, kept in the approximate index's hashed text blocks, which every
request has anyway): the engine reports the blocks only once its prefill computed them, and a
request for the same prefix in between should follow it, not spread it. So a prompt is tokenized
only as far as the engines hold it: one nobody holds costs one small piece.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from typing import Annotated, Any

import xxhash
from pydantic import Field
from tokenizers import Tokenizer

from kvgate.policies.engine_blocks import EngineCacheView, block_keys, chain_root
from kvgate.policies.errors import ConfigError
from kvgate.policies.feedback import FeedbackEnv, FeedbackPlugin
from kvgate.policies.framework import PREFIX_INDEX, SchedulingContext
from kvgate.policies.media import MediaItem, MediaTokens, media_items
from kvgate.policies.media_prompt import Span, media_block_keys, split_media
from kvgate.policies.model_tokenizer import ChatTemplateError, ModelTokenizer
from kvgate.policies.pending_blocks import PendingBlocks
from kvgate.policies.plugins.params import Params, parse_params
from kvgate.policies.types import ApiKind, Endpoint, InferenceRequest


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


class _MediaParams(Params):
    placeholder: Annotated[str, Field(min_length=1)]
    tokens: Annotated[int, Field(ge=1)]
    token_id: Annotated[int, Field(ge=0)] | None = None


class _Params(Params):
    tokenizer: str | None = None
    """The model's ``tokenizer.json`` or model directory (its chat template too); None: the pool's
    (``kvgate.io/tokenizer``; without one the plugin does nothing)."""
    block_size: Annotated[int, Field(ge=1)] | None = None
    """The engines' block size; None: as their events report it (vLLM's 16 before any)."""
    chunk_chars: Annotated[int, Field(ge=64)] = 512
    media: dict[str, _MediaParams] = Field(default_factory=dict)
    """Modality (``image``, ``audio``, ``video``) → how the model's engine puts one item in the
    prompt (``policies.media.MediaTokens``); a modality not named is not predicted past."""


DEFAULT_BLOCK_SIZE = 16
_MAX_PREPARED = 1024


class EnginePrefixBlueprint:
    """Built from the profile's YAML; each scheduler creates its own plugin (``FeedbackBlueprint``)."""

    produces: frozenset[str] = frozenset()
    consumes: frozenset[str] = frozenset({PREFIX_INDEX})

    def __init__(self, model: ModelTokenizer | None, block_size: int | None = None,
                 chunk_chars: int = 512, media: Mapping[str, MediaTokens] | None = None) -> None:
        self.model = model
        self.block_size = block_size
        self.chunk_chars = chunk_chars
        self.media: Mapping[str, MediaTokens] = dict(media or {})

    @staticmethod
    def from_parameters(parameters: Mapping[str, Any] | None) -> EnginePrefixBlueprint:
        p = parse_params(_Params, parameters, "engine-prefix-matches")
        try:
            model = ModelTokenizer.load(p.tokenizer) if p.tokenizer is not None else None
        except ConfigError as exc:
            raise ConfigError(f"engine-prefix-matches: {exc}") from exc
        media = {name: MediaTokens(m.placeholder, m.tokens, m.token_id) for name, m in p.media.items()}
        return EnginePrefixBlueprint(model, p.block_size, p.chunk_chars, media)

    def create(self, env: FeedbackEnv) -> FeedbackPlugin:
        return EnginePrefixMatches(self, env)


class EnginePrefixMatches(FeedbackPlugin):
    consumes = frozenset({PREFIX_INDEX})

    def __init__(self, blueprint: EnginePrefixBlueprint, env: FeedbackEnv) -> None:
        self._model = blueprint.model
        self._chunk_chars = blueprint.chunk_chars
        self._chunked: tuple[ModelTokenizer, ChunkedTokenizer] | None = None
        self._block_size = blueprint.block_size
        self._media = blueprint.media
        self._placeholders = {modality: m.placeholder for modality, m in self._media.items()}
        self._token_ids: tuple[ModelTokenizer, dict[str, int]] | None = None
        self._cache: EngineCacheView | None = env.engine_cache
        self._pending = PendingBlocks(env.max_pending)
        self._prepared: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        """Requests prepared and not yet picked → their prompt's approximate-index hashes (recent
        ones: picks follow at once)."""

    def _tokenizer(self, model: ModelTokenizer) -> ChunkedTokenizer:
        """The chunk memo of ``model`` (a new one when the pool's tokenizer is replaced)."""
        if self._chunked is None or self._chunked[0] is not model:
            self._chunked = (model, ChunkedTokenizer(model.tokenizer, self._chunk_chars))
        return self._chunked[1]

    def _keys(self, request: InferenceRequest, cache: EngineCacheView, size: int,
              adapter: str | None) -> list[int] | None:
        """The prompt's block keys as the engine has them; None where it cannot be predicted (the
        approximate index's guess then stays): no tokenizer, a template the messages fail, a batch of
        prompts, an API whose prompt the engine builds otherwise (Responses, embeddings)."""
        root = chain_root(adapter, request.cache_salt)
        options = request.prompt_options or {}
        if options.get("truncate_prompt_tokens") is not None:
            return None  # the engine keeps the prompt's last tokens: other blocks than its start's
        prompt = request.engine_prompt
        if request.messages is None and isinstance(prompt, tuple):  # token ids: the engine adds nothing
            return block_keys(prompt, size, parent=root) if prompt else None
        model = self._model or cache.tokenizer()
        if model is None:
            return None
        if request.messages is None:
            if request.api is not ApiKind.COMPLETIONS:
                return None
            text = prompt if isinstance(prompt, str) else request.prompt
            specials = options.get("add_special_tokens", True) is not False  # vLLM: true for completions
            return self._tokenizer(model).keys(text, size, root, specials=specials, held=cache.held)
        if model.chat_template is None:
            return None
        try:  # vLLM renders the chat template; the text holds the BOS
            text = model.chat_template.render(request.messages, self._placeholders, request.prompt_options)
        except ChatTemplateError:
            return None  # the engine refuses these messages too: nothing to predict
        # the template's text holds its BOS; add_special_tokens (false for chats) adds them again
        specials = options.get("add_special_tokens") is True
        media = media_items(request.messages) if self._media else []
        if media:
            keys = self._media_keys(model, text, media, (size, root, specials), adapter, request.cache_salt,
                                    cache.held)
            if keys is not None:
                return keys
        return self._tokenizer(model).keys(text, size, root, specials=specials, held=cache.held)

    def _media_token_ids(self, model: ModelTokenizer) -> dict[str, int]:
        """Modality → its placeholder tokens' id (given, or the placeholder's single token in the
        model's tokenizer; a modality with neither is left out: not predicted past)."""
        if self._token_ids is None or self._token_ids[0] is not model:
            ids: dict[str, int] = {}
            for modality, media in self._media.items():
                found = media.token_id
                if found is None:
                    found = model.tokenizer.token_to_id(media.placeholder)
                if found is not None:
                    ids[modality] = found
            self._token_ids = (model, ids)
        return self._token_ids[1]

    def _media_keys(self, model: ModelTokenizer, text: str, items: list[MediaItem],
                    chain: tuple[int, int, bool], adapter: str | None, salt: str | None,
                    held: Callable[[int], bool]) -> list[int] | None:
        """A multimodal chat's keys (None: not modelled, ``media_prompt.split_media``): the text
        before the first item as any prompt's (its chunks' keys remembered, keyed only as far as
        held), then the items' and the rest's blocks (``media_prompt.media_block_keys``). ``chain``:
        the block size, the chain's root, and whether the tokenizer's special tokens go in front."""
        size, root, specials = chain
        token_ids = self._media_token_ids(model)
        split = split_media(text, items, self._media, token_ids)
        if split is None:
            return None
        pieces, ordered = split
        chunked = self._tokenizer(model)
        keys, rest = chunked.keys_and_rest(pieces[0], size, root, specials=specials, held=held)
        if rest is None:
            return keys
        rest = array("I", rest)  # its own: the one returned may be a remembered chunk's
        spans: list[Span] = []
        for item, piece in zip(ordered, pieces[1:], strict=True):
            count = self._media[item.modality].tokens
            spans.append((item.identifier, len(rest), count))
            rest.extend(array("I", [token_ids[item.modality]]) * count)
            rest.extend(chunked.encode(piece, specials=False))
        return keys + media_block_keys(rest, size, keys[-1] if keys else root, spans, adapter, salt,
                                       first_block=len(keys))

    def prepare(self, ctx: SchedulingContext) -> None:
        cache = self._cache
        request = ctx.request
        if cache is None or not request.prompt:
            return
        size = self._block_size or cache.block_size() or DEFAULT_BLOCK_SIZE
        adapter = request.target_model if cache.knows_adapter(request.target_model) else None
        keys = self._keys(request, cache, size, adapter)
        if keys is None:
            return
        hashes = ctx.prefix_hashes()  # the approximate index's blocks: what in-flight requests hold
        if hashes:
            prepared = self._prepared
            prepared[request.request_id] = hashes
            if len(prepared) > _MAX_PREPARED:
                prepared.popitem(last=False)
        reported = cache.matches(keys) if keys else {}
        in_flight = self._pending.matches(hashes)
        approximate = ctx.prefix_matches()
        per_block = ctx.tokens_per_block
        merged = {address: blocks for address, blocks in approximate.items() if not cache.in_step(address)}
        for address in reported.keys() | in_flight.keys():
            if cache.in_step(address):
                merged[address] = max(reported.get(address, 0) * size // per_block, in_flight.get(address, 0))
        ctx.set_prefix_matches(merged)

    def on_picked(self, request: InferenceRequest, endpoint: Endpoint, now: float) -> None:
        keys = self._prepared.pop(request.request_id, None)
        if keys is not None:
            self._pending.add(request.request_id, endpoint.address, keys)

    def on_served(self, request: InferenceRequest, endpoint: Endpoint, now: float) -> None:
        self._pending.move(request.request_id, endpoint.address)

    def on_finished(self, request: InferenceRequest, endpoint: Endpoint, *, ok: bool, now: float) -> None:
        self._pending.remove(request.request_id)

    def forget_endpoint(self, address: str) -> None:
        self._pending.forget_endpoint(address)
