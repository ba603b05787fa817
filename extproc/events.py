"""Decoded ext_proc messages: what the data plane told the picker, free of protobuf.

One ``ProcessingRequest`` becomes one event (``extproc.codec.decode``); the servicer adds
:class:`StreamClosed` when the gRPC stream ends or is cancelled.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from kvgate.policies.flow_control import HoldOutcome

Headers = tuple[tuple[str, str], ...]
"""Header (name, value) pairs in arrival order; names lower-case."""


class BodyMode(Enum):
    """Envoy's ``ProcessingMode.BodySendMode`` (same numbers)."""

    NONE = 0
    STREAMED = 1
    BUFFERED = 2
    BUFFERED_PARTIAL = 3
    FULL_DUPLEX_STREAMED = 4
    GRPC = 5


@dataclass(frozen=True, slots=True)
class BodyModes:
    """The filter's body modes, from the ``protocol_config`` Envoy sends on a stream's first message."""

    request: BodyMode
    response: BodyMode


@dataclass(frozen=True, slots=True)
class RequestHeaders:
    headers: Headers
    end_of_stream: bool = False
    subset_hint: tuple[str, ...] | None = None
    modes: BodyModes | None = None


@dataclass(frozen=True, slots=True)
class RequestBodyChunk:
    data: bytes
    end_of_stream: bool = False
    subset_hint: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class RequestTrailers:
    trailers: Headers = ()


@dataclass(frozen=True, slots=True)
class ResponseHeaders:
    headers: Headers
    end_of_stream: bool = False
    served_endpoint: str | None = None


@dataclass(frozen=True, slots=True)
class ResponseBodyChunk:
    data: bytes
    end_of_stream: bool = False
    served_endpoint: str | None = None


@dataclass(frozen=True, slots=True)
class ResponseTrailers:
    trailers: Headers = ()


@dataclass(frozen=True, slots=True)
class StreamClosed:
    """The ext_proc stream ended (``cancelled``: reset or client gone rather than a half-close)."""

    cancelled: bool = False


@dataclass(frozen=True, slots=True)
class PrefillDone:
    """Not from Envoy: the outcome of a :class:`~extproc.actions.RunPrefill` the servicer ran (the
    ``kv_transfer_params`` of the prefill's answer, or why there are none: ``extproc.prefill_step``)."""

    params: Mapping[str, Any] | None
    seconds: float
    error: str = ""
    request_fault: bool = False
    """The prefill endpoint refused the request itself (a 4xx: a prompt past the model's context,
    a parameter the engine rejects): not the endpoint's failure (outlier ejection must not count it)."""

    @property
    def ok(self) -> bool:
        return self.params is not None


@dataclass(frozen=True, slots=True)
class HoldEnded:
    """Not from Envoy: how a held request's wait ended (:class:`~extproc.actions.AwaitHold`)."""

    outcome: HoldOutcome


Event = (
    RequestHeaders
    | RequestBodyChunk
    | RequestTrailers
    | ResponseHeaders
    | ResponseBodyChunk
    | ResponseTrailers
    | StreamClosed
    | PrefillDone
    | HoldEnded
)
