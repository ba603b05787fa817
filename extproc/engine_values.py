"""Request fields read as the engines read them: vLLM's and SGLang's request models are pydantic
models in lax mode, so ``"stream": "true"``, ``"stream": 1`` and ``"max_tokens": "16"`` are a
stream and 16 tokens to the engine. The picker must see the same request (a stream it took for a
whole response gets no usage injected and its first token is misread), so it reads those fields
with pydantic's own coercions rather than by Python type. The common case (a JSON ``true`` or an
integer) costs a type check; only other values reach pydantic.
"""

from __future__ import annotations

from pydantic import TypeAdapter, ValidationError

_BOOL: TypeAdapter[bool] = TypeAdapter(bool)
_INT: TypeAdapter[int] = TypeAdapter(int)


def engine_bool(value: object) -> bool:
    """``value`` as an engine's ``bool`` field takes it; a value it would refuse (its 400) as false."""
    if value is True or value is False or value is None:
        return value is True
    try:
        return _BOOL.validate_python(value)
    except ValidationError:
        return False


def engine_int(value: object) -> int | None:
    """``value`` as an engine's ``int`` field takes it (``"16"``, ``16.0``); None where it would refuse it."""
    if type(value) is int:
        return value
    if value is None or isinstance(value, dict | list):
        return None
    try:
        return _INT.validate_python(value)
    except ValidationError:
        return None
