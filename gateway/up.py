"""``kvgate up``: the control plane, the picker and Envoy (and optionally a simulated fleet) in one command.

::

    kvgate up [-f DIR] [--port 8080] [--sim N] [--sim-pool NAME] [--admin-port 9090]

* ``-f DIR``: a directory of Gateway API / Inference Extension manifests (hot reloaded; Envoy is
  updated over xDS, never restarted). Without it, the bundled example (``gateway/examples/default``).
* ``--port``: where Envoy listens. The lowest Gateway listener port is bound here; any other
  listener port binds as written.
* ``--sim N``: start N simulated vLLM replicas (``python -m kvgate.simulator``), replica i on the address
  127.0.1.(1+i) (``--sim-hosts-from``) and the pool's first targetPort, and add one synthetic Pod per
  replica (the pool's selector labels, ``status.podIP``) for the pool ``--sim-pool`` (name or
  ``namespace/name``; needed only when the configuration has several pools). Without ``-f`` it
  defaults to 4; with ``-f`` to 0 (the manifests' own Pods are the endpoints).

Startup order: configuration (fail fast on a manifest error) → simulator → picker → ADS server →
first xDS snapshot → Envoy (child process, bootstrap pointing at kvgate's ADS) → wait until the
listener accepts connections → ready line. SIGINT/SIGTERM (also during startup) stop everything in
reverse order; no child process outlives ``kvgate up``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING

from kvgate.extproc.attempt_timeout import AttemptTimeout
from kvgate.extproc.lifecycle_config import EveryNth, LifecycleConfig
from kvgate.gateway.controlplane.control_plane import ControlPlane, ControlPlaneSettings
from kvgate.gateway.controlplane.models.server import ModelsServer
from kvgate.gateway.controlplane.resources import ConfigProvider, FileProvider
from kvgate.gateway.controlplane.resources.core import Pod
from kvgate.gateway.controlplane.resources.validate import ValidationOptions
from kvgate.gateway.controlplane.system_ca import system_ca_file
from kvgate.gateway.controlplane.telemetry import ControlPlaneCollector
from kvgate.gateway.controlplane.translate.tracing import EnvoyTracing
from kvgate.gateway.controlplane.xds import LISTENER, AdsServer, SnapshotCache, XdsStatus, bootstrap_for_ads
from kvgate.gateway.picker.redis_link import RedisSettings
from kvgate.gateway.picker.service import PickerService, PickerSettings
from kvgate.gateway.picker.tracing import ENVOY_SERVICE_NAME, TracingSettings
from kvgate.gateway.picker.workers import UpWorkers
from kvgate.gateway.processes.envoy_events import EnvoyEvents
from kvgate.gateway.processes.envoy_process import EnvoyOptions, EnvoyProcess, free_port
from kvgate.gateway.processes.envoy_supervisor import EnvoySupervisor
from kvgate.gateway.processes.simulator import SimFleetProcess
from kvgate.gateway.up_options import UpOptions, check_ports_free
from kvgate.gateway.up_sim import (
    check_sim_addresses_free,
    find_pool,
    host_of,
    nth_host,
    process_shares,
    sim_kv_events_connect,
    sim_kv_events_port,
    sim_pods,
    sim_tokenizer,
)
from kvgate.policies.errors import ConfigError

if TYPE_CHECKING:
    from kvgate.gateway.controlplane.kubernetes.provider import KubernetesProvider
    from kvgate.gateway.controlplane.kubernetes.status import StatusPublisher

log = logging.getLogger(__name__)

NODE_ID = "kvgate"


def picker_body_limit(listener_limit: int) -> int:
    """The pickers read every body Envoy's listener takes (their own default if larger)."""
    return max(listener_limit, LifecycleConfig().max_body_bytes)


def envoy_tracing(settings: TracingSettings) -> EnvoyTracing:
    """Envoy's half of ``--otlp-endpoint``: the same receiver and sampling ratio."""
    host, port = settings.host_port()
    return EnvoyTracing(host, port, settings.sampling_ratio, ENVOY_SERVICE_NAME, tls=not settings.insecure)


class KvgateUp:
    """Everything ``kvgate up`` runs. ``await start()`` then ``await stop()`` (also after a failed start)."""

    def __init__(self, options: UpOptions) -> None:
        self.options = options
        self._validation = ValidationOptions(require_picker_service=False, system_ca_file=system_ca_file())
        self.provider: ConfigProvider = FileProvider(
            options.config_directory,
            options=self._validation,
            quiet_ms=options.quiet_ms,
            max_batch_ms=options.max_batch_ms,
        )
        self.fleets: list[SimFleetProcess] = []
        """``--sim N``'s simulator processes (``--sim-processes``)."""
        self.workers: UpWorkers | None = None
        """``--workers N``: the other N - 1 picker processes."""
        self.picker: PickerService | None = None
        self.ads: AdsServer | None = None
        self.envoy: EnvoyProcess | None = None
        self.supervisor: EnvoySupervisor | None = None
        """Keeps Envoy running once started; its ``failed`` future ends ``kvgate up``."""
        self.control: ControlPlane | None = None
        self.status_identity: str | None = None
        """This replica's name in the status Lease (``--kubernetes``)."""
        self.cache = SnapshotCache()
        self.xds_status = XdsStatus()
        self.listen_port = options.port
        self._stack = AsyncExitStack()
        self._stop_watch = asyncio.Event()
        self._listens = False
        """A Gateway listener binds ``--port`` (a configuration may have none yet)."""
        self._scheme = "http"
        """``https`` where the listener on ``--port`` terminates TLS."""
        self.draining = False
        """Taking no more connections (:meth:`drain`): ``/readyz`` answers 503."""

    @property
    def url(self) -> str:
        return f"{self._scheme}://{self.options.host}:{self.listen_port}"

    @property
    def admin_url(self) -> str:
        assert self.picker is not None
        return f"http://{self.options.admin_host}:{self.picker.admin.port}"

    async def _status_publisher(self, cluster: KubernetesProvider) -> StatusPublisher:
        """Status back to ``cluster``, by whichever kvgate replica holds the status Lease."""
        from kvgate.gateway.controlplane.kubernetes.client import KubeClient, own_namespace
        from kvgate.gateway.controlplane.kubernetes.lease import LeaderElector
        from kvgate.gateway.controlplane.kubernetes.status import StatusPublisher, StatusWriter

        options = self.options
        client = await KubeClient.connect(kubeconfig=options.kubeconfig, host=options.kube_api)
        lease_s = options.status_lease_s
        lease_namespace = options.lease_namespace or options.namespace or own_namespace() or "default"
        elector = LeaderElector(client, lease_namespace, lease_duration_s=lease_s,
                                retry_s=max(0.1, lease_s / 7.5))  # client-go's 15 s / 2 s
        self.status_identity = elector.identity
        writer = StatusWriter(client, addresses=options.status_addresses)
        publisher = StatusPublisher(client, elector, writer, cluster.gateway_classes)
        self._stack.push_async_callback(publisher.stop)
        await publisher.start()
        return publisher

    async def start(self) -> None:
        options = self.options
        check_ports_free(options)
        cluster: KubernetesProvider | None = None
        if options.kubernetes:
            # imported here: kubernetes_asyncio's client costs ~0.5 s and ~37 MB to import, which a
            # gateway run from manifest files never needs
            from kvgate.gateway.controlplane.kubernetes.client import KubeClient
            from kvgate.gateway.controlplane.kubernetes.provider import KubernetesProvider

            client = await KubeClient.connect(kubeconfig=options.kubeconfig, host=options.kube_api)
            cluster = KubernetesProvider(
                client, namespace=options.namespace,
                options=self._validation,
            )
            self._stack.push_async_callback(cluster.stop)
            self.provider = cluster
        first = await self.provider.first()
        extra: tuple[Pod, ...] = ()
        if options.sim_replicas > 0:
            pool = find_pool(first.resources, options.sim_pool)
            check_sim_addresses_free(options.sim_hosts_from, options.sim_replicas,
                                     pool.spec.target_ports[0].number)
            urls: list[str] = []
            kv_events_port = sim_kv_events_port(pool)
            for first_replica, roles in process_shares(options.sim_roles, options.sim_processes):
                fleet = SimFleetProcess(
                    roles=roles,
                    port=pool.spec.target_ports[0].number,
                    hosts_from=nth_host(options.sim_hosts_from, first_replica),
                    time_scale=options.sim_time_scale,
                    model=options.sim_model,
                    kv_events_port=kv_events_port,
                    kv_events_connect=sim_kv_events_connect(pool),
                    tokenizer=sim_tokenizer(pool, options.sim_tokenizer),
                )
                self.fleets.append(fleet)
                self._stack.push_async_callback(fleet.stop)
                await fleet.start()
                urls += fleet.urls
            extra = sim_pods(pool, [host_of(url) for url in urls], options.sim_roles)

        attempt_bound = (
            AttemptTimeout(options.attempt_timeout_s, options.attempt_timeout_per_token_s)
            if options.attempt_timeout_s > 0 else None
        )
        workers: UpWorkers | None = None
        redis_url = options.redis_url
        if options.workers > 1:
            workers = UpWorkers(
                options.workers - 1, scrape_interval=options.scrape_interval,
                stale_after=options.stale_after, attempt_timeout=attempt_bound,
                skip_unread_responses=options.skip_unread_responses,
                shared_scrapes=options.shared_scrapes, shared_fairness=options.shared_fairness,
                loop=options.loop, tracing=options.tracing,
                read_usage_every=options.read_usage_every, max_session_pins=options.max_session_pins,
                max_request_body=picker_body_limit(options.max_request_body),
            )
            self._stack.push_async_callback(workers.stop)
            redis_url = await workers.redis_url(redis_url)
            self.workers = workers
        picker = PickerService(
            PickerSettings(
                grpc_address=f"127.0.0.1:{options.picker_port}",
                admin_host=options.admin_host,
                admin_port=options.admin_port,
                scrape_interval=options.scrape_interval,
                stale_after=options.stale_after,
                redis=(
                    RedisSettings(url=redis_url, share_scrapes=options.shared_scrapes,
                                  share_fairness=options.shared_fairness)
                    if redis_url else None
                ),
                lifecycle=LifecycleConfig(
                    max_body_bytes=picker_body_limit(options.max_request_body),
                    attempt_timeout=attempt_bound, skip_unread_responses=options.skip_unread_responses,
                    outcome_reports=options.skip_unread_responses,  # kvgate's Envoy reports them
                    observe_usage=EveryNth(options.read_usage_every) if options.read_usage_every else None,
                ),
                outcome_address="127.0.0.1:0" if options.skip_unread_responses else None,
                tracing=options.tracing,
                max_session_pins=options.max_session_pins,
            )
        )
        self.picker = picker
        self._stack.push_async_callback(picker.stop)
        await picker.start()

        ads = AdsServer(self.cache, observer=self.xds_status, port=options.xds_port)
        self.ads = ads
        self._stack.push_async_callback(ads.stop, 0.5)
        await ads.start()

        models = ModelsServer(lambda: self.control.config if self.control is not None else None,
                              picker.replica_models.reports)
        self._stack.push_async_callback(models.stop)
        await models.start()

        listener_ports = sorted({ls.port for gw in first.config.gateways for ls in gw.listeners})
        listen_ports: tuple[tuple[int, int], ...] = ()
        if listener_ports:
            listen_ports = ((listener_ports[0], options.port),)
        offset = options.privileged_port_offset  # (80 and 443 in a container without privileges)
        if offset:
            listen_ports += tuple((port, port + offset) for port in listener_ports[1:] if port < 1024)
        self._listens = bool(listen_ports)
        self._scheme = "https" if listener_ports and any(
            ls.certificate is not None for gw in first.config.gateways for ls in gw.listeners
            if ls.port == listener_ports[0]) else "http"
        settings = ControlPlaneSettings(
            models_address=models.address,
            picker_address=f"127.0.0.1:{picker.grpc_port}",
            extra_picker_addresses=workers.addresses if workers is not None else (),
            stream_idle_retry_s=options.stream_idle_retry_s,
            outcome_reports=options.skip_unread_responses,
            outcome_addresses=(
                (f"127.0.0.1:{picker.extproc.outcome_port}", *(workers.outcome_addresses if workers else ()))
                if options.skip_unread_responses else ()
            ),
            listen_host=options.host,
            listen_ports=listen_ports,
            downstream=options.downstream,
            tracing=envoy_tracing(options.tracing) if options.tracing is not None else None,
            max_body_bytes=options.max_request_body,
            validation=self._validation,
        )
        on_pools = workers.write_pools if workers is not None else None
        publisher = await self._status_publisher(cluster) if cluster is not None else None
        control = ControlPlane(self.provider, picker, self.cache, settings, xds_status=self.xds_status,
                               extra_pods=extra, on_pools=on_pools,
                               on_applied=publisher.notify if publisher is not None else None)
        self.control = control
        picker.telemetry.registry.register(ControlPlaneCollector(control, self.xds_status))
        picker.admin.status_provider = control.status
        if not control.apply(first):
            raise ConfigError(f"cannot apply the configuration: {control.last_error}")
        if workers is not None and redis_url is not None:
            await workers.start(redis_url)  # serving before Envoy sends them anything

        admin_port = options.envoy_admin_port or free_port()
        envoy = EnvoyProcess(
            bootstrap_for_ads(NODE_ID, ads.address, admin_port,
                              overload_manager=options.downstream.overload_manager()),
            EnvoyOptions(
                log_level=options.envoy_log_level,
                concurrency=options.envoy_concurrency or os.cpu_count() or 1,
            ),
        )
        self.envoy = envoy
        self._stack.push_async_callback(envoy.stop)
        await envoy.start()
        await self._envoy_listening()
        supervisor = EnvoySupervisor(envoy, ready=self._envoy_listening)
        self.supervisor = supervisor
        picker.admin.readiness_checks.append(supervisor.not_ready)
        picker.admin.pools_required = False  # (a gateway routing to Services alone serves)
        picker.admin.envoy_stats_url = f"{envoy.admin_url}/stats/prometheus"
        picker.admin.readiness_checks.append(lambda: "draining: stopping" if self.draining else None)
        self._stack.push_async_callback(supervisor.stop)  # before Envoy is stopped on purpose
        supervisor.start()
        events = EnvoyEvents(envoy.admin_url)
        self._stack.push_async_callback(events.stop)
        events.start()

        watch = asyncio.create_task(control.run(self._stop_watch))
        self._stack.push_async_callback(self._stop_watching, watch)

    async def _envoy_listening(self) -> None:
        """Until Envoy's listener is bound to ``--port``; a refused listener configuration (the port
        taken since the check at start) fails with Envoy's reason."""
        envoy = self.envoy
        if envoy is None or not self._listens:
            return
        since = time.time()

        def refused() -> str | None:
            rejection = self.xds_status.last_rejection(NODE_ID, LISTENER)
            if rejection is None or rejection.at < since:
                return None
            where = f"{self.options.host}:{self.options.port}"
            return f"Envoy refused its listener on {where}: {rejection.message}"

        await envoy.wait_listening(self.options.port, rejected=refused)

    async def _stop_watching(self, watch: asyncio.Task[None]) -> None:
        self._stop_watch.set()
        try:
            await asyncio.wait_for(watch, 5.0)
        except (TimeoutError, asyncio.CancelledError):
            watch.cancel()
        except Exception:  # stopping: report it, go on stopping the rest
            log.exception("the configuration watcher failed")

    async def drain(self, timeout_s: float) -> int:
        """Stop taking connections and wait, at most ``timeout_s``, until the requests in flight
        (streams included, and those held for room) have finished; the requests still in flight
        then (0: all finished). The configuration is no longer followed meanwhile (a new listener
        would take connections again); :meth:`stop` follows."""
        self.draining = True
        self._stop_watch.set()
        envoy = self.envoy
        if envoy is None or not envoy.running:
            return 0
        return await envoy.drain(timeout_s)

    async def stop(self) -> None:
        """Stop what was started, newest first (Envoy before the picker and the simulator)."""
        await self._stack.aclose()
