"""A response's head as the picker reads it: its status and content type, and the body filter the
request's decision and the lifecycle's settings call for."""

from __future__ import annotations

from kvgate.extproc.decision import Decision
from kvgate.extproc.events import Headers
from kvgate.extproc.lifecycle_config import LifecycleConfig
from kvgate.extproc.openai_response import ResponseBodyProcessor
from kvgate.policies.types import ApiKind


def response_head(headers: Headers) -> tuple[int, str]:
    """``(status, content type in lower case)``; status 0 when it is not a number."""
    status, content_type = 0, ""
    for name, value in headers:
        key = name.lower()
        if key == ":status":
            status = int(value) if value.isdigit() else 0
        elif key == "content-type":
            content_type = value.lower()
    return status, content_type


def response_processor(
    decision: Decision, config: LifecycleConfig, content_type: str
) -> ResponseBodyProcessor:
    """The body filter of this response: the usage chunk the gateway asked for dropped, the model
    renamed back to the client's after a rewrite, the usage read."""
    request = decision.request
    rename = (request.target_model, request.model) if config.rename_response_model and request.model else None
    sse = "text/event-stream" in content_type
    return ResponseBodyProcessor(
        sse=sse,
        drop_usage_chunk=decision.usage_injected and config.drop_injected_usage_chunk,
        rename_model=rename,
        copy_limit=config.response_copy_limit,
        preamble=sse and request.api is ApiKind.RESPONSES,
    )
