"""What a process's request lifecycles share: their settings, the source of request ids, a sampler.

:class:`LifecycleConfig` is built once (``kvgate picker`` / ``kvgate up`` flags, the composition
root) and read by every :class:`extproc.lifecycle.RequestLifecycle`; :class:`RequestIds` and
:class:`EveryNth` are per process, shared by its lifecycles.
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field

from kvgate.extproc.attempt_timeout import AttemptTimeout
from kvgate.extproc.events import BodyMode, BodyModes
from kvgate.extproc.ports import TenantLimiter
from kvgate.extproc.session_persistence import SessionSpec
from kvgate.extproc.session_spread import RecentSessions

STREAM_CHUNK_BYTES = 62_000
"""Largest streamed body chunk sent back to Envoy (GIE's margin under a 64 KiB per-chunk limit)."""


@dataclass(frozen=True, slots=True)
class LifecycleConfig:
    max_body_bytes: int = 16 * 1024 * 1024
    fallback_count: int = 3
    """How many ranked endpoints go into the ``envoy.lb`` destination metadata (the pick first,
    then fallbacks a data plane may retry on: kvgate's own clusters do); the header always carries
    the pick alone (an ORIGINAL_DST cluster, as in GIE's reference configuration, reads one)."""
    stream_chunk_bytes: int = STREAM_CHUNK_BYTES
    default_modes: BodyModes = field(
        default_factory=lambda: BodyModes(BodyMode.FULL_DUPLEX_STREAMED, BodyMode.FULL_DUPLEX_STREAMED)
    )
    """Used when Envoy sends no ``protocol_config`` (it does on the first message since 1.33)."""
    inject_include_usage: bool = True
    drop_injected_usage_chunk: bool = True
    rename_response_model: bool = True
    response_copy_limit: int = 4 * 1024 * 1024
    tenant_limiter: TenantLimiter | None = None
    """Per-tenant rate limits (checked before scheduling, charged with the usage); None = none."""
    observe_usage: Callable[[], bool] | None = None
    """One-pass data path: asked once per request whether to read its response body anyway (usage
    for the token metrics and the prefix index's capacity learning, the exact first token), e.g.
    :class:`EveryNth`; None = only when a feature needs it (rename, token limits). Each request read
    costs a message per response chunk."""
    skip_unread_responses: bool = False
    """One-pass data path: a request whose response nothing needs (no model rewrite in its pool, no
    token limit, not sampled) skips the response-headers round trip (a ``mode_override`` in the
    reply to its request headers, honoured by Envoy 1.40): one message fewer each way. Its status,
    served endpoint and (non-streamed) first token are then not seen on the request path: without
    ``outcome_reports`` fallbacks it took are not counted and its replica's 5xx do not eject it from
    picking (Envoy's outlier detection still does). The request still ends when Envoy closes the
    stream."""
    outcome_reports: bool = False
    """With ``skip_unread_responses``, where Envoy reports outcomes to the picker (its gRPC access
    log: ``extproc.outcomes``, ``ExtProcSettings.outcome_reports``): a skipped request carries
    ``x-kvgate-outcome`` so that it is logged, and its success or failure counts when the report
    comes, not when its stream closes."""
    message_timeout_s: float = 30.0
    """The data plane's ext_proc message timeout (kvgate up's Envoy: 30 s): a request held for room
    asks Envoy to wait its queue timeout plus this (``override_message_timeout``, capped by the
    filter's ``max_message_timeout``)."""
    session: SessionSpec | None = None
    """The route rule's ``sessionPersistence`` (a cookie or header naming the session; set per
    stream from its metadata): the response is read, to start a session a request names none of."""
    attempt_timeout: AttemptTimeout | None = None
    """Bound each attempt of a non-streamed request by its ``max_tokens`` (Envoy's per-try timeout
    header): for data planes whose routes retry on the picker's fallbacks, as kvgate's do. None:
    no bound (a gateway configured by others keeps its own timeouts)."""
    attempt_cap_ms: int | None = None
    """The request's route rule's ``timeouts.backendRequest`` (gRPC initial metadata, per stream):
    the attempt bound is never longer (the route's own per-try timeout bounds the requests the
    picker sets no bound for)."""
    recent_sessions: RecentSessions | None = None
    """The process's realtime session picks (``extproc.session_spread``): sessions go to the
    endpoints that took the fewest lately; None: on the profile's scores alone."""


class RequestIds:
    """Request ids for the scheduler's in-flight state: a random 64-bit prefix per instance (per
    process: unique across the pickers sharing state through Redis) and a counter. Cheaper than
    ``uuid4`` (no ``getrandom`` call per request); ``next_id`` is the callable a lifecycle takes."""

    def __init__(self) -> None:
        self._prefix = secrets.token_hex(8)
        self._counter = itertools.count(1)

    def next_id(self) -> str:
        return f"{self._prefix}-{next(self._counter):x}"


class EveryNth:
    """True on one call in ``n`` (the first included): a deterministic 1-in-n sampler."""

    def __init__(self, n: int) -> None:
        if n < 1:
            raise ValueError("n must be >= 1")
        self._n = n
        self._countdown = 0

    def __call__(self) -> bool:
        hit = self._countdown == 0
        self._countdown = self._n - 1 if hit else self._countdown - 1
        return hit
