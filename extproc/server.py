"""Build and run the ext_proc gRPC server (ExternalProcessor + gRPC health)."""

from __future__ import annotations

import grpc
from envoy.service.accesslog.v3 import als_pb2_grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from kvgate.extproc.access_log import AccessLogServicer
from kvgate.extproc.lifecycle_config import LifecycleConfig
from kvgate.extproc.outcomes import OutcomeReports
from kvgate.extproc.ports import Clock, MonotonicClock, NoMetrics, PoolDirectory, RequestMetrics
from kvgate.extproc.prefill_client import DEFAULT_TIMEOUT_S as DEFAULT_PREFILL_TIMEOUT_S
from kvgate.extproc.prefill_client import PrefillClient
from kvgate.extproc.servicer import ExtProcServicer
from kvgate.extproc.tracing import RequestTracer

EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
LIVENESS_SERVICE = "liveness"
"""The Inference Extension's picker answers these names on its health port, and its Helm chart
probes them: ``liveness`` (the process serves), ``readiness`` and ``inference-extension`` (its pool is
known). kvgate answers the same, so that chart's probes work against kvgate's picker."""
READINESS_SERVICES = ("readiness", "inference-extension")

MESSAGE_HEADROOM_BYTES = 1024 * 1024
"""Room in one gRPC message beyond the body limit: the request's headers (Envoy caps them at 60 KiB
by default), metadata and protobuf framing."""

MAX_PENDING_STREAMS = 65536
"""Streams gRPC's core may hold before Python's server loop takes them up. Its defaults (a soft limit
of 1,000, a hard one of 3,000, random early drops in between) reset streams that a burst opens faster
than one event loop accepts them: a burst of clients lost some of their requests as 503
``endpoint_picker_unavailable`` (``bench/results/burst.md``). The picker is on every
request's path, so it queues what the data plane sends instead (Envoy's circuit breakers on the
ext_proc cluster bound that); soft = hard: no early drops."""


class ExtProcServer:
    """A grpc.aio server serving ext_proc and health on ``address`` (``host:port``; port 0 = any free).

    ``await start()`` binds and returns the bound port; ``await stop(grace)`` marks health
    NOT_SERVING and stops. ``health`` lets the composition root flip readiness itself.
    """

    def __init__(
        self,
        directory: PoolDirectory,
        *,
        address: str = "0.0.0.0:9002",
        clock: Clock | None = None,
        metrics: RequestMetrics | None = None,
        config: LifecycleConfig | None = None,
        max_concurrent_streams: int | None = None,
        reuse_port: bool = False,
        own_address: str | None = None,
        credentials: grpc.ServerCredentials | None = None,
        health_address: str | None = None,
        outcome_address: str | None = None,
        prefill_timeout_s: float = DEFAULT_PREFILL_TIMEOUT_S,
        tracer: RequestTracer | None = None,
    ) -> None:
        """``reuse_port`` lets several picker processes share one port (SO_REUSEPORT).
        ``own_address`` (``host:port``, port 0 = any free) is a second port of this process alone,
        for a data plane that balances over the workers itself (``own_port`` once started).
        ``credentials``: serve ext_proc over TLS (None: plaintext). ``health_address``: a separate
        plaintext port serving only the gRPC health service (probes; ``health_port`` once started),
        as the Inference Extension's picker does on 9003. ``outcome_address``: where Envoy's outcome
        reports are taken (``extproc.outcomes``; ``outcome_port`` once started): a loopback port of
        its own, never the ext_proc port that other gateways reach, because a report moves routing
        (forged 500s took a replica out of picking); None: no reports are taken."""
        self._address = address
        self._own_address = own_address
        self._credentials = credentials
        self._health_address = health_address
        self._outcome_address = outcome_address
        self.own_port = 0
        self.health_port = 0
        self.outcome_port = 0
        message_limit = (config or LifecycleConfig()).max_body_bytes + MESSAGE_HEADROOM_BYTES
        options: list[tuple[str, int]] = [
            ("grpc.so_reuseport", int(reuse_port)),
            ("grpc.server.max_pending_requests", MAX_PENDING_STREAMS),
            ("grpc.server.max_pending_requests_hard_limit", MAX_PENDING_STREAMS),
            # A BUFFERED body comes in one message and a rewritten one goes back in one: gRPC's
            # default 4 MiB refused 4-8 MiB bodies that Envoy's buffer had accepted (503).
            ("grpc.max_receive_message_length", message_limit),
            ("grpc.max_send_message_length", message_limit),
        ]
        if max_concurrent_streams is not None:
            options.append(("grpc.max_concurrent_streams", max_concurrent_streams))
        self._server = grpc.aio.server(options=options)
        self.prefills = PrefillClient(prefill_timeout_s)
        """Runs the prefills of disaggregated requests (``extproc.prefill_step``)."""
        self.servicer = ExtProcServicer(directory, clock=clock, metrics=metrics, config=config,
                                        prefills=self.prefills, tracer=tracer)
        pb_grpc.add_ExternalProcessorServicer_to_server(self.servicer, self._server)
        self.outcomes = OutcomeReports(
            directory, clock=clock or MonotonicClock(), metrics=metrics or NoMetrics()
        )
        self._outcome_server: grpc.aio.Server | None = None
        if outcome_address is not None:
            self._outcome_server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
            als_pb2_grpc.add_AccessLogServiceServicer_to_server(
                AccessLogServicer(self.outcomes), self._outcome_server
            )
        self.health = HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        self._health_server: grpc.aio.Server | None = None
        if health_address is not None:
            self._health_server = grpc.aio.server(options=[("grpc.so_reuseport", int(reuse_port))])
            health_pb2_grpc.add_HealthServicer_to_server(self.health, self._health_server)
        self.port = 0

    def _bind(self, address: str) -> int:
        if self._credentials is not None:
            return self._server.add_secure_port(address, self._credentials)
        return self._server.add_insecure_port(address)

    async def start(self) -> int:
        self.port = self._bind(self._address)
        if self._own_address is not None:
            self.own_port = self._bind(self._own_address)
        await self._server.start()
        if self._health_server is not None:
            assert self._health_address is not None
            self.health_port = self._health_server.add_insecure_port(self._health_address)
            await self._health_server.start()
        if self._outcome_server is not None:
            assert self._outcome_address is not None
            self.outcome_port = self._outcome_server.add_insecure_port(self._outcome_address)
            await self._outcome_server.start()
        for service in ("", EXT_PROC_SERVICE, LIVENESS_SERVICE):
            await self.health.set(service, health_pb2.HealthCheckResponse.SERVING)
        await self.set_ready(False)
        return self.port

    async def set_ready(self, ready: bool) -> None:
        """What the readiness health names answer (the composition root knows when it is ready)."""
        answer = health_pb2.HealthCheckResponse
        status = answer.SERVING if ready else answer.NOT_SERVING
        for service in READINESS_SERVICES:
            await self.health.set(service, status)

    async def drain(self, timeout_s: float) -> None:
        """Take no new stream (readiness NOT_SERVING; new RPCs refused) and let those open end,
        for at most ``timeout_s``: a stream is one request, so its end is the request's (a
        full-duplex one lasts its whole response)."""
        await self.set_ready(False)
        await self._server.stop(timeout_s)

    async def stop(self, grace: float | None = 1.0) -> None:
        await self.health.enter_graceful_shutdown()
        await self._server.stop(grace)
        if self._health_server is not None:
            await self._health_server.stop(grace)
        if self._outcome_server is not None:
            await self._outcome_server.stop(grace)
        await self.prefills.close()

    async def wait_for_termination(self) -> None:
        await self._server.wait_for_termination()
