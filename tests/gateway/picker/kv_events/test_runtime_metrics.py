"""The KV-event runtime's metrics (``KvEventsCollector``): what the pools' indexes could not take."""

from __future__ import annotations

import logging

import pytest
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


def test_key_checks_are_counted_shown_and_a_change_of_trust_logged(caplog: pytest.LogCaptureFixture) -> None:
    runtime = KvEventsRuntime()
    view = runtime.view("llama")  # what the pool's scheduler is given
    registry = CollectorRegistry()
    registry.register(KvEventsCollector(runtime))
    sample = registry.get_sample_value
    assert runtime.pool_report("llama") is None
    assert sample("kvgate_kv_events_keys_trusted", {"pool": "llama"}) is None
    view.key_checked("10.0.0.1:8000", held=True, trusted=True)
    with caplog.at_level(logging.INFO, logger="kvgate.gateway.picker.kv_events.runtime"):
        view.key_checked("10.0.0.2:8000", held=False, trusted=False)
        view.key_checked("10.0.0.2:8000", held=False, trusted=False)
    assert sample("kvgate_kv_events_key_checks_total", {"pool": "llama", "outcome": "held"}) == 1.0
    assert sample("kvgate_kv_events_key_checks_total", {"pool": "llama", "outcome": "missing"}) == 2.0
    assert sample("kvgate_kv_events_keys_trusted", {"pool": "llama"}) == 0.0
    assert runtime.pool_report("llama") == {"trusted": False, "held": 1, "missing": 2}
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "tokenizer or chat template" in warnings[0].getMessage()
    with caplog.at_level(logging.INFO, logger="kvgate.gateway.picker.kv_events.runtime"):
        view.key_checked("10.0.0.2:8000", held=True, trusted=True)
    assert sample("kvgate_kv_events_keys_trusted", {"pool": "llama"}) == 1.0
    assert "again" in caplog.records[-1].getMessage()
