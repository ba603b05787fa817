"""``policies.epp_config``: the Inference Extension's / llm-d's EndpointPickerConfig (the picker's
``--config-file``) as a kvgate profile, built by kvgate's registry; what cannot be translated says why."""

from __future__ import annotations

import pytest

from kvgate.policies.epp_config import is_reference_default, translate_epp_config
from kvgate.policies.profile import build_profile, load_profile

CHART_DEFAULT = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: metrics-data-source
  parameters: {scheme: "http", path: "/metrics", insecureSkipVerify: true}
- type: core-metrics-extractor
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: prefix-cache-scorer
    weight: 3
"""
"""The chart's default-plugins.yaml (llm-d's config/charts/epplib), which kvgate's gie-default mirrors."""

LLM_D_SAMPLE = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: approx-prefix-cache-producer
  parameters: {blockSizeTokens: 16, maxPrefixTokensToMatch: 4096, lruCapacityPerServer: 50000}
- type: prefix-cache-scorer
- type: decode-filter
- name: pick
  type: random-picker
- type: single-profile-handler
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: decode-filter
  - pluginRef: pick
  - pluginRef: prefix-cache-scorer
    weight: 2
"""


def test_the_charts_default_becomes_the_gie_default_profile() -> None:
    translation = translate_epp_config(CHART_DEFAULT)
    assert translation.profile is not None
    built = build_profile(translation.profile)
    reference = load_profile("gie-default")
    weights = [(s.plugin_type, s.weight) for s in built.scorers]
    assert weights == [(s.plugin_type, s.weight) for s in reference.scorers]
    assert built.picker.plugin_type == reference.picker.plugin_type == "max-score-picker"
    assert [f.plugin_type for f in built.filters] == ["stored-response-filter", "healthy-filter"]
    assert built.prefix == reference.prefix
    assert "prefix-index-recorder" in [f.plugin_type for f in built.feedback]
    assert any("metrics-data-source" in note for note in translation.notes)
    assert is_reference_default(translation.profile)
    custom = translate_epp_config(CHART_DEFAULT.replace("weight: 3", "weight: 5"))
    assert custom.profile is not None
    assert not is_reference_default(custom.profile)


def test_an_llm_d_sample_with_a_prefix_producer_and_a_picker() -> None:
    translation = translate_epp_config(LLM_D_SAMPLE)
    assert translation.profile is not None
    built = build_profile(translation.profile)
    assert [(s.plugin_type, s.weight) for s in built.scorers] == [("prefix-cache-scorer", 2.0)]
    assert (built.picker.plugin_type, built.picker.name) == ("random-picker", "pick")
    assert (built.prefix.block_chars, built.prefix.max_blocks, built.prefix.default_capacity_blocks) == (
        64, 256, 50000)
    assert any(note.startswith("decode-filter") for note in translation.notes)
    assert not is_reference_default(translation.profile)


@pytest.mark.parametrize(("text", "why"), [
    ("kind: Deployment", "not an EndpointPickerConfig"),
    ("kind: EndpointPickerConfig\nplugins: [{type: queue-scorer}]\n"
     "schedulingProfiles: [{name: a}, {name: b}]", "2 scheduling profiles"),
    ("kind: EndpointPickerConfig\nplugins: [{type: queue-scorer}, {type: latency-slo-admitter}]\n"
     "schedulingProfiles: [{name: a, plugins: [{pluginRef: queue-scorer}]}]", "'latency-slo-admitter'"),
    ("kind: EndpointPickerConfig\nplugins: [{type: latency-scorer}]\n"
     "schedulingProfiles: [{name: a, plugins: [{pluginRef: latency-scorer}]}]", "'latency-scorer'"),
    ("kind: EndpointPickerConfig\nplugins: []\nschedulingProfiles: [{name: a, plugins: [{pluginRef: x}]}]",
     "names no plugin"),
    ("kind: EndpointPickerConfig\nplugins: [{type: max-score-picker}]\n"
     "schedulingProfiles: [{name: a, plugins: [{pluginRef: max-score-picker}]}]", "no scorer"),
    ("{not yaml", "not valid YAML"),
])
def test_what_is_not_translated_says_why(text: str, why: str) -> None:
    translation = translate_epp_config(text)
    assert translation.profile is None
    assert why in translation.notes[0]
