"""The one mapping from an exception to the data plane's answer (an OpenAI-style JSON error, or
Anthropic's for its Messages API)."""

from __future__ import annotations

import json
import logging

from kvgate.extproc.actions import Immediate
from kvgate.policies.errors import KvgateError
from kvgate.policies.types import ApiKind

_log = logging.getLogger(__name__)


class ProtocolViolation(KvgateError):
    """Envoy sent a message the lifecycle does not expect in its state (500)."""

    code = "protocol_violation"

JSON_CONTENT_TYPE = "application/json"
DROPPED_REASON_HEADER = "x-llm-d-request-dropped-reason"
"""llm-d's response header naming why a request never reached a replica (``KvgateError.dropped_reason``)."""


def immediate_response(error: BaseException, api: ApiKind = ApiKind.OTHER) -> Immediate:
    """Map ``error`` to a local reply, in the shape of the request's API (Anthropic's for its
    Messages API, OpenAI's for everything else).

    A :class:`KvgateError` keeps its status, code and extra headers (``retry-after`` for 429; llm-d's
    ``x-llm-d-request-dropped-reason`` where it names the refusal);
    anything else is a bug: it is logged with its traceback and answered 500 ``internal_error``
    without leaking its text.
    """
    if not isinstance(error, KvgateError):
        _log.error("unexpected error while processing a request", exc_info=error)
        error = KvgateError("internal error")
    document = error.to_anthropic() if api is ApiKind.MESSAGES else error.to_openai()
    body = json.dumps(document, separators=(",", ":")).encode()
    headers = (("content-type", JSON_CONTENT_TYPE), *((k.lower(), v) for k, v in error.headers.items()))
    if error.dropped_reason is not None:
        headers = (*headers, (DROPPED_REASON_HEADER, error.dropped_reason))
    return Immediate(status=error.status, body=body, headers=headers, details=f"kvgate_{error.code}")
