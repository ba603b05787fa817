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

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field
from tokenizers import Tokenizer

from kvgate.policies.engine_blocks import EngineCacheView, block_keys
from kvgate.policies.errors import ConfigError
from kvgate.policies.feedback import FeedbackEnv, FeedbackPlugin
from kvgate.policies.framework import PREFIX_INDEX, SchedulingContext
from kvgate.policies.plugins.params import Params, parse_params


class _Params(Params):
    tokenizer: str
    """Path of the model's ``tokenizer.json``."""
    block_size: Annotated[int, Field(ge=1)] = 16


class EnginePrefixBlueprint:
    """Built from the profile's YAML; each scheduler creates its own plugin (``FeedbackBlueprint``)."""

    produces: frozenset[str] = frozenset()
    consumes: frozenset[str] = frozenset({PREFIX_INDEX})

    def __init__(self, tokenizer: Tokenizer, block_size: int) -> None:
        self.tokenizer = tokenizer
        self.block_size = block_size

    @staticmethod
    def from_parameters(parameters: Mapping[str, Any] | None) -> EnginePrefixBlueprint:
        p = parse_params(_Params, parameters, "engine-prefix-matches")
        path = Path(p.tokenizer).expanduser()
        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises its own Exception type for a bad file
            raise ConfigError(f"engine-prefix-matches: cannot load tokenizer {str(path)!r}: {exc}") from exc
        return EnginePrefixBlueprint(tokenizer, p.block_size)

    def create(self, env: FeedbackEnv) -> FeedbackPlugin:
        return EnginePrefixMatches(self, env)


class EnginePrefixMatches(FeedbackPlugin):
    consumes = frozenset({PREFIX_INDEX})

    def __init__(self, blueprint: EnginePrefixBlueprint, env: FeedbackEnv) -> None:
        self._tokenizer = blueprint.tokenizer
        self._block_size = blueprint.block_size
        self._cache: EngineCacheView | None = env.engine_cache

    def prepare(self, ctx: SchedulingContext) -> None:
        cache = self._cache
        request = ctx.request
        if cache is None or not request.prompt:
            return
        tokens = self._tokenizer.encode(request.prompt, add_special_tokens=True).ids
        size = self._block_size
        if len(tokens) < size:
            return
        adapter = request.target_model if cache.knows_adapter(request.target_model) else None
        reported = cache.matches(block_keys(tokens, size, lora=adapter, salt=request.cache_salt))
        approximate = ctx.prefix_matches()
        per_block = ctx.tokens_per_block
        merged = {address: blocks for address, blocks in approximate.items() if not cache.in_step(address)}
        for address, blocks in reported.items():
            if cache.in_step(address):
                merged[address] = blocks * size // per_block
        ctx.set_prefix_matches(merged)
