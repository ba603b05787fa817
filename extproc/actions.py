"""What the request lifecycle asks the data plane to do, free of protobuf.

``extproc.codec.encode`` turns each action into one ``ProcessingResponse``.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType

from kvgate.extproc.events import BodyMode, Headers
from kvgate.extproc.ports import HoldingPort


class Phase(Enum):
    REQUEST = "request"
    RESPONSE = "response"


DynamicMetadata = Mapping[str, Mapping[str, str]]
"""``{namespace: {key: value}}``, e.g. ``{"envoy.lb": {"x-gateway-destination-endpoint": "ip:port"}}``."""


def _no_metadata() -> DynamicMetadata:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class HeaderEdit:
    """Headers to set (overwrite or add), to append (beside any of the same name: a ``Set-Cookie``)
    and to remove."""

    set: Headers = ()
    remove: tuple[str, ...] = ()
    append: Headers = ()


@dataclass(frozen=True, slots=True)
class ContinueHeaders:
    """Answer a headers message, with optional mutations, route-cache clearing and dynamic metadata.

    ``response_body_mode``: a per-request ``mode_override`` turning the response body on (Envoy 1.40
    honours it only in the reply to the response headers, and only with ``allow_mode_override``).
    """

    phase: Phase
    edit: HeaderEdit = HeaderEdit()
    clear_route_cache: bool = False
    metadata: DynamicMetadata = field(default_factory=_no_metadata)
    response_body_mode: BodyMode | None = None
    skip_response: bool = False
    """In the reply to the request headers: this request's response phases are skipped (a whole
    ``mode_override``: request headers SEND, body BUFFERED, response headers SKIP, body NONE)."""
    tunnel: bool = False
    """In the reply to the request headers: nothing more of this request reaches the picker, its
    body included (a WebSocket session's frames: ``extproc.upgrades``)."""


@dataclass(frozen=True, slots=True)
class StreamBody:
    """One chunk of a body re-sent in FULL_DUPLEX_STREAMED mode (``streamed_response``)."""

    phase: Phase
    data: bytes
    end_of_stream: bool


@dataclass(frozen=True, slots=True)
class ContinueBody:
    """Answer one body message in BUFFERED / STREAMED mode.

    ``body`` None leaves the body as it is; otherwise it replaces it (empty clears it).
    Header edits, route-cache clearing and metadata are allowed here while the headers have not
    left Envoy (BUFFERED request bodies).
    """

    phase: Phase
    body: bytes | None = None
    edit: HeaderEdit = HeaderEdit()
    clear_route_cache: bool = False
    metadata: DynamicMetadata = field(default_factory=_no_metadata)


@dataclass(frozen=True, slots=True)
class ContinueTrailers:
    phase: Phase


@dataclass(frozen=True, slots=True)
class Immediate:
    """End the HTTP request now with a local reply (status, JSON body, headers)."""

    status: int
    body: bytes
    headers: Headers = ()
    details: str = ""


@dataclass(frozen=True, slots=True)
class ExtendTimeout:
    """Envoy's ext_proc message timer for the message being answered runs ``seconds`` from now
    (``override_message_timeout``: a held request is not cut by it; Envoy caps it at the filter's
    ``max_message_timeout``)."""

    seconds: float


Action = ContinueHeaders | StreamBody | ContinueBody | ContinueTrailers | Immediate | ExtendTimeout
"""A reply to Envoy (``extproc.codec.encode``)."""


@dataclass(frozen=True, slots=True)
class RunPrefill:
    """Not a reply to Envoy: the servicer sends a disaggregated request's prefill half to ``address``
    (``extproc.prefill_client``) and gives the lifecycle a ``PrefillDone`` event
    (``extproc.prefill_step``)."""

    address: str
    path: str
    body: bytes
    headers: Headers
    tls: ssl.SSLContext | None = None
    """HTTPS with this client context (the pool's model servers serve TLS); None: HTTP."""


@dataclass(frozen=True, slots=True)
class AwaitHold:
    """Not a reply to Envoy: the request is held in its pool's holding area (``extproc.holding``);
    the servicer awaits how its wait ends and gives the lifecycle a ``HoldEnded`` event."""

    request_id: str
    area: HoldingPort


Step = Action | RunPrefill | AwaitHold
"""What the lifecycle returns: replies, and what it needs awaited (a prefill, a held request's
dispatch) before its next reply."""
