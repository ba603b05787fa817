"""An immutable, versioned set of xDS resources, keyed by type URL then resource name.

Build one from Envoy JSON-style dicts (:meth:`Snapshot.from_dicts`) or from typed messages
(:meth:`Snapshot.from_messages`). Each type has a content-hash version, and the snapshot a version
over all of them, so equal content gives equal versions and an unchanged type is never re-pushed.
Resources are packed into ``Any`` once, at build time. A snapshot is never mutated after it is built;
the protobuf messages it hands out must be treated as read-only.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from google.protobuf import any_pb2, json_format
from google.protobuf.message import Message

from kvgate.gateway.controlplane.xds.resource_types import (
    CLUSTER,
    DEFAULT_KINDS,
    ENDPOINT,
    LISTENER,
    ROUTE,
    TYPE_URL_PREFIX,
    ResourceKind,
)
from kvgate.policies.errors import ConfigError

JsonResource = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class TypedResources:
    """All resources of one type: typed messages, their packed ``Any`` form and their content hashes,
    each by name, and the version of the whole set."""

    kind: ResourceKind
    messages: Mapping[str, Message]
    packed: Mapping[str, any_pb2.Any]
    hashes: Mapping[str, str]
    version: str

    def version_for(self, names: Iterable[str] | None) -> str:
        """The version of the whole set, or of the subset named by ``names`` (those that exist)."""
        if names is None:
            return self.version
        return _set_version(self.hashes, set(names) & self.hashes.keys())


def _digest(parts: Iterable[bytes]) -> str:
    hasher = hashlib.blake2b(digest_size=8)
    for part in parts:
        hasher.update(len(part).to_bytes(8, "big"))
        hasher.update(part)
    return hasher.hexdigest()


def _typed_resources(kind: ResourceKind, messages: Iterable[Message]) -> TypedResources:
    by_name: dict[str, Message] = {}
    for message in messages:
        if not isinstance(message, kind.message_type):
            raise ConfigError(
                f"{kind.short_name} resources must be {kind.message_type.__name__}, "
                f"got {type(message).__name__}"
            )
        name = kind.name_of(message)
        if not name:
            raise ConfigError(f"a {kind.short_name} resource has no name")
        if name in by_name:
            raise ConfigError(f"duplicate {kind.short_name} resource {name!r}")
        by_name[name] = message
    packed: dict[str, any_pb2.Any] = {}
    hashes: dict[str, str] = {}
    for name, message in by_name.items():
        wrapped = any_pb2.Any()
        wrapped.Pack(message, type_url_prefix=TYPE_URL_PREFIX)
        packed[name] = wrapped
        hashes[name] = _digest([message.SerializeToString(deterministic=True)])
    return TypedResources(
        kind,
        MappingProxyType(by_name),
        MappingProxyType(packed),
        MappingProxyType(hashes),
        _set_version(hashes, hashes.keys()),
    )


def _set_version(hashes: Mapping[str, str], names: Iterable[str]) -> str:
    return _digest(part for name in sorted(names) for part in (name.encode(), hashes[name].encode()))


def parse_resource(kind: ResourceKind, resource: JsonResource) -> Message:
    """Parse one Envoy JSON-style dict (proto3 JSON, ``@type`` in every ``Any``) into ``kind``'s message.

    Raises :class:`ConfigError` naming the resource when the dict does not fit the proto.
    """
    message = kind.message_type()
    try:
        json_format.ParseDict(dict(resource), message)
    except (json_format.ParseError, TypeError, ValueError) as exc:
        name = resource.get("name") or resource.get("cluster_name") or "?"
        raise ConfigError(f"invalid {kind.short_name} {name!r}: {exc}") from exc
    return message


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A versioned set of resources for every type in ``kinds`` (a type with no resources is present and
    empty: for wildcard types such as LDS and CDS, an empty set is meaningful, it removes everything)."""

    types: Mapping[str, TypedResources]
    version: str

    @classmethod
    def from_messages(
        cls,
        *,
        clusters: Iterable[Message] = (),
        endpoints: Iterable[Message] = (),
        listeners: Iterable[Message] = (),
        routes: Iterable[Message] = (),
        others: Mapping[str, Iterable[Message]] | None = None,
        kinds: Iterable[ResourceKind] = DEFAULT_KINDS,
    ) -> Snapshot:
        """A snapshot of typed messages. ``others`` holds resources of extra kinds by type URL."""
        by_type: dict[str, Iterable[Message]] = {
            CLUSTER: clusters,
            ENDPOINT: endpoints,
            LISTENER: listeners,
            ROUTE: routes,
        }
        by_type.update(others or {})
        kinds_by_url = {kind.type_url: kind for kind in kinds}
        unknown = sorted(url for url, items in by_type.items() if url not in kinds_by_url and list(items))
        if unknown:
            raise ConfigError(f"resources of unknown xDS types: {', '.join(unknown)}")
        types = {
            url: _typed_resources(kind, by_type.get(url, ())) for url, kind in kinds_by_url.items()
        }
        version = _digest(f"{url}={types[url].version}".encode() for url in sorted(types))
        return cls(MappingProxyType(types), version)

    @classmethod
    def from_dicts(
        cls,
        *,
        clusters: Iterable[JsonResource] = (),
        endpoints: Iterable[JsonResource] = (),
        listeners: Iterable[JsonResource] = (),
        routes: Iterable[JsonResource] = (),
        others: Mapping[str, Iterable[JsonResource]] | None = None,
        kinds: Iterable[ResourceKind] = DEFAULT_KINDS,
    ) -> Snapshot:
        """A snapshot of Envoy JSON-style dicts, each parsed with ``json_format.ParseDict``."""
        kinds = tuple(kinds)
        kinds_by_url = {kind.type_url: kind for kind in kinds}
        by_type: dict[str, Iterable[JsonResource]] = {
            CLUSTER: clusters,
            ENDPOINT: endpoints,
            LISTENER: listeners,
            ROUTE: routes,
        }
        by_type.update(others or {})
        parsed: dict[str, list[Message]] = {}
        for url, items in by_type.items():
            kind = kinds_by_url.get(url)
            resources = list(items)
            if kind is None:
                if resources:
                    raise ConfigError(f"resources of unknown xDS type {url}")
                continue
            parsed[url] = [parse_resource(kind, resource) for resource in resources]
        return cls.from_messages(
            clusters=parsed.pop(CLUSTER, ()),
            endpoints=parsed.pop(ENDPOINT, ()),
            listeners=parsed.pop(LISTENER, ()),
            routes=parsed.pop(ROUTE, ()),
            others=parsed,
            kinds=kinds,
        )

    def version_of(self, type_url: str, names: Iterable[str] | None = None) -> str | None:
        """The content version of one type (of its resources in ``names`` when given), or ``None`` when
        this snapshot does not serve that type."""
        typed = self.types.get(type_url)
        return None if typed is None else typed.version_for(names)

    def messages(self, type_url: str) -> Mapping[str, Message]:
        """The typed resources of one type by name (empty for a type this snapshot does not serve)."""
        typed = self.types.get(type_url)
        return MappingProxyType({}) if typed is None else typed.messages

    def packed(self, type_url: str, names: Iterable[str] | None = None) -> list[any_pb2.Any]:
        """Packed resources of one type in name order; only ``names`` (those that exist) when given."""
        typed = self.types.get(type_url)
        if typed is None:
            return []
        wanted = sorted(typed.packed) if names is None else sorted(set(names) & typed.packed.keys())
        return [typed.packed[name] for name in wanted]
