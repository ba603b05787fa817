"""The scheduling framework's contracts: Filter → weighted Scorers → Picker, over one request.

::

    candidates ──subset hint──▶ filters (each: endpoints → endpoints)
               ──▶ scorers (each: endpoints → {address: score}, clamped to [0, 1], × weight, summed)
               ──▶ picker (scored endpoints → pick + fallbacks)

Plugins receive a :class:`SchedulingContext`: the request, ``now`` (monotonic seconds, passed in:
the framework never reads a clock), the :class:`~policies.state.SchedulerState`, a seeded
``random.Random`` and per-request caches (prompt block hashes and prefix matches are computed at
most once per request, whichever plugins ask). Plugins never do IO.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from policies.hashing import PromptHasher
from policies.state import SchedulerState
from policies.types import EndpointView, InferenceRequest


@dataclass(slots=True)
class SchedulingContext:
    """Everything a plugin may read while one request is scheduled (one instance per request)."""

    request: InferenceRequest
    now: float
    state: SchedulerState
    rng: random.Random
    hasher: PromptHasher
    session_id: str | None = None
    _hashes: tuple[int, ...] | None = field(default=None, repr=False)
    _matches: Mapping[str, int] | None = field(default=None, repr=False)

    @property
    def tokens_per_block(self) -> int:
        """Estimated tokens in one hashed block (64 chars / 4 chars per token = 16)."""
        return max(1, self.hasher.block_chars // 4)

    def prefix_hashes(self) -> tuple[int, ...]:
        """The request's prompt block hashes, computed once."""
        if self._hashes is None:
            req = self.request
            self._hashes = self.hasher.hashes(req.target_model, req.prompt, req.cache_salt)
        return self._hashes

    def prefix_matches(self) -> Mapping[str, int]:
        """Leading blocks each endpoint probably holds, looked up once."""
        if self._matches is None:
            hashes = self.prefix_hashes()
            self._matches = self.state.prefix_match(hashes) if hashes else {}
        return self._matches


@runtime_checkable
class Filter(Protocol):
    def filter(self, ctx: SchedulingContext, endpoints: Sequence[EndpointView]) -> Sequence[EndpointView]:
        """The endpoints that remain eligible (a subset of ``endpoints``, order kept)."""
        ...


@runtime_checkable
class Scorer(Protocol):
    def score(self, ctx: SchedulingContext, endpoints: Sequence[EndpointView]) -> Mapping[str, float]:
        """Score per endpoint address in [0, 1] (clamped by the framework; absent = 0)."""
        ...


@runtime_checkable
class Picker(Protocol):
    def pick(
        self, ctx: SchedulingContext, scored: Sequence[tuple[EndpointView, float]], count: int
    ) -> Sequence[EndpointView]:
        """The pick then fallbacks, best first: at most ``count``, at least one (``scored`` non-empty)."""
        ...


class PluginTimer(Protocol):
    """Receives per-plugin durations (gateway/ exports ``inference_extension_plugin_duration_seconds``)."""

    def observe(self, extension_point: str, plugin_type: str, plugin_name: str, seconds: float) -> None: ...


def uses_prefix_index(plugin: object) -> bool:
    """Whether a plugin reads the prefix index (then the scheduler records picks into it)."""
    return bool(getattr(plugin, "uses_prefix_index", False))
