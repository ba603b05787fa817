"""vLLM's request errors and its request fields as its pydantic request models read them.

:class:`ApiError` is answered as vLLM's JSON error body (``error_body``) with its HTTP status.
vLLM's request models are pydantic models in lax mode: ``"stream": "true"`` is a stream and
``"max_tokens": "16"`` sixteen tokens to it; ``field_bool`` and ``field_int`` read a field so, and
what vLLM refuses is its 400.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import TypeAdapter, ValidationError

JsonObject = dict[str, Any]

_ERROR_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


class ApiError(Exception):
    """An error answered as vLLM's JSON error body with this HTTP status."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    def body(self) -> JsonObject:
        return error_body(self.status, self.message, self.param)


_BOOL: TypeAdapter[bool] = TypeAdapter(bool)
_INT: TypeAdapter[int] = TypeAdapter(int)


def field_bool(body: Mapping[str, Any], key: str, default: bool = False) -> bool:
    """A boolean field as vLLM's pydantic request models take it (lax: ``"true"``, ``1``), else 400."""
    value = body.get(key)
    if value is None:
        return default
    try:
        return _BOOL.validate_python(value)
    except ValidationError:
        raise ApiError(400, f"'{key}' must be a boolean", key) from None


def field_int(body: Mapping[str, Any], key: str, message: str | None = None) -> int | None:
    """A positive integer field as vLLM takes it (lax: ``"16"``, ``16.0``); None when absent, else 400."""
    value = body.get(key)
    if value is None:
        return None
    try:
        number = value if type(value) is int else _INT.validate_python(value)
    except ValidationError:
        number = 0
    if number < 1:
        raise ApiError(400, message or f"'{key}' must be an integer >= 1", key)
    return number


def error_body(status: int, message: str, param: str | None = None) -> JsonObject:
    return {
        "error": {
            "message": message,
            "type": _ERROR_TYPES.get(status, "InternalServerError"),
            "param": param,
            "code": status,
        }
    }
