"""Typed plugin parameters: each plugin declares a pydantic model; unknown keys are errors."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from kvgate.policies.errors import ConfigError
from kvgate.policies.validation import describe


class Params(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


P = TypeVar("P", bound=Params)


def parse_params(model: type[P], parameters: Mapping[str, Any] | None, plugin_type: str) -> P:
    try:
        return model.model_validate(dict(parameters or {}))
    except ValidationError as exc:
        raise ConfigError(f"invalid parameters for plugin {plugin_type!r}: {describe(exc)}") from exc
