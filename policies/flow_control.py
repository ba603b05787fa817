"""Flow control (issue 34): when a pool has room, what a held request costs, which held request
goes next. Sans-IO: no clock, no tasks; the picker's shell (``extproc.holding``) calls it.

A request is **held** in the picker (not sent into a replica's queue) when its pool has no room or
others already wait (no overtaking); a held request is **dispatched** when room appears (a request
finished, a fresh scrape), one grant at a time: the next grant waits until the last one has been
picked (its pick is then counted in the in-flight state the room rule reads), or its client has
gone. The order is :class:`~policies.holding_queue.HoldingQueue`'s (bands, cost-weighted fairness
between tenants, bounded length, deadlines).

**Room** (:func:`endpoint_has_room`): an endpoint has room when it is not saturated by the
Inference Extension's rule (healthy, fresh metrics, queue below ``queue_threshold``, KV cache below
``kv_threshold``), the requests this picker sent it since its last scrape do not make up such a
queue either (this picker's in-flight requests there beyond the scrape's running ones), and it
holds fewer than the user's ``max_inflight_per_endpoint`` of this picker's requests. A pool has room
when one of its endpoints has. A pool with no endpoint has none: its requests wait for a replica
(scale from zero).

**Cost** (:func:`work_seconds`): the GPU seconds a request will take, from kvgate's own estimate:
uncached prompt tokens at the prefill rate, cached ones at a small rate, the expected output at the
decode rate. The defaults are the BLIS linear fit for Llama-3.1-8B on one H100 that the simulator
uses (17.25 µs per uncached prompt token; a decode token 6 µs plus its share of the 5.75 ms step
base at a batch of 32).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum

from kvgate.policies.durations import go_duration
from kvgate.policies.holding_queue import HoldingQueue, QueueOrder, Waiting
from kvgate.policies.saturation import SaturationThresholds
from kvgate.policies.state import InFlight
from kvgate.policies.types import EndpointView

MAX_QUEUE_TIMEOUT_S = 1800.0
"""Held at most 30 minutes: Envoy's ext_proc extends one message's timer by an hour at most."""
DEFAULT_THRESHOLDS = SaturationThresholds(queue_threshold=32, kv_threshold=1.0, metrics_staleness_s=0.2)
"""kvgate's default profile's saturation filter (docs/routing.md, finding 15), not the Inference
Extension's queue 5 / KV 0.8: a fleet that caches prompt prefixes keeps its KV caches near full and
short queues below its capacity, and those held its requests while it had room (the routing
benchmark's shared-prefix-fit at 1.2x the estimate: p90 TTFT 337 ms against 49 without holding, the
prefix hit rate 0.54 against 0.77: docs/flow-control.md)."""
CHARS_PER_TOKEN = 4
"""The prompt's length in tokens, estimated from its characters (the prefix index's convention)."""


@dataclass(frozen=True, slots=True)
class WorkCosts:
    """GPU seconds per token of each kind (:func:`work_seconds`)."""

    prefill_s_per_token: float = 17.25e-6
    cached_s_per_token: float = 0.5e-6
    decode_s_per_token: float = 6.0e-6 + 5.7527e-3 / 32
    default_output_tokens: int = 256
    """Output tokens expected of a request that sets no ``max_tokens``."""


@dataclass(frozen=True, slots=True)
class FlowControlSettings:
    """One pool's flow control (pools file ``flowControl``, annotations ``kvgate.io/queue-*``)."""

    queue_timeout_s: float = 30.0
    """How long a request waits at most (then 429 when sheddable, else 503, with Retry-After); at
    most :data:`MAX_QUEUE_TIMEOUT_S`."""
    max_queue_length: int = 1000
    """Held requests at most; beyond it the lowest band's newest is shed (429)."""
    max_inflight_per_endpoint: int | None = None
    """This picker's requests on one endpoint at most (None: no limit beyond the thresholds)."""
    reserved_per_endpoint: int = 0
    """Slots per endpoint beyond ``max_inflight_per_endpoint`` that only a request whose tenant has
    nothing waiting may take, at once, past the queue: a light tenant does not wait for a slot to
    free behind a heavy tenant's backlog (set the two to add up to the engine's ``max_num_seqs``)."""
    thresholds: SaturationThresholds = field(default_factory=lambda: DEFAULT_THRESHOLDS)
    """When an endpoint is full (:data:`DEFAULT_THRESHOLDS`)."""
    retry_after_s: float = 1.0
    """The Retry-After of a request that timed out or was shed."""
    work: WorkCosts = field(default_factory=WorkCosts)
    order: QueueOrder = "fcfs"
    """Which of a tenant's held requests takes its turn (``policies.holding_queue``): the oldest, or
    the one whose first token is due soonest (``slo-deadline``: ``x-slo-ttft-ms``)."""

    def __post_init__(self) -> None:
        if not 0 < self.queue_timeout_s <= MAX_QUEUE_TIMEOUT_S:
            raise ValueError(f"the queue timeout must be > 0 and at most {MAX_QUEUE_TIMEOUT_S:g} s")
        if self.max_queue_length < 1:
            raise ValueError("the maximum queue length must be at least 1")
        if self.max_inflight_per_endpoint is not None and self.max_inflight_per_endpoint < 1:
            raise ValueError("the in-flight limit per endpoint must be at least 1")
        reserved = self.reserved_per_endpoint
        if reserved < 0 or (reserved and self.max_inflight_per_endpoint is None):
            raise ValueError("reserved slots need an in-flight limit per endpoint, and are never negative")


QUEUE_TTL_HEADER = "x-llm-d-inference-ttl"
"""llm-d's per-request queue budget (a Go duration, ``1500ms``): the request waits at most that long
(never longer than its pool's queue timeout). ``x-llm-d-router-inference-ttl``, llm-d's newer name,
is read as it (``extproc.names.HEADER_ALIASES``)."""


def queue_budget_s(headers: Mapping[str, str], timeout_s: float) -> float:
    """How long a request with ``headers`` may wait: its :data:`QUEUE_TTL_HEADER` where that is a
    positive duration shorter than ``timeout_s`` (the pool's), else ``timeout_s``."""
    text = headers.get(QUEUE_TTL_HEADER)
    if not text:
        return timeout_s
    try:
        ttl = go_duration(text)
    except ValueError:
        return timeout_s
    return ttl if 0 < ttl < timeout_s else timeout_s


def work_seconds(prompt_chars: int, cached_tokens: int, max_tokens: int | None, costs: WorkCosts) -> float:
    """A request's estimated GPU seconds (> 0): its uncached and cached prompt tokens and its
    expected output (``max_tokens``, else the default)."""
    prompt = prompt_chars // CHARS_PER_TOKEN
    cached = min(max(cached_tokens, 0), prompt)
    output = max_tokens if max_tokens is not None and max_tokens > 0 else costs.default_output_tokens
    seconds = ((prompt - cached) * costs.prefill_s_per_token + cached * costs.cached_s_per_token
               + output * costs.decode_s_per_token)
    return max(seconds, 1e-6)


def endpoint_has_room(view: EndpointView, own: InFlight | None, settings: FlowControlSettings,
                      now: float, *, reserved: bool = False) -> bool:
    """Whether one more request may go to ``view`` now (module docstring); ``own``: this picker's
    requests in flight there (None: none); ``reserved``: counting the slots reserved for tenants
    without a backlog (``reserved_per_endpoint``) as room too."""
    thresholds = settings.thresholds
    if thresholds.saturated(view, now):
        return False
    if own is None:
        return True
    metrics = view.metrics
    assert metrics is not None  # saturated() is True without metrics
    if metrics.running_reported and own.requests - metrics.running >= thresholds.queue_threshold:
        return False  # sent since the scrape: a queue the scrape does not show yet
    limit = settings.max_inflight_per_endpoint
    if limit is None:
        return True
    return own.requests < limit + (settings.reserved_per_endpoint if reserved else 0)


def pool_has_room(views: Iterable[EndpointView], inflight: Mapping[str, InFlight],
                  settings: FlowControlSettings, now: float, *, reserved: bool = False) -> bool:
    """Whether any of the pool's endpoints has room (False for a pool without endpoints)."""
    return any(endpoint_has_room(view, inflight.get(view.address), settings, now, reserved=reserved)
               for view in views)


class HoldOutcome(Enum):
    """How a held request's wait ended (the Inference Extension's flow-control outcome names)."""

    DISPATCHED = "Dispatched"
    REJECTED_CAPACITY = "RejectedCapacity"
    """Shed to keep the queue within its bound (or not queued: it was the one to shed)."""
    EVICTED_TTL = "EvictedTTL"
    """Its deadline passed (or the pool stopped serving)."""
    EVICTED_CANCELLED = "EvictedContextCancelled"
    """Its client went away."""


class FlowController:
    """One pool's held requests and the grant in progress (module docstring)."""

    def __init__(self, settings: FlowControlSettings) -> None:
        self.settings = settings
        self.queue = HoldingQueue(settings.max_queue_length, settings.order)
        self._granted = 0
        """Requests dispatched whose pick has not been made yet (0 or 1)."""

    def reconfigure(self, settings: FlowControlSettings) -> None:
        self.settings = settings
        self.queue.max_length = settings.max_queue_length
        self.queue.reorder(settings.order)

    def must_wait(self, has_room: bool | Callable[[], bool]) -> bool:
        """Whether an arriving request is held: others wait (no overtaking) or there is no room
        (``has_room`` may be asked lazily: at 1,000 endpoints a look costs ~0.4 ms, and while
        others wait the answer is yes without it)."""
        if self.queue or self._granted > 0:
            return True
        return not (has_room() if callable(has_room) else has_room)

    def hold(self, item: Waiting) -> Waiting | None:
        """Queue ``item``; the request shed to stay within bounds (maybe ``item``), or None."""
        return self.queue.push(item)

    def dispatch(self, has_room: bool) -> Waiting | None:
        """The held request to release now (None: no room, none held, or a grant in progress).
        The caller reports its pick with :meth:`grant_used`."""
        if self._granted or not has_room:
            return None
        item = self.queue.pop()
        if item is not None:
            self._granted += 1
        return item

    def grant_used(self) -> None:
        """The dispatched request was picked, or gave up before (its client went away)."""
        if self._granted:
            self._granted -= 1

    def expired(self, now: float) -> list[Waiting]:
        return self.queue.expired(now)

    def remove(self, request_id: str) -> Waiting | None:
        return self.queue.remove(request_id)

    @property
    def granting(self) -> bool:
        return self._granted > 0
