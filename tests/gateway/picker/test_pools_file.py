from __future__ import annotations

from pathlib import Path

import pytest

from kvgate.gateway.picker.pools_file import load_pools, parse_pools
from kvgate.policies.errors import ConfigError
from kvgate.policies.types import FailureMode

GOOD = """
pools:
  - name: llama
    models: [meta-llama/Llama-3.1-8B-Instruct, sql-lora]
    endpoints: ["127.0.0.1:8001", "127.0.0.1:8002"]
    failureMode: FailOpen
    profile: gie-default
  - name: qwen
    endpoints: ["127.0.1.1:8000"]
defaultPool: qwen
"""


def test_parses_pools_with_defaults() -> None:
    pools = parse_pools(GOOD)
    llama, qwen = pools.pools
    assert llama.failure_mode is FailureMode.FAIL_OPEN
    assert llama.models == ("meta-llama/Llama-3.1-8B-Instruct", "sql-lora")
    assert qwen.failure_mode is FailureMode.FAIL_CLOSE
    assert qwen.profile == "default"
    assert qwen.engine == "vllm"
    assert pools.effective_default == "qwen"


def test_single_pool_is_the_default() -> None:
    pools = parse_pools("pools: [{name: a, endpoints: ['127.0.0.1:1']}]")
    assert pools.effective_default == "a"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("pools: [{name: a, endpoints: ['localhost:80']}]", "not an IP address"),
        ("pools: [{name: a, endpoints: ['127.0.0.1']}]", "not ip:port"),
        ("pools: [{name: a, endpoints: ['127.0.0.1:0']}]", "port must be"),
        ("pools: [{name: a}, {name: a}]", "unique"),
        ("pools: [{name: a}]\ndefaultPool: b", "names no pool"),
        ("pools: [{name: a, failureMode: Maybe}]", "failureMode"),
        ("pools: [{name: a, colour: red}]", "colour"),
        ("pools: []", "pools"),
        ("pools: [", "not valid YAML"),
    ],
)
def test_rejects_bad_files_with_a_clear_reason(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        parse_pools(text)


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_pools(tmp_path / "absent.yaml")


def test_objectives_rate_limits_and_redis() -> None:
    pools = parse_pools(
        """
pools:
  - name: llama
    objectives: [{name: batch, priority: -1}, {name: chat, priority: 10}, {name: plain}]
    rateLimits: {requestsPerMinute: 60, tokensPerMinute: 1000}
  - name: qwen
redis: redis://127.0.0.1:6379/0
"""
    )
    llama, qwen = pools.pools
    assert llama.objective_priority("batch") == -1
    assert llama.objective_priority("chat") == 10
    assert llama.objective_priority("plain") == 0
    assert llama.objective_priority("unknown") is None
    assert llama.rate_limits is not None
    assert llama.rate_limits.requests_per_minute == 60
    assert llama.rate_limits.tokens_per_minute == 1000
    assert llama.rate_limits.header == "x-gateway-inference-fairness-id"
    assert qwen.rate_limits is None
    assert pools.redis == "redis://127.0.0.1:6379/0"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("pools: [{name: a, objectives: [{name: x}, {name: x}]}]", "objective names"),
        ("pools: [{name: a, rateLimits: {requestsPerMinute: 0}}]", "requestsPerMinute"),
        ("pools: [{name: a}]\nredis: http://x", "redis"),
    ],
)
def test_rejects_bad_admission_config(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        parse_pools(text)


def test_flow_control_is_off_unless_named_and_checked_when_it_is() -> None:
    [plain] = parse_pools("pools: [{name: a}]").pools
    assert plain.flow_control is None
    [pool] = parse_pools("""
pools:
  - name: a
    flowControl:
      {queueTimeoutSeconds: 5, maxQueueLength: 10, maxInflightPerEndpoint: 4, kvCacheThreshold: 0.9}
""").pools
    assert pool.flow_control is not None
    settings = pool.flow_control.settings()
    bounds = (settings.queue_timeout_s, settings.max_queue_length, settings.max_inflight_per_endpoint)
    assert bounds == (5, 10, 4)
    assert (settings.thresholds.kv_threshold, settings.thresholds.queue_threshold) == (0.9, 32)
    [defaults] = parse_pools("pools: [{name: a, flowControl: {}}]").pools
    assert defaults.flow_control is not None
    assert defaults.flow_control.settings().queue_timeout_s == 30
    assert defaults.flow_control.settings().order == "fcfs"
    [ordered] = parse_pools("pools: [{name: a, flowControl: {order: slo-deadline}}]").pools
    assert ordered.flow_control is not None
    assert ordered.flow_control.settings().order == "slo-deadline"
    for bad in ("{queueTimeoutSeconds: 0}", "{maxQueueLength: 0}", "{queueTimeout: 5}", "{order: lifo}"):
        with pytest.raises(ConfigError, match="flowControl"):
            parse_pools(f"pools: [{{name: a, flowControl: {bad}}}]")


def test_spill_to_names_another_pool() -> None:
    a, _ = parse_pools("pools: [{name: a, spillTo: b}, {name: b}]").pools
    assert a.spill_to == "b"
    for bad in ("[{name: a, spillTo: c}, {name: b}]", "[{name: a, spillTo: a}]"):
        with pytest.raises(ConfigError, match="spillTo"):
            parse_pools(f"pools: {bad}")


@pytest.mark.parametrize(("key", "field"), [("mediaUuids", "media_uuids"),
                                            ("modelRewriteHeader", "model_rewrite_header")])
def test_switches_off_by_default(key: str, field: str) -> None:
    on, off = parse_pools(f"pools: [{{name: a, {key}: true}}, {{name: b}}]").pools
    assert getattr(on, field) is True
    assert getattr(off, field) is False
    with pytest.raises(ConfigError, match=key):
        parse_pools(f"pools: [{{name: a, {key}: sometimes}}]")
