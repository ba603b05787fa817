"""Tracing settings (``gateway.picker.tracing``): the flags, then OpenTelemetry's variables."""

from __future__ import annotations

import argparse
import sys

import pytest

from kvgate.gateway.picker.tracing import (
    PICKER_SERVICE_NAME,
    TracingSettings,
    add_tracing_flags,
    tracer_provider,
    tracing_from_args,
    tracing_settings,
)
from kvgate.policies.errors import ConfigError


def test_off_without_an_endpoint_and_when_the_sdk_is_disabled() -> None:
    assert tracing_settings(None, None, {}) is None
    assert tracing_settings("http://c:4317", None, {"OTEL_SDK_DISABLED": "true"}) is None


def test_the_flag_first_then_the_traces_variable_then_the_generic_one() -> None:
    env = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://traces:4317",
           "OTEL_EXPORTER_OTLP_ENDPOINT": "http://any:4317"}
    assert tracing_settings("http://flag:4317", None, env) == TracingSettings("http://flag:4317")
    assert tracing_settings(None, None, env) == TracingSettings("http://traces:4317")
    assert tracing_settings(None, None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://any:4317"}) == \
        TracingSettings("http://any:4317")


def test_sampling_ratio_and_service_name() -> None:
    env = {"OTEL_TRACES_SAMPLER_ARG": "0.25", "OTEL_SERVICE_NAME": "edge-picker"}
    settings = tracing_settings("http://c:4317", None, env)
    assert settings == TracingSettings("http://c:4317", 0.25, "edge-picker")
    flagged = tracing_settings("http://c:4317", 0.5, env)
    assert flagged is not None
    assert flagged.sampling_ratio == 0.5
    default = TracingSettings("http://c:4317", 1.0, PICKER_SERVICE_NAME)
    assert tracing_settings("http://c:4317", None, {}) == default


@pytest.mark.parametrize(("endpoint", "ratio", "message"), [
    ("http://c:4317", 1.5, "within 0..1"),
    ("ftp://c:4317", 1.0, "not http"),
    ("http://c:notaport", 1.0, "OTLP endpoint"),
])
def test_bad_settings_are_startup_errors(endpoint: str, ratio: float, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        tracing_settings(endpoint, ratio, {})
    with pytest.raises(ConfigError, match="not a number"):
        tracing_settings("http://c:4317", None, {"OTEL_TRACES_SAMPLER_ARG": "half"})


def test_receiver_address_and_the_flags_a_worker_is_given() -> None:
    assert TracingSettings("http://collector.obs:4317").host_port() == ("collector.obs", 4317)
    assert TracingSettings("collector.obs").host_port() == ("collector.obs", 4317)
    secure = TracingSettings("https://tempo:443", 0.1)
    assert not secure.insecure
    parser = argparse.ArgumentParser()
    add_tracing_flags(parser)
    assert tracing_from_args(parser.parse_args(secure.args())) == TracingSettings("https://tempo:443", 0.1)


def test_an_exporter_that_cannot_load_is_a_startup_error_that_says_what_to_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """xds-protos ships an older copy of opentelemetry/proto; installed after opentelemetry-proto it
    breaks the OTLP exporter's import. A picker without tracing never imports it."""
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.grpc.trace_exporter", None)
    with pytest.raises(ConfigError, match="force-reinstall --no-deps opentelemetry-proto"):
        tracer_provider(TracingSettings("http://127.0.0.1:4317"))
