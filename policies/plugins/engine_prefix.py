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
chat template (``policies.model_tokenizer``), as vLLM renders them; images and other media as
``policies.media_prompt`` keys them. Where kvgate cannot key the whole prompt (an image without a
name, a modality the profile does not name) the keys stop before it, and an endpoint whose engine
holds all of them keeps the approximate index's guess where that is longer: past the item, only
the guess (kvgate's own picks, the item as a digest) can say.

A request picked and not finished counts as holding its prompt on its endpoint
(``policies.pending_blocks``, kept in the approximate index's hashed text blocks, which every
request has anyway): the engine reports the blocks only once its prefill computed them, and a
request for the same prefix in between should follow it, not spread it. So a prompt is tokenized
only as far as the engines hold it: one nobody holds costs one small piece.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Annotated, Any

from pydantic import Field, model_validator

from kvgate.policies.chunked_tokenizer import ChunkedTokenizer
from kvgate.policies.engine_blocks import EngineCacheView, block_keys, chain_root
from kvgate.policies.errors import ConfigError
from kvgate.policies.feedback import FeedbackEnv, FeedbackPlugin
from kvgate.policies.framework import PREFIX_INDEX, SchedulingContext
from kvgate.policies.key_checks import KeyChecks
from kvgate.policies.media import MediaItem, MediaTokens, is_media_part, media_items
from kvgate.policies.media_prompt import Span, media_block_keys, split_media
from kvgate.policies.model_tokenizer import ChatTemplateError, ModelTokenizer
from kvgate.policies.pending_blocks import PendingBlocks
from kvgate.policies.plugins.params import Params, parse_params
from kvgate.policies.types import ApiKind, Endpoint, InferenceRequest
from kvgate.policies.vision_grid import VisionGrid


class _GridParams(Params):
    """Qwen2-VL's dynamic resolution (``policies.vision_grid``; the model's preprocessor config)."""

    patch_size: Annotated[int, Field(ge=1)] = 14
    merge_size: Annotated[int, Field(ge=1)] = 2
    min_pixels: Annotated[int, Field(ge=1)] = 3_136
    max_pixels: Annotated[int, Field(ge=1)] = 12_845_056


class _MediaParams(Params):
    placeholder: Annotated[str, Field(min_length=1)]
    tokens: Annotated[int, Field(ge=1)] | None = None
    """A fixed count per item (LLaVA-1.5: 576); or ``grid``."""
    token_id: Annotated[int, Field(ge=0)] | None = None
    grid: _GridParams | None = None
    """The count follows each image's size (Qwen2-VL, Qwen2.5-VL: ``placeholder: <|image_pad|>``)."""

    @model_validator(mode="after")
    def _a_count(self) -> _MediaParams:
        if (self.tokens is None) == (self.grid is None):
            raise ValueError("give either 'tokens' (a fixed count per item) or 'grid'")
        return self


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

    @model_validator(mode="after")
    def _grids_for_images(self) -> _Params:
        # a video's count on the grid also depends on its frames, which kvgate does not read
        for modality, media in self.media.items():
            if media.grid is not None and modality != "image":
                raise ValueError(f"media.{modality}: 'grid' is for images (a video's frames are not read)")
        return self


DEFAULT_BLOCK_SIZE = 16
_MAX_PREPARED = 1024
_NO_KEY = -1
"""A prepared request without block keys (a prompt shorter than a block); keys are unsigned."""


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
        media = {name: MediaTokens(m.placeholder, m.tokens or 0, m.token_id,
                                   VisionGrid(**m.grid.model_dump()) if m.grid is not None else None)
                 for name, m in p.media.items()}
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
        self._prepared: OrderedDict[str, tuple[tuple[int, ...], int]] = OrderedDict()
        """Requests prepared and not yet picked → their prompt's approximate-index hashes and the
        last block key kvgate made for it (recent ones: picks follow at once)."""
        self._checks = KeyChecks(max_pending=env.max_pending)
        """Whether the engines hold what kvgate keys (``policies.key_checks``): where they do not,
        the approximate index's guess stays for every endpoint."""

    def _tokenizer(self, model: ModelTokenizer) -> ChunkedTokenizer:
        """The chunk memo of ``model`` (a new one when the pool's tokenizer is replaced)."""
        if self._chunked is None or self._chunked[0] is not model:
            self._chunked = (model, ChunkedTokenizer(model.tokenizer, self._chunk_chars))
        return self._chunked[1]

    def _keys(self, request: InferenceRequest, cache: EngineCacheView, size: int,
              adapter: str | None) -> tuple[list[int], bool] | None:
        """The prompt's block keys as the engine has them, and whether they cover it whole (False:
        they stop before a media item kvgate cannot key); None where nothing can be predicted (the
        approximate index's guess then stays): no tokenizer, a template the messages fail, a batch of
        prompts, an API whose prompt the engine builds otherwise (Responses, embeddings)."""
        root = chain_root(adapter, request.cache_salt)
        options = request.prompt_options or {}
        if options.get("truncate_prompt_tokens") is not None:
            return None  # the engine keeps the prompt's last tokens: other blocks than its start's
        prompt = request.engine_prompt
        if request.messages is None and isinstance(prompt, tuple):  # token ids: the engine adds nothing
            return (block_keys(prompt, size, parent=root), True) if prompt else None
        model = self._model or cache.tokenizer()
        if model is None:
            return None
        if request.messages is None:
            if request.api is not ApiKind.COMPLETIONS:
                return None
            text = prompt if isinstance(prompt, str) else request.prompt
            specials = options.get("add_special_tokens", True) is not False  # vLLM: true for completions
            return self._tokenizer(model).keys(text, size, root, specials=specials, held=cache.held), True
        if model.chat_template is None:
            return None
        try:  # vLLM renders the chat template; the text holds the BOS
            text = model.chat_template.render(request.messages, self._placeholders, request.prompt_options)
        except ChatTemplateError:
            return None  # the engine refuses these messages too: nothing to predict
        # the template's text holds its BOS; add_special_tokens (false for chats) adds them again
        specials = options.get("add_special_tokens") is True
        media = media_items(request.messages)
        if media:
            found = self._media_keys(model, text, media, (size, root, specials), adapter, request.cache_salt,
                                     cache.held)
            return found if found is not None else self._before_media(model, request, (size, root, specials),
                                                                       cache.held)
        return self._tokenizer(model).keys(text, size, root, specials=specials, held=cache.held), True

    def _before_media(self, model: ModelTokenizer, request: InferenceRequest, chain: tuple[int, int, bool],
                      held: Callable[[int], bool]) -> tuple[list[int], bool] | None:
        """A chat whose media kvgate cannot key (a modality the profile does not name, a placeholder
        count it cannot tell): the keys of the messages before the first that holds an item, rendered
        as a conversation of their own (a template renders a conversation's start as the start of its
        text), marked as stopping there."""
        size, root, specials = chain
        messages = request.messages or ()
        first = next((i for i, m in enumerate(messages) if isinstance(m.get("content"), list)
                      and any(is_media_part(p) for p in m["content"])), 0)
        if first == 0 or model.chat_template is None:
            return None
        options = {**(request.prompt_options or {}), "add_generation_prompt": False,
                   "continue_final_message": False}
        try:
            text = model.chat_template.render(messages[:first], self._placeholders, options)
        except ChatTemplateError:
            return None
        keys = self._tokenizer(model).keys(text, size, root, specials=specials, held=held)
        return (keys, False) if keys else None

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
                    held: Callable[[int], bool]) -> tuple[list[int], bool] | None:
        """A multimodal chat's keys and whether they cover it whole (None: not modelled,
        ``media_prompt.split_media``): the text before the first item as any prompt's (its chunks'
        keys remembered, keyed only as far as held), then the items' and the rest's blocks
        (``media_prompt.media_block_keys``, which stop before an item without a name). ``chain``:
        the block size, the chain's root, and whether the tokenizer's special tokens go in front."""
        size, root, specials = chain
        token_ids = self._media_token_ids(model)
        split = split_media(text, items, self._media, token_ids) if self._media else None
        if split is None:
            return None
        pieces, ordered = split
        chunked = self._tokenizer(model)
        keys, rest = chunked.keys_and_rest(pieces[0], size, root, specials=specials, held=held)
        if rest is None:
            return keys, True  # nobody holds what follows
        rest = array("I", rest)  # its own: the one returned may be a remembered chunk's
        spans: list[Span] = []
        for item, piece in zip(ordered, pieces[1:], strict=True):
            count = self._media[item.modality].count(item)
            if count is None:  # a size kvgate cannot read: the keys stop before the item
                spans.append((None, len(rest), 1))
                rest.append(token_ids[item.modality])
                more = media_block_keys(rest, size, keys[-1] if keys else root, spans, adapter, salt,
                                        first_block=len(keys))
                return keys + more, False
            spans.append((item.identifier, len(rest), count))
            rest.extend(array("I", [token_ids[item.modality]]) * count)
            rest.extend(chunked.encode(piece, specials=False))
        more = media_block_keys(rest, size, keys[-1] if keys else root, spans, adapter, salt,
                                first_block=len(keys))
        return keys + more, len(more) == len(rest) // size

    def prepare(self, ctx: SchedulingContext) -> None:
        cache = self._cache
        request = ctx.request
        if cache is None:
            return
        self._check_keys(cache, ctx.now)
        if not request.prompt:
            return
        size = self._block_size or cache.block_size() or DEFAULT_BLOCK_SIZE
        adapter = request.target_model if cache.knows_adapter(request.target_model) else None
        found = self._keys(request, cache, size, adapter)
        if found is None:
            return
        keys, whole = found
        hashes = ctx.prefix_hashes()  # the approximate index's blocks: what in-flight requests hold
        if hashes or keys:
            prepared = self._prepared
            prepared[request.request_id] = (hashes, keys[-1] if keys else _NO_KEY)
            if len(prepared) > _MAX_PREPARED:
                prepared.popitem(last=False)
        if not self._checks.trusted:
            return  # the engines do not hold what kvgate keys: the approximate guess stays
        reported = cache.matches(keys) if keys else {}
        in_flight = self._pending.matches(hashes)
        approximate = ctx.prefix_matches()
        per_block = ctx.tokens_per_block
        merged = {address: blocks for address, blocks in approximate.items() if not cache.in_step(address)}
        for address in reported.keys() | in_flight.keys() | (set() if whole else approximate.keys()):
            if cache.in_step(address):
                held = reported.get(address, 0)
                blocks = max(held * size // per_block, in_flight.get(address, 0))
                if not whole and held >= len(keys):  # it holds all kvgate can key: past it, only the guess
                    blocks = max(blocks, approximate.get(address, 0))
                merged[address] = blocks
        ctx.set_prefix_matches(merged)

    def _check_keys(self, cache: EngineCacheView, now: float) -> None:
        """Check the keys of requests that ended a moment ago against their endpoints' reports."""

        def holds(endpoint: str, key: int) -> bool | None:
            return endpoint in cache.matches((key,)) if cache.in_step(endpoint) else None

        for check in self._checks.poll(now, holds):
            cache.key_checked(check.endpoint, held=check.held, trusted=check.trusted)

    def on_picked(self, request: InferenceRequest, endpoint: Endpoint, now: float) -> None:
        prepared = self._prepared.pop(request.request_id, None)
        if prepared is None:
            return
        hashes, last_key = prepared
        self._pending.add(request.request_id, endpoint.address, hashes)
        cache = self._cache
        # a decode half reads its KV from a prefill endpoint: what its engine reports of it is not
        # a check of kvgate's keys
        if (last_key != _NO_KEY and cache is not None and cache.in_step(endpoint.address)
                and not request.prefilled_elsewhere):
            self._checks.expect(request.request_id, endpoint.address, last_key)

    def on_served(self, request: InferenceRequest, endpoint: Endpoint, now: float) -> None:
        self._pending.move(request.request_id, endpoint.address)
        self._checks.moved(request.request_id, endpoint.address)

    def on_finished(self, request: InferenceRequest, endpoint: Endpoint, *, ok: bool, now: float) -> None:
        self._pending.remove(request.request_id)
        self._checks.finished(request.request_id, now)
        if self._cache is not None:  # (requests that end check as many as those that start)
            self._check_keys(self._cache, now)

    def forget_endpoint(self, address: str) -> None:
        self._pending.forget_endpoint(address)
        self._checks.forget_endpoint(address)
