"""The picker's standalone pool source: a YAML file naming pools and their replicas.

Before (and beside) the Gateway API control plane, ``kvgate picker --pools FILE`` reads::

    pools:
      - name: llama
        models: ["meta-llama/Llama-3.1-8B-Instruct", "sql-lora"]   # empty or absent: what the replicas serve
        checkModels: true             # false: forward names no replica reports (engines that load
                                      #   adapters on first use, e.g. vLLM's LoRA resolvers)
        extraPaths: ["/v1/load_lora_adapter"]   # served besides the inference API (default: none)
        endpoints: ["127.0.0.1:8001", "127.0.0.1:8002"]
        roles: {"127.0.0.1:8001": prefill, "127.0.0.1:8002": decode}   # disaggregated serving:
                                      #   prefill | decode | both (the default); with profile: pd
        pdExecution: picker           # who runs a disaggregated request's prefill: the picker
                                      #   itself (default), or the decode side's routing sidecar,
                                      #   told x-prefiller-host-port (llm-d)
        failureMode: FailClose        # FailOpen | FailClose
        profile: default              # a profile name under policies/profiles, or a path
        engine: vllm                  # metrics dialect: vllm | sglang | trtllm | triton | jetstream
        # metricsPort: 9100           # where the engines serve /metrics, when not on their serving
                                      # port (Triton's 8002, JetStream's prometheus_port)
        objectives:                   # InferenceObjective-shaped; priority < 0 is sheddable
          - {name: batch, priority: -1}
          - {name: chat, priority: 10}
        rateLimits:                   # per tenant (the header's value), sliding one-minute window
          header: x-gateway-inference-fairness-id   # the default
          requestsPerMinute: 600
          tokensPerMinute: 200000     # prompt + completion, from the response's usage
        flowControl:                  # hold requests in the picker while the pool is full
          queueTimeoutSeconds: 30     #   then 429 (sheddable) or 503, with Retry-After
          maxQueueLength: 1000        #   beyond it the lowest priority's newest is shed (429)
          maxInflightPerEndpoint: 60  #   optional; besides queueThreshold / kvCacheThreshold
          reservedPerEndpoint: 4      #   more, for tenants with nothing waiting (taken at once)
          order: fcfs                 #   a tenant's oldest first; slo-deadline: its x-slo-ttft-ms soonest due
        spillTo: llama-spot           # while full, requests go to this pool (before they wait)
        modelRewriteHeader: false     # true: x-gateway-model-name-rewrite names the model served
    defaultPool: llama                # optional; the only pool when there is one
    redis: redis://127.0.0.1:6379/0   # optional; share picker state and limits across replicas
"""

from __future__ import annotations

import ipaddress
import ssl
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from kvgate.gateway.picker.model_server_tls import ClientTls
from kvgate.policies.errors import ConfigError
from kvgate.policies.flow_control import DEFAULT_THRESHOLDS, FlowControlSettings
from kvgate.policies.holding_queue import QueueOrder
from kvgate.policies.saturation import SaturationThresholds
from kvgate.policies.types import Endpoint, FailureMode, Role
from kvgate.policies.validation import describe

Dialect = Literal["vllm", "sglang", "trtllm", "triton", "jetstream"]
RoleName = Literal["prefill", "decode", "both", "prefill-decode"]
PdExecution = Literal["picker", "sidecar"]


def _check_address(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host:
        raise ValueError(f"endpoint {value!r} is not ip:port")
    try:
        ipaddress.ip_address(host)
    except ValueError as exc:
        raise ValueError(f"endpoint {value!r}: {host!r} is not an IP address") from exc
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"endpoint {value!r}: port must be 1-65535")
    return value


class ObjectiveSpec(BaseModel):
    """An InferenceObjective of the pool: requests naming it (``x-gateway-inference-objective``)
    get its priority; unset priority is 0, negative is sheddable."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=253)
    priority: int = 0


class RateLimitSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    header: str = Field(default="x-gateway-inference-fairness-id", min_length=1)
    requests_per_minute: int | None = Field(default=None, ge=1, alias="requestsPerMinute")
    tokens_per_minute: int | None = Field(default=None, ge=1, alias="tokensPerMinute")


class RewriteTargetSpec(BaseModel):
    """One weighted target of a model rewrite (InferenceModelRewrite's ``modelRewrite`` + ``weight``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(min_length=1, max_length=253)
    weight: int = Field(default=1, ge=1, le=1_000_000)


class ModelRewriteSpec(BaseModel):
    """Requests for one of ``models`` (empty: any model) go upstream as one of ``targets``, chosen
    at random in proportion to the weights; the first rule that matches wins."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    models: tuple[str, ...] = ()
    targets: tuple[RewriteTargetSpec, ...] = Field(min_length=1)


class KvEventsSpec(BaseModel):
    """Where a pool's engines publish their KV-cache events (vLLM's ``--kv-events-config``), one of:

    - ``port``: each endpoint's own address at ``port`` (its ZMQ PUB bound on ``tcp://*:port``), the
      picker connecting to each;
    - ``bind``: the address the picker binds one SUB socket at (``tcp://*:5557``), the engines'
      publishers connecting to it (llm-d's way: vLLM's ``endpoint`` names the picker), their topic
      ``kv@<pod-ip>@<model>`` naming the endpoint.

    The replay ROUTER each engine binds: ``replayPort`` on the endpoint's address (default, with
    ``port``: ``port + 1``; with ``bind``: none; 0: none). ``gateway.picker.kv_events``."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    port: int | None = Field(default=None, ge=1, le=65535)
    bind: str | None = None
    replay_port: int | None = Field(default=None, ge=0, le=65535, alias="replayPort")
    tokenizer: str | None = None
    """The model's ``tokenizer.json`` or model directory on the picker's disk (its chat template
    too): ``engine-prefix-matches`` keys prompts with it (None: only a profile's own tokenizer)."""

    @model_validator(mode="after")
    def _one_topology(self) -> KvEventsSpec:
        if (self.port is None) == (self.bind is None):
            raise ValueError("kvEvents needs one of port (the picker connects to each endpoint) and "
                             "bind (the engines connect to the picker)")
        if self.bind is not None and not self.bind.startswith(("tcp://", "ipc://")):
            raise ValueError(f"kvEvents bind {self.bind!r} is not a ZMQ address (tcp://HOST:PORT)")
        return self

    def addresses(self, endpoint: str) -> tuple[str | None, str | None]:
        """(publisher to connect to, or None where the engines connect to ``bind``; replay or None)
        of an endpoint ``host:port``."""
        host = endpoint.rpartition(":")[0] or endpoint
        if self.port is None:
            replay = self.replay_port or None
            return None, (f"tcp://{host}:{replay}" if replay else None)
        replay = self.port + 1 if self.replay_port is None else self.replay_port
        return f"tcp://{host}:{self.port}", (f"tcp://{host}:{replay}" if replay else None)


class FlowControlSpec(BaseModel):
    """Hold requests in the picker when the pool is full (``policies.flow_control``, docs/flow-control.md):
    its presence turns flow control on for the pool."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    queue_timeout_s: float = Field(default=30.0, gt=0, le=1800, alias="queueTimeoutSeconds")
    max_queue_length: int = Field(default=1000, ge=1, le=1_000_000, alias="maxQueueLength")
    max_inflight_per_endpoint: int | None = Field(default=None, ge=1, alias="maxInflightPerEndpoint")
    reserved_per_endpoint: int = Field(default=0, ge=0, alias="reservedPerEndpoint")
    queue_threshold: int = Field(default=DEFAULT_THRESHOLDS.queue_threshold, ge=1, alias="queueThreshold")
    kv_cache_threshold: float = Field(default=DEFAULT_THRESHOLDS.kv_threshold, gt=0, le=1.0,
                                      alias="kvCacheThreshold")
    metrics_staleness_s: float = Field(default=0.2, gt=0, alias="metricsStalenessSeconds")
    retry_after_s: float = Field(default=1.0, ge=0, alias="retryAfterSeconds")
    order: QueueOrder = "fcfs"

    @model_validator(mode="after")
    def _reserve_needs_a_limit(self) -> FlowControlSpec:
        if self.reserved_per_endpoint and self.max_inflight_per_endpoint is None:
            raise ValueError("flowControl reservedPerEndpoint needs maxInflightPerEndpoint")
        return self

    def settings(self) -> FlowControlSettings:
        return FlowControlSettings(
            queue_timeout_s=self.queue_timeout_s, max_queue_length=self.max_queue_length,
            max_inflight_per_endpoint=self.max_inflight_per_endpoint,
            reserved_per_endpoint=self.reserved_per_endpoint,
            thresholds=SaturationThresholds(self.queue_threshold, self.kv_cache_threshold,
                                            self.metrics_staleness_s),
            retry_after_s=self.retry_after_s, order=self.order,
        )


class ModelServerTlsSpec(BaseModel):
    """The pool's model servers serve HTTPS (vLLM's ``--ssl-certfile``): the picker scrapes their
    metrics and sends its own requests (a disaggregated request's prefill, ``/v1/models``) over
    TLS; ``caFile`` and ``caCertificates`` (PEM) verify their certificates (the chain: pods are
    reached by IP); else they are not verified (the Inference Extension picker's default).
    ``hostname`` (a BackendTLSPolicy's): named in every handshake (SNI), and the name their
    certificates must carry unless ``checkHostname`` is false (a policy naming subjectAltNames:
    Envoy checks those; the picker, the chain alone)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    ca_file: str | None = Field(default=None, alias="caFile", min_length=1)
    ca_certificates: str | None = Field(default=None, alias="caCertificates", min_length=1)
    hostname: str | None = Field(default=None, min_length=1, max_length=253)
    check_hostname: bool = Field(default=True, alias="checkHostname")

    @field_validator("ca_certificates")
    @classmethod
    def _pem(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                ssl.create_default_context(cadata=value)
            except (ValueError, ssl.SSLError) as exc:
                raise ValueError(f"caCertificates cannot be loaded: {exc}") from exc
        return value

    @field_validator("ca_file")
    @classmethod
    def _loads(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                ssl.create_default_context(cafile=value)
            except (OSError, ssl.SSLError) as exc:
                raise ValueError(f"caFile {value!r} cannot be loaded: {exc}") from exc
        return value

    def client(self) -> ClientTls:
        return ClientTls(self.ca_file, self.ca_certificates, self.hostname, self.check_hostname)


class PoolSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    name: str = Field(min_length=1, max_length=253)
    models: tuple[str, ...] = ()
    endpoints: tuple[str, ...] = ()
    failure_mode: FailureMode = Field(default=FailureMode.FAIL_CLOSE, alias="failureMode")
    profile: str = "default"
    engine: Dialect = "vllm"
    metrics_port: int | None = Field(default=None, alias="metricsPort", ge=1, le=65535)
    """The port the engines serve their metrics on (None: each endpoint's own port)."""
    objectives: tuple[ObjectiveSpec, ...] = ()
    rate_limits: RateLimitSpec | None = Field(default=None, alias="rateLimits")
    model_rewrites: tuple[ModelRewriteSpec, ...] = Field(default=(), alias="modelRewrites")
    route_models: tuple[str, ...] = Field(default=(), alias="routeModels")
    """Models an HTTPRoute sends here by an exact model match (the control plane fills it in)."""
    check_models: bool = Field(default=True, alias="checkModels")
    """Answer 404 for a model that no ready replica reports (when all have reported)."""
    extra_paths: tuple[str, ...] = Field(default=(), alias="extraPaths")
    """Paths served besides the inference API (``extproc.inference_paths``), e.g. a model server's
    admin API for a trusted gateway."""
    roles: Mapping[str, RoleName] = Field(default_factory=dict)
    """Endpoint address → its role in disaggregated serving (absent: both)."""
    pd_execution: PdExecution = Field(default="picker", alias="pdExecution")
    """Who runs a disaggregated request's prefill: the picker, or the decode side's sidecar."""
    kv_events: KvEventsSpec | None = Field(default=None, alias="kvEvents")
    """Subscribe to the engines' KV-cache events (None: none published)."""
    flow_control: FlowControlSpec | None = Field(default=None, alias="flowControl")
    """Hold requests in the picker while the pool is full (None: never held)."""
    spill_to: str | None = Field(default=None, alias="spillTo")
    """The pool that takes this pool's requests while it is full (docs/flow-control.md)."""
    model_server_tls: ModelServerTlsSpec | None = Field(default=None, alias="modelServerTls")
    """HTTPS to the pool's model servers (None: plain HTTP)."""
    media_uuids: bool = Field(default=False, alias="mediaUuids")
    model_rewrite_header: bool = Field(default=False, alias="modelRewriteHeader")
    """Requests may name the model they are served in ``x-gateway-model-name-rewrite`` (llm-d's
    picker header; docs/operations.md says what it opens); off: such a request is 400."""
    """Name each inline media item of a chat (a ``data:`` URL, base64 audio or embeddings) that the
    client did not name with its digest, as vLLM's ``uuid`` (docs/kv-events.md: images)."""

    def role_of(self, address: str) -> Role:
        return Role.parse(self.roles.get(address))

    def endpoint_objects(self) -> tuple[Endpoint, ...]:
        """The pool's endpoints with their roles."""
        return tuple(Endpoint(address, self.name, role=self.role_of(address)) for address in self.endpoints)

    @model_validator(mode="after")
    def _roles_name_endpoints(self) -> PoolSpec:
        unknown = sorted(set(self.roles) - set(self.endpoints))
        if unknown:
            raise ValueError(f"roles name addresses that are not endpoints: {', '.join(unknown)}")
        return self

    @staticmethod
    def check_extra_path(value: str) -> str:
        """``value`` as an extra path (its trailing slash dropped); ValueError when it is not one."""
        if not value.startswith("/") or "?" in value or any(c.isspace() for c in value):
            raise ValueError(f"extra path {value!r} must start with / and have no query or spaces")
        return value.rstrip("/") or "/"

    @field_validator("extra_paths")
    @classmethod
    def _paths(cls, values: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(cls.check_extra_path(value) for value in values)

    def declared_models(self) -> frozenset[str]:
        """Every name the configuration gives this pool: its models, its routes' model matches, its
        rewrites' sources and targets."""
        names = {*self.models, *self.route_models}
        for rule in self.model_rewrites:
            names.update(rule.models)
            names.update(target.model for target in rule.targets)
        return frozenset(names)

    def rewrite_targets(self, model: str) -> tuple[RewriteTargetSpec, ...] | None:
        """The weighted targets of the first rewrite rule matching ``model``; None when none does."""
        for rule in self.model_rewrites:
            if not rule.models or model in rule.models:
                return rule.targets
        return None

    def objective_priority(self, name: str) -> int | None:
        for objective in self.objectives:
            if objective.name == name:
                return objective.priority
        return None

    @field_validator("objectives")
    @classmethod
    def _objective_names(cls, values: tuple[ObjectiveSpec, ...]) -> tuple[ObjectiveSpec, ...]:
        if len({o.name for o in values}) != len(values):
            raise ValueError("objective names must be unique within a pool")
        return values

    @field_validator("endpoints")
    @classmethod
    def _addresses(cls, values: tuple[str, ...]) -> tuple[str, ...]:
        for value in values:
            _check_address(value)
        if len(set(values)) != len(values):
            raise ValueError("endpoints must be unique")
        return values


class PoolsFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    pools: tuple[PoolSpec, ...] = Field(min_length=1)
    default_pool: str | None = Field(default=None, alias="defaultPool")
    redis: str | None = Field(default=None, pattern=r"^(redis|rediss|unix)://")

    @model_validator(mode="after")
    def _names(self) -> PoolsFile:
        names = [pool.name for pool in self.pools]
        if len(set(names)) != len(names):
            raise ValueError("pool names must be unique")
        for pool in self.pools:
            if pool.spill_to is not None and (pool.spill_to not in names or pool.spill_to == pool.name):
                raise ValueError(f"pool {pool.name!r}: spillTo {pool.spill_to!r} names no other pool")
        if self.default_pool is not None and self.default_pool not in names:
            raise ValueError(f"defaultPool {self.default_pool!r} names no pool")
        return self

    @property
    def effective_default(self) -> str | None:
        if self.default_pool is not None:
            return self.default_pool
        return self.pools[0].name if len(self.pools) == 1 else None


def parse_pools(text: str, *, source: str = "<pools>") -> PoolsFile:
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {exc}") from exc
    try:
        return PoolsFile.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {describe(exc)}") from exc


def load_pools(path: Path) -> PoolsFile:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read pools file {path}: {exc}") from exc
    return parse_pools(text, source=str(path))


def dump_pools(specs: Sequence[PoolSpec], default: str | None = None, redis: str | None = None) -> str:
    """The pools file of ``specs`` (what ``load_pools`` reads back to equal specs)."""
    document: dict[str, object] = {
        "pools": [spec.model_dump(mode="json", by_alias=True, exclude_defaults=True) for spec in specs]
    }
    if default is not None:
        document["defaultPool"] = default
    if redis is not None:
        document["redis"] = redis
    return yaml.safe_dump(document, sort_keys=False)
