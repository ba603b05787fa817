"""WebSocket sessions through the picker: vLLM's realtime API (``GET /v1/realtime``).

A WebSocket upgrade has no request body to read and no response to parse: the picker picks an
endpoint on its headers (the model named by the ``model`` query parameter, as OpenAI's realtime
clients name it, else any endpoint: vLLM's clients name it in the session's first event, which the
picker never sees), then the session is a tunnel: the reply to the headers turns every later phase
off (``ContinueHeaders.tunnel``), so the frames either way pass through Envoy without reaching
Python. A gateway that does not let the picker change its processing mode (the Inference
Extension's full-duplex configuration) sends the frames anyway: each goes back as it came (the
lifecycle's TUNNEL state), at a Python round trip a frame. Where the mode changes, Envoy ends the
ext_proc stream as soon as nothing more is to be processed, so the picker counts a session in flight
only until it is released: sessions are spread by their recent picks instead
(``extproc.session_spread``), and the replica's load shows in its own metrics (each transcription a
request its engine runs). An upgrade anywhere else is refused (400): a path
whose request the picker reads as a body would wait for one that never ends.
"""

from __future__ import annotations

from urllib.parse import parse_qs

from kvgate.extproc.events import Headers
from kvgate.extproc.inference_paths import route_of
from kvgate.policies.errors import BadRequestError

REALTIME_PATH = "/v1/realtime"


def upgrade_of(headers: Headers) -> str | None:
    """The request's ``upgrade`` header, lower case (None: not an upgrade). Envoy hands header names
    over in lower case; every request passes here, so they are compared as they come."""
    for name, value in headers:
        if name == "upgrade":
            return value.strip().lower()
    return None


def check_upgrade(upgrade: str, path: str) -> None:
    """400 unless this is a WebSocket upgrade of a realtime path."""
    if upgrade != "websocket":
        raise BadRequestError(f"upgrade to {upgrade!r} is not served (WebSocket on {REALTIME_PATH} is)")
    if not route_of(path).endswith(REALTIME_PATH):
        raise BadRequestError(f"WebSocket sessions are served on {REALTIME_PATH} only")


def realtime_model(path: str) -> str:
    """The model a realtime session's ``model`` query parameter names ("" when none)."""
    _, _, query = path.partition("?")
    values = parse_qs(query).get("model") if query else None
    return values[0] if values else ""
