"""What every manifest shares: object metadata, keys, the pydantic base classes and durations.

Field names follow Python; aliases are the Kubernetes camelCase names (``to_camel``), so a model
validates straight from a manifest and dumps back with ``by_alias=True``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

DEFAULT_NAMESPACE = "default"


class SpecModel(BaseModel):
    """A spec fragment: unknown fields are errors (``kubectl apply`` validates strictly)."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        populate_by_name=True,
        alias_generator=to_camel,
        protected_namespaces=(),
    )


class LenientModel(BaseModel):
    """A fragment Kubernetes owns and we only read from (metadata, status, Pod/Service specs)."""

    model_config = ConfigDict(
        frozen=True,
        extra="ignore",
        populate_by_name=True,
        alias_generator=to_camel,
        protected_namespaces=(),
    )


class ObjectMeta(LenientModel):
    name: str = Field(min_length=1, max_length=253)
    namespace: str = Field(default=DEFAULT_NAMESPACE, min_length=1, max_length=63)
    labels: Mapping[str, str] = Field(default_factory=dict)
    annotations: Mapping[str, str] = Field(default_factory=dict)
    generation: int | None = None
    creation_timestamp: str | None = None
    deletion_timestamp: str | None = None


class Resource(LenientModel):
    """A top-level object. ``status`` and other server-set fields are tolerated and ignored."""

    api_version: str
    kind: str
    metadata: ObjectMeta

    @property
    def key(self) -> ObjectKey:
        return ObjectKey(self.metadata.namespace, self.metadata.name)

    @property
    def ref(self) -> ResourceRef:
        return ResourceRef(self.kind, self.metadata.namespace, self.metadata.name)

    @property
    def observed_generation(self) -> int:
        return self.metadata.generation if self.metadata.generation is not None else 1


@dataclass(frozen=True, slots=True, order=True)
class ObjectKey:
    """``namespace/name``: how one object of a known kind is named."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True, order=True)
class ResourceRef:
    """An object of any kind: ``Kind namespace/name``."""

    kind: str
    namespace: str
    name: str

    @property
    def key(self) -> ObjectKey:
        return ObjectKey(self.namespace, self.name)

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"


_DURATION = re.compile(r"^(?:[0-9]{1,5}(?:h|m|s|ms)){1,4}$")
_DURATION_PART = re.compile(r"([0-9]{1,5})(h|ms|m|s)")
_UNIT_SECONDS: Mapping[str, float] = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def parse_duration(text: str) -> float:
    """Seconds in a Gateway API duration (GEP-2257: ``1h``, ``10s``, ``500ms``, ``1m30s``)."""
    if not _DURATION.match(text):
        raise ValueError(f"{text!r} is not a Gateway API duration (e.g. 10s, 500ms, 1m30s)")
    return sum(int(number) * _UNIT_SECONDS[unit] for number, unit in _DURATION_PART.findall(text))


def _check_duration(text: str) -> str:
    parse_duration(text)
    return text


Duration = Annotated[str, AfterValidator(_check_duration)]
PortNumber = Annotated[int, Field(ge=1, le=65535)]
AnyValue = Any
