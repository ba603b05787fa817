"""``policies.epp_config``: the Inference Extension's / llm-d's EndpointPickerConfig (the picker's
``--config-file``) as a kvgate profile, built by kvgate's registry; what cannot be translated says why."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kvgate.policies.disaggregation import build_disaggregated
from kvgate.policies.epp_config import (
    KvEventsSource,
    TokenizerHint,
    is_reference_default,
    quantity,
    translate_epp_config,
)
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


LLM_D_PD = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefix-cache-scorer
  parameters: {maxPrefixBlocksToMatch: 256, lruCapacityPerServer: 31250}
- type: queue-scorer
- type: prefill-filter
- type: decode-filter
- type: max-score-picker
- type: prefix-based-pd-decider
  parameters: {nonCachedTokens: 16}
- type: disagg-profile-handler
  parameters: {deciders: {prefill: prefix-based-pd-decider}}
schedulingProfiles:
- name: prefill
  plugins:
  - pluginRef: prefill-filter
  - pluginRef: max-score-picker
  - pluginRef: prefix-cache-scorer
    weight: 2
  - pluginRef: queue-scorer
    weight: 1
- name: decode
  plugins:
  - pluginRef: decode-filter
  - pluginRef: max-score-picker
  - pluginRef: prefix-cache-scorer
    weight: 3
  - pluginRef: queue-scorer
    weight: 1
"""
"""llm-d's sample P/D configuration (deploy/config/pd-epp-config.yaml), the decode half's prefix
weight changed to tell the halves apart."""


def test_llm_ds_pd_pair_becomes_a_disaggregated_profile(tmp_path: Path) -> None:
    translation = translate_epp_config(LLM_D_PD)
    assert translation.profile is not None
    assert not is_reference_default(translation.profile)
    assert translation.profile["disaggregation"]["decider"] == {
        "type": "prefix-based-pd-decider", "parameters": {"non_cached_tokens": 16}}
    paths = {}
    for role, half in translation.halves.items():
        paths[role] = tmp_path / f"{role}.yaml"
        paths[role].write_text(yaml.safe_dump(dict(half)))
    document = {**translation.profile, "disaggregation": {
        **translation.profile["disaggregation"], **{role: str(path) for role, path in paths.items()}}}
    built = build_disaggregated(document)
    assert [(s.plugin_type, s.weight) for s in built.decode.scorers] == [("prefix-cache-scorer", 3.0),
                                                                        ("queue-scorer", 1.0)]
    assert [(s.plugin_type, s.weight) for s in built.prefill.scorers] == [("prefix-cache-scorer", 2.0),
                                                                         ("queue-scorer", 1.0)]
    assert "session-recorder" not in [f.plugin_type for f in built.prefill.feedback]
    assert any(note.startswith("prefill-filter") for note in translation.notes)
    decider = "type: prefix-based-pd-decider\n  parameters: {nonCachedTokens: 16}"
    assert decider in LLM_D_PD
    always = translate_epp_config(LLM_D_PD.replace(decider, "type: always-disagg-pd-decider"))
    assert always.profile is not None
    assert always.profile["disaggregation"]["decider"]["parameters"] == {"non_cached_tokens": 0}


LLM_D_PRECISE = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
  - type: single-profile-handler
  - type: precise-prefix-cache-scorer
    parameters:
      tokenProcessorConfig:
        blockSize: 64
        hashSeed: "42"
      indexerConfig:
        tokenizersPoolConfig:
          modelName: Qwen/Qwen3-32B
          local:
            autoDiscoveryDir: /models
        kvBlockIndexConfig:
          enableMetrics: true
      kvEventsConfig:
        topicFilter: "kv@"
        concurrency: 4
        discoverPods: false
        zmqEndpoint: "tcp://*:5557"
  - type: kv-cache-utilization-scorer
  - type: queue-scorer
  - type: max-score-picker
schedulingProfiles:
  - name: default
    plugins:
      - pluginRef: precise-prefix-cache-scorer
        weight: 3.0
      - pluginRef: kv-cache-utilization-scorer
        weight: 2.0
      - pluginRef: queue-scorer
        weight: 2.0
      - pluginRef: max-score-picker
"""
"""llm-d's precise prefix-cache routing guide's config (the picker binds, the engines connect)."""

LLM_D_PRODUCER = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: token-producer
  parameters: {modelName: "Qwen/Qwen3-32B", vllm: {url: "http://localhost:8000"}}
- type: endpoint-notification-source
- type: metrics-data-source
- type: core-metrics-extractor
- type: decode-filter
- type: precise-prefix-cache-producer
  parameters:
    tokenProcessorConfig: {blockSizeTokens: 32}
    kvEventsConfig: {topicFilter: "kv@", discoverPods: true, podDiscoveryConfig: {socketPort: 5600}}
- type: prefix-cache-scorer
  parameters: {prefixMatchInfoProducerName: precise-prefix-cache-producer}
- type: queue-scorer
- type: max-score-picker
dataLayer:
  sources:
  - pluginRef: endpoint-notification-source
    extractors: [{pluginRef: precise-prefix-cache-producer}]
schedulingProfiles:
- name: decode
  plugins:
  - pluginRef: decode-filter
  - pluginRef: prefix-cache-scorer
    weight: 3
  - pluginRef: queue-scorer
    weight: 1
  - pluginRef: max-score-picker
"""
"""llm-d's newer split form: a precise producer feeding the prefix scorer, discovering each Pod's
publisher."""


def test_llm_ds_precise_scorer_routes_on_the_engines_events() -> None:
    translation = translate_epp_config(LLM_D_PRECISE)
    assert translation.profile is not None
    built = build_profile(translation.profile)
    assert [(s.plugin_type, s.weight) for s in built.scorers] == [
        ("prefix-cache-scorer", 3.0), ("kv-cache-utilization-scorer", 2.0), ("queue-scorer", 2.0)]
    feedback = {f.plugin_type: f for f in built.feedback}
    assert "engine-prefix-matches" in feedback
    assert feedback["engine-prefix-matches"].plugin.block_size == 64  # type: ignore[attr-defined]
    assert translation.kv_events == KvEventsSource(bind="tcp://*:5557")
    assert translation.tokenizer == TokenizerHint(model="Qwen/Qwen3-32B", directory="/models")
    assert any("hashSeed" in note for note in translation.notes)
    # the weights are the Inference Extension's default: the picker keeps kvgate's default profile
    # (which has engine-prefix-matches too), the KV events still apply to the pools
    assert is_reference_default(translation.profile)


def test_llm_ds_precise_producer_discovering_pods_subscribes_to_each_endpoint() -> None:
    translation = translate_epp_config(LLM_D_PRODUCER)
    assert translation.profile is not None
    built = build_profile(translation.profile)
    assert [(s.plugin_type, s.weight) for s in built.scorers] == [("prefix-cache-scorer", 3.0),
                                                                ("queue-scorer", 1.0)]
    [engine_prefix] = [f for f in built.feedback if f.plugin_type == "engine-prefix-matches"]
    assert engine_prefix.plugin.block_size == 32  # type: ignore[attr-defined]
    assert translation.kv_events == KvEventsSource(port=5600)
    assert translation.tokenizer == TokenizerHint(model="Qwen/Qwen3-32B")
    noted = " ".join(translation.notes)
    assert "token-producer" in noted
    assert "endpoint-notification-source" in noted


@pytest.mark.parametrize(("events", "source"), [
    ("{}", KvEventsSource(port=5557)),  # discoverPods is llm-d's default
    ("{zmqEndpoint: 'tcp://*:6000'}", KvEventsSource(bind="tcp://*:6000")),  # older releases: bind
    ("{discoverPods: true, zmqEndpoint: 'tcp://*:6000'}", KvEventsSource(port=5557)),
    ("{discoverPods: false}", None),
])
def test_the_kv_event_source_follows_llm_ds_rules(events: str, source: KvEventsSource | None) -> None:
    text = ("kind: EndpointPickerConfig\n"
            f"plugins: [{{type: precise-prefix-cache-scorer, parameters: {{kvEventsConfig: {events}}}}}]\n"
            "schedulingProfiles: [{name: a, plugins: [{pluginRef: precise-prefix-cache-scorer}]}]\n")
    translation = translate_epp_config(text)
    assert translation.profile is not None
    assert translation.kv_events == source


def test_every_single_translated_profile_carries_the_engines_matches() -> None:
    """As kvgate's default profile does: a pool that follows its engines' events (kvgate.io/kv-events-*)
    routes on them under a customised config too; elsewhere the plugin does nothing."""
    translation = translate_epp_config(LLM_D_SAMPLE)
    assert translation.profile is not None
    assert "engine-prefix-matches" in [f.plugin_type for f in build_profile(translation.profile).feedback]
    assert translation.kv_events is None


def test_the_saturation_detectors_thresholds_become_the_admission_thresholds() -> None:
    """What llm-d's variant autoscaler is aligned with (its kvCacheThreshold / queueLengthThreshold)."""
    section = CHART_DEFAULT + ("saturationDetector: {queueDepthThreshold: 12, kvCacheUtilThreshold: 0.9, "
                               "metricsStalenessThreshold: 500ms}\n")
    translation = translate_epp_config(section)
    assert translation.profile is not None
    built = build_profile(translation.profile)
    thresholds = built.admission.thresholds
    assert (thresholds.queue_threshold, thresholds.kv_threshold) == (12, 0.9)
    assert thresholds.metrics_staleness_s == 0.5
    assert is_reference_default(translation.profile)  # (the caller keeps kvgate's default, with these)
    plugin = CHART_DEFAULT.replace(
        "- type: core-metrics-extractor\n",
        "- type: core-metrics-extractor\n- type: utilization-detector\n"
        "  parameters: {queueDepthThreshold: 3, kvCacheUtilThreshold: 0.7}\n")
    translation = translate_epp_config(plugin)
    assert translation.profile is not None
    assert translation.profile["admission"] == {"queue_threshold": 3, "kv_threshold": 0.7}
    bad = CHART_DEFAULT + "saturationDetector: {queueDepthThreshold: 0, kvCacheUtilThreshold: 80, " \
                          "metricsStalenessThreshold: soon}\n"
    translation = translate_epp_config(bad)
    assert translation.profile is not None
    assert "admission" not in translation.profile
    assert len([n for n in translation.notes if "left out" in n and "Threshold" in n]) == 3


LLM_D_FLOW_CONTROL = CHART_DEFAULT + """
featureGates: [flowControl]
saturationDetector: {queueDepthThreshold: 8, kvCacheUtilThreshold: 0.85}
flowControl:
  maxRequests: 2k
  defaultRequestTTL: 45s
  maxBytes: 1Gi
  priorityBands:
  - {priority: 100, orderingPolicyRef: slo-deadline-ordering-policy}
  - {priority: -1, orderingPolicyRef: slo-deadline-ordering-policy, maxRequests: "50"}
"""
"""llm-d's flow-control guide's shape: the gate, the section, its bands."""


def test_llm_ds_flow_control_becomes_the_pools_flow_control() -> None:
    translation = translate_epp_config(LLM_D_FLOW_CONTROL)
    assert translation.flow_control == {
        "queueTimeoutSeconds": 45.0, "maxQueueLength": 2000, "order": "slo-deadline",
        "queueThreshold": 8, "kvCacheThreshold": 0.85,
    }
    [left] = [note for note in translation.notes if note.startswith("flowControl maxBytes")]
    assert "priorityBands[-1].maxRequests" in left
    # the gate off: nothing held (as llm-d), and said
    off = translate_epp_config(LLM_D_FLOW_CONTROL.replace("[flowControl]", "[flowControl=false]"))
    assert off.flow_control is None
    assert any("feature gate" in note for note in off.notes)
    # the gate alone: llm-d's defaults (a minute's wait) with kvgate's queue length
    bare = translate_epp_config(CHART_DEFAULT + "featureGates: [flowControl]\n")
    assert bare.flow_control == {"queueTimeoutSeconds": 60.0}
    forever = translate_epp_config(CHART_DEFAULT + "featureGates: [flowControl]\nflowControl: "
                                   "{defaultRequestTTL: 0s, priorityBands: [{priority: 1, "
                                   "orderingPolicyRef: fcfs-ordering-policy}, {priority: 2, "
                                   "orderingPolicyRef: slo-deadline-ordering-policy}]}\n")
    assert forever.flow_control == {"queueTimeoutSeconds": 1800.0}  # kvgate's longest wait
    assert any("one way" in note for note in forever.notes)


@pytest.mark.parametrize(("text", "value"), [
    ("100", 100), ("1k", 1000), ("2Ki", 2048), ("1.5M", 1_500_000), (250, 250), ("lots", None), ("-1", None),
])
def test_kubernetes_quantities(text: object, value: int | None) -> None:
    assert quantity(text) == value


LLM_D_OPTIMIZED_BASELINE = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: no-hit-lru-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: prefix-cache-scorer
    weight: 3
  - pluginRef: no-hit-lru-scorer
    weight: 2
"""
"""llm-d's optimized-baseline well-lit path's config (its guides' default)."""


def test_llm_ds_optimized_baseline_is_the_inference_extensions_default_to_kvgate() -> None:
    translation = translate_epp_config(LLM_D_OPTIMIZED_BASELINE)
    assert translation.profile is not None
    assert is_reference_default(translation.profile)  # kvgate's default profile serves it
    assert any(note.startswith("no-hit-lru-scorer: left out") for note in translation.notes)


def test_the_pools_settings_apply_where_the_scheduling_profile_is_not_translated() -> None:
    """A plugin kvgate has not (a health scorer) leaves kvgate's default profile in charge, but the
    config's KV-event source, tokenizer, flow control and admission thresholds still hold."""
    text = (LLM_D_PRECISE.replace("  - type: max-score-picker\n",
                                  "  - type: health-scorer\n  - type: max-score-picker\n", 1)
            + "featureGates: [flowControl]\nsaturationDetector: {queueDepthThreshold: 9}\n")
    translation = translate_epp_config(text)
    assert translation.profile is None
    assert any("'health-scorer'" in note for note in translation.notes)
    assert translation.kv_events == KvEventsSource(bind="tcp://*:5557")
    assert translation.tokenizer is not None
    assert translation.flow_control is not None
    assert translation.admission == {"queue_threshold": 9}


def test_llm_ds_load_aware_scorer_is_kvgates_queue_scorer() -> None:
    text = ("kind: EndpointPickerConfig\nplugins: [{type: load-aware-scorer, parameters: {threshold: 128}}, "
            "{type: prefix-cache-scorer}]\nschedulingProfiles: [{name: a, plugins: "
            "[{pluginRef: load-aware-scorer, weight: 2}, {pluginRef: prefix-cache-scorer, weight: 1}]}]\n")
    translation = translate_epp_config(text)
    assert translation.profile is not None
    built = build_profile(translation.profile)
    assert [(s.plugin_type, s.weight) for s in built.scorers] == [("queue-scorer", 2.0),
                                                                ("prefix-cache-scorer", 1.0)]
    assert any(note.startswith("load-aware-scorer") for note in translation.notes)
