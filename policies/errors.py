"""kvgate's one error hierarchy. Each error carries an HTTP status, an OpenAI error ``type`` and a ``code``.

::

    KvgateError                       500 internal_error
    ├── BadRequestError               400 invalid_request_error / bad_request
    │   ├── MalformedBodyError        400 invalid_request_error / invalid_json
    │   └── InvalidModelNameError     400 invalid_request_error / invalid_model_name
    ├── ModelNotFoundError            404 invalid_request_error / model_not_found
    │   └── RouteNotFoundError        404 invalid_request_error / route_not_found
    ├── UnknownPathError              404 invalid_request_error / unknown_url
    ├── MethodNotAllowedError         405 invalid_request_error / method_not_allowed (carries allow)
    ├── PayloadTooLargeError          413 invalid_request_error / payload_too_large
    ├── HeadersTooLargeError          431 invalid_request_error / request_header_fields_too_large
    ├── TooManyRequestsError          429 (abstract: carries retry_after)
    │   ├── RequestShedError          429 rate_limit_error / request_shed
    │   └── RateLimitedError          429 rate_limit_error / rate_limit_exceeded
    ├── NoEligibleEndpointError       503 service_unavailable / no_eligible_endpoint
    │   ├── PoolNotFoundError         503 service_unavailable / pool_not_found
    │   └── QueueTimeoutError         503 service_unavailable / queue_timeout (carries retry_after)
    └── ConfigError                   500 internal_error / invalid_config  (never reaches a client)

The mapping to a data-plane answer lives in one place: ``extproc.errors.immediate_response``.
This module sits in ``policies`` because it is the lowest layer and imports nothing of ours.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import ClassVar


class KvgateError(Exception):
    status: ClassVar[int] = 500
    error_type: ClassVar[str] = "internal_error"
    code: ClassVar[str] = "internal_error"
    dropped_reason: ClassVar[str | None] = None
    """llm-d's name for why a request was dropped before reaching a replica (its response header
    ``x-llm-d-request-dropped-reason``, which its clients read), where it has one."""

    def __init__(self, message: str, *, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers: Mapping[str, str] = MappingProxyType(dict(headers or {}))

    def to_openai(self) -> dict[str, object]:
        """The OpenAI-style error body: ``{"error": {"message", "type", "code"}}``."""
        return {"error": {"message": self.message, "type": self.error_type, "code": self.code}}

    def to_anthropic(self) -> dict[str, object]:
        """Anthropic's error body, for its Messages API's clients: ``{"type": "error", "error":
        {"type", "message"}}``, the type Anthropic gives the status (503: ``overloaded_error``,
        which Anthropic's SDKs retry as they retry 529)."""
        kind = _ANTHROPIC_TYPES.get(self.status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": self.message}}


_ANTHROPIC_TYPES = MappingProxyType({
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large",
    429: "rate_limit_error", 431: "invalid_request_error", 503: "overloaded_error",
})


class BadRequestError(KvgateError):
    status = 400
    error_type = "invalid_request_error"
    code = "bad_request"


class MalformedBodyError(BadRequestError):
    code = "invalid_json"


class InvalidModelNameError(BadRequestError):
    """A ``model`` no model server could be serving: too long, or characters outside the names
    that models and adapters have (``extproc.model_names``)."""

    code = "invalid_model_name"


class ModelNotFoundError(KvgateError):
    status = 404
    error_type = "invalid_request_error"
    code = "model_not_found"

    @classmethod
    def of(cls, model: str) -> ModelNotFoundError:
        """OpenAI's and vLLM's wording, which their clients show as it is."""
        return cls(f"The model `{model}` does not exist.")


class RouteNotFoundError(ModelNotFoundError):
    """No route (so no pool) matched the request: with model routing, a model nobody serves."""

    code = "route_not_found"


class UnknownPathError(KvgateError):
    """A path outside the inference API (a model server's admin API, a typo): OpenAI answers these
    ``Invalid URL (METHOD /path)``."""

    status = 404
    error_type = "invalid_request_error"
    code = "unknown_url"


class MethodNotAllowedError(KvgateError):
    """A method the path does not take (``GET /v1/completions``): 405 with the ``allow`` header, as
    the model servers answer it (vLLM's FastAPI routes)."""

    status = 405
    error_type = "invalid_request_error"
    code = "method_not_allowed"

    def __init__(self, message: str, *, allow: str) -> None:
        super().__init__(message, headers={"allow": allow})
        self.allow = allow


class PayloadTooLargeError(KvgateError):
    status = 413
    error_type = "invalid_request_error"
    code = "payload_too_large"


class HeadersTooLargeError(KvgateError):
    status = 431
    error_type = "invalid_request_error"
    code = "request_header_fields_too_large"


class TooManyRequestsError(KvgateError):
    status = 429
    error_type = "rate_limit_error"
    code = "too_many_requests"

    def __init__(
        self, message: str, *, retry_after: float = 1.0, headers: Mapping[str, str] | None = None
    ) -> None:
        merged = {"retry-after": str(max(1, round(retry_after)))}
        merged.update(headers or {})
        super().__init__(message, headers=merged)
        self.retry_after = retry_after


class RequestShedError(TooManyRequestsError):
    code = "request_shed"
    dropped_reason = "rejected-saturated"


class RateLimitedError(TooManyRequestsError):
    code = "rate_limit_exceeded"


class NoEligibleEndpointError(KvgateError):
    status = 503
    error_type = "service_unavailable"
    code = "no_eligible_endpoint"
    dropped_reason = "rejected-no-endpoints"


class PoolNotFoundError(NoEligibleEndpointError):
    code = "pool_not_found"


class QueueTimeoutError(NoEligibleEndpointError):
    """A request held for room in its pool (flow control) waited its whole queue timeout."""

    code = "queue_timeout"
    dropped_reason = "rejected-ttl-expired"

    def __init__(self, message: str, *, retry_after: float = 1.0) -> None:
        super().__init__(message, headers={"retry-after": str(max(1, round(retry_after)))})
        self.retry_after = retry_after


class ConfigError(KvgateError):
    code = "invalid_config"
