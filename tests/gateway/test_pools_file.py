from __future__ import annotations

from pathlib import Path

import pytest

from gateway.pools_file import load_pools, parse_pools
from policies.errors import ConfigError
from policies.types import FailureMode

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
