"""Builders for scheduler tests (pure: no sockets, no clocks)."""

from __future__ import annotations

import random

from kvgate.policies.framework import SchedulingContext
from kvgate.policies.hashing import PromptHasher
from kvgate.policies.state import InProcessState, SchedulerState
from kvgate.policies.types import Endpoint, EndpointMetrics, EndpointView, InferenceRequest

NOW = 1000.0


def view(
    i: int,
    *,
    waiting: int = 0,
    running: int = 0,
    kv: float = 0.1,
    active: frozenset[str] = frozenset(),
    waiting_loras: frozenset[str] = frozenset(),
    max_loras: int = 0,
    age: float = 0.01,
    healthy: bool = True,
    scraped: bool = True,
    num_gpu_blocks: int | None = None,
    served: frozenset[str] = frozenset(),
) -> EndpointView:
    metrics = EndpointMetrics(
        waiting=waiting,
        running=running,
        kv_cache_usage=kv,
        active_loras=active,
        waiting_loras=waiting_loras,
        max_loras=max_loras,
        block_size=16 if num_gpu_blocks else None,
        num_gpu_blocks=num_gpu_blocks,
        updated_at=NOW - age,
        served_models=served,
    )
    return EndpointView(Endpoint(f"10.0.0.{i}:8000", "pool"), metrics if scraped else None, healthy)


def index_of(address: str) -> int:
    """The ``i`` of ``view(i)``'s address ``10.0.0.i:8000``."""
    return int(address.split(":")[0].rsplit(".", 1)[1])


def request(
    rid: str = "r1",
    prompt: str = "",
    *,
    model: str = "base",
    priority: int = 0,
    subset: frozenset[str] | None = None,
    session: str | None = None,
    headers: dict[str, str] | None = None,
) -> InferenceRequest:
    return InferenceRequest(
        request_id=rid,
        pool="pool",
        model=model,
        target_model=model,
        prompt=prompt,
        priority=priority,
        subset=subset,
        session_id=session,
        headers=headers or {},
    )


def context(req: InferenceRequest, state: SchedulerState | None = None, seed: int = 1) -> SchedulingContext:
    return SchedulingContext(req, NOW, state or InProcessState(), random.Random(seed), PromptHasher())


def text(seed: int, chars: int) -> str:
    rng = random.Random(seed)
    return "".join(rng.choices("abcdefghijklmnopqrstuvwxyz ", k=chars))
