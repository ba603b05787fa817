"""Domain types shared by the scheduler, the ext_proc service and the control plane.

Everything here is immutable: the scraper builds a new :class:`EndpointSnapshot` and swaps
one reference; the scheduler reads whatever snapshot it was handed and never does IO.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any

import msgspec

CHARS_PER_TOKEN = 4
"""The gateway's token estimate for a prompt it has not tokenized (GIE uses the same)."""


class ApiKind(StrEnum):
    """Which OpenAI-compatible API a request targets, from its path suffix."""

    COMPLETIONS = "completions"
    CHAT_COMPLETIONS = "chat_completions"
    EMBEDDINGS = "embeddings"
    RESPONSES = "responses"
    MESSAGES = "messages"
    """Anthropic's Messages API (vLLM's ``/v1/messages``)."""
    OTHER = "other"


class FailureMode(StrEnum):
    """What the data plane does when the picker cannot be reached (InferencePool endpointPickerRef)."""

    FAIL_OPEN = "FailOpen"
    FAIL_CLOSE = "FailClose"


class Role(StrEnum):
    """What a replica does in a disaggregated pool: prefill, decode, or both (aggregated serving).

    Kubernetes: the Pod label ``llm-d.ai/role`` (``prefill``, ``decode``, ``prefill-decode``, or
    ``both``); absent means both.
    """

    PREFILL = "prefill"
    DECODE = "decode"
    BOTH = "both"

    @property
    def prefills(self) -> bool:
        return self is not Role.DECODE

    @property
    def decodes(self) -> bool:
        return self is not Role.PREFILL

    @staticmethod
    def parse(text: str | None) -> Role:
        """A role from a label or config value; ValueError for anything else."""
        if text is None or text in ("", "both", "prefill-decode"):
            return Role.BOTH
        if text in ("prefill", "decode"):
            return Role(text)
        raise ValueError(f"role {text!r} is not prefill, decode, prefill-decode or both")


ROLE_LABEL = "llm-d.ai/role"
"""The Pod label naming a replica's :class:`Role` (llm-d's convention)."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One model-server replica: an ``ip:port`` inside one pool, with its :class:`Role`."""

    address: str
    pool: str
    name: str = ""
    role: Role = Role.BOTH

    @property
    def host(self) -> str:
        return self.address.rsplit(":", 1)[0]

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])


class EndpointMetrics(msgspec.Struct, frozen=True, gc=False):
    """What one scrape of a replica's ``/metrics`` told us, engine-neutral.

    A frozen ``msgspec.Struct``, not a frozen dataclass: one is made per scrape and per view
    another picker shares (tens of thousands a second at 1,000 endpoints), and a frozen dataclass
    took ~3.5 µs to construct against ~0.25 (bench/results/scrape_engine.md, session 22). Not
    tracked by the garbage collector: it holds numbers and frozensets of strings, never a cycle.

    ``updated_at`` is the monotonic time (seconds) of the scrape that produced it.
    ``active_loras`` are adapters running or loaded now; ``waiting_loras`` those queued.
    ``block_size`` / ``num_gpu_blocks`` come from ``cache_config_info`` when the engine exposes it.
    ``served_models`` are the model names the page labels its gauges with (vLLM's ``model_name``:
    the base model's served name), empty when it has none; on a LoRA-enabled endpoint any other
    model a request names is an adapter.
    """

    waiting: int = 0
    running: int = 0
    kv_cache_usage: float = 0.0
    active_loras: frozenset[str] = frozenset()
    waiting_loras: frozenset[str] = frozenset()
    max_loras: int = 0
    block_size: int | None = None
    num_gpu_blocks: int | None = None
    updated_at: float = 0.0
    served_models: frozenset[str] = frozenset()
    running_reported: bool = True
    """False for an engine whose page has no count of running requests (JetStream: decode slots
    in use, as a fraction, only): ``running`` is then 0 and says nothing."""


class EndpointView(msgspec.Struct, frozen=True, gc=False):
    """An endpoint with its latest metrics as the scheduler sees it (a frozen ``msgspec.Struct``
    for the reason :class:`EndpointMetrics` is one).

    ``metrics`` is None until the first successful scrape. ``healthy`` is False while scrapes
    fail (the replica is unreachable or answers errors); the metrics then keep their last value
    and their age tells how stale they are.
    """

    endpoint: Endpoint
    metrics: EndpointMetrics | None = None
    healthy: bool = True

    @property
    def address(self) -> str:
        return self.endpoint.address

    def age(self, now: float) -> float:
        """Seconds since the metrics were scraped; infinite when never scraped."""
        if self.metrics is None:
            return float("inf")
        return max(0.0, now - self.metrics.updated_at)


def _frozen_pools(pools: Mapping[str, tuple[EndpointView, ...]]) -> Mapping[str, tuple[EndpointView, ...]]:
    return MappingProxyType(dict(pools))


@dataclass(frozen=True, slots=True)
class EndpointSnapshot:
    """Every pool's endpoints with their metrics at one instant (``version`` grows on each swap)."""

    pools: Mapping[str, tuple[EndpointView, ...]] = field(default_factory=lambda: _frozen_pools({}))
    version: int = 0

    @staticmethod
    def of(pools: Mapping[str, tuple[EndpointView, ...]], version: int = 0) -> EndpointSnapshot:
        return EndpointSnapshot(pools=_frozen_pools(pools), version=version)

    def endpoints(self, pool: str) -> tuple[EndpointView, ...]:
        return self.pools.get(pool, ())


PROMPT_OPTIONS = ("tools", "documents", "add_generation_prompt", "continue_final_message",
                  "chat_template_kwargs", "chat_template", "add_special_tokens", "truncate_prompt_tokens")
"""A request's fields that shape the prompt vLLM builds: what it hands the chat template besides the
messages, and whether it adds the tokenizer's special tokens."""


@dataclass(frozen=True, slots=True)
class InferenceRequest:
    """What routing needs to know of one request, parsed once from headers and body.

    ``model`` is the name the client sent; ``target_model`` the one the replica will serve
    (after any rewrite): a base model or a LoRA adapter name. ``prompt`` is the text that prefix
    hashing reads (the completion prompt, or the chat messages flattened in order).
    ``subset`` is the data plane's subset hint (``ip`` or ``ip:port`` strings) or None.
    ``headers`` are the request headers, lower-cased, with system-owned headers removed.
    """

    request_id: str
    pool: str
    model: str
    target_model: str
    api: ApiKind = ApiKind.COMPLETIONS
    prompt: str = ""
    stream: bool = False
    priority: int = 0
    fairness_id: str | None = None
    session_id: str | None = None
    cache_salt: str | None = None
    max_tokens: int | None = None
    body_size: int = 0
    subset: frozenset[str] | None = None
    headers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    messages: Sequence[Mapping[str, Any]] | None = None
    """A chat request's messages as sent (for the model's chat template: engine-prefix-matches); None
    for other APIs."""
    engine_prompt: str | tuple[int, ...] | None = None
    """A completion's prompt as the engine receives it: its text, or its token ids (a client that
    tokenized it), ``()`` for a batch of prompts (each its own engine request); None: not given
    (``prompt`` is the text). engine-prefix-matches keys it."""
    prompt_options: Mapping[str, Any] | None = None
    """The request's fields in ``PROMPT_OPTIONS`` as sent (a chat's ``tools``, ``documents``,
    ``add_generation_prompt``, ``continue_final_message``, ``chat_template_kwargs``,
    ``chat_template``; ``add_special_tokens``): engine-prefix-matches builds the prompt as vLLM does."""
    prefilled_elsewhere: bool = False
    """The decode half of a disaggregated request: another endpoint computes the prompt's KV, the
    endpoint this request is picked for reads it (set by ``policies.pd_scheduler``, not parsed)."""
    response_id: str | None = None
    """A Responses API request's id for its stored response (the engine stores it where it ran:
    ``stored-response-recorder`` remembers where)."""
    previous_response_id: str | None = None
    """The stored response a Responses API request continues (or, on ``/v1/responses/{id}``, reads
    or cancels): only the endpoint that stored it can serve it (``stored-response-filter``)."""

    @property
    def prompt_tokens_estimate(self) -> int:
        return max(1, len(self.prompt) // CHARS_PER_TOKEN) if self.prompt else 0

    @property
    def sheddable(self) -> bool:
        return self.priority < 0


@dataclass(frozen=True, slots=True)
class Usage:
    """Token usage a replica reported for a finished (or streaming) request."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int | None = None
