"""The scheduling framework's contracts: Filter → weighted Scorers → Picker, over one request.

::

    candidates ──subset hint──▶ filters (each: endpoints → endpoints)
               ──▶ scorers (each: endpoints → {address: score}, clamped to [0, 1], × weight, summed)
               ──▶ picker (scored endpoints → pick + fallbacks)

The hot path (docs/architecture.md, principle 7): a scorer that scores every endpoint may also implement
:class:`DenseScorer` (a list in endpoint order, already in [0, 1]); the scheduler then sums lists by
position instead of building and merging a dict per scorer. Sparse scorers (prefix, session) keep
returning small mappings. Filters return their input object unchanged when they drop nothing.

Plugins receive a :class:`SchedulingContext`: the request, ``now`` (monotonic seconds, passed in:
the framework never reads a clock), the :class:`~policies.state.SchedulerState`, a seeded
``random.Random`` and per-request caches (prompt block hashes and prefix matches are computed at
most once per request, whichever plugins ask). Plugins never do IO.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, overload, runtime_checkable

from kvgate.policies.hashing import PromptHasher
from kvgate.policies.state import SchedulerState
from kvgate.policies.types import EndpointView, InferenceRequest

PREFIX_INDEX = "prefix-index"
"""The state's prefix index: which endpoint probably holds which prompt blocks."""
IN_FLIGHT = "in-flight"
"""The state's requests and prefill tokens in flight per endpoint."""
SESSIONS = "sessions"
"""The state's session → endpoint pins."""
OWN_MODELS = "own-models"
""":attr:`SchedulingContext.own_models` and ``own_requests``."""
TTFT_ESTIMATES = "ttft-estimates"
""":attr:`SchedulingContext.ttft_estimates`."""
STORED_RESPONSES = "stored-responses"
"""The state's pins of stored responses (Responses API) to the endpoints that stored them."""


@dataclass(slots=True)
class SchedulingContext:
    """Everything a plugin may read while one request is scheduled (one instance per request)."""

    request: InferenceRequest
    now: float
    state: SchedulerState
    rng: random.Random
    hasher: PromptHasher
    session_id: str | None = None
    own_models: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    """This picker's in-flight requests per endpoint and target model (``policies.inflight_models``),
    set by the plugin that produces :data:`OWN_MODELS` (``inflight-recorder``) before scheduling."""
    own_requests: int = 0
    """This picker's requests in flight in the pool (``state`` may also count other pickers');
    :data:`OWN_MODELS` too."""
    ttft_estimates: Mapping[str, float] | None = None
    """Seconds (clock seconds) to this request's first token per endpoint address, set by the scorer
    that produces :data:`TTFT_ESTIMATES` (``estimated-ttft-scorer``); the ``inflight-recorder`` ends
    the prefill of a request whose first token the data plane does not show at this estimate."""
    tpot_estimates: Mapping[str, float] | None = None
    """Seconds per output token (clock seconds: the endpoint's decode step as scraped) per endpoint
    address, set with :attr:`ttft_estimates` for a request stating a TPOT objective
    (``x-slo-tpot-ms``) alone."""
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

    def known_prefix_matches(self) -> Mapping[str, int] | None:
        """The prefix matches if a plugin has looked them up for this request, else None (without
        hashing the prompt)."""
        return self._matches

    def set_prefix_matches(self, matches: Mapping[str, int]) -> None:
        """Replace the prefix matches the plugins read (a plugin that knows better: the engines'
        own reports, ``policies.plugins.engine_prefix``)."""
        self._matches = matches

    def prefix_matches(self) -> Mapping[str, int]:
        """Leading blocks each endpoint probably holds, looked up once."""
        if self._matches is None:
            hashes = self.prefix_hashes()
            self._matches = self.state.prefix_match(hashes) if hashes else {}
        return self._matches

    def prompt_tokens(self) -> int:
        """The prompt's tokens as the plugins should count them: the request's estimate from its
        text, or, where the engines report holding more of it than that (the estimate counts
        characters; a chat template's tools, headers and an image's placeholder tokens it cannot
        see), what they hold. An estimate below what an endpoint holds made every endpoint that
        holds at least the estimate look fully cached, and their differences vanish."""
        estimate = self.request.prompt_tokens_estimate
        matches = self.prefix_matches() if estimate else {}
        held = max(matches.values(), default=0) * self.tokens_per_block
        return held if held > estimate else estimate


@runtime_checkable
class Filter(Protocol):
    def filter(self, ctx: SchedulingContext, endpoints: Sequence[EndpointView]) -> Sequence[EndpointView]:
        """The endpoints that remain eligible (a subset of ``endpoints``, order kept)."""
        ...


@runtime_checkable
class Scorer(Protocol):
    def score(self, ctx: SchedulingContext, endpoints: Sequence[EndpointView]) -> Mapping[str, float]:
        """Score per endpoint address in [0, 1] (clamped by the framework; absent = 0; addresses
        that are not among ``endpoints`` are ignored)."""
        ...


@runtime_checkable
class DenseScorer(Scorer, Protocol):
    """A scorer that scores every endpoint: the scheduler calls ``dense_scores`` instead of ``score``."""

    def dense_scores(self, ctx: SchedulingContext, endpoints: Sequence[EndpointView]) -> Sequence[float]:
        """One score per endpoint, in the order of ``endpoints``, each already in [0, 1]
        (the same values ``score`` maps by address)."""
        ...


class ScoredEndpoints(Sequence[tuple[EndpointView, float]]):
    """What the scheduler hands a picker: ``(endpoint, total score)`` pairs, in candidate order, that
    also expose their two columns (``endpoints``, ``scores``) so a picker need not split the pairs."""

    __slots__ = ("endpoints", "scores")

    def __init__(self, endpoints: Sequence[EndpointView], scores: Sequence[float]) -> None:
        if len(endpoints) != len(scores):
            raise ValueError("one score per endpoint")
        self.endpoints = endpoints
        self.scores = scores

    @overload
    def __getitem__(self, index: int) -> tuple[EndpointView, float]: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[tuple[EndpointView, float]]: ...

    def __getitem__(
        self, index: int | slice
    ) -> tuple[EndpointView, float] | Sequence[tuple[EndpointView, float]]:
        if isinstance(index, slice):
            return list(zip(self.endpoints[index], self.scores[index], strict=True))
        return self.endpoints[index], self.scores[index]

    def __iter__(self) -> Iterator[tuple[EndpointView, float]]:
        return zip(self.endpoints, self.scores, strict=True)

    def __len__(self) -> int:
        return len(self.endpoints)


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


class SchedulingTrace(PluginTimer, Protocol):
    """What scheduling reports of one traced request (``extproc.tracing`` makes spans of it);
    untraced requests pass none, and nothing is made for them. ``observe`` times every plugin."""

    def scored(self, scorer: str, endpoints: Sequence[EndpointView],
               values: Sequence[float] | Mapping[str, float]) -> None:
        """One scorer's scores: in ``endpoints``' order, or by address."""
        ...

    def ranked(self, ctx: SchedulingContext, profile: str, candidates: int,
               ranked: Sequence[EndpointView], totals: Mapping[str, float]) -> None:
        """A profile's outcome: ``candidates`` it was given, the ranked pick and fallbacks, the
        totals by address; ``ctx`` for what was looked up (``known_prefix_matches``)."""
        ...

    def note(self, key: str, value: str | int | float | bool) -> None:
        """A decision worth seeing (``kvgate.pd.*``: whether and why a request was split)."""
        ...


def declared(plugin: object) -> tuple[frozenset[str], frozenset[str]]:
    """What a plugin declares it ``produces`` and ``consumes`` (class attributes; none declared:
    nothing), for the profile's check that everything consumed is produced."""
    produces: frozenset[str] = getattr(plugin, "produces", frozenset())
    consumes: frozenset[str] = getattr(plugin, "consumes", frozenset())
    return produces, consumes
