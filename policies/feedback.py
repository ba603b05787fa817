"""Feedback plugins: what the scheduler learns from what becomes of the requests it picked.

Scheduling (filters → scorers → picker) reads; feedback writes. A feedback plugin is told of a
picked request's life, hook by hook, in the order the request lifecycle reports it (the Inference
Extension's request-control plugins: PreRequest, ResponseReceived, ResponseComplete):

::

    prepare(ctx)            a request is about to be scheduled (a plugin may fill the context)
    on_scheduled(ctx, ranked)   it was: the context holds what the scorers computed
    on_picked / on_served   the data plane was told the pick / another endpoint served it
    on_first_token          its first response bytes came (or, ``_unseen``, will not be shown)
    on_usage                the response's token usage
    on_endpoint_failed / on_endpoint_ok    an endpoint failed a request / served one
    on_finished             exactly once per picked request, success or not
    forget_endpoint         the endpoint left the pool

A plugin implements the hooks it needs (:class:`FeedbackPlugin` has them all as no-ops; the scheduler
calls only the ones a plugin overrides). A plugin that also implements :class:`EndpointGate` keeps
endpoints out of picking before the filters run (outlier ejection).

**What flows between plugins is declared.** Every plugin (filter, scorer, picker, feedback) names
what it ``produces`` and what it ``consumes`` (``policies.framework``'s :data:`PREFIX_INDEX`,
:data:`IN_FLIGHT`, ...: parts of the scheduler's state a recorder fills, or fields of the
:class:`SchedulingContext` a plugin sets for the others), as class attributes; a profile whose
plugins consume what none of them produces is refused when it is built (``policies.profile``). The
scheduler itself reads nothing a plugin leaves behind.

Feedback plugins keep per-pool memory (pending requests, deadlines, failure counts), so a profile
holds a :class:`FeedbackBlueprint` for each, built from its YAML parameters, and every scheduler
creates its own instances from them with its :class:`FeedbackEnv`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol, runtime_checkable

from kvgate.policies.engine_blocks import EngineCacheView
from kvgate.policies.framework import (
    IN_FLIGHT,
    OWN_MODELS,
    PREFIX_INDEX,
    SESSIONS,
    TTFT_ESTIMATES,
    SchedulingContext,
)
from kvgate.policies.hashing import PromptHasher
from kvgate.policies.outliers import OutlierSettings
from kvgate.policies.state import SchedulerState
from kvgate.policies.types import Endpoint, EndpointView, InferenceRequest, Usage


@dataclass(frozen=True, slots=True)
class FeedbackEnv:
    """What a scheduler gives the feedback plugins it creates."""

    state: SchedulerState
    hasher: PromptHasher
    default_capacity_blocks: int
    """Prefix-index capacity of an endpoint that reports no ``num_gpu_blocks``."""
    session_header: str
    max_pending: int = 4096
    """How many scheduled-but-unfinished requests a plugin remembers at most."""
    outliers: OutlierSettings | None = None
    """Overrides an outlier-ejection plugin's own settings (tests, tools)."""
    engine_cache: EngineCacheView | None = None
    """The engines' reported blocks of the pool (KV events), where the picker follows them."""

    def session_id(self, request: InferenceRequest) -> str | None:
        return request.session_id or request.headers.get(self.session_header) or None


class FeedbackPlugin:
    """Every hook, doing nothing: subclass it and override what the plugin needs."""

    produces: ClassVar[frozenset[str]] = frozenset()
    consumes: ClassVar[frozenset[str]] = frozenset()

    def prepare(self, ctx: SchedulingContext) -> None:
        """A request is about to be scheduled with ``ctx`` (its fields this plugin produces)."""

    def on_scheduled(self, ctx: SchedulingContext, ranked: Sequence[EndpointView]) -> None:
        """The request was ranked (``ranked[0]`` is the pick); what the scorers computed is in ``ctx``."""

    def on_picked(self, request: InferenceRequest, endpoint: Endpoint, now: float) -> None:
        """The data plane was told the pick."""

    def on_served(self, request: InferenceRequest, endpoint: Endpoint, now: float) -> None:
        """Another endpoint than the pick served the request (a fallback)."""

    def on_first_token(self, request: InferenceRequest, endpoint: Endpoint, now: float) -> None:
        """The response's first body bytes arrived."""

    def on_first_token_unseen(self, request: InferenceRequest, endpoint: Endpoint, now: float) -> None:
        """The response started and its body will not be shown (kvgate's one-pass data path)."""

    def on_usage(self, request: InferenceRequest, endpoint: Endpoint, usage: Usage, now: float) -> None:
        """The replica reported the request's token usage."""

    def on_endpoint_failed(self, address: str, now: float) -> None:
        """An endpoint failed a request (a 5xx, a refused connection, a fallback taken past it)."""

    def on_endpoint_ok(self, address: str, now: float) -> None:
        """An endpoint served a request (reported after the request, by Envoy's access log)."""

    def on_finished(self, request: InferenceRequest, endpoint: Endpoint, *, ok: bool, now: float) -> None:
        """The request ended (once per picked request)."""

    def forget_endpoint(self, address: str) -> None:
        """The endpoint left the pool: drop what is kept about it."""


@runtime_checkable
class EndpointGate(Protocol):
    """A feedback plugin that keeps some endpoints out of picking (before the filters)."""

    def gate(self, endpoints: Sequence[EndpointView], now: float) -> Sequence[EndpointView]:
        """The endpoints that may be picked now; never empty when ``endpoints`` is not."""
        ...


@runtime_checkable
class FeedbackBlueprint(Protocol):
    """A feedback plugin as a profile declares it: its parameters, not yet its memory."""

    produces: frozenset[str]
    consumes: frozenset[str]

    def create(self, env: FeedbackEnv) -> FeedbackPlugin:
        """A new instance for one scheduler."""
        ...


HOOKS = ("prepare", "on_scheduled", "on_picked", "on_served", "on_first_token", "on_first_token_unseen",
         "on_usage", "on_endpoint_failed", "on_endpoint_ok", "on_finished", "forget_endpoint")


def overridden(plugins: Sequence[FeedbackPlugin], hook: str) -> tuple[FeedbackPlugin, ...]:
    """The plugins whose ``hook`` does something (not :class:`FeedbackPlugin`'s no-op)."""
    base = getattr(FeedbackPlugin, hook)
    return tuple(p for p in plugins if getattr(type(p), hook, base) is not base)


__all__ = [
    "HOOKS", "IN_FLIGHT", "OWN_MODELS", "PREFIX_INDEX", "SESSIONS", "TTFT_ESTIMATES", "EndpointGate",
    "FeedbackBlueprint", "FeedbackEnv", "FeedbackPlugin", "overridden",
]
