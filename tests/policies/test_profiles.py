from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from kvgate.policies.disaggregation import load_scheduling
from kvgate.policies.errors import ConfigError
from kvgate.policies.plugins.filters import HealthyFilter
from kvgate.policies.plugins.pickers import MaxScorePicker
from kvgate.policies.profile import available_profiles, build_profile, load_profile
from kvgate.policies.registry import PluginRegistry, builtin_registry


def test_all_shipped_profiles_build() -> None:
    assert set(available_profiles()) >= {"default", "gie-default", "round-robin", "random", "pd"}
    for name in available_profiles():
        assert load_scheduling(name).name == name


def test_gie_default_is_gies_weights() -> None:
    profile = load_profile("gie-default")
    assert [(s.plugin_type, s.weight) for s in profile.scorers] == [
        ("queue-scorer", 2.0),
        ("kv-cache-utilization-scorer", 2.0),
        ("prefix-cache-scorer", 3.0),
    ]
    assert profile.picker.plugin_type == "max-score-picker"
    assert profile.prefix.block_chars == 64
    assert profile.prefix.max_blocks == 256
    assert "prefix-index-recorder" in [f.plugin_type for f in profile.feedback]


def test_round_robin_records_no_prefix_index() -> None:
    assert "prefix-index-recorder" not in [f.plugin_type for f in load_profile("round-robin").feedback]


def test_load_by_path(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text(
        "name: mine\nplugins:\n  - {type: queue-scorer, name: q}\n  - {type: random-picker}\n"
        "profile:\n  scorers: [{plugin: q, weight: 2}]\n  picker: random-picker\nfallbacks: 0\n"
    )
    profile = load_profile(path)
    assert profile.name == "mine"
    assert profile.fallbacks == 0
    assert profile.scorers[0].name == "q"
    assert profile.scorers[0].weight == 2.0
    assert load_profile(str(path)).name == "mine"


BASE: dict[str, Any] = {
    "name": "t",
    "plugins": [{"type": "queue-scorer"}, {"type": "max-score-picker"}],
    "profile": {"scorers": [{"plugin": "queue-scorer"}], "picker": "max-score-picker"},
}


@pytest.mark.parametrize(
    "change",
    [
        {"plugins": [{"type": "nope"}, {"type": "max-score-picker"}]},
        {"profile": {"scorers": [{"plugin": "missing"}], "picker": "max-score-picker"}},
        {"profile": {"scorers": [{"plugin": "max-score-picker"}], "picker": "max-score-picker"}},
        {"profile": {"picker": "queue-scorer"}},
        {"plugins": [{"type": "max-score-picker", "parameters": {"tie_tolerance": -1}}]},
        {"plugins": [{"type": "queue-scorer", "parameters": {"bogus": 1}}, {"type": "max-score-picker"}]},
        {"plugins": [{"type": "queue-scorer"}, {"type": "queue-scorer"}, {"type": "max-score-picker"}]},
        {"unknown_key": 1},
    ],
)
def test_invalid_profiles_raise_config_error(change: Mapping[str, Any]) -> None:
    with pytest.raises(ConfigError):
        build_profile({**BASE, **change})


def test_unknown_profile_name() -> None:
    with pytest.raises(ConfigError):
        load_profile("no-such-profile")


def test_registry_is_an_object_with_custom_plugins() -> None:
    registry = PluginRegistry()
    registry.register("only-healthy", lambda params: HealthyFilter())
    registry.register("picker", lambda params: MaxScorePicker(float(params.get("tol", 0))))
    with pytest.raises(ConfigError):
        registry.register("picker", lambda params: MaxScorePicker())
    profile = build_profile(
        {
            "name": "custom",
            "plugins": [{"type": "only-healthy"}, {"type": "picker", "parameters": {"tol": 0.5}}],
            "profile": {"filters": ["only-healthy"], "picker": "picker"},
        },
        registry,
    )
    assert isinstance(profile.picker.plugin, MaxScorePicker)
    assert profile.picker.plugin.tie_tolerance == 0.5
    assert "queue-scorer" in builtin_registry().types()
    assert "queue-scorer" not in registry.types()
