"""The KV-event runtime's metrics (``KvEventsCollector``): what the pools' indexes could not take."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from kvgate.gateway.picker.kv_events.runtime import KvEventsCollector, KvEventsRuntime
from kvgate.policies.engine_blocks import EngineBlockIndex

TOKENS = list(range(32))


def test_blocks_not_indexed_are_counted_per_pool_and_reason() -> None:
    runtime = KvEventsRuntime()
    index = runtime.indexes["llama"] = EngineBlockIndex()  # the pool's index, as its subscribers fill it
    index.stored("10.0.0.1:8000", [3], 2, TOKENS[:16], 16)  # its parent never seen
    index.stored("10.0.0.1:8000", [1, 2], None, TOKENS, 16, group=0, kind="full_attention")
    index.stored("10.0.0.1:8000", [1, 2], None, TOKENS, 16, group=1, kind="sliding_window")
    registry = CollectorRegistry()
    registry.register(KvEventsCollector(runtime))
    sample = registry.get_sample_value
    name = "kvgate_kv_events_unindexed_blocks_total"
    assert sample(name, {"pool": "llama", "reason": "missed_parent"}) == 1.0
    assert sample(name, {"pool": "llama", "reason": "other_group"}) == 2.0
