"""``gateway.picker.epp_kv_events``: an EndpointPickerConfig's precise prefix plugin as the pools'
default KV events, its tokenizer found on disk where llm-d's ``tokenizersPoolConfig`` says; and its
flow control as theirs (``epp_flags.EppDefaults``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kvgate.gateway.picker.cli import build_parser
from kvgate.gateway.picker.epp_flags import epp_defaults, with_pool_defaults
from kvgate.gateway.picker.epp_kv_events import find_tokenizer, kv_events_default, with_kv_events_default
from kvgate.gateway.picker.pools_file import KvEventsSpec, parse_pools
from kvgate.policies.epp_config import TokenizerHint, translate_epp_config
from tests.policies.test_epp_config import LLM_D_FLOW_CONTROL, LLM_D_PRECISE

TOKENIZER = Path(__file__).resolve().parents[3] / "simulator" / "data" / "tokenizer.json"


def _file(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{}")
    return path


def test_the_tokenizer_is_found_where_llm_d_looks(tmp_path: Path) -> None:
    model = "Qwen/Qwen3-32B"
    assert find_tokenizer(TokenizerHint(model=model, directory=str(tmp_path))) is None
    hf_cache = _file(tmp_path / "models--Qwen--Qwen3-32B" / "snapshots" / "abc123" / "tokenizer.json")
    assert find_tokenizer(TokenizerHint(model=model, directory=str(tmp_path))) == str(hf_cache)
    by_name = _file(tmp_path / "Qwen" / "Qwen3-32B" / "tokenizer.json")
    assert find_tokenizer(TokenizerHint(model=model, directory=str(tmp_path))) == str(by_name)
    mapped = _file(tmp_path / "elsewhere" / "tok.json")
    hint = TokenizerHint(model=model, files={model: str(mapped)}, directory=str(tmp_path))
    assert find_tokenizer(hint) == str(mapped)
    assert find_tokenizer(TokenizerHint(model=model, files={model: str(tmp_path / "gone.json")})) is None
    one_model = _file(tmp_path / "single" / "tokenizer.json")
    assert find_tokenizer(TokenizerHint(directory=str(tmp_path / "single"))) == str(one_model)


def test_the_precise_config_gives_the_pools_their_kv_events(tmp_path: Path,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    config = LLM_D_PRECISE.replace("autoDiscoveryDir: /models", f"autoDiscoveryDir: {tmp_path}")
    default = kv_events_default(translate_epp_config(config))
    assert default == KvEventsSpec(bind="tcp://*:5557")  # no tokenizer there yet: said
    assert "kvgate.io/tokenizer" in caplog.text
    tokenizer = tmp_path / "Qwen" / "Qwen3-32B" / "tokenizer.json"
    tokenizer.parent.mkdir(parents=True)
    tokenizer.write_bytes(TOKENIZER.read_bytes())
    args = build_parser().parse_args(["--pools", "p.yaml", "--config-text", config])
    defaults = epp_defaults(args)
    assert defaults.profile is None  # the Inference Extension's weights: kvgate's default profile
    assert defaults.kv_events == KvEventsSpec(bind="tcp://*:5557", tokenizer=str(tokenizer))
    pools = parse_pools(
        "pools:\n"
        "- {name: a}\n"
        "- {name: b, kvEvents: {port: 6000}}\n"
        "- {name: c, kvEvents: {port: 6000, tokenizer: /own/tokenizer.json}}\n"
    ).pools
    a, b, c = with_pool_defaults(pools, defaults.profile, kv_events=defaults.kv_events)
    assert a.kv_events == defaults.kv_events
    assert b.kv_events == KvEventsSpec(port=6000, tokenizer=str(tokenizer))  # its own source, the tokenizer
    assert c.kv_events == pools[2].kv_events
    assert with_kv_events_default(pools[0], None) is pools[0]
    assert kv_events_default(None) is None


def test_llm_ds_flow_control_holds_the_pools_naming_none() -> None:
    args = build_parser().parse_args(["--pools", "p.yaml", "--config-text", LLM_D_FLOW_CONTROL])
    defaults = epp_defaults(args)
    assert defaults.flow_control is not None
    assert (defaults.flow_control.queue_timeout_s, defaults.flow_control.max_queue_length) == (45.0, 2000)
    assert defaults.flow_control.order == "slo-deadline"
    own = {"queueTimeoutSeconds": 5}
    pools = parse_pools(yaml.safe_dump({"pools": [{"name": "a"}, {"name": "b", "flowControl": own}]})).pools
    a, b = with_pool_defaults(pools, defaults.profile, kv_events=defaults.kv_events,
                              flow_control=defaults.flow_control)
    assert a.flow_control == defaults.flow_control
    assert b.flow_control is not None
    assert b.flow_control.queue_timeout_s == 5  # the pool's own
