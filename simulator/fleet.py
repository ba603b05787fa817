"""A fleet of simulated replicas in one asyncio process, each behind its own HTTP listener.

Addresses: replica ``i`` listens on ``host:port + i`` (default host 127.0.0.1), or, with
``hosts_from`` (e.g. ``127.0.1.1``), on ``hosts_from + i : port`` — one loopback address per replica,
all on the same port, as pods have their own IPs. ``port == 0`` gives every replica an ephemeral port
(with ``hosts_from``: the first replica's ephemeral port, shared by all).

The fleet can stop a replica's listener (connections are then refused; its in-flight requests end with
an error) and start it again on the same address; the replica's engine (and its KV cache) lives on.

Ready protocol (stdout, one line each, flushed; see :func:`ready_lines`)::

    kvgate-sim replica 0 http://127.0.0.1:8000
    kvgate-sim replica 1 http://127.0.0.1:8001 role=decode   (a role other than both is named)
    kvgate-sim admin http://127.0.0.1:9000            (only with an admin port)
    kvgate-sim ready http://127.0.0.1:8000 http://127.0.0.1:8001

The ``ready`` line comes last, once every listener accepts connections: ``kvgate-sim ready`` followed by
the replica base URLs in replica order, separated by single spaces.

The replicas of one fleet share a :class:`~simulator.kv_transfer.KvTransferHub`: a decode replica's
read of a prefill replica's KV frees it there (disaggregated serving).
"""

from __future__ import annotations

import asyncio
import ipaddress
import ssl
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from kvgate.simulator.admin import make_admin_app
from kvgate.simulator.driver import LagMonitor
from kvgate.simulator.encode_memo import EncodeMemo
from kvgate.simulator.file_tokenizer import file_encoder
from kvgate.simulator.kv_transfer import KvTransferHub
from kvgate.simulator.server import Replica, ReplicaConfig

READY_PREFIX = "kvgate-sim ready"
SHUTDOWN_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class FleetConfig:
    replicas: tuple[ReplicaConfig, ...]
    port: int = 8000
    host: str = "127.0.0.1"
    hosts_from: str | None = None
    admin_port: int | None = None
    admin_host: str = "127.0.0.1"
    lag_interval_s: float = 0.005
    tokenizer: str | None = None
    """A tokenizer file the replicas tokenize with (``simulator.file_tokenizer``); None: the
    simulator's own rule."""
    kv_events_port: int | None = None
    """Publish each replica's KV events (``simulator.kv_events``): on its own address at this port
    with ``hosts_from``, else replica ``i`` at this port + 2i (the replay socket on the next port)."""

    def address_of(self, index: int) -> tuple[str, int]:
        if self.hosts_from is not None:
            return str(ipaddress.ip_address(self.hosts_from) + index), self.port
        return self.host, (self.port + index if self.port else 0)

    kv_events_connect: str | None = None
    """The replicas' publishers connect to this address (a picker's bound socket, llm-d's way)
    instead of binding; their replay sockets stay on their own addresses."""
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    """Serve HTTPS with this certificate and key (vLLM's ``--ssl-certfile``/``--ssl-keyfile``):
    inference and ``/metrics`` alike, on the same port."""

    def ssl_context(self) -> ssl.SSLContext | None:
        if self.ssl_certfile is None:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.ssl_certfile, self.ssl_keyfile)
        return context

    def kv_events_address_of(self, index: int) -> tuple[str, int] | None:
        if self.kv_events_port is None:
            return None
        host, _ = self.address_of(index)
        return host, self.kv_events_port + (0 if self.hosts_from is not None else 2 * index)


_GAUGES = frozenset({"in_flight", "waiting", "running"})


class ReplicaListener:
    """Serves one replica's app on one address; can be stopped and started again."""

    def __init__(self, replica: Replica, host: str, port: int, tls: ssl.SSLContext | None = None) -> None:
        self.replica = replica
        self.host = host
        self.port = port
        self.tls = tls
        self._runner: web.AppRunner | None = None

    @property
    def running(self) -> bool:
        return self._runner is not None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls is not None else 'http'}://{host}:{self.port}"

    async def start(self) -> None:
        if self._runner is not None:
            return
        runner = web.AppRunner(self.replica.make_app(), access_log=None, handler_cancellation=True,
                               shutdown_timeout=SHUTDOWN_TIMEOUT_S)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, reuse_address=True, backlog=1024,
                           ssl_context=self.tls)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self.port = runner.addresses[0][1]  # the real port when 0 was asked for
        self.replica.accepting = True
        self._runner = runner

    async def stop(self) -> None:
        """Refuses new connections and ends every in-flight request with an error."""
        runner, self._runner = self._runner, None
        if runner is None:
            return
        self.replica.stop_in_flight()
        await runner.cleanup()


@dataclass
class Fleet:
    """All replicas of one process, their listeners, the lag monitor and the optional admin server."""

    config: FleetConfig
    replicas: list[Replica] = field(default_factory=list)
    listeners: list[ReplicaListener] = field(default_factory=list)
    lag: LagMonitor | None = None
    encode_memo: EncodeMemo = field(default_factory=EncodeMemo)  # shared: one CPU plays every replica
    kv_hub: KvTransferHub = field(default_factory=KvTransferHub)
    admin_url: str | None = None
    _admin_runner: web.AppRunner | None = None
    _retired: list[Replica] = field(default_factory=list)
    """Replicas replaced by a restart: their counters still count in the fleet's totals."""

    async def start(self) -> None:
        """Builds the replicas and starts every listener (and the admin server)."""
        if self.config.tokenizer is not None:
            self.encode_memo = EncodeMemo(encoder=file_encoder(self.config.tokenizer))
        self.lag = LagMonitor(self.config.lag_interval_s)
        self.lag.start()
        tls = self.config.ssl_context()
        try:
            for replica_config in self.config.replicas:
                replica = Replica(replica_config, self.lag, self.encode_memo, self.kv_hub)
                self.replicas.append(replica)
                host, port = self.config.address_of(replica_config.index)
                if self.config.hosts_from is not None and port == 0 and self.listeners:
                    port = self.listeners[0].port  # one shared port, as pods share a targetPort
                listener = ReplicaListener(replica, host, port, tls)
                self.listeners.append(listener)
                await listener.start()
                events_at = self.config.kv_events_address_of(replica_config.index)
                if events_at is not None:
                    replica.start_kv_events(*events_at, connect=self.config.kv_events_connect)
            if self.config.admin_port is not None:
                runner = web.AppRunner(make_admin_app(self), access_log=None)
                await runner.setup()
                await web.TCPSite(runner, self.config.admin_host, self.config.admin_port,
                                  reuse_address=True).start()
                self._admin_runner = runner
                admin_port = runner.addresses[0][1]
                self.admin_url = f"http://{self.config.admin_host}:{admin_port}"
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        if self._admin_runner is not None:
            await self._admin_runner.cleanup()
            self._admin_runner = None
        for listener in self.listeners:
            await listener.stop()
        for replica in self.replicas:
            await replica.close()
        if self.lag is not None:
            await self.lag.stop()

    async def restart(self, index: int) -> ReplicaListener:
        """Replica ``index``'s process restarts: its listener stops (in-flight requests end with an
        error), a new engine with an empty KV cache and a new KV-event publisher (sequence from 0)
        take its place on the same addresses, its counters and metrics start from zero as a new
        process's do (the fleet's totals keep the old ones)."""
        listener = self.listener(index)
        old = listener.replica
        await listener.stop()
        await old.close()
        self._retired.append(old)
        replica = Replica(old.config, self.lag, self.encode_memo, self.kv_hub)
        self.replicas[self.replicas.index(old)] = replica
        listener.replica = replica
        await listener.start()
        events_at = self.config.kv_events_address_of(old.config.index)
        if events_at is not None:
            replica.start_kv_events(*events_at, connect=self.config.kv_events_connect)
        return listener

    @property
    def urls(self) -> list[str]:
        return [listener.url for listener in self.listeners]

    def listener(self, index: int) -> ReplicaListener:
        if not 0 <= index < len(self.listeners):
            raise KeyError(f"no replica {index}; the fleet has {len(self.listeners)}")
        return self.listeners[index]

    def stats(self, window_s: float = 60.0) -> dict[str, Any]:
        """Every replica's /sim/stats plus fleet totals of the counters."""
        per_replica = []
        for listener in self.listeners:
            item = listener.replica.stats(window_s)
            item["url"] = listener.url
            item["listening"] = listener.running
            per_replica.append(item)
        summed = ("requests_received", "requests_served", "requests_rejected", "requests_aborted",
                  "requests_failed_stopped", "errors_injected", "hung", "streams_cut", "in_flight",
                  "waiting", "running",
                  "prefix_cache_queries", "prefix_cache_hits", "prompt_tokens", "generation_tokens",
                  "request_success", "preemptions", "remote_prefills", "remote_decodes",
                  "kv_transfers_failed", "kv_expired", "realtime_sessions", "realtime_transcriptions")
        totals: dict[str, Any] = {key: sum(item[key] for item in per_replica) for key in summed}
        for old in self._retired:  # restarted replicas' earlier processes (their gauges are gone)
            item = old.stats(window_s)
            for key in summed:
                if key not in _GAUGES:
                    totals[key] += item[key]
        return {
            "replicas": per_replica,
            "totals": totals,
            "loop_lag": self.lag.summary(window_s) if self.lag is not None else None,
        }


def ready_lines(urls: Sequence[str], admin_url: str | None, roles: Sequence[str] = ()) -> list[str]:
    """``roles``: each replica's role, in order (none given: all ``both``)."""
    lines = []
    for i, url in enumerate(urls):
        role = roles[i] if i < len(roles) else "both"
        lines.append(f"kvgate-sim replica {i} {url}" + ("" if role == "both" else f" role={role}"))
    if admin_url is not None:
        lines.append(f"kvgate-sim admin {admin_url}")
    lines.append(" ".join([READY_PREFIX, *urls]))
    return lines


def parse_ready_line(line: str) -> list[str] | None:
    """The replica URLs of a ``kvgate-sim ready …`` line, or None for any other line."""
    if not line.startswith(READY_PREFIX + " ") and line.strip() != READY_PREFIX:
        return None
    return line[len(READY_PREFIX):].split()


async def run_until(fleet: Fleet, stop: asyncio.Event, announce: bool = True) -> None:
    """Starts ``fleet``, prints the ready lines, serves until ``stop`` is set, then stops it."""
    await fleet.start()
    try:
        if announce:
            roles = [replica.config.role for replica in fleet.replicas]
            for line in ready_lines(fleet.urls, fleet.admin_url, roles):
                print(line, flush=True)
        await stop.wait()
    finally:
        await fleet.stop()
