"""``gateway.picker.epp_flags``: the command lines llm-d's chart gives its picker (config/charts/epplib
templates/_deployment.yaml) start kvgate's, and mean on it what they mean there."""

from __future__ import annotations

import argparse

import pytest

from kvgate.gateway.picker.cli import build_parser, warn_ignored
from kvgate.gateway.picker.epp_flags import apply_epp_flags, go_duration, log_level, with_pool_defaults
from kvgate.gateway.picker.pools_file import parse_pools
from kvgate.gateway.picker.tracing import tracing_from_args
from kvgate.policies.errors import ConfigError

COMMON = [
    "--pool-name",
    "llama",
    "--pool-namespace",
    "default",
    "--pool-group",
    "inference.networking.k8s.io",
]
TAIL = [
    "--zap-encoder",
    "json",
    "--config-file",
    "/config/default-plugins.yaml",
    "--ha-enable-leader-election",
    "--tracing=false",
    "--metrics-endpoint-auth=false",
]
"""What the chart passes every picker (two replicas: leader election; tracing off)."""


def parsed(*args: str) -> argparse.Namespace:
    namespace = build_parser().parse_args(["--kubernetes", *COMMON, *args, *TAIL])
    apply_epp_flags(namespace)
    return namespace


@pytest.mark.parametrize(
    ("flags", "engine"),
    [
        ([], None),
        (
            [
                '--total-queued-requests-metric="sglang:num_queue_reqs"',
                '--total-running-requests-metric="sglang:num_running_reqs"',
                '--kv-cache-usage-percentage-metric="sglang:token_usage"',
                '--cache-info-metric="sglang:cache_config_info"',
            ],
            "sglang",
        ),
        (
            [
                "--total-queued-requests-metric",
                "nv_trt_llm_request_metrics{request_type=waiting}",
                "--total-running-requests-metric",
                "nv_trt_llm_request_metrics{request_type=scheduled}",
                "--kv-cache-usage-percentage-metric",
                "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=fraction}",
                "--lora-info-metric",
                "",
            ],
            "triton",
        ),
        (
            [
                '--total-queued-requests-metric="trtllm_num_requests_waiting"',
                '--model-server-metrics-path="/prometheus/metrics"',
                "--lora-info-metric",
                "",
            ],
            "trtllm",
        ),
    ],
)
def test_the_charts_command_lines_start_the_picker_and_name_the_engine(
    flags: list[str], engine: str | None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317")
    args = parsed(*flags)
    assert args.default_engine == engine
    assert str(args.config_file) == "/config/default-plugins.yaml"
    assert tracing_from_args(args) is None  # --tracing=false: off, whatever the environment names
    warn_ignored(args)
    assert "--ha-enable-leader-election" in caplog.text


def test_tracing_true_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317")
    args = build_parser().parse_args(["--kubernetes", *COMMON, "--tracing=true"])
    settings = tracing_from_args(args)
    assert settings is not None
    assert settings.host_port() == ("collector", 4317)


def test_refresh_and_staleness_durations_are_the_scrape_interval_and_stale_after() -> None:
    args = parsed(
        "--refresh-metrics-interval=100ms",
        "--metrics-staleness-threshold",
        "2s",
        "--model-server-metrics-port=9100",
    )
    assert (args.scrape_interval, args.stale_after, args.model_server_metrics_port) == (0.1, 2.0, 9100)
    assert (go_duration("1m30s"), go_duration("1.5s"), go_duration('"50ms"')) == (90.0, 1.5, 0.05)
    with pytest.raises(argparse.ArgumentTypeError):
        go_duration("fast")


def test_metric_names_of_no_known_engine_are_said(caplog: pytest.LogCaptureFixture) -> None:
    assert parsed("--total-queued-requests-metric=my_queue").default_engine is None
    assert "my_queue" in caplog.text


def test_the_mode_without_an_inference_pool_needs_the_cluster() -> None:
    args = build_parser().parse_args(["--endpoint-selector", "app=vllm", "--endpoint-target-ports", "8000"])
    with pytest.raises(ConfigError, match="--kubernetes"):
        apply_epp_flags(args)
    args.kubernetes = True  # (how kvgate picker runs it: gateway.picker_kubernetes)
    apply_epp_flags(args)
    assert (args.standalone_endpoint_selector, args.standalone_endpoint_target_ports) == ("app=vllm", "8000")


def test_pools_get_the_flags_defaults_for_what_they_do_not_name() -> None:
    pools = parse_pools(
        "pools: [{name: a}, {name: b, engine: vllm, metricsPort: 8000, profile: gie-default}]"
    ).pools
    a, b = with_pool_defaults(pools, "mine.yaml", "sglang", 9100)
    assert (a.profile, a.engine, a.metrics_port) == ("mine.yaml", "sglang", 9100)
    assert (b.profile, b.engine, b.metrics_port) == ("gie-default", "vllm", 8000)


DEPLOYMENTS_FLAGS = [
    # what llm-d's guides, scripts and manifests pass their pickers besides the chart's flags
    "--zap-log-level", "debug", "--allow-experimental-plugins", "--emit-endpoint-scores", "--zap-devel",
    "--zap-stacktrace-level", "error", "--zap-time-encoding", "iso8601", "--enable-leader-election",
    "--kube-api-qps", "50", "--kube-api-burst", "100", "--feature-gates", "dataLayer=true",
    "--secure-serving=false", "--grpc-health-port", "9003", "--v", "4",
]


def test_the_flags_deployments_pass_start_the_picker(caplog: pytest.LogCaptureFixture) -> None:
    """Each of these made kvgate picker exit at start ("unrecognized arguments")."""
    args = parsed(*DEPLOYMENTS_FLAGS)
    warn_ignored(args)
    for flag in ("--allow-experimental-plugins", "--emit-endpoint-scores", "--feature-gates",
                 "--kube-api-qps"):
        assert flag in caplog.text
    assert log_level(args) == "DEBUG"


@pytest.mark.parametrize(("flags", "level"), [
    ([], "INFO"),
    (["--zap-log-level", "error"], "ERROR"),
    (["--zap-log-level=info", "--v", "5"], "INFO"),  # zap's level wins over the verbosity
    (["--zap-log-level", "3"], "DEBUG"),  # a verbosity: below debug
    (["--v", "2"], "INFO"),
    (["--v", "4"], "DEBUG"),
    (["--zap-log-level", "debug", "--log-level", "WARNING"], "WARNING"),  # kvgate's own wins
    (["--zap-log-level", "loud"], "INFO"),
])
def test_zap_log_level_and_verbosity_set_the_log_level(flags: list[str], level: str) -> None:
    assert log_level(parsed(*flags)) == level
