"""The endpoint-picker runtime: pools → schedulers + scraper + ext_proc server + admin HTTP.

``PickerService`` is fed pool configurations through ``apply_pools`` (from a pools file, from the
Gateway API control plane, from a cluster's InferencePool) and keeps three things in step: the
scraper's endpoint membership, one scheduler per pool (``policies.schedulers``: a
``ProfileScheduler``, or a ``DisaggregatedScheduler`` for a P/D profile; kept across updates while its
profile is unchanged, so in-flight counts and the prefix index survive a reload), and the immutable
pool table the ext_proc service resolves pools from (swapped as one reference).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import ssl
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import grpc

from kvgate.extproc.holding import HoldingArea, PoolLoad
from kvgate.extproc.lifecycle_config import LifecycleConfig
from kvgate.extproc.ports import MonotonicClock, Pool
from kvgate.extproc.prefill_client import DEFAULT_TIMEOUT_S as DEFAULT_PREFILL_TIMEOUT_S
from kvgate.extproc.server import ExtProcServer
from kvgate.extproc.tracing import RequestTracer
from kvgate.gateway.picker.admin_http import AdminServer
from kvgate.gateway.picker.flow_telemetry import FlowTelemetry
from kvgate.gateway.picker.kv_events.runtime import KvEventsCollector, KvEventsRuntime
from kvgate.gateway.picker.model_server_tls import ClientTls
from kvgate.gateway.picker.pool_runtime import PoolRuntime, PoolTable, with_spill_chains
from kvgate.gateway.picker.pools_file import ModelServerTlsSpec, PoolSpec
from kvgate.gateway.picker.redis_link import RedisSettings
from kvgate.gateway.picker.replica_models import ReplicaModels
from kvgate.gateway.picker.scraper import MetricsScraper
from kvgate.gateway.picker.shared_state.runtime import SharingCollector, SharingRuntime
from kvgate.gateway.picker.telemetry import GatewayTelemetry, OutcomeReportsCollector, SessionPinsCollector
from kvgate.gateway.picker.tracing import TracingSettings, tracer_provider
from kvgate.policies.pd_scheduler import DisaggregatedScheduler
from kvgate.policies.registry import PluginRegistry, builtin_registry
from kvgate.policies.saturation import SaturationThresholds
from kvgate.policies.schedulers import PoolScheduler, make_scheduler
from kvgate.policies.state import DEFAULT_MAX_SESSIONS, SessionCounts

log = logging.getLogger(__name__)


class _LiveDirectory:
    """Forwards to whatever table the service holds now (one reference read per request)."""

    def __init__(self, service: PickerService) -> None:
        self._service = service

    def resolve(self, name: str | None) -> Pool:
        return self._service.table.resolve(name)


@dataclass(frozen=True, slots=True)
class PickerSettings:
    grpc_address: str = "127.0.0.1:9002"
    admin_host: str = "127.0.0.1"
    admin_port: int = 9090
    scrape_interval: float = 0.05
    scrape_timeout: float = 0.5
    stale_after: float = 0.2
    lifecycle: LifecycleConfig = field(default_factory=LifecycleConfig)
    redis: RedisSettings | None = None
    """Share scheduler state and tenant limits with other picker replicas (None: in process)."""
    plugin_timing_every: int = 8
    """Time the scheduler's plugins (``inference_extension_plugin_duration_seconds``) on one request
    in this many (1: every request): a sample keeps the histogram's shape at a fraction of the cost
    (``python -m kvgate.bench.datapath.offline --timing-every N`` measures it)."""
    reuse_port: bool = False
    """Bind the gRPC port with SO_REUSEPORT (one of several workers on one port)."""
    own_grpc_address: str | None = None
    """A second gRPC address of this worker alone (``kvgate picker --workers``: the data planes
    kvgate configures balance over these; the shared port is for gateways given one address)."""
    secure_serving: bool = False
    """Serve ext_proc over TLS (``gateway.picker.tls``): ``kvgate picker``'s default, as the
    Inference Extension's picker; ``kvgate up`` keeps its own loopback link plaintext."""
    cert_path: Path | None = None
    cert_reload: bool = False
    health_address: str | None = None
    """A plaintext port for the gRPC health service alone (``kvgate picker``: 9003); None: none."""
    outcome_address: str | None = None
    """A loopback port taking Envoy's outcome reports (``extproc.outcomes``); None: none taken."""
    prefill_timeout: float = DEFAULT_PREFILL_TIMEOUT_S
    """Bound of the prefill step the picker runs for a disaggregated request (then served
    aggregated): below the data plane's ext_proc message timeout (kvgate up's Envoy: 30 s)."""
    tracing: TracingSettings | None = None
    """Export the picker's spans over OTLP (``gateway.picker.tracing``); None: tracing off."""
    max_session_pins: int = DEFAULT_MAX_SESSIONS
    """Session pins each pool keeps (``x-session-id`` affinity and stored responses' replicas)."""
    model_server_tls: ModelServerTlsSpec | None = None
    """HTTPS to the model servers of pools whose spec does not say (``--model-server-metrics-scheme``)."""


class PickerService:
    """Owns the scraper, the schedulers, the ext_proc gRPC server and the admin HTTP server."""

    def __init__(self, settings: PickerSettings, *, registry: PluginRegistry | None = None) -> None:
        self.settings = settings
        self.registry = registry if registry is not None else builtin_registry()
        self.telemetry = GatewayTelemetry()
        self.scraper = MetricsScraper(
            interval=settings.scrape_interval,
            timeout=settings.scrape_timeout,
            stale_after=settings.stale_after,
        )
        self.replica_models = ReplicaModels(self.scraper.snapshot, tls_of=self._model_server_tls)
        self.table = PoolTable(pools=MappingProxyType({}), default=None)
        self.sharing = SharingRuntime(settings.redis, max_sessions=settings.max_session_pins)
        self.scraper.delegate_to(self.sharing.share_scrapes(self.scraper, settings.stale_after))
        self.telemetry.registry.register(SharingCollector(self.sharing))
        self.tracer_provider = tracer_provider(settings.tracing) if settings.tracing is not None else None
        self.kv_events = KvEventsRuntime()
        """The engines' KV-cache events of the pools that publish them (issue 37)."""
        relay = self.sharing.share_kv_events(self.kv_events.deliver)
        self.kv_events.relay_to(relay.relay if relay is not None else None)
        self.telemetry.registry.register(KvEventsCollector(self.kv_events))
        lifecycle = settings.lifecycle
        if lifecycle.tenant_limiter is None:
            lifecycle = dataclasses.replace(lifecycle, tenant_limiter=self.sharing.limiter)
        self.extproc = ExtProcServer(
            _LiveDirectory(self),
            address=settings.grpc_address,
            metrics=self.telemetry,
            config=lifecycle,
            reuse_port=settings.reuse_port,
            own_address=settings.own_grpc_address,
            credentials=_server_credentials(settings) if settings.secure_serving else None,
            health_address=settings.health_address,
            outcome_address=settings.outcome_address,
            prefill_timeout_s=settings.prefill_timeout,
            tracer=RequestTracer(self.tracer_provider.get_tracer("kvgate.extproc"))
            if self.tracer_provider is not None else None,
        )
        self.flow_telemetry = FlowTelemetry(self.telemetry.registry, self._held_counts)
        self.admin = AdminServer(self, host=settings.admin_host, port=settings.admin_port)
        outcomes = self.extproc.outcomes
        self.telemetry.registry.register(OutcomeReportsCollector(lambda: outcomes.counts))
        self.telemetry.registry.register(SessionPinsCollector(self._session_counts))
        self._serving = False
        self._draining = False
        self.admin.readiness_checks.append(lambda: "draining: stopping" if self._draining else None)
        self._readiness_updates: set[asyncio.Task[None]] = set()
        self.telemetry.watch_pools(self.scraper.snapshot, self._scrape_counts, self._saturation_thresholds)

    def _model_server_tls(self, pool: str) -> ssl.SSLContext | None:
        runtime = self.table.pools.get(pool)
        return runtime.model_server_tls if runtime is not None else None

    def _session_counts(self) -> Mapping[str, SessionCounts]:
        return {name: pool.scheduler_impl.state.session_counts() for name, pool in self.table.pools.items()}

    def _saturation_thresholds(self) -> Mapping[str, SaturationThresholds]:
        """Each pool's thresholds of a full endpoint: flow control's where it holds requests, else
        the profile's admission thresholds (when sheddable requests are shed)."""
        out: dict[str, SaturationThresholds] = {}
        for name, pool in self.table.pools.items():
            if pool.holding_area is not None:
                out[name] = pool.holding_area.settings.thresholds
            else:
                scheduler = pool.scheduler_impl
                side = scheduler.decode if isinstance(scheduler, DisaggregatedScheduler) else scheduler
                out[name] = side.profile.admission.thresholds
        return out

    def _held_counts(self) -> Mapping[str, Mapping[tuple[int, str], int]]:
        return {name: pool.holding_area.waiting() for name, pool in self.table.pools.items()
                if pool.holding_area is not None}

    def _holding_area(self, spec: PoolSpec, scheduler: PoolScheduler,
                      previous: PoolRuntime | None) -> HoldingArea | None:
        """The pool's holding area: the one it had, its settings and scheduler brought up to date
        (its held requests go on waiting), else a new one; None when flow control is off (the old
        area's requests are then answered 503 by ``stop``)."""
        if spec.flow_control is None:
            return None
        settings = spec.flow_control.settings()
        name = spec.name
        scraper = self.scraper
        load = PoolLoad(endpoints=lambda: scraper.snapshot().endpoints(name),
                        inflight=scheduler.state.inflight_by_endpoint,
                        cached_tokens=scheduler.expected_cached_tokens,
                        spill_room=lambda: (pool := self.table.pools.get(name)) is not None
                        and pool.spill_room())
        ledger = self.sharing.ledger_for(name)
        kept = previous.holding_area if previous is not None else None
        if kept is not None:
            kept.reconfigure(settings, load)
            kept.ledger = ledger
            return kept
        return HoldingArea(name, settings, load, MonotonicClock(), metrics=self.flow_telemetry, ledger=ledger)

    def _scrape_counts(self) -> Mapping[str, tuple[int, int]]:
        return {e.address: (c.successes, c.failures) for e, c in self.scraper.counters().items()}

    def apply_pools(self, specs: Sequence[PoolSpec], default: str | None) -> None:
        """Make the service serve exactly ``specs`` (raises ConfigError before changing anything)."""
        tls = self.settings.model_server_tls
        if tls is not None:
            default_tls = {"model_server_tls": tls}
            specs = [spec if spec.model_server_tls is not None else spec.model_copy(update=default_tls)
                     for spec in specs]
        old = self.table.pools
        tokenizers = self.kv_events.load_tokenizers(specs)
        schedulers: dict[str, PoolScheduler] = {}
        for spec in specs:  # build everything first: a bad profile leaves the old table serving
            previous = old.get(spec.name)
            if previous is not None and previous.spec.profile == spec.profile:
                schedulers[spec.name] = previous.scheduler_impl
            else:
                schedulers[spec.name] = make_scheduler(
                    spec.profile, self.registry, state=self.sharing.state_for(spec.name),
                    timer=self.telemetry, timing_every=self.settings.plugin_timing_every,
                    engine_cache=self.kv_events.view(spec.name),
                )
        for name in old.keys() - {spec.name for spec in specs}:
            self.scraper.remove_pool(name)
        for spec in specs:
            self.scraper.set_endpoints(spec.name, spec.engine, spec.endpoint_objects(),
                                       metrics_port=spec.metrics_port, tls=_client_tls(spec))
            kept = set(spec.endpoints)
            previous = old.get(spec.name)
            if previous is not None:
                for address in set(previous.spec.endpoints) - kept:
                    schedulers[spec.name].forget_endpoint(address)
        self.sharing.apply(specs)
        self.kv_events.apply(specs, tokenizers)
        self.sharing.follow_kv_events(
            spec.name for spec in specs if spec.kv_events is not None and spec.kv_events.bind is not None)
        names = self.replica_models.names
        pools = with_spill_chains({
            spec.name: PoolRuntime.of(spec, schedulers[spec.name], self.scraper, names,
                                      self._holding_area(spec, schedulers[spec.name], old.get(spec.name)))
            for spec in specs
        })
        self.table = PoolTable(pools=MappingProxyType(pools), default=default)
        live_areas = {id(p.holding_area) for p in pools.values() if p.holding_area is not None}
        for previous in old.values():
            if previous.holding_area is not None and id(previous.holding_area) not in live_areas:
                self._stop_later(previous.holding_area.stop())
        self._publish_readiness()
        log.info("serving pools: %s", ", ".join(sorted(pools)) or "(none)")
        for spec in specs:  # said once as a pool becomes empty (not at every apply while it stays so)
            previous = old.get(spec.name)
            if not spec.endpoints and (previous is None or previous.spec.endpoints):
                log.warning("pool %s has no endpoints: its requests are answered 503 until one is ready",
                            spec.name)

    def pool_report(self) -> list[dict[str, object]]:
        """What the admin endpoint shows: each pool, its endpoints and their latest metrics."""
        snapshot = self.scraper.snapshot()
        now = self.scraper.now()
        report: list[dict[str, object]] = []
        for name, runtime in sorted(self.table.pools.items()):
            endpoints: list[dict[str, object]] = []
            for view in snapshot.endpoints(name):
                m = view.metrics
                inflight = runtime.scheduler_impl.state.inflight(view.address)
                endpoints.append(
                    {
                        "address": view.address,
                        "healthy": view.healthy,
                        "metrics_age_s": None if m is None else round(view.age(now), 4),
                        "waiting": None if m is None else m.waiting,
                        "running": None if m is None else m.running,
                        "kv_cache_usage": None if m is None else m.kv_cache_usage,
                        "active_loras": [] if m is None else sorted(m.active_loras),
                        "inflight_requests": inflight.requests,
                        "inflight_tokens": inflight.tokens,
                        **({"kv_events": events} if (events := self.kv_events.endpoint_report(
                            name, view.address)) is not None else {}),
                    }
                )
            report.append(
                {
                    "name": name,
                    "profile": runtime.spec.profile,
                    "failure_mode": runtime.spec.failure_mode.value,
                    "models": list(runtime.spec.models),
                    "endpoints": endpoints,
                    **({"flow_control": {"held": len(area), "queue_timeout_s": area.timeout_s}}
                       if (area := runtime.holding_area) is not None else {}),
                    **({"spill_to": runtime.spec.spill_to} if runtime.spec.spill_to else {}),
                    **({"kv_event_keys": keys}
                       if (keys := self.kv_events.pool_report(name)) is not None else {}),
                }
            )
        return report

    async def start(self) -> None:
        await self.scraper.start()
        await self.replica_models.start()
        await self.sharing.start()
        await self.extproc.start()
        await self.admin.start()
        self._serving = True
        await self.extproc.set_ready(bool(self.table.pools))

    def _stop_later(self, stopping: Coroutine[Any, Any, None]) -> None:
        """Run ``stopping`` on the loop (a holding area replaced by a configuration change)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            stopping.close()  # no loop: nothing can be waiting in it
            return
        task = loop.create_task(stopping)
        self._readiness_updates.add(task)
        task.add_done_callback(self._readiness_updates.discard)

    def _publish_readiness(self) -> None:
        """The gRPC readiness names answer SERVING while at least one pool is served (the
        Inference Extension's meaning: its pool is known); /readyz also wants fresh metrics."""
        if not self._serving:
            return  # start() publishes the table it finds
        task = asyncio.get_running_loop().create_task(self.extproc.set_ready(bool(self.table.pools)))
        self._readiness_updates.add(task)
        task.add_done_callback(self._readiness_updates.discard)

    async def drain(self, timeout_s: float) -> None:
        """Take no new request and let those in flight end, for at most ``timeout_s`` (``/readyz``
        answers 503 meanwhile); :meth:`stop` follows."""
        self._draining = True
        await self.extproc.drain(timeout_s)

    async def stop(self) -> None:
        self._serving = False
        for pool in self.table.pools.values():
            if pool.holding_area is not None:
                await pool.holding_area.stop()
        await asyncio.gather(*self._readiness_updates, return_exceptions=True)
        await self.admin.stop()
        await self.extproc.stop(0.5)
        await self.sharing.stop()
        await self.replica_models.stop()
        await self.scraper.stop()
        await self.kv_events.stop()
        if self.tracer_provider is not None:  # exports what is batched (a bounded wait)
            await asyncio.to_thread(self.tracer_provider.shutdown)

    @property
    def grpc_port(self) -> int:
        return self.extproc.port


def _server_credentials(settings: PickerSettings) -> grpc.ServerCredentials:
    # Imported here: cryptography (the self-signed certificate) loads only where TLS is served,
    # not on `kvgate up`'s plaintext loopback picker.
    from kvgate.gateway.picker.tls import server_credentials

    return server_credentials(settings.cert_path, reload=settings.cert_reload)


def _client_tls(spec: PoolSpec) -> ClientTls | None:
    return spec.model_server_tls.client() if spec.model_server_tls is not None else None
