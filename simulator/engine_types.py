"""Value types of the simulator engine: its configuration, requests, events and snapshots.

All times are *simulated* seconds (floats). Everything here is frozen; ``simulator.engine`` re-exports
these names, so callers import them from there.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineConfig:
    """One replica's engine settings (vLLM's names where vLLM has the setting)."""

    model: str = "meta-llama/Llama-3.1-8B-Instruct"
    served_loras: tuple[str, ...] = ()  # adapters this replica can serve (registered at start)
    max_loras: int = 4  # GPU LoRA slots
    lora_load_time: float = 0.025  # simulated seconds added to the step that loads one adapter
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    num_gpu_blocks: int = 27000  # ~Llama-3.1-8B on an 80 GB H100 at 0.9 utilisation
    block_size: int = 16
    enable_prefix_caching: bool = True
    slowdown: float = 1.0  # multiplies every step time (a slower replica)
    kv_events: bool = False  # record KV-cache events (vLLM's --kv-events-config; simulator.kv_events)

    def __post_init__(self) -> None:
        if self.max_loras < 1:
            raise ValueError("max_loras must be >= 1")
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        if self.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be >= 1")
        if self.num_gpu_blocks < 1 or self.block_size < 1:
            raise ValueError("num_gpu_blocks and block_size must be >= 1")
        if self.slowdown <= 0 or self.lora_load_time < 0:
            raise ValueError("slowdown must be > 0 and lora_load_time >= 0")


@dataclass(frozen=True)
class SimRequest:
    """A generation request as the engine sees it."""

    request_id: str
    prompt_tokens: tuple[int, ...]
    max_tokens: int  # exact output length (ignore-EOS semantics), >= 1
    lora: str | None = None  # adapter name, None = base model
    remote_tokens: int = 0
    """Leading prompt tokens whose KV a remote prefill computed and this replica received (vLLM's
    ``do_remote_prefill``): admitted as computed, like a prefix hit, in whole blocks; the rest of the
    prompt (at least its last token, as vLLM recomputes it) is computed here."""
    hold_kv: bool = False
    """Keep the prompt's full blocks referenced after the request finishes, for a decode instance to
    read (vLLM's ``do_remote_decode``): ``Finished.held_blocks`` names them and
    ``Engine.release_held`` lets them go."""
    cache_salt: str | None = None
    """vLLM's ``cache_salt``: hashed into the prompt's first block, so only requests with the same
    salt share its cached blocks."""
    output_tokens: tuple[int, ...] = ()
    """The ids its output tokens have where a client resends them (a chat's next turn: the server
    derives them from the reply it writes, ``openai_api.continuation_tokens``). As vLLM does, the
    full blocks of prompt and output enter the prefix cache as they are computed (and are reported
    as stored); empty: only the prompt's blocks do."""
    media: tuple[tuple[str, int, int], ...] = ()
    """The prompt's images: identifier, first token's index, token count (``simulator.media``). A
    block holding part of one is hashed with ``(identifier, offset)`` as vLLM's is."""


@dataclass(frozen=True)
class FirstToken:
    """The first output token of a request was made at ``time``."""

    request_id: str
    time: float
    prompt_tokens: int
    cached_tokens: int


@dataclass(frozen=True)
class TokenOut:
    """Output token ``index`` (0-based; index 0 follows FirstToken) was made at ``time``."""

    request_id: str
    time: float
    index: int


@dataclass(frozen=True)
class Finished:
    """A request produced all its tokens; ``ttft`` and ``e2e`` are measured from ``submit``."""

    request_id: str
    time: float
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    ttft: float
    e2e: float
    held_blocks: tuple[int, ...] = ()
    """The prompt's full blocks kept for a remote decode (``SimRequest.hold_kv``), in order."""
    remote_tokens: int = 0
    """Prompt tokens that came from a remote prefill (``SimRequest.remote_tokens``, whole blocks)."""


EngineEvent = FirstToken | TokenOut | Finished


@dataclass(frozen=True)
class PeekResult:
    """What a request would meet on this replica now (computed without changing any state)."""

    cached_tokens: int  # leading prompt tokens the prefix cache would serve (vLLM's cap applied)
    waiting: int
    running: int
    estimated_wait: float  # rough simulated seconds until this request's first token


@dataclass(frozen=True)
class StepPlan:
    """What one scheduled step does (extra, for tests and benchmarks)."""

    prefill_tokens: int  # uncached prompt (or recomputed) tokens computed in the step
    decode_tokens: int  # sequences decoding one token in the step
    batch_size: int  # sequences in the step
    lora_loads: tuple[str, ...]  # adapters loaded into a GPU slot for this step
    preempted: tuple[str, ...]  # request ids preempted (recompute) while scheduling the step
    duration: float  # simulated seconds


@dataclass(frozen=True)
class EngineMetrics:
    """A snapshot of the engine's gauges and counters (counters are totals since start)."""

    model: str
    waiting: int
    running: int
    kv_cache_usage: float  # used blocks / total blocks, 0..1 (vLLM: 1 - free / total)
    running_loras: tuple[str, ...]  # adapters of running requests, sorted
    waiting_loras: tuple[str, ...]  # adapters of waiting requests, sorted
    served_loras: tuple[str, ...]  # adapters registered on this replica, sorted
    max_loras: int
    block_size: int
    num_gpu_blocks: int
    prefix_cache_queries: int  # tokens looked up in the prefix cache, total
    prefix_cache_hits: int  # of which served from cache, total
    prompt_tokens_total: int
    generation_tokens_total: int
    request_success_total: int
    preemptions_total: int
    requests_submitted_total: int
    requests_aborted_total: int
    max_num_seqs: int = 0  # batch slots (JetStream reports the share of its decode slots in use)


@dataclass(frozen=True, slots=True)
class Stored:
    """A full prompt block entered the prefix cache (vLLM's ``BlockStored``, one block)."""

    block_hash: int
    parent_hash: int | None
    tokens: tuple[int, ...]
    lora: str | None
    salt: str | None = None
    """The cache salt, on a prompt's first block (vLLM puts it in that block's extra keys)."""
    media: tuple[tuple[str, int], ...] = ()
    """The ``(identifier, offset from the block's start)`` of each image the block holds part of."""


@dataclass(frozen=True, slots=True)
class Removed:
    """A cached block was evicted (vLLM's ``BlockRemoved``)."""

    block_hash: int


CacheEvent = Stored | Removed
