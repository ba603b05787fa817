"""``kvgate up``'s options (``gateway.up_cli`` builds them from the command line, tests and
benchmarks directly), the bundled example configurations, and the ports checked before anything
starts."""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources as package_resources
from pathlib import Path

from kvgate.gateway.controlplane.downstream import DownstreamSettings
from kvgate.gateway.picker.tracing import TracingSettings
from kvgate.gateway.processes import event_loop
from kvgate.gateway.processes.envoy_process import port_in_use
from kvgate.policies.errors import ConfigError
from kvgate.policies.state import DEFAULT_MAX_SESSIONS

DEFAULT_SIM_REPLICAS = 4
EXAMPLE_MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def bundled_example(name: str = "default") -> Path:
    """An example configuration shipped with kvgate (package data): ``default``, or ``pd`` (a
    disaggregated pool)."""
    return Path(str(package_resources.files("kvgate.gateway") / "examples" / name))


@dataclass(frozen=True, slots=True)
class UpOptions:
    directory: Path | None = None
    port: int = 8080
    host: str = "127.0.0.1"
    admin_host: str = "127.0.0.1"
    """Where the admin server (metrics, readiness, status) binds: loopback unless told, whatever
    ``host`` the gateway listens on."""
    admin_port: int = 9090
    picker_port: int = 0
    xds_port: int = 0
    envoy_admin_port: int = 0
    sim: int | None = None
    sim_pool: str | None = None
    sim_hosts_from: str = "127.0.1.1"
    sim_time_scale: float = 1.0
    max_request_body: int = 8 * 1024 * 1024
    """The largest request body the gateway takes (Envoy's listener buffer; the pickers read at least
    as much); a larger one is 413 (``--max-request-body``)."""
    sim_processes: int = 1
    """Simulator processes the replicas are spread over (``--sim-processes``)."""
    sim_model: str | None = None
    sim_prefill: int = 0
    sim_decode: int = 0
    """Simulated prefill and decode replicas (``--sim-prefill``, ``--sim-decode``): a disaggregated
    fleet; ``sim`` then counts replicas of role both besides them (default 0)."""
    envoy_log_level: str = "warning"
    envoy_concurrency: int = 0
    """Envoy worker threads; 0 = one per core of this machine."""
    workers: int = 1
    """Picker processes: the in-process one and ``workers - 1`` more (``gateway.picker.workers``)."""
    loop: str = event_loop.DEFAULT
    """The picker workers' event loop (``gateway.processes.event_loop``; this process's is chosen
    where it starts: ``kvgate up --loop``)."""
    stream_idle_retry_s: float = 30.0
    """A streamed request whose replica sends nothing this long goes to the next endpoint (0: never)."""
    privileged_port_offset: int = 0
    """Gateway listener ports below 1024, other than the one ``port`` binds, are bound at the port plus
    this (Envoy Gateway's 10000: a container without privileges; its Service maps them back)."""
    drain_timeout_s: float = 60.0
    """On SIGTERM/SIGINT, stop taking connections and let the requests in flight finish for at most
    this long before stopping (0: stop at once; a second signal stops at once too)."""
    attempt_timeout_s: float = 30.0
    attempt_timeout_per_token_s: float = 0.1
    """A non-streamed request with ``max_tokens`` whose replica has not answered within
    ``attempt_timeout_s + attempt_timeout_per_token_s × max_tokens`` goes to the next endpoint
    (``extproc.attempt_timeout``; a base of 0: never)."""
    downstream: DownstreamSettings = field(default_factory=DownstreamSettings)
    """The clients' timeouts and limits (``--request-timeout``, ``--request-headers-timeout``,
    ``--max-connections``)."""
    redis_url: str | None = None
    tracing: TracingSettings | None = None
    """OpenTelemetry traces from Envoy and the pickers (``--otlp-endpoint``); None: off."""
    sim_tokenizer: str | None = None
    """The simulated replicas tokenize with this tokenizer.json (``--sim-tokenizer``)."""
    read_usage_every: int = 0
    """Read one response in N for its usage where the one-pass data path skips it (0: none)."""
    max_session_pins: int = DEFAULT_MAX_SESSIONS
    """Session pins each pool keeps, in every picker (``--max-session-pins``)."""
    scrape_interval: float = 0.05
    stale_after: float = 0.2
    quiet_ms: int = 100
    max_batch_ms: int = 400
    kubernetes: bool = False
    """Follow a Kubernetes cluster instead of a directory (``gateway.controlplane.kubernetes``)."""
    kubeconfig: str | None = None
    namespace: str | None = None
    """The one namespace to follow (None: all; RBAC must allow it)."""
    kube_api: str | None = None
    """The API server's URL without authentication (``kubectl proxy``'s, a test's); None: the
    kubeconfig, else the in-cluster service account."""
    skip_unread_responses: bool = True
    """A request whose response nothing needs skips the response-headers round trip
    (``extproc.lifecycle_config.LifecycleConfig.skip_unread_responses``); kvgate's Envoy reports its
    outcome afterwards (``extproc.outcomes``). False: every request keeps the round trip."""
    shared_scrapes: bool = True
    """With Redis (``--redis``, ``--workers``): one picker per pool scrapes for all
    (``gateway.picker.shared_state.scrapes``)."""
    shared_fairness: bool = True
    """With Redis and flow control: fairness between tenants across pickers
    (``RedisSettings.share_fairness``)."""
    status_lease_s: float = 15.0
    """How long the status Lease holds without renewal (another replica takes over after it)."""
    lease_namespace: str | None = None
    """Where the status Lease lives (None: ``namespace``, else this Pod's own, else ``default``)."""
    gateway_addresses: tuple[str, ...] = ()
    """What Gateways' ``status.addresses`` name (IPs or hostnames, e.g. the Service in front of
    kvgate); none given: ``host`` unless it is a wildcard."""

    @property
    def status_addresses(self) -> tuple[str, ...]:
        if self.gateway_addresses:
            return self.gateway_addresses
        return () if self.host in ("0.0.0.0", "::", "") else (self.host,)

    @property
    def disaggregated_sim(self) -> bool:
        return self.sim_prefill > 0 or self.sim_decode > 0

    @property
    def config_directory(self) -> Path:
        if self.directory is not None:
            return self.directory
        return bundled_example("pd" if self.disaggregated_sim else "default")

    @property
    def config_source(self) -> str:
        if self.kubernetes:
            return f"kubernetes:{self.namespace or '*'}"
        return str(self.config_directory)

    @property
    def sim_roles(self) -> tuple[str, ...]:
        """Each simulated replica's role, in replica order (the simulator's order: prefill, decode,
        then both)."""
        if self.disaggregated_sim:
            both = self.sim or 0
            return ("prefill",) * self.sim_prefill + ("decode",) * self.sim_decode + ("both",) * both
        return ("both",) * self.sim_replicas

    @property
    def sim_replicas(self) -> int:
        if self.disaggregated_sim:
            return self.sim_prefill + self.sim_decode + (self.sim or 0)
        if self.sim is not None:
            return self.sim
        return DEFAULT_SIM_REPLICAS if self.directory is None and not self.kubernetes else 0


def check_ports_free(options: UpOptions) -> None:
    """Fail at once, in one line, when a port ``kvgate up`` must bind is taken (Envoy would only
    warn, and the printed curl would reach the other process)."""
    wanted = [("--port", options.port), ("--admin-port", options.admin_port),
              ("--picker-port", options.picker_port), ("--xds-port", options.xds_port),
              ("--envoy-admin-port", options.envoy_admin_port)]
    for flag, port in wanted:
        host = {"--port": options.host, "--admin-port": options.admin_host}.get(flag, "127.0.0.1")
        if port and port_in_use(host, port):
            raise ConfigError(
                f"port {port} ({flag}) is in use by another process: choose another, e.g. {flag} "
                f"{port + 1}" + (" or 0 for any free one" if flag != "--port" else "")
                + (" (a second kvgate up needs --port, --admin-port and --sim-hosts-from of its own: "
                   "--port 8081 --admin-port 9091 --sim-hosts-from 127.0.2.1)"
                   if (flag, port) in (("--port", 8080), ("--admin-port", 9090)) else "")
            )
