"""``kvgate picker``'s flags that reach its settings: the prefill step's bound, the model servers'
TLS, the Inference Extension's EndpointPickerConfig."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvgate.extproc.prefill_client import DEFAULT_TIMEOUT_S
from kvgate.gateway.picker.cli import build_parser, settings_from_args
from kvgate.gateway.picker.epp_flags import apply_epp_flags, epp_defaults, epp_profile, with_pool_defaults
from kvgate.gateway.picker.pools_file import ModelServerTlsSpec, PoolSpec, parse_pools
from kvgate.gateway.picker.tls import self_signed
from kvgate.policies.disaggregation import DisaggregatedProfile, load_scheduling
from kvgate.policies.errors import ConfigError
from kvgate.policies.profile import load_profile
from tests.policies.test_epp_config import LLM_D_PD


def test_the_prefill_timeout_reaches_the_settings_and_defaults_below_envoys_message_timeout() -> None:
    parser = build_parser()
    assert settings_from_args(parser.parse_args([]), None).prefill_timeout == DEFAULT_TIMEOUT_S < 30.0
    args = parser.parse_args(["--prefill-timeout", "7.5"])
    assert settings_from_args(args, None).prefill_timeout == 7.5


@pytest.mark.parametrize("value", ["0", "-1", "soon", "nan"])
def test_a_prefill_timeout_that_is_not_a_positive_number_is_refused(
    value: str, capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--prefill-timeout", value])
    assert "--prefill-timeout" in capsys.readouterr().err


def test_the_inference_extensions_model_server_https_flags(tmp_path: Path) -> None:
    def tls(*flags: str) -> ModelServerTlsSpec | None:
        return settings_from_args(build_parser().parse_args(list(flags)), None).model_server_tls

    assert tls() is None
    assert tls("--model-server-metrics-scheme", "https") == ModelServerTlsSpec()  # not verified (its default)
    ca = tmp_path / "ca.pem"
    ca.write_bytes(self_signed().cert_pem)
    verify = "--model-server-metrics-https-insecure-skip-verify=false"
    assert tls("--model-server-metrics-scheme", "https", "--model-server-ca-file", str(ca), verify) == (
        ModelServerTlsSpec(caFile=str(ca)))
    with pytest.raises(ConfigError, match="needs --model-server-ca-file"):
        tls("--model-server-metrics-scheme", "https", verify)
    with pytest.raises(ConfigError, match="cannot be loaded"):
        tls("--model-server-ca-file", str(tmp_path / "missing.pem"))


def test_a_pools_model_server_tls_overrides_the_flags() -> None:
    spec = PoolSpec.model_validate({"name": "p", "modelServerTls": {}})
    assert spec.model_server_tls == ModelServerTlsSpec()
    assert PoolSpec.model_validate({"name": "p"}).model_server_tls is None


EPP_CONFIG = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: prefix-cache-scorer
  parameters: {blockSize: 128}
schedulingProfiles:
- name: chart
  plugins:
  - pluginRef: queue-scorer
    weight: 3
  - pluginRef: prefix-cache-scorer
"""


def test_an_endpoint_picker_config_becomes_the_profile_of_the_pools_naming_none(tmp_path: Path) -> None:
    config = tmp_path / "default-plugins.yaml"
    config.write_text(EPP_CONFIG)
    args = build_parser().parse_args(["--pools", "p.yaml", "--config-file", str(config)])
    path = epp_profile(args)
    assert path is not None
    profile = load_profile(path)
    assert profile.name == "chart"
    assert [(s.plugin_type, s.weight) for s in profile.scorers] == [("queue-scorer", 3.0),
                                                                   ("prefix-cache-scorer", 1.0)]
    assert profile.prefix.block_chars == 128
    pools = parse_pools("pools: [{name: a}, {name: b, profile: gie-default}]").pools
    assert [p.profile for p in with_pool_defaults(pools, path)] == [path, "gie-default"]
    assert with_pool_defaults(pools, None) == list(pools)


def test_a_config_kvgate_cannot_translate_keeps_the_default_profile(caplog: pytest.LogCaptureFixture) -> None:
    admitter = "- type: queue-scorer\n- type: latency-slo-admitter\n"
    text = EPP_CONFIG.replace("- type: queue-scorer\n", admitter, 1)
    args = build_parser().parse_args(["--pools", "p.yaml", "--config-text", text])
    assert epp_profile(args) is None
    assert "latency-slo-admitter" in caplog.text
    assert epp_profile(build_parser().parse_args(["--pools", "p.yaml"])) is None


def test_the_charts_default_config_keeps_kvgates_default_profile() -> None:
    """The default-plugins.yaml every Inference Extension chart passes asks for nothing but the
    picker's default: kvgate's own (which routes better) serves the pools."""
    chart = EPP_CONFIG.replace("    weight: 3\n  - pluginRef: prefix-cache-scorer\n",
                               "    weight: 2\n  - pluginRef: kv-cache-utilization-scorer\n    weight: 2\n"
                               "  - pluginRef: prefix-cache-scorer\n    weight: 3\n")
    chart = chart.replace("- type: prefix-cache-scorer\n  parameters: {blockSize: 128}\n",
                          "- type: kv-cache-utilization-scorer\n- type: prefix-cache-scorer\n")
    assert epp_profile(build_parser().parse_args(["--pools", "p.yaml", "--config-text", chart])) is None


def test_llm_ds_pd_config_becomes_a_disaggregated_profile_on_disk() -> None:
    args = build_parser().parse_args(["--pools", "p.yaml", "--config-text", LLM_D_PD])
    path = epp_profile(args)
    assert path is not None
    loaded = load_scheduling(path)
    assert isinstance(loaded, DisaggregatedProfile)
    assert loaded.decider.plugin_type == "prefix-based-pd-decider"


def test_profile_and_engine_flags_are_the_defaults_of_pools_naming_none(tmp_path: Path) -> None:
    args = build_parser().parse_args(["--pools", "p.yaml", "--profile", "gie-default", "--engine", "sglang"])
    apply_epp_flags(args)
    assert epp_defaults(args).profile == "gie-default"
    assert args.default_engine == "sglang"
    pools = parse_pools("pools: [{name: a}, {name: b, profile: default, engine: vllm}]").pools
    a, b = with_pool_defaults(pools, epp_defaults(args).profile, args.default_engine)
    assert (a.profile, a.engine, b.profile, b.engine) == ("gie-default", "sglang", "default", "vllm")
    own = tmp_path / "mine.yaml"
    shipped = Path(__file__).resolve().parents[3] / "policies" / "profiles" / "default.yaml"
    own.write_text(shipped.read_text())
    args = build_parser().parse_args(["--pools", "p.yaml", "--profile", str(own)])
    assert epp_defaults(args).profile == str(own)
    # the metric-name flags name an engine too: --engine wins
    args = build_parser().parse_args(["--pools", "p.yaml", "--engine", "vllm",
                                      "--total-queued-requests-metric", "sglang:num_queue_reqs"])
    apply_epp_flags(args)
    assert args.default_engine == "vllm"


@pytest.mark.parametrize(("argv", "fragment"), [
    (["--profile", "no-such-profile"], "--profile no-such-profile"),
    (["--profile", "default", "--config-text", EPP_CONFIG], "not both"),
])
def test_a_profile_flag_that_cannot_serve_is_refused_at_start(argv: list[str], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        epp_defaults(build_parser().parse_args(["--pools", "p.yaml", *argv]))


def test_the_charts_default_with_its_own_admission_thresholds_keeps_kvgates_profile() -> None:
    """The scorers of the Inference Extension's default with a saturationDetector of the
    deployment's own: kvgate's default profile (its routing) admitting at the config's thresholds."""
    text = EPP_CONFIG.replace("    weight: 3\n  - pluginRef: prefix-cache-scorer\n",
                              "    weight: 2\n  - pluginRef: kv-cache-utilization-scorer\n    weight: 2\n"
                              "  - pluginRef: prefix-cache-scorer\n    weight: 3\n")
    text = text.replace("- type: prefix-cache-scorer\n  parameters: {blockSize: 128}\n",
                        "- type: kv-cache-utilization-scorer\n- type: prefix-cache-scorer\n")
    text += "saturationDetector: {queueDepthThreshold: 10, kvCacheUtilThreshold: 0.95}\n"
    path = epp_profile(build_parser().parse_args(["--pools", "p.yaml", "--config-text", text]))
    assert path is not None
    profile, default = load_profile(path), load_profile("default")
    assert [(s.plugin_type, s.weight) for s in profile.scorers] == [
        (s.plugin_type, s.weight) for s in default.scorers]
    thresholds = profile.admission.thresholds
    assert (thresholds.queue_threshold, thresholds.kv_threshold) == (10, 0.95)
    assert thresholds.metrics_staleness_s == default.admission.thresholds.metrics_staleness_s


def test_a_config_not_translated_still_gives_its_admission_thresholds() -> None:
    admitter = "- type: queue-scorer\n- type: latency-slo-admitter\n"
    text = EPP_CONFIG.replace("- type: queue-scorer\n", admitter, 1)
    text += "saturationDetector: {queueDepthThreshold: 7, kvCacheUtilThreshold: 0.9}\n"
    path = epp_profile(build_parser().parse_args(["--pools", "p.yaml", "--config-text", text]))
    assert path is not None
    profile, default = load_profile(path), load_profile("default")
    assert [s.plugin_type for s in profile.scorers] == [s.plugin_type for s in default.scorers]
    thresholds = profile.admission.thresholds
    assert (thresholds.queue_threshold, thresholds.kv_threshold) == (7, 0.9)
