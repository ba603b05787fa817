"""The Inference Extension's (now llm-d's) picker flags, as its charts pass them, on ``kvgate picker``:
a drop-in must start with its manifests unchanged and do what the flags mean where kvgate can.

- ``--config-file`` / ``--config-text``: its EndpointPickerConfig, translated to a kvgate profile
  for the pools that name none (``policies.epp_config``; :func:`epp_profile`).
- ``--tracing=true|false``: ``false`` turns tracing off even where the OpenTelemetry environment
  names an endpoint; ``true`` traces to the environment's (``OTEL_EXPORTER_OTLP_ENDPOINT``, which
  its charts set) unless ``--otlp-endpoint`` says otherwise.
- ``--refresh-metrics-interval`` and ``--metrics-staleness-threshold`` (Go durations, ``50ms``) are
  ``--scrape-interval`` and ``--stale-after``; ``--model-server-metrics-port`` is the pool's metrics
  port (``kvgate.io/metrics-port`` unless the pool names one).
- ``--total-queued-requests-metric`` and its siblings name an engine's metrics, as the charts pass
  them for SGLang, Triton and TensorRT-LLM pools: kvgate reads the engine's dialect they belong to
  (``kvgate.io/engine`` unless the pool names one); names of no known engine are said.
- Flags for what kvgate does otherwise (leader election: kvgate's pickers serve side by side, sharing
  state through Redis; pprof, the log encoder, verbosity, the health-checking switch, the
  Prometheus refresh) are accepted and named in a warning.
- ``--endpoint-selector`` / ``--endpoint-target-ports``: the mode without an InferencePool, the Pods
  the selector selects are the pool (``gateway.picker_kubernetes``; ``kvgate picker`` runs it as
  ``--kubernetes``).
"""

from __future__ import annotations

import argparse
import atexit
import logging
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kvgate.gateway.picker.epp_kv_events import kv_events_default, with_kv_events_default
from kvgate.gateway.picker.pools_file import Dialect, FlowControlSpec, KvEventsSpec, PoolSpec
from kvgate.policies.disaggregation import load_scheduling
from kvgate.policies.durations import go_duration as go_duration_s
from kvgate.policies.epp_config import Translation, is_reference_default, translate_epp_config
from kvgate.policies.errors import ConfigError
from kvgate.policies.profile import read_profile_document

log = logging.getLogger(__name__)

IGNORED = ("--zap-encoder", "--enable-pprof", "--model-server-metrics-path",
           "--refresh-prometheus-metrics-interval", "--zap-stacktrace-level", "--zap-time-encoding",
           "--kube-api-qps", "--kube-api-burst", "--feature-gates")
"""Flags taking a value that kvgate has no use for."""
IGNORED_SWITCHES = ("--ha-enable-leader-election", "--enable-leader-election", "--health-checking",
                    "--disable-endpoint-subset-filter", "--allow-experimental-plugins",
                    "--emit-endpoint-scores", "--zap-devel")
"""Boolean flags (Go's: bare or ``=true``) that kvgate has no use for."""
ZAP_LEVELS = {"debug": "DEBUG", "info": "INFO", "warn": "WARNING", "error": "ERROR", "dpanic": "CRITICAL",
              "panic": "CRITICAL", "fatal": "CRITICAL"}
DEBUG_VERBOSITY = 4
"""The Inference Extension's ``--v`` from which it logs at debug (its logutil.DEBUG)."""
METRIC_FLAGS = ("--total-queued-requests-metric", "--total-running-requests-metric",
                "--kv-cache-usage-percentage-metric", "--lora-info-metric", "--cache-info-metric")
ENGINE_PREFIXES: tuple[tuple[str, Dialect], ...] = (
    ("vllm:", "vllm"), ("sglang:", "sglang"), ("nv_trt_llm", "triton"), ("trtllm_", "trtllm"),
    ("jetstream_", "jetstream"),
)
"""A metric name's prefix → the engine dialect it belongs to."""


def go_duration(text: str) -> float:
    """Seconds of a Go duration (``50ms``, ``1m30s``, ``1.5s``), for argparse."""
    try:
        return go_duration_s(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_epp_flags(parser: argparse.ArgumentParser, accepted: argparse._ArgumentGroup,
                  flag_bool: Callable[[str], bool]) -> None:
    """The Inference Extension picker's flags (module docstring) on ``parser``; ``accepted``: the
    group of those accepted and not used."""
    epp = parser.add_argument_group("the Inference Extension picker's flags kvgate maps onto its own")
    epp.add_argument("--config-file", type=Path, default=None, metavar="FILE",
                     help="an EndpointPickerConfig (the Inference Extension's, llm-d's): its scheduling "
                     "profile's scorers, weights and picker (or llm-d's P/D pair) become the profile of "
                     "the pools that name none (kvgate.io/profile, a pools file's profile); one kvgate "
                     "cannot translate is said and kvgate's default profile kept")
    epp.add_argument("--config-text", default=None, metavar="YAML", help="the same, inline")
    epp.add_argument("--tracing", type=flag_bool, nargs="?", const=True, default=None, metavar="BOOL",
                     help="false: no tracing, whatever the environment names; true: trace to "
                     "OTEL_EXPORTER_OTLP_ENDPOINT unless --otlp-endpoint")
    epp.add_argument("--refresh-metrics-interval", type=go_duration, default=None, metavar="DURATION",
                     help="--scrape-interval as a Go duration (50ms)")
    epp.add_argument("--metrics-staleness-threshold", type=go_duration, default=None, metavar="DURATION",
                     help="--stale-after as a Go duration (2s)")
    epp.add_argument("--model-server-metrics-port", type=int, default=None, metavar="PORT",
                     help="the port the engines serve metrics on (a pool's kvgate.io/metrics-port wins)")
    epp.add_argument("--zap-log-level", default=None, metavar="LEVEL",
                     help="--log-level as zap names it (debug, info, error, or a verbosity: debug)")
    epp.add_argument("--v", dest="verbosity", type=int, default=None, metavar="N",
                     help=f"--log-level as a verbosity ({DEBUG_VERBOSITY} or more: debug)")
    for flag in METRIC_FLAGS:
        epp.add_argument(flag, dest=f"metric_{_dest(flag)}", default=None, metavar="NAME",
                         help=argparse.SUPPRESS)
    epp.add_argument("--endpoint-selector", dest="standalone_endpoint_selector", default=None,
                     metavar="SELECTOR", help="instead of --pool-name: the Pods this label selector selects "
                     "(app=vllm,env in (a,b),!canary) in the namespace are the pool, without an "
                     "InferencePool (the Inference Extension's standalone mode; implies --kubernetes)")
    epp.add_argument("--endpoint-target-ports", dest="standalone_endpoint_target_ports", default=None,
                     metavar="PORTS",
                     help="their model servers' ports, comma-separated (with --endpoint-selector)")
    for flag in IGNORED:
        accepted.add_argument(flag, dest=f"ignored_{_dest(flag)}", default=None, metavar="VALUE",
                              help=argparse.SUPPRESS)
    for flag in IGNORED_SWITCHES:
        accepted.add_argument(flag, dest=f"ignored_{_dest(flag)}", nargs="?", const="true", default=None,
                              metavar="BOOL", help=argparse.SUPPRESS)


def log_level(args: argparse.Namespace) -> str:
    """``--log-level``, else what ``--zap-log-level`` or ``--v`` (the Inference Extension's) mean,
    else INFO."""
    if args.log_level is not None:
        return str(args.log_level)
    zap = (args.zap_log_level or "").strip().lower()
    if zap:
        if zap.isdigit():
            return "DEBUG" if int(zap) > 0 else "INFO"  # (zap: a verbosity below debug)
        if zap in ZAP_LEVELS:
            return ZAP_LEVELS[zap]
        log.warning("--zap-log-level %s: not a level (debug, info, error); logging at INFO",
                    args.zap_log_level)
    if args.verbosity is not None and args.verbosity >= DEBUG_VERBOSITY:
        return "DEBUG"
    return "INFO"


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def apply_epp_flags(args: argparse.Namespace) -> None:
    """The flags' meaning on kvgate's own (``args`` changed in place; module docstring). Raises
    ConfigError for the pool-less mode's flags without ``--kubernetes`` (``kvgate picker`` runs
    that mode with it: ``gateway.picker_kubernetes``)."""
    standalone = (args.standalone_endpoint_selector, args.standalone_endpoint_target_ports) != (None, None)
    if standalone and not args.kubernetes:
        raise ConfigError("--endpoint-selector / --endpoint-target-ports select the pool's Pods in a "
                          "cluster: with --kubernetes (a pools file, --pools, lists its endpoints itself)")
    if args.refresh_metrics_interval is not None:
        args.scrape_interval = args.refresh_metrics_interval
    if args.metrics_staleness_threshold is not None:
        args.stale_after = args.metrics_staleness_threshold
    named = metric_engine(args)
    if args.engine is not None and named is not None and named != args.engine:
        log.warning("--engine %s wins over the engine the metric-name flags name (%s)", args.engine, named)
    args.default_engine = args.engine or named


def metric_engine(args: argparse.Namespace) -> Dialect | None:
    """The engine whose metrics the metric-name flags name (None: none given); names of no known
    engine are said (kvgate reads its dialects' names: kvgate.io/engine)."""
    names = [value.strip().strip('"') for flag in METRIC_FLAGS
             if (value := getattr(args, f"metric_{_dest(flag)}")) is not None and value.strip().strip('"')]
    engines = {engine for name in names for prefix, engine in ENGINE_PREFIXES if name.startswith(prefix)}
    unknown = [name for name in names if not any(name.startswith(prefix) for prefix, _ in ENGINE_PREFIXES)]
    if unknown or len(engines) > 1:
        log.warning("metric names of no single engine kvgate reads (%s): the pools' kvgate.io/engine, "
                    "else vllm, decides which names are scraped", ", ".join(names))
        return None
    return next(iter(engines), None)


@dataclass(frozen=True, slots=True)
class EppDefaults:
    """What the flags give the pools that name none (``with_pool_defaults``)."""

    profile: str | None = None
    kv_events: KvEventsSpec | None = None
    flow_control: FlowControlSpec | None = None

    def apply(self, pool: PoolSpec) -> PoolSpec:
        """``pool`` with the KV events and flow control it does not name itself (its profile: the
        caller's, which knows whether the pool named one)."""
        pool = with_kv_events_default(pool, self.kv_events)
        if self.flow_control is not None and pool.flow_control is None:
            pool = pool.model_copy(update={"flow_control": self.flow_control})
        return pool


def epp_defaults(args: argparse.Namespace) -> EppDefaults:
    """The profile of the pools naming none (``--profile``, checked here: a profile that does not
    load stops the picker at its start, not at its first pool; else what ``--config-file`` /
    ``--config-text`` translate to, :func:`epp_profile`; else None, kvgate's default) and their KV
    events (the config's precise prefix plugin's: ``gateway.picker.epp_kv_events``)."""
    translation = epp_translation(args)
    if args.profile is None:
        return EppDefaults(profile_file(translation), kv_events_default(translation),
                           flow_control_default(translation))
    if translation is not None:
        raise ConfigError("give --profile or --config-file / --config-text (an EndpointPickerConfig that "
                          "becomes the profile), not both")
    try:
        load_scheduling(args.profile)
    except ConfigError as exc:
        raise ConfigError(f"--profile {args.profile}: {exc.message}") from None
    return EppDefaults(str(args.profile))


def flow_control_default(translation: Translation | None) -> FlowControlSpec | None:
    """The pools' flow control where the config turns llm-d's on (``policies.epp_config``)."""
    if translation is None or translation.flow_control is None:
        return None
    try:
        spec = FlowControlSpec.model_validate(dict(translation.flow_control))
    except ValueError as exc:
        raise ConfigError(f"EndpointPickerConfig flowControl: {exc}") from None
    log.info("EndpointPickerConfig: flow control on for the pools that name none (queue timeout %g s, "
             "%d held at most, %s)", spec.queue_timeout_s, spec.max_queue_length, spec.order)
    return spec


def epp_translation(args: argparse.Namespace) -> Translation | None:
    """``--config-file`` / ``--config-text`` translated (``policies.epp_config``; what it leaves out
    is said), or None: none given."""
    if args.config_file is None and args.config_text is None:
        return None
    try:
        text = args.config_text if args.config_text is not None else args.config_file.read_text()
    except OSError as exc:
        raise ConfigError(f"--config-file: {exc}") from exc
    translation = translate_epp_config(text)
    for note in translation.notes:
        log.warning("EndpointPickerConfig: %s", note)
    return translation


def epp_profile(args: argparse.Namespace) -> str | None:
    """The profile ``--config-file`` / ``--config-text`` translate to, as a file: :func:`profile_file`."""
    return profile_file(epp_translation(args))


def profile_file(translation: Translation | None) -> str | None:
    """A translation's profile as a file the pools can name (written once, in a directory of its
    own), or None: none given, not translated (said), or the charts' default (kvgate's default
    profile serves it). Where the config sets admission thresholds and its profile is not translated
    or is the charts' default: kvgate's default profile with those thresholds, as a file."""
    if translation is None:
        return None
    admission = translation.admission
    if translation.profile is None:
        log.warning("EndpointPickerConfig not translated; pools without a profile of their own use kvgate's "
                    "default profile%s",
                    " (admitting at its saturation detector's thresholds)" if admission else "")
        if not admission:
            return None
        profile: dict[str, Any] = _default_admitting_at(admission)
    elif is_reference_default(translation.profile):
        log.info("EndpointPickerConfig: the Inference Extension's default; pools without a profile of their "
                 "own use kvgate's default profile (kvgate.io/profile: gie-default runs the Inference "
                 "Extension's)%s", f", with its admission thresholds {dict(admission)}" if admission else "")
        if not admission:
            return None
        profile = _default_admitting_at(admission)
    else:
        profile = dict(translation.profile)
    directory = Path(tempfile.mkdtemp(prefix="kvgate-epp-config-"))
    atexit.register(shutil.rmtree, directory, True)
    if translation.halves:  # a disaggregated profile names its halves' files
        for role, half in translation.halves.items():
            (directory / f"{role}.yaml").write_text(yaml.safe_dump(dict(half), sort_keys=False))
        profile["disaggregation"] = {**profile["disaggregation"],
                                     **{role: str(directory / f"{role}.yaml") for role in translation.halves}}
    path = directory / "profile.yaml"
    path.write_text(yaml.safe_dump(profile, sort_keys=False))
    load_scheduling(path)  # (refuse it here, not at the first pool)
    log.info("EndpointPickerConfig translated to the profile %s", path)
    return str(path)


def _default_admitting_at(admission: Mapping[str, float]) -> dict[str, Any]:
    """kvgate's default profile, admitting as the config says."""
    default = read_profile_document("default")
    return {**default, "name": "default-epp-admission",
            "admission": {**default.get("admission", {}), **admission}}


def with_pool_defaults(pools: Sequence[PoolSpec], profile: str | None, engine: Dialect | None = None,
                       metrics_port: int | None = None, kv_events: KvEventsSpec | None = None,
                       flow_control: FlowControlSpec | None = None) -> list[PoolSpec]:
    """``pools``, each given what it does not name itself: ``profile``, ``engine``, ``metrics_port``,
    ``kv_events`` (``epp_kv_events.with_kv_events_default``), ``flow_control`` (None: nothing)."""
    defaults = {"profile": profile, "engine": engine, "metrics_port": metrics_port}
    out = []
    for pool in pools:
        update = {field: value for field, value in defaults.items()
                  if value is not None and field not in pool.model_fields_set}
        pool = pool.model_copy(update=update) if update else pool
        out.append(EppDefaults(kv_events=kv_events, flow_control=flow_control).apply(pool))
    return out
