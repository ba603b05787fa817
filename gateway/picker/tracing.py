"""OpenTelemetry tracing: the settings (flags and the standard ``OTEL_*`` variables) and the SDK's
tracer provider with its OTLP/gRPC exporter (the picker's spans: ``extproc.tracing``; Envoy's:
``gateway.controlplane.translate.tracing``).

Off unless an endpoint is given (``--otlp-endpoint URL``, else ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``
or ``OTEL_EXPORTER_OTLP_ENDPOINT``); ``OTEL_SDK_DISABLED=true`` turns it off whatever is given.
Sampling: ``--otlp-sampling-ratio`` (else ``OTEL_TRACES_SAMPLER_ARG``, default 1.0) is the share of
requests Envoy starts a sampled trace for; the picker follows the decision it is sent (the W3C
``traceparent`` of Envoy's ext_proc call: a parent-based sampler), so the two never disagree, and
applies the ratio itself only to requests that come without one (a gateway that does not trace).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from kvgate.policies.errors import ConfigError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

PICKER_SERVICE_NAME = "kvgate-picker"
ENVOY_SERVICE_NAME = "kvgate-envoy"


@dataclass(frozen=True, slots=True)
class TracingSettings:
    """Where traces go (an OTLP/gRPC receiver, ``http://host:port``) and the share sampled."""

    endpoint: str
    sampling_ratio: float = 1.0
    service_name: str = PICKER_SERVICE_NAME
    """The picker's ``service.name`` (``OTEL_SERVICE_NAME``); Envoy's is ``kvgate-envoy``."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.sampling_ratio <= 1.0:
            raise ConfigError(f"the trace sampling ratio must be within 0..1, not {self.sampling_ratio}")
        self.host_port()  # checked here: a bad URL is a startup error, not a silent lack of traces

    @property
    def insecure(self) -> bool:
        return urlsplit(self.endpoint).scheme != "https"

    def host_port(self) -> tuple[str, int]:
        """The receiver's host and port (Envoy's OTLP cluster)."""
        url = urlsplit(self.endpoint if "://" in self.endpoint else f"http://{self.endpoint}")
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ConfigError(f"OTLP endpoint {self.endpoint!r} is not http(s)://host:port")
        try:
            port = url.port
        except ValueError as exc:
            raise ConfigError(f"OTLP endpoint {self.endpoint!r}: {exc}") from exc
        return url.hostname, port or 4317

    def args(self) -> list[str]:
        """The same settings as ``kvgate picker`` flags (``kvgate up``'s worker processes)."""
        return ["--otlp-endpoint", self.endpoint, "--otlp-sampling-ratio", f"{self.sampling_ratio:g}"]


def tracing_settings(
    endpoint: str | None, sampling_ratio: float | None, environ: Mapping[str, str] | None = None
) -> TracingSettings | None:
    """The flags first, then OpenTelemetry's standard variables; None when tracing is off."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    url = endpoint or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if not url:
        return None
    ratio = sampling_ratio
    if ratio is None:
        text = env.get("OTEL_TRACES_SAMPLER_ARG", "").strip()
        try:
            ratio = float(text) if text else 1.0
        except ValueError as exc:
            raise ConfigError(f"OTEL_TRACES_SAMPLER_ARG={text!r} is not a number") from exc
    name = env.get("OTEL_SERVICE_NAME", "").strip() or PICKER_SERVICE_NAME
    return TracingSettings(url, ratio, name)


PROTO_CONFLICT = (
    "tracing: the installed OpenTelemetry protos are an older copy that lacks what the OTLP exporter "
    "needs (xds-protos ships its own copy of opentelemetry/proto and, installed after "
    "opentelemetry-proto, overwrites it); run `pip install --force-reinstall --no-deps "
    "opentelemetry-proto` in kvgate's environment"
)


def tracer_provider(settings: TracingSettings) -> TracerProvider:
    """The SDK's provider: parent-based sampling at the ratio, batched OTLP/gRPC export. The caller
    owns it (``shutdown()`` flushes what is batched); it is not installed as OpenTelemetry's global.

    Imported here, not at module level: a picker without tracing never loads the exporter, so the
    protos' install-order conflict (``PROTO_CONFLICT``) cannot stop it; with tracing it is a clear
    start-up error instead of an ImportError."""
    try:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    except ImportError as exc:
        raise ConfigError(f"{PROTO_CONFLICT} ({exc})") from exc
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    host, port = settings.host_port()
    exporter = OTLPSpanExporter(endpoint=f"{host}:{port}", insecure=settings.insecure)
    provider = TracerProvider(
        sampler=ParentBased(TraceIdRatioBased(settings.sampling_ratio)),
        resource=Resource.create({"service.name": settings.service_name}),
    )
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=500))
    return provider


def add_tracing_flags(parser: argparse.ArgumentParser) -> None:
    """``--otlp-endpoint`` and ``--otlp-sampling-ratio`` (``kvgate picker`` and ``kvgate up``)."""
    parser.add_argument("--otlp-endpoint", default=None, metavar="URL",
                        help="export traces over OTLP/gRPC to URL (http://host:4317); default: "
                        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT, else off")
    parser.add_argument("--otlp-sampling-ratio", type=float, default=None, metavar="RATIO",
                        help="share of requests traced, 0..1 (default: OTEL_TRACES_SAMPLER_ARG, else 1)")


def tracing_from_args(args: argparse.Namespace) -> TracingSettings | None:
    """The flags' tracing (``--tracing=false``, the Inference Extension's: off whatever the
    environment names)."""
    if getattr(args, "tracing", None) is False:
        return None
    return tracing_settings(args.otlp_endpoint, args.otlp_sampling_ratio)
