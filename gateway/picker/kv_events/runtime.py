"""The picker's KV-event subscriptions: an index per pool (``policies.engine_blocks``), the
subscribers that keep it (``kv_events.subscriber``), what ``/debug/pools`` shows of them and the
``kvgate_kv_events_*`` metrics."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kvgate.gateway.picker.kv_events.subscriber import EndpointSubscription, KvEventSubscribers
from kvgate.gateway.picker.pools_file import PoolSpec
from kvgate.policies.engine_blocks import EngineBlockIndex
from kvgate.policies.errors import ConfigError
from kvgate.policies.model_tokenizer import ModelTokenizer

log = logging.getLogger(__name__)

_COUNTERS = (
    ("batches", "KV-event batches applied (replayed ones included)"),
    ("gaps", "gaps in a publisher's sequence"),
    ("replayed", "batches recovered from a publisher's replay socket"),
    ("unrecoverable", "gaps that could not be filled (the endpoint's entries dropped)"),
    ("malformed", "messages that were not KV-event batches (dropped)"),
    ("skipped", "events of types kvgate does not know (skipped)"),
)


@dataclass(slots=True)
class KeyCheckCounts:
    """A pool's checks of kvgate's keys against its engines' reports (``policies.key_checks``)."""

    held: int = 0
    missing: int = 0
    trusted: bool = True


class PoolEngineCache:
    """One pool's ``EngineCacheView`` for its scheduler: its index as the subscribers keep it (looked
    up per call: stable across configuration changes, empty while the pool has no KV events)."""

    def __init__(self, runtime: KvEventsRuntime, pool: str) -> None:
        self._runtime = runtime
        self._pool = pool

    def matches(self, keys: Sequence[int]) -> Mapping[str, int]:
        index = self._runtime.indexes.get(self._pool)
        return index.matches(keys) if index is not None else {}

    def in_step(self, endpoint: str) -> bool:
        return self._runtime.in_step(self._pool, endpoint)

    def knows_adapter(self, name: str) -> bool:
        index = self._runtime.indexes.get(self._pool)
        return index is not None and index.knows_adapter(name)

    def held(self, key: int) -> bool:
        index = self._runtime.indexes.get(self._pool)
        return index is not None and index.held(key)

    def tokenizer(self) -> ModelTokenizer | None:
        return self._runtime.tokenizers.get(self._pool)

    def block_size(self) -> int | None:
        index = self._runtime.indexes.get(self._pool)
        return index.block_size if index is not None else None

    def key_checked(self, endpoint: str, *, held: bool, trusted: bool) -> None:
        self._runtime.key_checked(self._pool, endpoint, held=held, trusted=trusted)


class KvEventsRuntime:
    def __init__(self) -> None:
        self.indexes: dict[str, EngineBlockIndex] = {}
        self.tokenizers: dict[str, ModelTokenizer] = {}
        """Pool → its model's tokenizer (``KvEventsSpec.tokenizer``)."""
        self._loaded: dict[str, tuple[float, ModelTokenizer]] = {}
        """Path → (its modification time, the tokenizer loaded from it)."""
        self._subscribers: KvEventSubscribers | None = None
        self._relay: Callable[[str, list[bytes]], None] | None = None
        self.key_checks: dict[str, KeyCheckCounts] = {}
        """Pool → its schedulers' checks of kvgate's keys against the engines' reports."""

    def key_checked(self, pool: str, endpoint: str, *, held: bool, trusted: bool) -> None:
        """Counted for the metrics and ``/debug/pools``; a change of trust is logged (the operator's
        cue: the pool's tokenizer or chat template is not the engines')."""
        counts = self.key_checks.get(pool)
        if counts is None:
            counts = self.key_checks[pool] = KeyCheckCounts()
        if held:
            counts.held += 1
        else:
            counts.missing += 1
        if trusted != counts.trusted:
            counts.trusted = trusted
            if trusted:
                log.info("pool %s: the engines hold the blocks kvgate keys again; routing on their "
                         "KV events", pool)
            else:
                log.warning(
                    "pool %s: the engines' KV events do not hold the blocks kvgate keyed for the "
                    "requests they served (last: %s): the pool's tokenizer or chat template "
                    "(kvgate.io/tokenizer, or the profile's) is not the one the model servers use; "
                    "routing on the approximate prefix index until they match", pool, endpoint)

    def relay_to(self, relay: Callable[[str, list[bytes]], None] | None) -> None:
        """Share each message a bound socket receives with the pool's other pickers (``relay(pool,
        frames)``; call before :meth:`apply`); their messages come back through :meth:`deliver`."""
        self._relay = relay

    def deliver(self, pool: str, frames: list[bytes]) -> None:
        """A message another picker's bound socket received for ``pool``."""
        if self._subscribers is not None:
            self._subscribers.deliver(pool, frames)

    def load_tokenizers(self, specs: Sequence[PoolSpec]) -> dict[str, ModelTokenizer]:
        """Each pool's tokenizer, loaded from disk unless unchanged since the last load; ConfigError
        (naming the pool) for one that cannot load: call before changing anything."""
        out: dict[str, ModelTokenizer] = {}
        loaded: dict[str, tuple[float, ModelTokenizer]] = {}
        for spec in specs:
            path = spec.kv_events.tokenizer if spec.kv_events is not None else None
            if path is None:
                continue
            try:
                mtime = Path(path).expanduser().stat().st_mtime
            except OSError as exc:
                raise ConfigError(f"pool {spec.name!r}: tokenizer {path!r}: {exc.strerror or exc}") from exc
            entry = loaded.get(path) or self._loaded.get(path)
            if entry is None or entry[0] != mtime:
                try:
                    entry = (mtime, ModelTokenizer.load(path))
                except ConfigError as exc:
                    raise ConfigError(f"pool {spec.name!r}: {exc}") from exc
            loaded[path] = entry
            out[spec.name] = entry[1]
        self._loaded = loaded
        return out

    def view(self, pool: str) -> PoolEngineCache:
        return PoolEngineCache(self, pool)

    def _index(self, pool: str) -> EngineBlockIndex:
        index = self.indexes.get(pool)
        if index is None:
            index = self.indexes[pool] = EngineBlockIndex()
        return index

    def apply(self, specs: Sequence[PoolSpec], tokenizers: Mapping[str, ModelTokenizer]) -> None:
        """Subscribe to the publishers of every pool that has KV events (call in the event loop);
        ``tokenizers``: ``load_tokenizers(specs)``."""
        self.tokenizers = dict(tokenizers)
        wanted = {spec.name: spec for spec in specs if spec.kv_events is not None}
        if not wanted and self._subscribers is None:
            return
        if self._subscribers is None:
            self._subscribers = KvEventSubscribers(self._index, self._relay)
        for spec in specs:
            events = spec.kv_events
            publishers = {a: events.addresses(a) for a in spec.endpoints} if events is not None else {}
            bind = events.bind if events is not None else None
            self._subscribers.set_endpoints(spec.name, publishers, bind)
        for pool in [p for p in self.indexes if p not in wanted]:
            del self.indexes[pool]
        for pool in [p for p in self.key_checks if p not in wanted]:
            del self.key_checks[pool]

    def endpoint_report(self, pool: str, address: str) -> dict[str, Any] | None:
        """What ``/debug/pools`` shows of one endpoint's events (None: the pool has none)."""
        if self._subscribers is None:
            return None
        sub = self._subscribers.subscriptions().get((pool, address))
        if sub is None:
            return None
        c = sub.counts
        return {"in_step": sub.in_step, "blocks": sub.index.blocks(address), "batches": c.batches,
                "gaps": c.gaps, "unrecoverable": c.unrecoverable, "malformed": c.malformed}

    def pool_report(self, pool: str) -> dict[str, Any] | None:
        """What ``/debug/pools`` shows of a pool's key checks (None: none made yet)."""
        counts = self.key_checks.get(pool)
        if counts is None:
            return None
        return {"trusted": counts.trusted, "held": counts.held, "missing": counts.missing}

    def subscriptions(self) -> Mapping[tuple[str, str], EndpointSubscription]:
        return self._subscribers.subscriptions() if self._subscribers is not None else {}

    def in_step(self, pool: str, address: str) -> bool:
        return self._subscribers is not None and self._subscribers.in_step(pool, address)

    def unrouted(self) -> int:
        return self._subscribers.unrouted() if self._subscribers is not None else 0

    async def stop(self) -> None:
        if self._subscribers is not None:
            await self._subscribers.stop()
            self._subscribers = None


class KvEventsCollector(Collector):
    """``kvgate_kv_events_<counter>_total{pool,endpoint}``, ``kvgate_kv_events_in_step``,
    ``kvgate_kv_events_blocks`` (GPU blocks the index holds for the endpoint),
    ``kvgate_kv_events_key_checks_total{pool,outcome}`` and ``kvgate_kv_events_keys_trusted{pool}``
    (``policies.key_checks``),
    ``kvgate_kv_events_unindexed_blocks_total{pool,reason}`` (stored blocks not indexed) and
    ``kvgate_kv_events_unrouted_total`` (bound sockets' messages for no known endpoint)."""

    def __init__(self, runtime: KvEventsRuntime) -> None:
        self._runtime = runtime

    def collect(self) -> Iterable[Metric]:
        subs = self._runtime.subscriptions()
        labels = ["pool", "endpoint"]
        for name, text in _COUNTERS:
            family = CounterMetricFamily(f"kvgate_kv_events_{name}", f"kvgate KV events: {text}",
                                         labels=labels)
            for (pool, endpoint), sub in subs.items():
                family.add_metric([pool, endpoint], getattr(sub.counts, name))
            yield family
        in_step = GaugeMetricFamily("kvgate_kv_events_in_step",
                                    "1 while the endpoint's KV events are followed without loss",
                                    labels=labels)
        blocks = GaugeMetricFamily("kvgate_kv_events_blocks",
                                   "GPU blocks the index holds for the endpoint (from its events)",
                                   labels=labels)
        for (pool, endpoint), sub in subs.items():
            in_step.add_metric([pool, endpoint], 1.0 if sub.in_step else 0.0)
            blocks.add_metric([pool, endpoint], sub.index.blocks(endpoint))
        yield in_step
        yield blocks
        unindexed = CounterMetricFamily(
            "kvgate_kv_events_unindexed_blocks",
            "Stored blocks the pool's index could not take: their parent was never seen (a missed "
            "event: reason missed_parent), or another KV-cache group's (a hybrid model's window or "
            "Mamba groups: reason other_group)", labels=["pool", "reason"])
        for pool, index in self._runtime.indexes.items():
            unindexed.add_metric([pool, "missed_parent"], index.unresolved)
            unindexed.add_metric([pool, "other_group"], index.other_groups)
        yield unindexed
        checks = CounterMetricFamily(
            "kvgate_kv_events_key_checks",
            "Served requests whose last block as kvgate keyed it was (outcome held) or was not "
            "(missing) in their endpoint's KV events a moment after they ended", labels=["pool", "outcome"])
        trusted = GaugeMetricFamily(
            "kvgate_kv_events_keys_trusted",
            "1 while the pool's engines hold the blocks kvgate keys (0: its tokenizer or chat template "
            "is not the engines'; routing on the approximate prefix index)", labels=["pool"])
        for pool, counts in self._runtime.key_checks.items():
            checks.add_metric([pool, "held"], counts.held)
            checks.add_metric([pool, "missing"], counts.missing)
            trusted.add_metric([pool], 1.0 if counts.trusted else 0.0)
        yield checks
        yield trusted
        yield CounterMetricFamily("kvgate_kv_events_unrouted",
                                  "KV-event messages on the picker's bound sockets whose topic names no "
                                  "endpoint of a pool (dropped)", value=self._runtime.unrouted())
