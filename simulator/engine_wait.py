"""A rough estimate of how long a new request would wait for its first token (for ``Engine.peek``).

Model: the tokens queued ahead of it (waiting requests' prompts, before cache hits) plus its own
uncached prompt are prefilled in steps of at most ``max_num_batched_tokens`` tokens, each step also
decoding the running batch; an adapter not resident adds one load. It ignores KV pressure, the
``max_num_seqs`` limit and requests still prefilling, so it is a lower bound under heavy load; it is
meant for a benchmark's oracle router, not for scheduling.
"""

from __future__ import annotations

from kvgate.simulator.engine_types import EngineConfig
from kvgate.simulator.profiles import LatencyProfile


def estimate_wait(
    profile: LatencyProfile,
    config: EngineConfig,
    *,
    uncached: int,
    queued_tokens: int,
    running: int,
    lora_load: bool,
) -> float:
    """Simulated seconds until the first token of a request with ``uncached`` tokens to prefill."""
    tokens = queued_tokens + max(uncached, 1)
    steps = -(-tokens // config.max_num_batched_tokens)
    decode = min(running, config.max_num_seqs)
    per_step = -(-tokens // steps)
    wait = steps * profile.step_time(per_step, decode, decode + 1) * config.slowdown
    if lora_load:
        wait += config.lora_load_time
    return wait
