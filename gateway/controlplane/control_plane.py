"""The control loop: manifests → validated config → Envoy over xDS, and → the in-process picker's pools.

Each provider snapshot (plus any synthetic Pods, e.g. those of ``kvgate up --sim``) is validated,
translated (``gateway.controlplane.translate``) and published to the :class:`SnapshotCache` the
ADS server serves, and every InferencePool that uses kvgate's own picker becomes one :class:`PoolSpec` of the
:class:`PickerService` (pool name = the pool id ``namespace/name``; endpoints; failure mode;
objectives from its InferenceObjectives; model rewrites from its InferenceModelRewrites; profile and
metrics dialect from the annotations ``kvgate.io/profile`` / ``kvgate.io/engine``).

The picker learns new pools before Envoy routes to them. A configuration that cannot be applied
(inconsistent xDS snapshot, unknown profile…) changes nothing: the last good one keeps serving and
:meth:`ControlPlane.status` reports the error, next to the resources' conditions, the provider's
last load error and Envoy's ACKs/NACKs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, get_args

from kvgate.gateway.controlplane.downstream import DownstreamSettings
from kvgate.gateway.controlplane.envoy_config import ONE_PASS
from kvgate.gateway.controlplane.flow_annotations import flow_control
from kvgate.gateway.controlplane.models.catalog import declared_models
from kvgate.gateway.controlplane.resources import (
    ConfigProvider,
    ConfigSnapshot,
    ResolvedPool,
    ResourceSet,
    ValidatedConfig,
    validate,
)
from kvgate.gateway.controlplane.resources.backends import (
    MODEL_SERVER_CA_ANNOTATION,
    MODEL_SERVER_TLS_ANNOTATION,
)
from kvgate.gateway.controlplane.resources.certificates import not_after
from kvgate.gateway.controlplane.resources.core import Pod
from kvgate.gateway.controlplane.resources.provider import ProviderStatus
from kvgate.gateway.controlplane.resources.validate import ValidationOptions
from kvgate.gateway.controlplane.translate import BodyRouting, TranslationSettings, translate
from kvgate.gateway.controlplane.translate.tracing import EnvoyTracing
from kvgate.gateway.controlplane.xds import ANY_NODE, SnapshotCache, XdsStatus
from kvgate.gateway.picker.pools_file import (
    Dialect,
    KvEventsSpec,
    ModelRewriteSpec,
    ObjectiveSpec,
    PoolSpec,
    RateLimitSpec,
    RewriteTargetSpec,
)
from kvgate.gateway.picker.service import PickerService
from kvgate.policies.errors import ConfigError
from kvgate.policies.types import Role

log = logging.getLogger(__name__)

PROFILE_ANNOTATION = "kvgate.io/profile"
MEDIA_UUIDS_ANNOTATION = "kvgate.io/media-uuids"
MODEL_REWRITE_HEADER_ANNOTATION = "kvgate.io/model-rewrite-header"
"""``"true"``: name a chat's inline media items with their digest as vLLM's ``uuid`` (the picker then
knows the identifier the engines key those blocks with: docs/kv-events.md)."""
ENGINE_ANNOTATION = "kvgate.io/engine"
METRICS_PORT_ANNOTATION = "kvgate.io/metrics-port"
"""The port the pool's engines serve their metrics on, when it is not their serving port (Triton's
8002, JetStream's ``prometheus_port``)."""
# Per-tenant limits of a pool (no Gateway API resource carries them): requests and tokens per
# minute per value of the fairness header (default x-gateway-inference-fairness-id).
RPM_ANNOTATION = "kvgate.io/requests-per-minute"
TPM_ANNOTATION = "kvgate.io/tokens-per-minute"
FAIRNESS_HEADER_ANNOTATION = "kvgate.io/fairness-header"
EXTRA_PATHS_ANNOTATION = "kvgate.io/extra-paths"
"""Comma-separated paths the picker serves for this pool besides the inference API
(``extproc.inference_paths``): e.g. ``/v1/load_lora_adapter`` for a gateway only operators reach."""
MODEL_CHECK_ANNOTATION = "kvgate.io/model-check"
"""``"false"``: forward names no replica reports (engines that load an adapter on first use, such as
vLLM's LoRA resolvers), instead of answering them 404 ``model_not_found`` at the gateway."""
PD_EXECUTION_ANNOTATION = "kvgate.io/pd-execution"
KV_EVENTS_PORT_ANNOTATION = "kvgate.io/kv-events-port"
TOKENIZER_ANNOTATION = "kvgate.io/tokenizer"
KV_EVENTS_BIND_ANNOTATION = "kvgate.io/kv-events-bind"
"""The port each endpoint's engine publishes KV-cache events on (vLLM's --kv-events-config
endpoint tcp://*:PORT); absent: the pool's engines publish none."""
KV_EVENTS_REPLAY_PORT_ANNOTATION = "kvgate.io/kv-events-replay-port"
"""Their replay socket's port (default: the events port + 1; 0: none)."""
"""Who runs a disaggregated request's prefill (profile ``pd``): ``picker`` (kvgate, the default) or
``sidecar`` (llm-d's decode-side routing sidecar, told ``x-prefiller-host-port``)."""
_DIALECTS: tuple[str, ...] = get_args(Dialect)


@dataclass(frozen=True, slots=True)
class ControlPlaneSettings:
    """``picker_address``: ``ip:port`` Envoy uses for the ext_proc cluster. ``listen_ports``:
    ``(Gateway listener port, port Envoy binds)`` pairs (others bind as written)."""

    picker_address: str
    extra_picker_addresses: tuple[str, ...] = ()
    """More picker processes (``kvgate up --workers``): Envoy balances over all of them."""
    node_id: str = ANY_NODE
    listen_host: str = "127.0.0.1"
    listen_ports: tuple[tuple[int, int], ...] = ()
    body_based_routing: BodyRouting = "auto"
    stream_idle_retry_s: float = 30.0
    """A streamed request whose replica sends nothing this long is retried elsewhere (0: never)."""
    models_address: str | None = None
    """kvgate's models server (``GET /v1/models`` answered by the gateway); None: not routed."""
    default_profile: str = "default"
    default_engine: Dialect = "vllm"
    outcome_reports: bool = False
    """Envoy reports the outcomes of the requests whose response the picker skips
    (``kvgate up --skip-unread-responses``): ``ExtProcSettings.outcome_reports``."""
    outcome_addresses: tuple[str, ...] = ()
    """Where the pickers take those reports (loopback ports apart from their ext_proc ports)."""
    downstream: DownstreamSettings = field(default_factory=DownstreamSettings)
    """The clients' timeouts and limits (``gateway.controlplane.downstream``)."""
    tracing: EnvoyTracing | None = None
    """Envoy's tracing (``kvgate up --otlp-endpoint``); None: off."""
    max_body_bytes: int = ONE_PASS.max_body_bytes
    """The listeners' buffer limit: a larger request body is 413 (``kvgate up --max-request-body``)."""
    validation: ValidationOptions = field(
        default_factory=lambda: ValidationOptions(require_picker_service=False)
    )

    def translation(self) -> TranslationSettings:
        return TranslationSettings(
            picker_addresses=(self.picker_address, *self.extra_picker_addresses),
            listen_host=self.listen_host,
            listen_ports=self.listen_ports,
            body_based_routing=self.body_based_routing,
            stream_idle_retry_s=self.stream_idle_retry_s,
            models_address=self.models_address,
            ext_proc=dataclasses.replace(ONE_PASS, outcome_reports=self.outcome_reports,
                                         max_body_bytes=self.max_body_bytes),
            outcome_addresses=self.outcome_addresses,
            downstream=self.downstream,
            tracing=self.tracing,
        )


def with_pods(resources: ResourceSet, pods: Sequence[Pod]) -> ResourceSet:
    """``resources`` plus ``pods`` (synthetic ones, e.g. a simulated fleet's replicas)."""
    if not pods:
        return resources
    return dataclasses.replace(resources, pods=resources.pods + tuple(pods))


def pool_annotations(resources: ResourceSet, pool: ResolvedPool) -> Mapping[str, str]:
    for source in resources.inference_pools:
        if source.key == pool.key:
            return source.metadata.annotations
    return {}


def pool_spec(
    pool: ResolvedPool, resources: ResourceSet, config: ValidatedConfig, settings: ControlPlaneSettings
) -> tuple[PoolSpec, list[str]]:
    """The picker's view of ``pool`` and any warnings (e.g. an unknown engine annotation)."""
    warnings: list[str] = []
    annotations = pool_annotations(resources, pool)
    engine = annotations.get(ENGINE_ANNOTATION, settings.default_engine)
    if engine not in _DIALECTS:
        warnings.append(
            f"InferencePool {pool.id}: {ENGINE_ANNOTATION} {engine!r} is not one of {list(_DIALECTS)}; "
            f"using {settings.default_engine}"
        )
        engine = settings.default_engine
    objectives = tuple(
        ObjectiveSpec(name=objective.key.name, priority=objective.priority)
        for objective in config.objectives
        if objective.pool == pool.key
    )
    table = config.rewrites.get(pool.key)
    rewrites = tuple(
        ModelRewriteSpec(
            models=tuple(sorted(rule.models)),
            targets=tuple(RewriteTargetSpec(model=t.model, weight=t.weight) for t in rule.targets),
        )
        for rule in (table.rules if table is not None else ())
    )
    rate_limits = _rate_limits(pool, annotations, warnings)
    check = annotations.get(MODEL_CHECK_ANNOTATION, "true").strip().lower()
    if check not in ("true", "false"):
        warnings.append(f"InferencePool {pool.id}: {MODEL_CHECK_ANNOTATION} {check!r} is not true or false; "
                        "using true")
    spec = PoolSpec.model_validate(
        {
            "name": pool.id,
            "endpoints": pool.addresses,
            "failure_mode": pool.picker.failure_mode,
            "profile": annotations.get(PROFILE_ANNOTATION, settings.default_profile),
            "engine": engine,
            "metrics_port": _metrics_port(pool, annotations, warnings),
            "objectives": objectives,
            "model_rewrites": rewrites,
            "rate_limits": rate_limits,
            "route_models": tuple(sorted(declared_models(config).get(pool.id, ()))),
            "check_models": check != "false",
            "extra_paths": _extra_paths(pool, annotations, warnings),
            "roles": {e.address: e.role.value for e in pool.endpoints if e.role is not Role.BOTH},
            "pd_execution": _pd_execution(pool, annotations, warnings),
            "kv_events": _kv_events(pool, annotations, warnings),
            "flow_control": flow_control(pool.id, annotations, warnings),
            "spill_to": str(pool.spill_to) if pool.spill_to is not None else None,
            "media_uuids": _flag(pool, annotations, MEDIA_UUIDS_ANNOTATION, warnings),
            "model_rewrite_header": _flag(pool, annotations, MODEL_REWRITE_HEADER_ANNOTATION, warnings),
            "model_server_tls": _model_server_tls(pool, annotations, warnings),
        }
    )
    return spec, warnings


def _kv_events(
    pool: ResolvedPool, annotations: Mapping[str, str], warnings: list[str]
) -> KvEventsSpec | None:
    """The pool's ``kvgate.io/kv-events-port`` (and replay port, and ``kvgate.io/tokenizer``: the
    model's tokenizer on the picker's disk); a bad port is warned about and leaves the pool without
    KV events (routing falls back to the approximate index)."""
    text = annotations.get(KV_EVENTS_PORT_ANNOTATION)
    bind = annotations.get(KV_EVENTS_BIND_ANNOTATION, "").strip() or None
    if text is None and bind is None:
        if TOKENIZER_ANNOTATION in annotations:
            warnings.append(f"InferencePool {pool.id}: {TOKENIZER_ANNOTATION} without "
                            f"{KV_EVENTS_PORT_ANNOTATION}: nothing reports the engines' caches")
        return None
    replay = annotations.get(KV_EVENTS_REPLAY_PORT_ANNOTATION)
    tokenizer = annotations.get(TOKENIZER_ANNOTATION, "").strip() or None
    try:
        return KvEventsSpec.model_validate(
            {"port": int(text) if text is not None else None, "bind": bind,
             "replay_port": int(replay) if replay is not None else None, "tokenizer": tokenizer})
    except ValueError as exc:
        warnings.append(f"InferencePool {pool.id}: {KV_EVENTS_PORT_ANNOTATION} {text!r} / "
                        f"{KV_EVENTS_BIND_ANNOTATION} {bind!r} / {KV_EVENTS_REPLAY_PORT_ANNOTATION} "
                        f"{replay!r}: {_first_error(exc)}; no KV events")
        return None


def _first_error(exc: ValueError) -> str:
    """A validation error's first message (pydantic's, without its URL lines), else the text."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        found = errors()
        if found:
            return str(found[0].get("msg", exc))
    return str(exc)


def _flag(pool: ResolvedPool, annotations: Mapping[str, str], name: str, warnings: list[str]) -> bool:
    """A ``"true"``/``"false"`` annotation (absent: false; anything else warned about: false)."""
    value = annotations.get(name, "false").strip().lower()
    if value not in ("true", "false"):
        warnings.append(f"InferencePool {pool.id}: {name} {value!r} is not true or false; using false")
    return value == "true"


def _model_server_tls(
    pool: ResolvedPool, annotations: Mapping[str, str], warnings: list[str]
) -> dict[str, str | bool | None] | None:
    """The pool's HTTPS to its model servers, as the data plane's: a BackendTLSPolicy's (the
    picker checks the hostname where the policy names no subjectAltNames), else the annotations'
    as ``resources.backends.model_server_tls`` read them; a value other than true or false is
    warned about (plain HTTP then)."""
    if MODEL_SERVER_TLS_ANNOTATION in annotations and MODEL_SERVER_CA_ANNOTATION not in annotations:
        _flag(pool, annotations, MODEL_SERVER_TLS_ANNOTATION, warnings)
    policy = pool.backend_tls
    if policy is not None:
        return {"ca_certificates": policy.ca_pem, "ca_file": policy.ca_file,
                "hostname": policy.hostname, "check_hostname": not policy.subject_alt_names}
    tls = pool.model_server_tls
    return None if tls is None else {"ca_file": tls.ca_file}


def _pd_execution(pool: ResolvedPool, annotations: Mapping[str, str], warnings: list[str]) -> str:
    value = annotations.get(PD_EXECUTION_ANNOTATION, "picker").strip().lower()
    if value not in ("picker", "sidecar"):
        warnings.append(f"InferencePool {pool.id}: {PD_EXECUTION_ANNOTATION} {value!r} is not picker or "
                        "sidecar; using picker")
        return "picker"
    return value


def _metrics_port(pool: ResolvedPool, annotations: Mapping[str, str], warnings: list[str]) -> int | None:
    """The pool's ``kvgate.io/metrics-port`` (None: the endpoints' own port, also for a bad value)."""
    text = annotations.get(METRICS_PORT_ANNOTATION)
    if text is None:
        return None
    try:
        port = int(text.strip())
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        warnings.append(f"InferencePool {pool.id}: {METRICS_PORT_ANNOTATION} {text!r} is not a port; "
                        "scraping the endpoints' own port")
        return None
    return port


def _extra_paths(pool: ResolvedPool, annotations: Mapping[str, str], warnings: list[str]) -> tuple[str, ...]:
    """The pool's ``kvgate.io/extra-paths``; a path that is not one is warned about and left out."""
    paths = []
    for text in annotations.get(EXTRA_PATHS_ANNOTATION, "").split(","):
        path = text.strip()
        if not path:
            continue
        try:
            PoolSpec.check_extra_path(path)
        except ValueError as exc:
            warnings.append(f"InferencePool {pool.id}: {EXTRA_PATHS_ANNOTATION}: {exc}; ignored")
            continue
        paths.append(path)
    return tuple(paths)


def _rate_limits(
    pool: ResolvedPool, annotations: Mapping[str, str], warnings: list[str]
) -> RateLimitSpec | None:
    """The pool's per-tenant limits from its annotations (None: no limits); bad values are warned
    about and ignored, so a typo never takes the pool down."""
    limits: dict[str, int] = {}
    for key, name in ((RPM_ANNOTATION, "requests_per_minute"), (TPM_ANNOTATION, "tokens_per_minute")):
        text = annotations.get(key)
        if text is None:
            continue
        try:
            value = int(text)
            if value < 1:
                raise ValueError(text)
        except ValueError:
            warnings.append(f"InferencePool {pool.id}: {key} {text!r} is not a positive integer; ignored")
            continue
        limits[name] = value
    if not limits:
        return None
    header = annotations.get(FAIRNESS_HEADER_ANNOTATION, "").strip().lower()
    return RateLimitSpec.model_validate({**limits, **({"header": header} if header else {})})


def pool_specs(
    resources: ResourceSet, config: ValidatedConfig, settings: ControlPlaneSettings
) -> tuple[tuple[PoolSpec, ...], list[str]]:
    """One PoolSpec per pool served by kvgate's own picker (pools with an external picker are left out)."""
    specs: list[PoolSpec] = []
    warnings: list[str] = []
    for pool in config.pools:
        if pool.picker.addresses:
            continue
        spec, pool_warnings = pool_spec(pool, resources, config, settings)
        specs.append(spec)
        warnings.extend(pool_warnings)
    return tuple(specs), warnings


@dataclass(frozen=True, slots=True)
class Applied:
    """What the control loop last published."""

    config_version: int
    content_hash: str
    xds_version: str
    pools: tuple[str, ...]
    warnings: tuple[str, ...]
    at: float


class ControlPlane:
    """Keeps Envoy (through ``cache``) and ``picker`` in step with ``provider``'s snapshots."""

    def __init__(
        self,
        provider: ConfigProvider,
        picker: PickerService,
        cache: SnapshotCache,
        settings: ControlPlaneSettings,
        *,
        xds_status: XdsStatus | None = None,
        extra_pods: Sequence[Pod] = (),
        on_pools: Callable[[Sequence[PoolSpec], str | None], None] | None = None,
        on_applied: Callable[[ValidatedConfig], None] | None = None,
    ) -> None:
        """``on_pools`` is told every pool table the picker is given (e.g. to write it for worker
        processes), before Envoy learns the configuration."""
        self.on_pools = on_pools
        self.on_applied = on_applied
        """Told each configuration once applied (e.g. to write its status back to the cluster)."""
        self.provider = provider
        self.picker = picker
        self.cache = cache
        self.settings = settings
        self.xds_status = xds_status or XdsStatus()
        self.extra_pods = tuple(extra_pods)
        self.applied: Applied | None = None
        self.config: ValidatedConfig | None = None
        self.last_error: str | None = None
        self.last_error_at: float | None = None
        self._problems: frozenset[str] = frozenset()
        """What the last applied configuration's status and warnings said was wrong (logged once)."""

    def apply(self, snapshot: ConfigSnapshot) -> bool:
        """Publish ``snapshot``; False (and ``last_error`` set) when it could not be applied."""
        try:
            resources = with_pods(snapshot.resources, self.extra_pods)
            config = validate(resources, self.settings.validation, snapshot.config.certificates()) \
                if self.extra_pods else snapshot.config
            specs, warnings = pool_specs(resources, config, self.settings)
            envoy = translate(config, self.settings.translation())
            xds = envoy.snapshot()
            default = specs[0].name if len(specs) == 1 else None
            self.picker.apply_pools(specs, default)  # first: the picker knows a pool before Envoy uses it
            if self.on_pools is not None:
                self.on_pools(specs, default)
            self.cache.set_snapshot(self.settings.node_id, xds)
        except ConfigError as exc:
            self.last_error, self.last_error_at = exc.message, time.time()
            log.warning("keeping the last good configuration: %s", exc.message)
            return False
        self.config = config
        self.last_error = self.last_error_at = None
        self.applied = Applied(
            snapshot.version,
            snapshot.content_hash,
            xds.version,
            tuple(spec.name for spec in specs),
            (*warnings, *envoy.warnings),
            time.time(),
        )
        log.info(
            "configuration %s applied (xDS %s, pools: %s)",
            snapshot.version, xds.version, ", ".join(self.applied.pools) or "none",
        )
        self._log_problems(config, self.applied.warnings)
        if self.on_applied is not None:
            self.on_applied(config)
        return True

    def _log_problems(self, config: ValidatedConfig, warnings: Sequence[str]) -> None:
        """Log what is wrong with the applied configuration as it appears, and when it is gone: a
        condition in its bad state (a route whose InferencePool does not exist answers 500 to every
        request it matches, which only ``kvgate status`` said) and the translation's warnings."""
        problems = frozenset((*config.status.problem_lines(), *warnings))
        for line in sorted(problems - self._problems):
            log.warning("configuration: %s", line)
        for line in sorted(self._problems - problems):  # at the warning's level: seen where it was
            log.warning("configuration: resolved: %s", line)
        self._problems = problems

    async def run(self, stop: asyncio.Event) -> None:
        """Apply each snapshot the provider publishes until ``stop`` is set."""
        async for snapshot in self.provider.updates(stop):
            if self.applied is None or snapshot.content_hash != self.applied.content_hash:
                self.apply(snapshot)

    def provider_status(self) -> ProviderStatus:
        return self.provider.status()

    def status(self) -> dict[str, Any]:
        """The JSON of ``GET /status`` (what ``kvgate status`` prints)."""
        provider = self.provider.status()
        applied = self.applied
        config = self.config
        return {
            "config": {
                "directory": provider.directory,
                "version": provider.version,
                "content_hash": provider.content_hash,
                "loaded_at": provider.loaded_at,
                "load_error": provider.last_error,
                "load_error_at": provider.last_error_at,
            },
            "applied": None if applied is None else {
                "config_version": applied.config_version,
                "content_hash": applied.content_hash,
                "xds_version": applied.xds_version,
                "pools": list(applied.pools),
                "warnings": list(applied.warnings),
                "at": applied.at,
            },
            "apply_error": self.last_error,
            "apply_error_at": self.last_error_at,
            "resources": [] if config is None else config.status.to_json(),
            "notes": [] if config is None else list(config.notes),
            "certificates": [] if config is None else [
                {"gateway": str(gateway), "listener": listener, "secret": str(certificate.secret),
                 "not_after": not_after(certificate)}
                for (gateway, listener), certificate in sorted(config.certificates().items(),
                                                               key=lambda item: (str(item[0][0]), item[0][1]))
            ],
            "xds": self.xds_status.as_dict(),
        }
