"""What the ADS server reports, and a status board built from it.

The server calls an injected :class:`XdsObserver` for every push, ACK and NACK; a metrics adapter
(Prometheus counters, say) implements the same three methods. :class:`XdsStatus` is the built-in
observer: counters per type URL plus, per node and type, the last version sent, the last one acknowledged
and the last rejection, in a JSON-ready form for the admin endpoint.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Protocol


class XdsObserver(Protocol):
    def on_push(self, node_id: str, type_url: str, version: str, resource_count: int) -> None: ...

    def on_ack(self, node_id: str, type_url: str, version: str) -> None: ...

    def on_nack(self, node_id: str, type_url: str, version: str, message: str) -> None: ...


class NullObserver:
    """Reports nothing."""

    def on_push(self, node_id: str, type_url: str, version: str, resource_count: int) -> None:
        pass

    def on_ack(self, node_id: str, type_url: str, version: str) -> None:
        pass

    def on_nack(self, node_id: str, type_url: str, version: str, message: str) -> None:
        pass


class FanoutObserver:
    """Reports to several observers, in order."""

    def __init__(self, observers: Sequence[XdsObserver]) -> None:
        self._observers = tuple(observers)

    def on_push(self, node_id: str, type_url: str, version: str, resource_count: int) -> None:
        for observer in self._observers:
            observer.on_push(node_id, type_url, version, resource_count)

    def on_ack(self, node_id: str, type_url: str, version: str) -> None:
        for observer in self._observers:
            observer.on_ack(node_id, type_url, version)

    def on_nack(self, node_id: str, type_url: str, version: str, message: str) -> None:
        for observer in self._observers:
            observer.on_nack(node_id, type_url, version, message)


@dataclass(frozen=True, slots=True)
class Rejection:
    """A version Envoy refused, with its reason and when (``time.time()`` seconds)."""

    version: str
    message: str
    at: float


@dataclass(slots=True)
class TypeCounters:
    pushes: int = 0
    acks: int = 0
    nacks: int = 0


@dataclass(slots=True)
class NodeTypeStatus:
    sent_version: str | None = None
    acked_version: str | None = None
    last_rejection: Rejection | None = None


@dataclass(slots=True)
class XdsStatus:
    """Counters per type URL and per-node state, fed by the ADS server as its observer."""

    clock: Callable[[], float] = time.time
    counters: dict[str, TypeCounters] = field(default_factory=dict)
    nodes: dict[str, dict[str, NodeTypeStatus]] = field(default_factory=dict)

    def _node_type(self, node_id: str, type_url: str) -> NodeTypeStatus:
        return self.nodes.setdefault(node_id, {}).setdefault(type_url, NodeTypeStatus())

    def _counters(self, type_url: str) -> TypeCounters:
        return self.counters.setdefault(type_url, TypeCounters())

    def on_push(self, node_id: str, type_url: str, version: str, resource_count: int) -> None:
        self._counters(type_url).pushes += 1
        self._node_type(node_id, type_url).sent_version = version

    def on_ack(self, node_id: str, type_url: str, version: str) -> None:
        self._counters(type_url).acks += 1
        self._node_type(node_id, type_url).acked_version = version

    def on_nack(self, node_id: str, type_url: str, version: str, message: str) -> None:
        self._counters(type_url).nacks += 1
        self._node_type(node_id, type_url).last_rejection = Rejection(version, message, self.clock())

    def last_rejection(self, node_id: str, type_url: str) -> Rejection | None:
        status = self.nodes.get(node_id, {}).get(type_url)
        return None if status is None else status.last_rejection

    def as_dict(self) -> dict[str, object]:
        """``{"counters": {type_url: {pushes, acks, nacks}}, "nodes": {node: {type_url: {...}}}}``."""
        return {
            "counters": {url: asdict(c) for url, c in sorted(self.counters.items())},
            "nodes": {
                node: {url: asdict(s) for url, s in sorted(types.items())}
                for node, types in sorted(self.nodes.items())
            },
        }
